"""transformers' `quant_method: gemma` layout (transformers 5.24 `integrations/gemma_quant.py`), read without
transformers' quantizer:

- a QuantizedLinear `<m>.weight`: int8 as int8, int4 two per uint8 (low nibble first), int2 four per uint8 (bits
  1:0 first), each code stored as code + 2^(bits-1); `<m>.weight_scale` float32 [out, 1];
  `<m>.input_activation_scale` / `<m>.output_activation_scale` static int8 activation scales (0: none);
- a QuantizedEmbedding `<m>.embedding_quantized` packed the same way, `<m>.embedding_scale` [rows, blocks];
- `<m>.k_cache_scale` / `<m>.v_cache_scale`: a quantized KV cache's scales.
Bit widths come from `module_quant_configs` (module-name regex -> {"num_bits"}, the first match wins) over
`num_bits`, matched on the checkpoint's own module names, as transformers matches them.
"""

from __future__ import annotations

import re

import numpy as np
import torch

from mtpkit.errors import CheckpointError

from .types import Lattice, Weight, key, supported_bits

FORMAT = "gemma"
_SRQ = (".input_activation_scale", ".output_activation_scale")
_KV = (".k_cache_scale", ".v_cache_scale")


def check(qc: dict) -> None:
    supported_bits("quantization_config num_bits", qc.get("num_bits", 4), "gemma")
    for pattern, opts in (qc.get("module_quant_configs") or {}).items():
        try:
            re.compile(pattern)
        except re.error as e:
            raise CheckpointError(f"quantization_config module_quant_configs pattern {pattern!r} is not a regex "
                                  f"({e})") from e
        supported_bits(f"module_quant_configs[{pattern!r}] num_bits", (opts or {}).get("num_bits", qc.get(
            "num_bits", 4)), "gemma")


def bits_of(qc: dict, module: str) -> int:
    """A module's width as transformers' replace_with_quant_layers gives it."""
    for pattern, opts in (qc.get("module_quant_configs") or {}).items():
        if re.search(pattern, module):
            return int((opts or {}).get("num_bits", qc.get("num_bits", 4)))
    return int(qc.get("num_bits", 4))


def check_packed(name: str, packed: torch.Tensor, bits: int, width: int) -> np.ndarray:
    """A packed tensor's rows as stored (export/lattice/unpack.gemma), its dtype and row width checked against the
    config's width."""
    per = 8 // bits
    want_dtype, want_cols = (torch.int8, width) if bits == 8 else (torch.uint8, -(-width // per))
    if packed.dtype != want_dtype or packed.dim() != 2 or packed.shape[1] != want_cols:
        raise CheckpointError(f"{name} is {str(packed.dtype).removeprefix('torch.')} {tuple(packed.shape)}; "
                              f"int{bits} codes of the config's {width}-wide rows are stored as "
                              f"{str(want_dtype).removeprefix('torch.')} (rows, {want_cols}); the checkpoint is "
                              "damaged or its quantization_config names other widths")
    return packed.numpy()


def _scales(name: str, scale: torch.Tensor | None, rows: int, width: int, per_row_blocks: bool) -> np.ndarray:
    if scale is None:
        raise CheckpointError(f"{name} is missing; a quantized tensor needs its scales")
    s = scale.float().numpy().reshape(rows, -1) if scale.numel() % max(rows, 1) == 0 and scale.dim() <= 2 else None
    groups = None if s is None else s.shape[1]
    if s is None or scale.shape[0] != rows or (not per_row_blocks and groups != 1) or width % groups:
        what = "one per output channel (rows, 1)" if not per_row_blocks else "(rows, blocks) with blocks dividing the row"
        raise CheckpointError(f"{name} has shape {tuple(scale.shape)}; the config's ({rows}, {width}) weight needs "
                              f"{what}")
    return np.ascontiguousarray(s, np.float32)


# a quantized tensor's data and scale suffixes: (data, scale, several scales per row allowed)
_LINEAR = (".weight", ".weight_scale", False)
_TABLE = (".embedding_quantized", ".embedding_scale", True)


def read(qc: dict, state: dict, expected: dict, prefix: str) -> tuple[dict, Lattice]:
    out, weights, activations, kv = {}, {}, {}, {}
    for name in list(state):
        kind = next((k for k in (_LINEAR, _TABLE) if name.endswith(k[1])), None)
        if kind is not None:
            module = name.removesuffix(kind[1])
            weights[key(module)] = out[module + ".weight"] = _packed(qc, state, module, expected, prefix, kind)
        elif name.endswith(_SRQ):
            _set_pair(activations, name, float(state[name].float().reshape(-1)[0]), name.endswith(_SRQ[0]))
        elif name.endswith(_KV):
            _set_pair(kv, name, float(state[name].float().reshape(-1)[0]), name.endswith(_KV[0]))
    for name, tensor in state.items():
        if name.endswith((".weight_scale", ".embedding_scale", ".embedding_quantized", *_SRQ, *_KV)):
            continue
        if name.endswith(".weight") and name in out:
            continue
        out.setdefault(name, tensor)
    return out, Lattice(FORMAT, weights, activations, kv)


def _set_pair(pairs: dict, name: str, value: float, first: bool) -> None:
    """One of a module's two scalars ((input, output) activation scales, (k, v) cache scales)."""
    module = key(name.rsplit(".", 1)[0])
    pair = pairs.get(module, (0.0, 0.0))
    pairs[module] = (value, pair[1]) if first else (pair[0], value)


def _shape(expected: dict, module: str, name: str) -> tuple[int, int]:
    shape = expected.get(module + ".weight")
    if shape is None or len(shape) != 2:
        raise CheckpointError(f"{name} is a quantized tensor of no 2-D weight of this model (no {module}.weight "
                              "in the config's model)")
    return int(shape[0]), int(shape[1])


def _packed(qc: dict, state: dict, module: str, expected: dict, prefix: str, kind: tuple) -> Weight:
    """A QuantizedLinear's weight or a QuantizedEmbedding's table (`kind`: _LINEAR or _TABLE), checked against the
    config's shape by name."""
    data, scale, blocks = kind
    name = module + data
    if name not in state:
        raise CheckpointError(f"{module}{scale} has no {name} beside it; the checkpoint is damaged")
    rows, width = _shape(expected, module, name)
    bits = bits_of(qc, _original(module, prefix))
    stored = check_packed(_original(name, prefix), state[name], bits, width)
    if stored.shape[0] != rows:
        raise CheckpointError(f"{_original(name, prefix)} has {stored.shape[0]} rows; the config's "
                              f"{'table' if blocks else 'weight'} has {rows}")
    scales = _scales(_original(module + scale, prefix), state[module + scale], rows, width, blocks)
    return Weight(stored, scales, bits, "gemma", width)


def _original(name: str, prefix: str) -> str:
    """The checkpoint's own name of a key renamed to "model." (what module_quant_configs' patterns match)."""
    return prefix + name.removeprefix("model.") if prefix else name
