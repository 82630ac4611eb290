"""Two LiteRT or ONNX exports of the same pair on the demo's 12 held-out prompts, interleaved per prompt: plain and
speculative (auto) ms/token, the median speed-up over plain, tokens per target call, and runs whose speculative
tokens equal plain decoding's. For a before/after of one export option (e.g. `--max-draft 4` against the default)
on a trained pair, timed in one process. Not run in CI.

    .venv/bin/python tools/heldout_vs.py DEMO/int8 OTHER/int8[@BACKEND] [--backend litert] [--threads 1] \\
        [--max-new-tokens 64] [--repeats 3]

EXPORT@BACKEND runs that export on BACKEND (else --backend): e.g. an ONNX int4 export's plain decoding against a
LiteRT int8 export's speculative decoding. The last line divides each speculative ms/token by the fastest plain.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def _run(engine, ids: list[int], cfg) -> tuple[list[int], float, object]:
    from mtpkit.runtime.stats import Stats

    stats, start = Stats(), time.perf_counter()
    out = [t for t, _ in engine.generate(ids, cfg, stats)]
    return out, (time.perf_counter() - start) / len(out), stats


def _fitted(engine, text: str, max_new_tokens: int) -> list[int]:
    """The prompt's ids, their head only where the export's KV capacity cannot hold them and the new tokens."""
    ids = engine.codec.encode(text)
    while len(ids) > 1 and engine.target.positions_needed(len(ids), max_new_tokens) > engine.kv.capacity:
        ids = ids[:-1]
    return ids


def main(argv: list[str] | None = None) -> int:
    from mtpkit.runtime.engine import Engine, GenConfig
    from mtpkit.tiny.demo import heldout_prompts

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("exports", nargs=2, help="two export folders, each optionally EXPORT@BACKEND")
    p.add_argument("--backend", default="litert")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    specs = [e.partition("@") for e in a.exports]  # (folder, "@", backend or "")
    engines = {f"{i}: {folder}{at}{backend}": Engine(Path(folder), a.threads, backend or a.backend)
               for i, (folder, at, backend) in enumerate(specs, 1)}  # the same twice too
    prompts = heldout_prompts()
    for e in engines.values():  # auto calibrates once per engine
        _run(e, _fitted(e, prompts[0][1], 8), GenConfig(max_new_tokens=8))
    rows: dict = {n: {"plain": [], "spec": [], "speedup": [], "same": 0, "tokens": 0, "calls": 0} for n in engines}
    for _, text in prompts:
        per: dict = {(n, m): [] for n in engines for m in ("plain", "spec")}
        for _ in range(a.repeats):
            for n, e in engines.items():
                ids = _fitted(e, text, a.max_new_tokens)
                plain, per_plain, _ = _run(e, ids, GenConfig(max_new_tokens=a.max_new_tokens, mtp=False))
                spec, per_spec, stats = _run(e, ids, GenConfig(max_new_tokens=a.max_new_tokens))
                per[(n, "plain")].append(per_plain)
                per[(n, "spec")].append(per_spec)
                r = rows[n]
                r["same"], r["tokens"], r["calls"] = r["same"] + (spec == plain), r["tokens"] + stats.new_tokens, \
                    r["calls"] + stats.target_calls
        for n, r in rows.items():
            plain_ms, spec_ms = statistics.median(per[(n, "plain")]), statistics.median(per[(n, "spec")])
            r["plain"].append(plain_ms)
            r["spec"].append(spec_ms)
            r["speedup"].append(plain_ms / spec_ms)
    print(f"{len(prompts)} held-out prompts, {a.max_new_tokens} new tokens, median of {a.repeats} interleaved repeats, "
          f"{a.threads} thread(s), {a.backend}")
    print("| export | max_draft | plain ms/token | speculative (auto) ms/token | median speed-up | tokens per target call "
          "| same tokens as plain |\n|---|---:|---:|---:|---:|---:|---:|")
    for n, r in rows.items():
        print(f"| {n} | {engines[n].max_draft} | {1e3 * statistics.median(r['plain']):.2f} | "
              f"{1e3 * statistics.median(r['spec']):.2f} | {statistics.median(r['speedup']):.2f}x | "
              f"{r['tokens'] / r['calls']:.2f} | {r['same']}/{len(prompts) * a.repeats} |")
    first, second = (statistics.median(r["spec"]) for r in rows.values())
    fastest = min(statistics.median(r["plain"]) for r in rows.values())
    print(f"speculative ms/token, first / second: {first / second:.2f}x; against the fastest plain "
          f"({1e3 * fastest:.2f} ms/token): {first / fastest:.2f}x, {second / fastest:.2f}x")
    return 0 if all(r["same"] == len(prompts) * a.repeats for r in rows.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
