"""Peak RSS and time from process start to the first token: `mtpkit run` on an export's LiteRT graphs (and ONNX,
if it has them) against LiteRT-LM on its model.litertlm, every run a fresh process, caches warm.

    python tools/start_cost.py EXPORT [--prompt-tokens 900] [--new-tokens 256] [--threads N] [--repeats 1]
                               [--cold-timings] [--only TEXT]

Each configuration runs once to warm up (page cache, XNNPACK weight caches: mtpkit's beside the graphs,
LiteRT-LM's beside the bundle), then --repeats times, interleaved, each in a new process whose peak RSS is the
kernel's (wait4's ru_maxrss, what `/usr/bin/time -v` prints) and whose times are stamped from the moment the
process was started: the engine open, the first token. mtpkit runs exactly `mtpkit run DIR --backend B
--prompt-file P --max-new-tokens N [--no-mtp]` (speculative: its default, auto); LiteRT-LM opens the bundle with
speculative decoding off / on, prefills the same text and streams the decode. The prompt is words repeated up to
--prompt-tokens tokens of the export's tokenizer, shortened to fit the export's KV capacity. Prints one row per
configuration (the median of the repeats) and mtpkit / LiteRT-LM ratios for the same speculation setting.
--cold-timings adds each speculative mtpkit run once more with the auto schedule's recorded call costs
(runtime/timings.py) removed first, as on a first start: the cost of timing calls before the first token.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COLD = "cold"  # a configuration run with runtime/timings.py's records removed first
WORDS = "the quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing matches".split()


def _stamp(mark: str, what: str) -> None:
    """Wall time, and CPU seconds of every thread so far (what a busy machine does not inflate)."""
    with open(mark, "a", encoding="utf-8") as f:
        f.write(f"{what} {time.time()}\n{what}_cpu {time.process_time()}\n")


def _resident(mark: str) -> None:
    """What is resident at the end, by kind (MB): anonymous (heap, packed weights in memory) and file-backed
    (mapped graphs, tables and weight caches), which the peak alone does not tell apart."""
    with open("/proc/self/status", encoding="utf-8") as f:
        status = {line.split(":")[0]: int(line.split()[1]) for line in f
                  if line.startswith(("RssAnon", "RssFile", "RssShmem"))}
    mapped = status.get("RssFile", 0) + status.get("RssShmem", 0)  # an export on tmpfs maps shared memory
    with open(mark, "a", encoding="utf-8") as f:
        f.write(f"anon_mb {status.get('RssAnon', 0) / 1024}\nfile_mb {mapped / 1024}\n")


def child_mtpkit(mark: str, argv: list[str]) -> int:
    """`mtpkit run ARGV` with the engine's open and its first token stamped into MARK."""
    from mtpkit.cli import main
    from mtpkit.runtime import engine

    init, generate = engine.Engine.__init__, engine.Engine.generate

    def opened(self, *a, **k):  # type: ignore[no-untyped-def]
        init(self, *a, **k)
        _stamp(mark, "open")

    def first_token(self, *a, **k):  # type: ignore[no-untyped-def]
        for i, item in enumerate(generate(self, *a, **k)):
            if i == 0:
                _stamp(mark, "first")
            yield item
        _resident(mark)  # while the engine is open

    engine.Engine.__init__, engine.Engine.generate = opened, first_token
    return main(argv)


def child_litert_lm(mark: str, bundle: str, prompt_file: str, new_tokens: int, threads: int, spec: bool) -> int:
    """LiteRT-LM: the bundle opened (speculative decoding off / on), the prompt prefilled, the decode streamed."""
    import litert_lm

    engine = litert_lm.Engine(bundle, backend=litert_lm.Backend.CPU(thread_count=threads),
                              enable_speculative_decoding=spec)
    _stamp(mark, "open")
    session = engine.create_session(apply_prompt_template=False, max_output_tokens=new_tokens)
    session.run_prefill([Path(prompt_file).read_text(encoding="utf-8")])
    for i, _ in enumerate(session.run_decode_async()):
        if i == 0:
            _stamp(mark, "first")
    _resident(mark)
    session.close()
    engine.close()
    return 0


def prompt_for(export: Path, tokens: int, new_tokens: int) -> tuple[str, int]:
    """Words repeated to about `tokens` tokens, fewer if prompt + new tokens (+ a verify's overhang) would not fit
    the export's KV capacity; (text, its token count)."""
    from mtpkit.runtime.manifest import load_manifest
    from mtpkit.runtime.tokenizer import TextCodec

    manifest = load_manifest(export)
    codec = TextCodec(manifest)
    tokens = min(tokens, manifest.kv_cache.capacity - new_tokens - 24)
    words: list[str] = []
    while len(codec.encode(" ".join(words))) < tokens:
        words += WORDS
    while len(codec.encode(" ".join(words))) > tokens:
        words.pop()
    text = " ".join(words)
    return text, len(codec.encode(text))


