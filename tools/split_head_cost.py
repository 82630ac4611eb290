"""What a split lm_head (export/backends/litert/head.py) costs per call on LiteRT: one integer-weight
FULLY_CONNECTED at E2B's tied-table shape (262144 x 1536, 2-bit per-channel codes, as the mobile QAT layout has it)
on one row per token against two, interleaved in one run, with XNNPACK on 1 thread. The split's own float ops
(min, max and rounding over 1536 values per token) are not in the graph timed here. Not in CI.

    .venv/bin/python tools/split_head_cost.py [--rows 1,4] [--rounds 15] [--bits 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def runner(bits: int, vocab: int, hidden: int, rows: int):
    sys.path.insert(0, str(ROOT / "tests"))
    import test_static_int8 as hand  # the hand-built one-layer graph of the static int8 tests

    from ai_edge_litert.interpreter import Interpreter

    from mtpkit.export.backends.litert.graft import _pack as pack_model

    hand.K, hand.N = hidden, vocab
    model, _ = hand._graph([hand._layer(bits, 0)])
    for t in model.subgraphs[0].tensors:
        if t.name in (b"x", b"y0"):
            t.shape = np.array([rows, hidden if t.name == b"x" else vocab], np.int32)
    interp = Interpreter(model_content=pack_model(model), num_threads=1)
    interp.allocate_tensors()
    x = np.random.default_rng(1).standard_normal((rows, hidden)).astype(np.float32)
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    return interp


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,4", help="tokens per call: decode 1, verify of k drafts k + 1")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--bits", type=int, default=2)
    p.add_argument("--vocab", type=int, default=262144)
    p.add_argument("--hidden", type=int, default=1536)
    args = p.parse_args(argv)
    tokens = [int(r) for r in args.rows.split(",")]
    cases = {(t, split): runner(args.bits, args.vocab, args.hidden, t * (2 if split else 1))
             for t in tokens for split in (False, True)}
    times: dict = {c: [] for c in cases}
    for _ in range(args.rounds):
        for c, interp in cases.items():  # interleaved: load drifts hit every case alike
            start = time.perf_counter()
            interp.invoke()
            times[c].append((time.perf_counter() - start) * 1e3)
    result = {}
    for t in tokens:
        one, two = float(np.median(times[(t, False)])), float(np.median(times[(t, True)]))
        result[f"{t} token(s)"] = {"one row per token ms": round(one, 3), "split ms": round(two, 3),
                                   "split / one": round(two / one, 3)}
    print(json.dumps({"bits": args.bits, "shape": [args.vocab, args.hidden], "rounds": args.rounds, **result}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
