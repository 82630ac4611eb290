"""What LiteRT-LM holds resident, by part of the bundle, with speculative decoding off and on.

    python tools/litert_lm_memory.py EXPORT [--prompt-tokens 900] [--new-tokens 256] [--threads N]

For each setting, a fresh process opens the export's model.litertlm in LiteRT-LM (`litert-lm-api`), prefills the
prompt (start_cost.py's words, about --prompt-tokens tokens) and decodes --new-tokens. After the open, the prefill
and the decode it reads /proc/self/smaps and sums what is resident: each mapping of the bundle split by the bundle's
sections (the target, the embedder, the per-layer embedder, the drafter; a page mapped twice counts twice, as RSS
counts it), LiteRT-LM's weight cache files beside the bundle, other files, and anonymous memory, beside the peak
(VmHWM) so far. Prints one table per stage; the last line of each setting is the process's peak RSS (wait4's
ru_maxrss, start_cost.py's figure). Needs the litert extra.

First it measures what one read of a table row costs in RSS on the bundle's filesystem: 300 reads of a byte at
random offsets of the mapped bundle, and the resident growth per read. A table row read maps the kernel's
fault-around window (64 KB with 4 KB pages) or, where the page cache holds large folios (ext4 on recent Linux), the
whole folio, so the RSS of memory-mapped tables depends on the filesystem as much as on the bundle.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from start_cost import prompt_for  # noqa: E402

STAGES = ("open", "prefill", "decode")


def sections(bundle: Path) -> list[tuple[int, int, str]]:
    """(begin, end, name) of every section of the bundle, in file offsets."""
    from ai_edge_quantizer.utils import litertlm_utils

    lm = litertlm_utils.LiteRTLMFile(bundle)
    return [(s.beginOffset, s.endOffset, lm.get_model_type(i) or f"section {i}") for i, s in enumerate(lm.sections)]


def resident(bundle: Path, parts: list[tuple[int, int, str]]) -> dict[str, float]:
    """MB resident now, by part: bundle sections, the bundle's weight caches, other files, anonymous."""
    out: collections.Counter = collections.Counter()
    mapping = None
    with open("/proc/self/smaps", encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                mapping = (lo, hi, int(fields[2], 16), fields[5] if len(fields) > 5 else "")
            elif fields[0] == "Rss:" and mapping is not None:
                out[_part(mapping, int(fields[1]), bundle, parts)] += int(fields[1]) / 1024
    with open("/proc/self/status", encoding="utf-8") as f:
        out["peak so far (VmHWM)"] = next(int(x.split()[1]) for x in f if x.startswith("VmHWM")) / 1024
    return dict(out)


def _part(mapping: tuple, rss_kb: int, bundle: Path, parts: list) -> str:
    lo, hi, offset, path = mapping
    if not path or path.startswith("["):  # the heap, anonymous mappings, stacks
        return "anonymous"
    if Path(path) == bundle:
        middle = offset + (hi - lo) // 2
        return next((f"bundle: {name}" for begin, end, name in parts if begin <= middle < end), "bundle: header")
    if Path(path).parent == bundle.parent and Path(path).name.startswith(bundle.name):
        return f"weight cache{'' if 'mtp_drafter' not in path else ' (drafter)'}"
    return "other files (libraries)"


def mapped_per_read(bundle: Path, reads: int = 300) -> float:
    """KB that become resident per read of one byte at a random offset of the mapped bundle (page cache warm)."""
    import mmap
    import random

    def mapped() -> int:
        with open("/proc/self/status", encoding="utf-8") as f:
            return sum(int(x.split()[1]) for x in f if x.startswith(("RssFile", "RssShmem")))

    with open(bundle, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        rng, before = random.Random(0), mapped()
        for _ in range(reads):
            m[rng.randrange(len(m))]
        return (mapped() - before) / reads


def child(bundle: str, prompt_file: str, new_tokens: int, threads: int, spec: bool, out: str) -> int:
    import litert_lm

    parts, path, stages = sections(Path(bundle)), Path(bundle).resolve(), {}
    engine = litert_lm.Engine(bundle, backend=litert_lm.Backend.CPU(thread_count=threads),
                              enable_speculative_decoding=spec)
    stages["open"] = resident(path, parts)
    session = engine.create_session(apply_prompt_template=False, max_output_tokens=new_tokens)
    session.run_prefill([Path(prompt_file).read_text(encoding="utf-8")])
    stages["prefill"] = resident(path, parts)
    for _ in session.run_decode_async():
        pass
    stages["decode"] = resident(path, parts)
    Path(out).write_text(json.dumps(stages))
    session.close()
    engine.close()
    return 0


def measure(bundle: Path, prompt: Path, new: int, threads: int, spec: bool) -> tuple[dict, float]:
    with tempfile.NamedTemporaryFile("r", suffix=".json") as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, __file__, "--child", str(bundle), str(prompt), str(new),
                                 str(threads), str(int(spec)), out.name], stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise SystemExit(err.read().decode(errors="replace")[-2000:])
        return json.loads(Path(out.name).read_text()), usage.ru_maxrss / 1024


def report(runs: dict[str, tuple[dict, float]]) -> None:
    names = list(runs)
    for stage in STAGES:
        keys = sorted({k for stages, _ in runs.values() for k in stages[stage]})
        print(f"\nafter {stage} (MB)\n  {'part':<44}" + "".join(f"{n:>18}" for n in names))
        for k in keys:
            print(f"  {k:<44}" + "".join(f"{runs[n][0][stage].get(k, 0):>18.0f}" for n in names))
    print(f"\n  {'peak RSS (ru_maxrss)':<44}" + "".join(f"{runs[n][1]:>18.0f}" for n in names))


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        bundle, prompt, new, threads, spec, out = sys.argv[2:]
        return child(bundle, prompt, int(new), int(threads), spec == "1", out)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("export", type=Path)
    p.add_argument("--prompt-tokens", type=int, default=900)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = p.parse_args()
    from mtpkit.runtime.manifest import load_manifest

    manifest = load_manifest(a.export)
    bundle = manifest.path(manifest.backend("litert").graphs["bundle"].file).resolve()
    text, count = prompt_for(a.export, a.prompt_tokens, a.new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        prompt = Path(tmp) / "prompt.txt"
        prompt.write_text(text, encoding="utf-8")
        print(f"{bundle}: prompt {count} tokens, {a.new_tokens} new, {a.threads} threads", flush=True)
        measure(bundle, prompt, a.new_tokens, a.threads, True)  # warm-up: page cache, LiteRT-LM's weight cache
        print(f"one read of a random row maps {mapped_per_read(bundle):.0f} KB on this filesystem", flush=True)
        runs = {f"speculation {'on' if spec else 'off'}": measure(bundle, prompt, a.new_tokens, a.threads, spec)
                for spec in (False, True)}
    report(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
