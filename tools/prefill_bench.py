"""Prefill speed and time to first token: mtpkit's runtime beside LiteRT-LM on the same export, one run, interleaved.

    python tools/prefill_bench.py EXPORT [--lengths 128,512,1024] [--threads 1,2] [--repeats 3] [--json F]

For each thread count, mtpkit opens the export on each of its backends (LiteRT, ONNX) and LiteRT-LM opens its
model.litertlm (speculative decoding off: a prefill does not draft); then, per repeat and prompt length, each runs
the same prompt (words repeated to that many tokens of the export's tokenizer) to its first token: mtpkit through
`Engine.generate` (--no-mtp, one new token), LiteRT-LM through `run_prefill` and its first decode step. Reports the
median time to first token and the prompt tokens per second it implies, with mtpkit's LiteRT / LiteRT-LM ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from start_cost import prompt_for  # noqa: E402  (the same prompt text as the start-up measurement)


def _mtpkit(export: Path, backend: str, threads: int):
    from mtpkit.runtime.engine import Engine, GenConfig
    from mtpkit.runtime.stats import Stats

    engine, cfg = Engine(export, threads, backend), GenConfig(max_new_tokens=1, mtp=False)

    def first_token(text: str) -> float:
        stats = Stats()
        for _ in engine.generate(engine.codec.encode(text), cfg, stats):
            pass
        return stats.ttft_s
    return first_token


def _litert_lm(export: Path, threads: int):
    import litert_lm

    from mtpkit.runtime.manifest import load_manifest
    from mtpkit.runtime.quiet import output_captured

    manifest = load_manifest(export)
    bundle = str(manifest.path(manifest.backend("litert").graphs["bundle"].file))
    with output_captured("LiteRT-LM engine"):  # its C++ logs on fd 2
        engine = litert_lm.Engine(bundle, backend=litert_lm.Backend.CPU(thread_count=threads),
                                  enable_speculative_decoding=False)

    def first_token(text: str) -> float:
        session = engine.create_session(apply_prompt_template=False, max_output_tokens=8)  # 1 streams nothing
        start = time.perf_counter()
        session.run_prefill([text])
        for _ in session.run_decode_async():  # its first item is the first token
            break
        took = time.perf_counter() - start
        session.close()
        return took
    return first_token


def runners(export: Path, threads: int) -> dict:
    """name -> first_token(text) seconds, for every runtime that reads this export."""
    from mtpkit.runtime.manifest import load_manifest

    kinds = load_manifest(export).backends
    out = {f"mtpkit {kind}": _mtpkit(export, kind, threads) for kind in ("litert", "onnx") if kind in kinds}
    if "litert" in kinds:
        out["litert-lm"] = _litert_lm(export, threads)
    return out


def measure(export: Path, lengths: list[int], threads: list[int], repeats: int) -> list[dict]:
    rows = []
    for t in threads:
        run = runners(export, t)
        prompts = {n: prompt_for(export, n, 8) for n in lengths}
        for fn in run.values():  # warm-up: page cache, weight caches, first-call allocations
            fn(prompts[lengths[0]][0])
        times: dict[tuple[str, int], list[float]] = {}
        for _ in range(repeats):
            for n, (text, _) in prompts.items():
                for name, fn in run.items():
                    times.setdefault((name, n), []).append(fn(text))
        for (name, n), seconds in times.items():
            ttft = statistics.median(seconds)
            rows.append({"runtime": name, "threads": t, "prompt_tokens": prompts[n][1], "ttft_ms": 1e3 * ttft,
                         "tokens_per_s": prompts[n][1] / ttft})
    return rows


def table(rows: list[dict]) -> str:
    peer = {(r["threads"], r["prompt_tokens"]): r for r in rows if r["runtime"] == "litert-lm"}
    lines = ["| runtime | threads | prompt tokens | time to first token ms | prompt tokens/s | vs LiteRT-LM |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["threads"], r["prompt_tokens"], r["runtime"])):
        p = peer.get((r["threads"], r["prompt_tokens"]))
        ratio = f"{r['tokens_per_s'] / p['tokens_per_s']:.2f}x" if p and r is not p else ""
        lines.append(f"| {r['runtime']} | {r['threads']} | {r['prompt_tokens']} | {r['ttft_ms']:.1f} | "
                     f"{r['tokens_per_s']:.1f} | {ratio} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("export", type=Path)
    p.add_argument("--lengths", default="128,512,1024", help="prompt lengths in tokens")
    p.add_argument("--threads", default="1,2", help="thread counts")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, help="also write the rows here")
    a = p.parse_args()
    rows = measure(a.export, [int(n) for n in a.lengths.split(",")], [int(t) for t in a.threads.split(",")],
                   a.repeats)
    print(table(rows))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
