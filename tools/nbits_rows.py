"""What one MatMulNBits kernel costs for M rows relative to one row: why verify(k+1) costs what it does at E2B shape.

    .venv/bin/python tools/nbits_rows.py [--shapes 1536x6144,6144x1536,1536x2048] [--block-sizes 32,64,128,256]
                                         [--bits 4,8] [--threads 1,2] [--rows 1,2,3,5,9] [--rounds 7]

A verify of k+1 tokens runs every weight MatMul of the target with M = k+1 activation rows; a decode with M = 1.
At E2B shape those MatMuls are most of a call (docs/scale-bench.md), so the verify/decode ratio of the whole graph
follows this one. Each weight is quantized by the exporter's own code (MatMulNBits, symmetric,
accuracy level 4) into a one-node graph; all settings are timed interleaved, round by round, in one process (the
median of the rounds' medians). Prints one Markdown table: per setting, the M = 1 time and the ratio for each M.
"""

from __future__ import annotations

import argparse


def session(k: int, n: int, bits: int, block_size: int, threads: int, seed: int = 0):
    """An ORT session of y = x @ W, W [k, n] random, quantized by the exporter's whole-graph path (MatMulNBits at
    `bits`, `block_size`, accuracy level 4: the bytes its streamed path writes too)."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from mtpkit.export.backends.onnx.quantization import ort_matmul_nbits

    weight = (np.random.default_rng(seed).standard_normal((k, n)) * 0.02).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "one_matmul",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "M", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weight, "W")])
    model = ort_matmul_nbits(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), bits,
                             block_size, accuracy_level=4)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def measure(shapes, block_sizes, bits, threads, rows, rounds: int = 7, calls: int = 30) -> list[dict]:
    """One dict per (shape, bits, block size, threads): ms at the fewest rows M0 and {M: time(M) / time(M0)}, all
    settings interleaved round by round (export/backends/onnx/bench.py time_interleaved)."""
    import numpy as np

    from mtpkit.export.backends.onnx.bench import time_interleaved

    rng = np.random.default_rng(1)
    settings = [(k, n, b, bs, th) for k, n in shapes for b in bits for bs in block_sizes for th in threads]
    runs = {}
    for s in settings:
        sess = session(*s)
        for m in rows:
            feed = {"x": rng.standard_normal((1, m, s[0])).astype(np.float32)}
            runs[(s, m)] = lambda sess=sess, feed=feed: sess.run(None, feed)
    seconds = time_interleaved(runs, rounds, calls)
    result = []
    for s in settings:
        base = seconds[(s, min(rows))]
        result.append({"k": s[0], "n": s[1], "bits": s[2], "block_size": s[3], "threads": s[4],
                       "ms": base * 1e3, "ratio": {m: seconds[(s, m)] / base for m in rows}})
    return result


def table(result: list[dict]) -> str:
    rows = sorted(result[0]["ratio"])
    lines = ["| weight | bits | block | threads | M=%d ms | " % rows[0] + " | ".join(f"M={m} / M={rows[0]}" for m in rows[1:])
             + " |", "|---|---:|---:|---:|---:|" + "---:|" * (len(rows) - 1)]
    for r in result:
        lines.append(f"| {r['k']}x{r['n']} | {r['bits']} | {r['block_size']} | {r['threads']} | {r['ms']:.3f} | "
                     + " | ".join(f"{r['ratio'][m]:.2f}x" for m in rows[1:]) + " |")
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="1536x6144,6144x1536,1536x2048",
                   help="weights K x N, comma-separated (default: E2B's MLP up, MLP down, q projection)")
    p.add_argument("--block-sizes", default="32,64,128,256", type=_ints, help="default 32,64,128,256")
    p.add_argument("--bits", default="4", type=_ints, help="4 and/or 8 (default 4)")
    p.add_argument("--threads", default="1,2", type=_ints, help="intra-op threads (default 1,2)")
    p.add_argument("--rows", default="1,2,3,5,9", type=_ints, help="activation rows M (default 1,2,3,5,9)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    p.add_argument("--calls", type=int, default=30, help="timed calls per setting and round (default 30)")
    args = p.parse_args(argv)
    try:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",")]
        if any(len(s) != 2 or min(s) < 16 for s in shapes):
            raise ValueError
    except ValueError:
        p.error(f"--shapes wants K x N pairs of at least 16, e.g. 1536x6144,6144x1536; got {args.shapes!r}")
    print(table(measure(shapes, args.block_sizes, args.bits, args.threads, args.rows, args.rounds, args.calls)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
