"""ONNX lowering of fused_ops.py, and the graph rewrites that finish the fusion after export.

Each custom op becomes one ONNX Runtime CPU kernel; all run on ORT 1.17.3 and later, except that ORT < 1.20
rejects the mask MultiHeadAttention gets with more than one K/V head (measured on 1.17.3 - 1.32):
- mtpkit::rms_norm  -> SimplifiedLayerNormalization (an ORT contrib op registered in the ONNX domain)
- mtpkit::rotary    -> com.microsoft RotaryEmbedding, with this call's cos/sin rows as its cache
- mtpkit::attention -> com.microsoft MultiHeadAttention over the K/V heads, each group's query heads as extra
                       query rows (K/V are read in place, not repeated per query head), the additive mask as
                       attention_bias
Then fuse_graph() turns residual Add + norm pairs into com.microsoft SkipSimplifiedLayerNormalization.

MultiHeadAttention rather than GroupQueryAttention: GQA's local_window_size means W-1 keys plus the query in
ORT 1.20 but W keys in 1.32 (measured), so no one graph is right on both, and GQA derives positions from cache
lengths where MHA takes the masks built from positions as they are. The opset-23 RMSNormalization, Attention
and RotaryEmbedding are not used: ORT 1.20 runs opsets up to 21.
"""

from __future__ import annotations

import onnx_ir as ir
import onnxscript
from onnx.defs import OpSchema
from onnxscript import opset20 as op
from onnxscript.rewriter import pattern

_TYPES = ["tensor(float)", "tensor(float16)", "tensor(int64)", "tensor(int32)"]
_A = OpSchema.AttrType


def _param(name: str, type_str: str) -> OpSchema.FormalParameter:
    option = OpSchema.FormalParameterOption.Optional if name.endswith("?") else OpSchema.FormalParameterOption.Single
    return OpSchema.FormalParameter(name.rstrip("?"), type_str, "", param_option=option)


def _ort_op(domain: str, name: str, inputs: list[str], outputs: list[str], attributes: dict) -> onnxscript.values.Op:
    """An ORT contrib op for onnxscript: torch.onnx's graph builder needs a schema, and onnx ships none for these
    (a local schema, not registered, so onnx's global registry is left alone). A trailing ? marks optional."""
    schema = OpSchema(
        name, domain, 1,
        inputs=[_param(n, f"I{i}") for i, n in enumerate(inputs)],
        outputs=[_param(n, f"O{i}") for i, n in enumerate(outputs)],
        type_constraints=[(f"I{i}", _TYPES, "") for i in range(len(inputs))]
        + [(f"O{i}", _TYPES, "") for i in range(len(outputs))],
        attributes=[OpSchema.Attribute(a, kind, "") for a, kind in attributes.items()])
    opset = op if domain == "" else onnxscript.values.Opset(domain, 1)
    return onnxscript.values.Op(opset, name, schema)


_SIMPLIFIED_LAYER_NORM = _ort_op("", "SimplifiedLayerNormalization", ["X", "scale"], ["Y"],
                                 {"axis": _A.INT, "epsilon": _A.FLOAT, "stash_type": _A.INT})
_ROTARY = _ort_op("com.microsoft", "RotaryEmbedding", ["input", "position_ids", "cos_cache", "sin_cache"],
                  ["output"], {"interleaved": _A.INT})
_MHA = _ort_op("com.microsoft", "MultiHeadAttention",
               ["query", "key", "value", "bias?", "key_padding_mask?", "attention_bias?"], ["output"],
               {"num_heads": _A.INT, "scale": _A.FLOAT})


def rms_norm(x, weight, eps: float):
    """x * (mean(x^2) + eps)^-0.5 * weight over the last axis, accumulated in fp32 (stash_type 1)."""
    return _SIMPLIFIED_LAYER_NORM(x, weight, axis=-1, epsilon=eps, stash_type=1)


