"""Which ONNX Runtime weight kernel verifies several tokens cheaply and stays batch-invariant, at E2B's MLP widths.

Builds one graph per candidate from the same random weights: `--layers` MLP-like pairs (hidden -> ffn -> hidden,
distinct weights, so they stream from memory as a real decoder's do), and times a decode call (1 row) and a
verify call (5 rows), interleaved over `--rounds`, on `--threads` threads. For each it also checks that every
row of the 5-row call equals, bit for bit, the same row run alone: a speculative verify that keeps that property
can never change a greedy token. Not run in CI.

Candidates:
- `int4 MatMulNBits`: the int4 recipe's op (accuracy level 4: int8 activations per block of 32).
- `int8 MatMulNBits`: the int8 recipe's op.
- `int8 per-row`: int8 weights (per-column scale) and int8 activations with one scale per row, multiplied with
  integer accumulation by com.microsoft MatMulIntegerToFloat, so a row's result cannot depend on the other rows.

    .venv/bin/python tools/verify_kernels.py [--layers 8] [--threads 1] [--rounds 15]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

HIDDEN, FFN = 1536, 6144  # E2B


def _per_row_int8(p: str, x: str, w: np.ndarray, nodes: list, inits: list) -> str:
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    ws = np.abs(w).max(0) / 127
    inits += [nh.from_array(np.clip(np.rint(w / ws), -127, 127).astype(np.int8), p + "Wq"),
              nh.from_array(ws.astype(np.float32), p + "Ws")]
    nodes += [h.make_node("Abs", [x], [p + "a"]), h.make_node("ReduceMax", [p + "a", "axis"], [p + "m"], keepdims=1),
              h.make_node("Div", [p + "m", "c127"], [p + "s0"]), h.make_node("Max", [p + "s0", "tiny"], [p + "s"]),
              h.make_node("Div", [x, p + "s"], [p + "xs"]), h.make_node("Round", [p + "xs"], [p + "xr"]),
              # int8 codes shifted to uint8 with zero point 128: the U8S8 kernel, and the same integers
              h.make_node("Add", [p + "xr", "c128"], [p + "xu"]),
              h.make_node("Cast", [p + "xu"], [p + "xq"], to=T.UINT8),
              h.make_node("MatMulIntegerToFloat", [p + "xq", p + "Wq", p + "s", p + "Ws", "zp"], [p + "y"],
                          domain="com.microsoft")]
    return p + "y"


def _nbits(bits: int):
    def add(p: str, x: str, w: np.ndarray, nodes: list, inits: list) -> str:
        from onnx import helper as h
        from onnx import numpy_helper as nh
        from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

        (k, n), blocks = w.shape, w.shape[0] // 32
        packed = np.zeros((n, blocks, 32 * bits // 8), np.uint8)
        scales = np.zeros((n, blocks), np.float32)
        zero_points = np.zeros((n, (blocks * bits + 7) // 8), np.uint8)
        (quantize_matmul_4bits if bits == 4 else quantize_matmul_8bits)(packed, w, scales, zero_points, 32, n, k, True)
        inits += [nh.from_array(packed, p + "B"), nh.from_array(scales, p + "S")]
        nodes.append(h.make_node("MatMulNBits", [x, p + "B", p + "S"], [p + "y"], domain="com.microsoft", K=k, N=n,
                                 bits=bits, block_size=32, accuracy_level=4))
        return p + "y"
    return add


CANDIDATES = {"int4 MatMulNBits": _nbits(4), "int8 MatMulNBits": _nbits(8), "int8 per-row": _per_row_int8}


def session(add, layers: int, threads: int):
    import onnxruntime as ort
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    nodes, inits = [], [nh.from_array(np.array(v, dt), name) for name, v, dt in (
        ("c127", 127, np.float32), ("c128", 128, np.float32), ("tiny", 1e-30, np.float32), ("zp", 128, np.uint8),
        ("axis", [-1], np.int64))]
    rng, x = np.random.default_rng(1), "x"  # the same weights for every candidate
    for layer in range(layers):
        for j, (k, n) in enumerate(((HIDDEN, FFN), (FFN, HIDDEN))):
            x = add(f"l{layer}_{j}_", x, (rng.normal(size=(k, n)) / np.sqrt(k)).astype(np.float32), nodes, inits)
    nodes.append(h.make_node("Identity", [x], ["y"]))
    graph = h.make_graph(nodes, "mlp", [h.make_tensor_value_info("x", T.FLOAT, ["M", HIDDEN])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["M", HIDDEN])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18), h.make_opsetid("com.microsoft", 1)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads, opts.log_severity_level = threads, 1, 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    sessions = {name: session(add, args.layers, args.threads) for name, add in CANDIDATES.items()}
    x = np.random.default_rng(0).normal(size=(5, HIDDEN)).astype(np.float32)
    times: dict = {(name, m): [] for name in sessions for m in (1, 5)}
    for _ in range(args.rounds):  # interleaved, so a busy moment hits every candidate alike
        for name, s in sessions.items():
            for m in (1, 5):
                start = time.perf_counter()
                s.run(None, {"x": x[:m]})
                times[(name, m)].append(time.perf_counter() - start)
    print(f"{args.layers} layers {HIDDEN}->{FFN}->{HIDDEN}, {args.threads} thread(s), median of {args.rounds - 3}")
    print("| weights | decode ms | verify(5) ms | verify(5) / decode | rows bit-equal |\n|---|---:|---:|---:|---|")
    for name, s in sessions.items():
        d, v = (float(np.median(times[(name, m)][3:])) * 1e3 for m in (1, 5))
        alone = np.concatenate([s.run(None, {"x": x[i:i + 1]})[0] for i in range(5)])
        print(f"| {name} | {d:.2f} | {v:.2f} | {v / d:.2f} | {np.array_equal(s.run(None, {'x': x})[0], alone)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