def measure(argv: list[str]) -> dict:
    """One fresh process: peak RSS (MB), seconds from its start to the engine open and to the first token. A
    configuration whose argv starts with COLD forgets the auto schedule's recorded call costs first."""
    if argv[0] == COLD:
        from mtpkit.runtime.verified import cache_dir

        shutil.rmtree(cache_dir() / "timings", ignore_errors=True)
        argv = argv[1:]
    with tempfile.NamedTemporaryFile("r", suffix=".marks") as mark, tempfile.TemporaryFile() as err:
        start = time.time()  # LiteRT-LM logs much on fd 2: to a file, read once the process is gone
        proc = subprocess.Popen([sys.executable, __file__, "--child", mark.name, *argv],
                                stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        end = time.time()
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(argv[:4])}... failed ({proc.returncode}):\n"
                             f"{err.read().decode(errors='replace')[-2000:]}")
        marks = dict(line.split() for line in Path(mark.name).read_text().splitlines())
    return {"rss_mb": usage.ru_maxrss / 1024, "open_s": float(marks["open"]) - start,
            "first_token_s": float(marks["first"]) - start, "first_token_cpu_s": float(marks["first_cpu"]),
            "total_s": end - start,
            "anon_mb_at_end": float(marks["anon_mb"]), "file_mb_at_end": float(marks["file_mb"])}


def configurations(export: Path, prompt: Path, new: int, threads: int, cold: bool = False) -> dict[str, list[str]]:
    """Each configuration's argv; with cold, each speculative mtpkit run also once with the auto schedule's recorded
    call costs forgotten (it times its calls before the first token, as a first start does)."""
    from mtpkit.runtime.manifest import load_manifest

    manifest = load_manifest(export)
    runs = {}
    for kind in [k for k in ("litert", "onnx") if k in manifest.backends]:
        for spec in (False, True):
            argv = ["mtpkit", "run", str(export), "--backend", kind, "--prompt-file", str(prompt),
                    "--max-new-tokens", str(new), "--threads", str(threads), *([] if spec else ["--no-mtp"])]
            runs[f"mtpkit {kind} {'spec' if spec else 'plain'}"] = argv
            if spec and cold:
                runs[f"mtpkit {kind} spec, costs timed"] = [COLD, *argv]
    if "litert" in manifest.backends:
        bundle = str(manifest.path(manifest.backend("litert").graphs["bundle"].file))
        for spec in (False, True):
            runs[f"litert-lm {'spec' if spec else 'plain'}"] = ["litert-lm", bundle, str(prompt), str(new),
                                                                 str(threads), str(int(spec))]
    return runs


COLUMNS = ("configuration", "peak RSS MB", "anon / file MB at end", "open s", "first token s (CPU s)", "total s",
           "RSS / LiteRT-LM", "first token / LiteRT-LM (CPU)")


def report(results: dict[str, list[dict]]) -> None:
    """One row per configuration, medians of its repeats; ratios against LiteRT-LM with the same speculation."""
    median = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in results.items()}
    rows = [COLUMNS]
    for name, m in median.items():
        setting = "spec" if " spec" in name else "plain"
        peer = median.get(f"litert-lm {setting}") if not name.startswith("litert-lm") else None
        row = [name, f"{m['rss_mb']:.0f}", f"{m['anon_mb_at_end']:.0f} / {m['file_mb_at_end']:.0f}",
               f"{m['open_s']:.2f}", f"{m['first_token_s']:.2f} ({m['first_token_cpu_s']:.2f})", f"{m['total_s']:.2f}"]
        if peer:
            wall, cpu = (m[k] / peer[k] for k in ("first_token_s", "first_token_cpu_s"))
            row += [f"{m['rss_mb'] / peer['rss_mb']:.2f}", f"{wall:.2f} ({cpu:.2f})"]
        rows.append(tuple(row))
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(len(COLUMNS))]
    for r in rows:
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths))))


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        mark, kind, rest = sys.argv[2], sys.argv[3], sys.argv[4:]
        if kind == "mtpkit":
            return child_mtpkit(mark, rest)
        bundle, prompt, new, threads, spec = rest
        return child_litert_lm(mark, bundle, prompt, int(new), int(threads), spec == "1")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("export", type=Path)
    p.add_argument("--prompt-tokens", type=int, default=900)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--json", type=Path, help="also write every run's figures here")
    p.add_argument("--only", default="", help="only the configurations whose name contains this text")
    p.add_argument("--cold-timings", action="store_true",
                   help="also run each speculative mtpkit configuration with its recorded call costs forgotten")
    a = p.parse_args()
    text, count = prompt_for(a.export, a.prompt_tokens, a.new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        prompt = Path(tmp) / "prompt.txt"
        prompt.write_text(text, encoding="utf-8")
        runs = {name: argv for name, argv in configurations(a.export, prompt, a.new_tokens, a.threads,
                                                            a.cold_timings).items() if a.only in name}
        print(f"{a.export}: prompt {count} tokens, {a.new_tokens} new, {a.threads} threads; warming up", flush=True)
        for argv in runs.values():
            measure(argv)
        results: dict[str, list[dict]] = {name: [] for name in runs}
        for _ in range(a.repeats):
            for name, argv in runs.items():
                results[name].append(measure(argv))
    report(results)
    if a.json:
        a.json.write_text(json.dumps({"prompt_tokens": count, "new_tokens": a.new_tokens, "threads": a.threads,
                                      "runs": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
