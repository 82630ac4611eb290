"""LiteRT target calls with and without fresh output arrays, interleaved in one process. Not run in CI.

    .venv/bin/python tools/litert_call_alloc.py EXPORT [--threads 1] [--past 256] [--rounds 15]

"fresh": the call as ai_edge_litert's SignatureRunner makes it, every output (the whole KV caches included) a
new numpy array that replaces the runtime's caches; "in place": mtpkit's SignatureCall, outputs read from the
interpreter's buffers and the caches copied into the runtime's arrays. Two engines on the export, each with
its own interpreters and caches, at the same position; decode and verify medians in ms, and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def fresh_call(target):
    """StateTarget._call as it was with SignatureRunner: outputs allocated per call, caches replaced by them."""
    def call(signature: str, ids: list[int], pos: int):
        session, kv, feeds = target.session, target.kv, target.feeds(ids, pos)
        sig = session.backend.signatures[signature]
        runner = session._runners[sig.graph].get_signature_runner(sig.backend_name)
        out = runner(**{t.name: feeds[t.key] for t in sig.inputs})
        out = {t.key: out[t.name] for t in sig.outputs}
        kv.tensors.update({k: out.pop(k) for k in list(kv.tensors)})
        kv.version += 1
        return out
    return call


def main(argv: list[str] | None = None) -> int:
    from mtpkit.runtime.engine import Engine

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--past", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    engines = {name: Engine(args.export, threads=args.threads, backend="litert") for name in ("fresh", "in place")}
    targets = {name: engine.target._inner for name, engine in engines.items()}  # the backend's, untimed
    targets["fresh"]._call = fresh_call(targets["fresh"])
    verify = targets["fresh"].verify_len
    runs = {}
    for name, target in targets.items():
        target.forward(list(range(2, args.past + 2)), 0)
        runs[(name, "decode")] = lambda t=target: t.forward([0], args.past)
        runs[(name, "verify")] = lambda t=target: t.forward([0] * verify, args.past)
    samples: dict[tuple, list[float]] = {k: [] for k in runs}
    for r in range(args.rounds + 1):
        for key, call in runs.items():
            t0 = time.perf_counter()
            call()
            if r:  # round 0 warms up
                samples[key].append(1e3 * (time.perf_counter() - t0))
    ms = {k: statistics.median(v) for k, v in samples.items()}
    print(f"{args.export}: threads {args.threads}, position {args.past}, {args.rounds} rounds, verify of {verify}")
    for kind in ("decode", "verify"):
        a, b = ms[("fresh", kind)], ms[("in place", kind)]
        print(f"{kind}: fresh outputs {a:.1f} ms, in place {b:.1f} ms, fresh / in place {a / b:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
