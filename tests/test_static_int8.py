"""LiteRT's static int8 layers (export/backends/litert/static_int8.py) on a hand-built graph: which layers become
QUANTIZE -> int8 FULLY_CONNECTED -> DEQUANTIZE, and that LiteRT then computes the checkpoint's rounding exactly
(input rounded at its scale, integer products, output rounded at its scale) for 8-, 4- and 2-bit codes."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")

K, N = 64, 48
S_IN, S_OUT = 0.03, 0.05


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """The layouts graft writes (encodings.py): int8 as is, int4 two per byte and int2 four, lowest bits first."""
    q = codes.reshape(-1).astype(np.int8)
    if bits == 4:
        q = q & 0x0F
        return (q[0::2] | (q[1::2] << 4)).astype(np.uint8)
    if bits == 2:
        q = q.reshape(-1, 4) & 0x03
        return (q[:, 0] | q[:, 1] << 2 | q[:, 2] << 4 | q[:, 3] << 6).astype(np.uint8)
    return q.view(np.uint8)


def _graph(layers: list[dict]):
    """One subgraph: input x [1, K] float; per layer an FC reading x with its weight (per-channel scales), and a
    float output. Returns (model, placed entries as graft's plan has them)."""
    from ai_edge_litert import schema_py_generated as schema

    from mtpkit.export.backends.litert.graft import WEIGHT
    from mtpkit.export.backends.litert.encodings import Encoding

    model, sg = schema.ModelT(), schema.SubGraphT()
    model.version, model.buffers, model.subgraphs = 3, [schema.BufferT()], [sg]
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.FULLY_CONNECTED
    code.version = 1
    model.operatorCodes = [code]
    sg.tensors, sg.operators, placed = [_tensor("x", schema.TensorType.FLOAT32)], [], []
    types = {8: schema.TensorType.INT8, 4: schema.TensorType.INT4, 2: schema.TensorType.INT2}
    for i, layer in enumerate(layers):
        buf = schema.BufferT()
        buf.data = _pack(layer["codes"], layer["bits"])
        model.buffers.append(buf)
        q = schema.QuantizationParametersT()
        q.scale, q.zeroPoint, q.quantizedDimension = layer["scales"], np.zeros(N, np.int64), 0
        name = f"model.layers.{i}.mlp.down_proj.weight"
        sg.tensors.append(_tensor(WEIGHT + name, types[layer["bits"]], [N, K], len(model.buffers) - 1, q))
        sg.tensors.append(_tensor(f"y{i}", schema.TensorType.FLOAT32, [1, N]))
        op = schema.OperatorT()
        op.opcodeIndex, op.inputs = 0, np.array([0, len(sg.tensors) - 2, -1], np.int32)
        op.outputs = np.array([len(sg.tensors) - 1], np.int32)
        op.builtinOptionsType = schema.BuiltinOptions.FullyConnectedOptions
        op.builtinOptions = schema.FullyConnectedOptionsT()
        op.builtinOptions.fusedActivationFunction = layer.get("activation", 0)
        sg.operators.append(op)
        kind = layer.get("kind", {8: "int8", 4: "int4c", 2: "int2"}[layer["bits"]])
        placed.append({"name": name, "enc": Encoding(kind, block=32)})
    sg.inputs = np.array([0], np.int32)
    sg.outputs = np.array([int(op.outputs[0]) for op in sg.operators], np.int32)
    return model, placed


def _tensor(name, dtype, shape=(1, K), buffer=0, quantization=None):
    from ai_edge_litert import schema_py_generated as schema

    t = schema.TensorT()
    t.name, t.type, t.shape, t.buffer, t.quantization = name.encode(), dtype, np.array(shape, np.int32), buffer, \
        quantization
    return t


def _layer(bits: int, seed: int, **extra) -> dict:
    rng = np.random.default_rng(seed)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return {"bits": bits, "codes": rng.integers(lo, hi + 1, (N, K)).astype(np.int8),
            "scales": ((rng.random(N) + 0.5) * 0.02).astype(np.float32), **extra}


def _run(model, x: np.ndarray) -> list[np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter

    from mtpkit.export.backends.litert.graft import _pack as pack_model

    runner = Interpreter(model_content=pack_model(model))
    runner.allocate_tensors()
    runner.set_tensor(runner.get_input_details()[0]["index"], x)
    runner.invoke()
    return [runner.get_tensor(d["index"]) for d in runner.get_output_details()]


def test_only_layers_with_both_scales_per_channel_and_nothing_fused_become_int8():
    from mtpkit.export.backends.litert import static_int8

    layers = [_layer(4, 0), _layer(2, 1), _layer(8, 2, activation=1), _layer(4, 3, kind="int4"), _layer(8, 4)]
    model, placed = _graph(layers)
    scales = {"layers.0.mlp.down_proj": (S_IN, S_OUT), "layers.1.mlp.down_proj": (S_IN, 0.0),  # input scale only
              "layers.2.mlp.down_proj": (S_IN, S_OUT),  # a fused RELU
              "layers.3.mlp.down_proj": (S_IN, S_OUT)}  # blockwise scales; layer 4 has none
    assert static_int8.apply(model, placed, scales) == 1
    ops = [model.operatorCodes[o.opcodeIndex].builtinCode for o in model.subgraphs[0].operators]
    from ai_edge_litert import schema_py_generated as schema

    B = schema.BuiltinOperator
    assert ops == [B.QUANTIZE, B.FULLY_CONNECTED, B.DEQUANTIZE] + [B.FULLY_CONNECTED] * 4
    assert static_int8.apply(*_graph(layers), {}) == 0


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_litert_computes_the_checkpoints_rounding_exactly(bits):
    """Inputs on the input scale's grid (the traced model rounds them before the layer): the output equals
    clamp(round(codes . x * weight scale / output scale)) * output scale to float precision, with XNNPACK."""
    from mtpkit.export.backends.litert import static_int8

    layer = _layer(bits, 7)
    model, placed = _graph([layer])
    assert static_int8.apply(model, placed, {"layers.0.mlp.down_proj": (S_IN, S_OUT)}) == 1
    x = np.clip(np.round(np.random.default_rng(8).standard_normal((1, K)) * 50), -128, 127)
    want = np.clip(np.round(x @ layer["codes"].astype(np.float64).T * S_IN * layer["scales"] / S_OUT), -128, 127)
    got = _run(model, (x * S_IN).astype(np.float32))[0] / S_OUT
    np.testing.assert_allclose(got, want, atol=1e-4)
