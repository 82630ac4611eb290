"""Static int8 activations in a grafted LiteRT graph: a QAT checkpoint's linear layer with static input and output
scales runs as QUANTIZE (float -> int8 at the input scale) -> FULLY_CONNECTED (int8 x the checkpoint's per-channel
int8 / int4 / int2 codes, int8 out at the output scale) -> DEQUANTIZE, as the checkpoint computes it.

Left as they are, such layers run LiteRT's dynamic-range kernels: XNNPACK quantizes each row of activations to int8
at a range of its own, a second rounding on top of the checkpoint's, which moves the model (held-out top-1 0.95
against the checkpoint, docs/quant-report-tiny-pair/qat.md). The float rounding the traced model computes around the
layer stays in the graph: its values lie on the int8 grid, so QUANTIZE reads them exactly and the rounding after
DEQUANTIZE changes nothing."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ...lattice.types import key
from .encodings import PER_CHANNEL

def apply(model, placed: list[dict], activations: Mapping[str, tuple[float, float]]) -> int:
    """Rewrite, in the flatbuffer object `model`, every FULLY_CONNECTED whose weight (a graft plan entry in
    `placed`) is stored per channel and whose layer has both static scales in `activations` (module key ->
    (input, output); 0: none); returns how many ops changed. A layer with one scale only, a bias or a fused
    activation keeps the dynamic-range kernel (LiteRT has no int8 -> float FULLY_CONNECTED)."""
    from ai_edge_litert import schema_py_generated as schema

    from .graft import WEIGHT, opcode

    scaled = {p["name"]: activations.get(key(p["name"])) for p in placed if p["enc"].kind in PER_CHANNEL}
    scaled = {WEIGHT + n: s for n, s in scaled.items() if s and s[0] and s[1]}
    if not scaled:
        return 0
    fc = opcode(model, schema.BuiltinOperator.FULLY_CONNECTED)
    # version 2 of QUANTIZE / DEQUANTIZE: int8 (version 1 knows uint8 only)
    quantize, dequantize = (opcode(model, op, version=2) for op in (schema.BuiltinOperator.QUANTIZE,
                                                                    schema.BuiltinOperator.DEQUANTIZE))
    changed = 0
    for sg in model.subgraphs:
        ops = []
        for op in sg.operators:
            scales = scaled.get(sg.tensors[int(op.inputs[1])].name.decode()) if op.opcodeIndex == fc else None
            if scales is None or not _plain(op):
                ops.append(op)
                continue
            ops.extend(_static(sg, op, scales, quantize, dequantize))
            changed += 1
        sg.operators = ops
    return changed


def _plain(op) -> bool:
    """No bias (it would need int32 at the product of the scales) and no fused activation."""
    options = op.builtinOptions
    return (len(op.inputs) < 3 or int(op.inputs[2]) < 0) and (options is None or not options.fusedActivationFunction)


def _static(sg, op, scales: tuple[float, float], quantize: int, dequantize: int) -> list:
    """[QUANTIZE, op (now int8 in and out), DEQUANTIZE], the op's own input and output tensors kept float outside."""
    from ai_edge_litert import schema_py_generated as schema

    src, dst = int(op.inputs[0]), int(op.outputs[0])
    q_in, q_out = (_int8_like(sg, t, s, suffix) for t, s, suffix in ((src, scales[0], ";int8_in"),
                                                                     (dst, scales[1], ";int8_out")))
    op.inputs = np.array([q_in, *[int(i) for i in op.inputs[1:]]], np.int32)
    op.outputs = np.array([q_out], np.int32)
    first, last = schema.OperatorT(), schema.OperatorT()
    first.opcodeIndex, first.inputs, first.outputs = quantize, np.array([src], np.int32), np.array([q_in], np.int32)
    last.opcodeIndex, last.inputs, last.outputs = dequantize, np.array([q_out], np.int32), np.array([dst], np.int32)
    return [first, op, last]


def _int8_like(sg, t: int, scale: float, suffix: str) -> int:
    """A new int8 tensor shaped as tensor t, quantized per tensor at `scale` (zero point 0, as the checkpoint's
    symmetric int8); its index."""
    from ai_edge_litert import schema_py_generated as schema

    like = sg.tensors[t]
    new = schema.TensorT()
    new.name, new.type, new.buffer = like.name + suffix.encode(), schema.TensorType.INT8, 0
    new.shape = None if like.shape is None else np.array(like.shape, np.int32)
    new.shapeSignature = None if like.shapeSignature is None else np.array(like.shapeSignature, np.int32)
    q = schema.QuantizationParametersT()
    q.scale, q.zeroPoint, q.quantizedDimension = np.array([scale], np.float32), np.zeros(1, np.int64), 0
    new.quantization = q
    sg.tensors.append(new)
    return len(sg.tensors) - 1
