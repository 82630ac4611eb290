"""What each ONNX weight is stored as under a recipe, and its bytes: one decision per weight, taken by the quantizer
(quantization.py, stream.py) and by the size plan (export/sizes.py) through the same function, so a new recipe is
planned as it is exported. Torch- and onnx-free: `mtpkit export --dry-run` imports it.

A weight's uses are how the graph reads it: MATMUL (a MatMul's constant B), LOOKUP (a Gather's table), both (the tied
embedding / lm_head table, stored once in embeddings.bin). Shapes are the checkpoint's: [out, in] for a MatMul
weight (the graph stores it transposed, [in, out]), [rows, width] for a table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...recipes import CHANNELWISE_ONNX_BLOCK, Recipe

MATMUL, LOOKUP = "matmul", "lookup"
SCALE_BYTES = 4  # MatMulNBits' scales are float32, as the float graph's weights (and the tied table's, read by both)
LOOKUP_SCALE_BYTES = 2  # a table read by Gathers only keeps float16 scales (GatherBlockQuantized's output, cast)
DYNAMIC_ROW_BYTES = 5  # quantize_dynamic's per-channel int8: a float32 scale and an int8 zero point per column


@dataclass(frozen=True)
class Encoding:
    kind: str  # float32 | float16 | nbits (MatMulNBits / GatherBlockQuantized blocks) | int8-channel (dynamic)
    bits: int = 0  # nbits only
    block: int = 0
    scale_bytes: int = SCALE_BYTES  # nbits only: float32, or float16 for a table read by lookups alone

    def nbytes(self, shape) -> int:
        """Bytes stored for a weight of checkpoint shape `shape` (scales included)."""
        rows, width = shape[0] if shape else 1, math.prod(shape[1:])
        if self.kind == "nbits":
            blocks, blob = nbits_layout(width, self.bits, self.block)
            return rows * blocks * (blob + self.scale_bytes)
        if self.kind == "int8-channel":
            return rows * (width + DYNAMIC_ROW_BYTES)
        return {"float32": 4, "float16": 2}[self.kind] * rows * width

    @property
    def label(self) -> str:
        return f"int{self.bits}/b{self.block}" if self.kind == "nbits" else self.kind


def lattice_encoding(weight, uses: set, channel_block: int) -> Encoding:
    """--quant checkpoint: the checkpoint's codes at the narrowest width ONNX Runtime's ops take that holds them
    (export/lattice/pack.py), float32 scales so they stay exact; a weight the checkpoint keeps float stays float."""
    from ...lattice import pack

    if weight is None or not set(uses) <= {MATMUL, LOOKUP} or not uses:
        return Encoding("float32")
    widths = pack.ONNX_TABLE_BITS if LOOKUP in uses else pack.ONNX_BITS
    return Encoding("nbits", pack.widen(weight.bits, widths), pack.onnx_block(weight, channel_block))


def nbits_layout(width: int, bits: int, block: int) -> tuple[int, int]:
    """(blocks, bytes per block) of a row of `width` weights: the row zero-padded to whole blocks, as MatMulNBits
    and GatherBlockQuantized store it."""
    return -(-width // block), block * bits // 8


def matmul_bits(bits: int, plan, name: str) -> int:
    """A MatMul weight's bits: the int4 plan's choice (export/int4.py) where there is a plan, else the recipe's."""
    return plan.bits(name) if plan is not None else bits


def encoding_for(recipe: Recipe, graph: str, block_size: int, ple_bits: int, plan=None):
    """choose(name, shape, uses) -> Encoding of each weight of `graph` ("target" | "drafter") under `recipe`:
    streamed recipes pack MatMul weights as MatMulNBits at matmul_bits; the tied table (lookup and MatMul) at the
    recipe's table_bits (the plan's choice under int4); under the int recipes the target's other tables (the
    per-layer-embedding table) at ple_bits;
    int8-dynamic quantizes MatMul weights per channel; fp16 stores every 2-D weight in float16; the rest float32.
    The drafter's lookup table (a centroid head's) takes draft_table_bits (its plan may keep it at 8). Tables read
    by lookups alone keep float16 scales. A
    channelwise recipe (mobile) takes ONNX Runtime's largest block, its nearest to one scale per channel."""
    block_size = CHANNELWISE_ONNX_BLOCK if recipe.channelwise else block_size

    def choose(name: str, shape: tuple, uses: set) -> Encoding:
        if len(shape) != 2 or not recipe.quantized:
            return Encoding("float32")
        if plan is not None and plan.lattice is not None:
            return lattice_encoding(plan.lattice.weight(name), uses, block_size)
        if recipe.onnx == "fp16":  # ONNX Runtime's converter: every float table and weight (norms keep fp32)
            return Encoding("float16")
        if not uses or not set(uses) <= {MATMUL, LOOKUP}:
            return Encoding("float32")
        if set(uses) == {MATMUL, LOOKUP}:
            if not recipe.table_bits:
                return Encoding("float32")
            return Encoding("nbits", plan.bits(name) if plan is not None else recipe.table_bits, block_size)
        if LOOKUP in uses and graph == "drafter":  # the centroid head's table, read by a Gather only
            if not recipe.draft_table_bits:
                return Encoding("float32")
            return Encoding("nbits", 8 if plan is not None and plan.bits(name) == 8 else recipe.draft_table_bits,
                            block_size, LOOKUP_SCALE_BYTES)
        if LOOKUP in uses:
            return Encoding("nbits", ple_bits, block_size, LOOKUP_SCALE_BYTES) if recipe.bits is not None \
                else Encoding("float32")
        if recipe.onnx == "dynamic":
            return Encoding("int8-channel")
        if recipe.onnx == "streamed":
            return Encoding("nbits", matmul_bits(recipe.bits, plan, name), block_size)
        return Encoding("float32")

    return choose