def rotary(x, cos, sin, rows):
    """x [B,N,S,H]; cos/sin [1,R,H]: their first halves [R,H/2] are the cache, rows [B,S] its position_ids (or
    None: offset 0, rows 0..S-1)."""
    dim = x.shape[-1]
    cos_cache, sin_cache = (op.Slice(op.Reshape(t, [-1, dim]), [0], [dim // 2], [1]) for t in (cos, sin))
    positions = op.Constant(value_ints=[0]) if rows is None else rows
    return _ROTARY(x, positions, cos_cache, sin_cache, interleaved=0)


def attention(query, key, value, mask, scale: float, groups: int):
    """query [1,T*g,N_kv*H], key/value [1,N_kv,L,H], mask [1,1,T,L] or None -> [1,T*g,N_kv*H]: MultiHeadAttention
    with N_kv heads over the T*g query rows, so grouped K/V are read in place; the mask rows repeat g times."""
    bias = mask
    if mask is not None and groups > 1:  # [1,1,T,L] -> [1,T,g,L] -> [1,1,T*g,L]; 0 keeps L, which is dynamic
        bias = op.Reshape(op.Expand(op.Reshape(mask, [1, -1, 1, 0]), [1, 1, groups, 1]), [1, 1, -1, 0])
    return _MHA(query, key, value, None, None, bias, num_heads=key.shape[1], scale=scale)


def translation_table() -> dict:
    """torch.onnx.export's custom_translation_table for fused_ops.py."""
    import torch

    from . import fused_ops  # noqa: F401  (registers the mtpkit:: ops)

    return {torch.ops.mtpkit.rms_norm.default: rms_norm, torch.ops.mtpkit.rotary.default: rotary,
            torch.ops.mtpkit.attention.default: attention}


def fuse_graph(model) -> None:
    """Rewrites after export, in place on the onnx_ir model; each keeps the values (up to float rounding):

    - the rotary cache cos/sin(cat(f, f))[:, :H/2] is computed as cos/sin(f);
    - a Mul by a one-element constant 1 (Gemma 4's layer_scalar where a checkpoint leaves it at 1) is dropped, so
      the residual Add before the next layer's input norm can fuse;
    - each residual Add + SimplifiedLayerNormalization becomes SkipSimplifiedLayerNormalization, which also
      returns the sum for the next residual (onnxscript's rule; it checks the 3-D shapes ORT needs).

    A layer_scalar s != 1 keeps its Mul between the Add and the norm: rms_norm(s * x, eps) == rms_norm(x,
    eps / s^2) would fuse too, but rounds differently from transformers (it flipped a test model's logit near-tie).
    """
    from onnx_ir.passes.common import CommonSubexpressionEliminationPass, IdentityEliminationPass
    from onnxscript.rewriter import RewriteRuleSet, rewrite
    from onnxscript.rewriter.ort_fusions.skip_normalization import fuse_skip_rms_normalization

    rewrite(model, RewriteRuleSet([_MulByOne.rule(), _HalfRotaryTable.rule("Cos"), _HalfRotaryTable.rule("Sin")]))
    IdentityEliminationPass()(model)
    CommonSubexpressionEliminationPass()(model)
    fuse_skip_rms_normalization(model)


def _rank(value) -> int | None:
    return len(value.shape) if value.shape is not None else None


def _const(value):
    """The numpy value of a constant (initializer or folded Constant), else None."""
    tensor = value.const_value if value is not None else None
    return tensor.numpy() if tensor is not None else None


class _MulByOne(pattern.RewriteRuleClassBase):
    """x * c -> x for a one-element constant c == 1 that does not broadcast x to a higher rank."""

    def pattern(self, op, x, one):
        return op.Mul(x, one)

    def check(self, context, x, one, **_):
        value = _const(one)
        ok = (value is not None and value.size == 1 and value.item() == 1.0 and _rank(x) is not None
              and value.ndim <= _rank(x) and x.dtype == one.dtype)
        return pattern.MatchResult() if ok else pattern.MatchResult().fail("not a multiplication by one")

    def rewrite(self, op, x, one, **_):
        return op.Identity(x)


class _HalfRotaryTable(pattern.RewriteRuleClassBase):
    """Slice(Reshape(Cos(Concat(f, f)), [-1, 2h]), 0, h, axis 1) -> Cos(Reshape(f, [-1, h])) (and for Sin): the
    rotary cache taken from transformers' cat(freqs, freqs) tables without building them. The Concat is checked
    rather than matched: Cos and Sin share it, and a matched node may have no reader outside its match."""

    def __init__(self, trig: str):
        super().__init__(f"HalfRotaryTable{trig}")
        self._trig = trig

    def pattern(self, op, table_in, shape, starts, ends, axes):
        return op.Slice(op.Reshape(getattr(op, self._trig)(table_in), shape), starts, ends, axes)

    def check(self, context, table_in, shape, starts, ends, axes, **_):
        freqs = _doubled(table_in)
        half = freqs.shape[-1] if freqs is not None and freqs.shape is not None else None
        values = [_const(v) for v in (shape, starts, ends, axes)]
        ok = isinstance(half, int) and all(v is not None for v in values) and [v.tolist() for v in values] in (
            [[-1, 2 * half], [0], [half], [1]], [[-1, 2 * half], [0], [half], [-1]])
        return pattern.MatchResult() if ok else pattern.MatchResult().fail("not a half rotary table")

    def rewrite(self, op, table_in, **_):
        freqs = _doubled(table_in)
        # one shape for the Cos and Sin rewrites, so CSE merges their Reshapes; the second reuses the first's:
        # onnxscript 0.7.2's rewriter swaps in a new initializer of the same name, orphaning the first Reshape
        name = f"{freqs.name}/half_rows"
        shape = table_in.producer().graph.initializers.get(name)
        if shape is None:
            shape = op.initializer(ir.tensor([-1, freqs.shape[-1]], dtype=ir.DataType.INT64), name=name)
        flat = op.Reshape(freqs, shape)
        return getattr(op, self._trig)(flat)


def _doubled(value):
    """f when value = Concat(f, f) along the last axis, else None."""
    node = value.producer()
    if node is None or node.op_type != "Concat" or node.domain != "" or len(node.inputs) != 2:
        return None
    axis, f = node.attributes.get_int("axis", 0), node.inputs[0]
    if node.inputs[1] is not f or f.shape is None or axis not in (-1, len(f.shape) - 1):
        return None
    return f
