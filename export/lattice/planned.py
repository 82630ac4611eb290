"""A pre-quantized checkpoint's lattice as far as its safetensors headers and config tell it (no weight read): each
packed tensor's float name, shape, bit width and scale groups, for the size plan (`mtpkit export --dry-run`)."""

from __future__ import annotations

import dataclasses


from .types import Lattice, key, quantization_config

# packed tensor suffix -> the float weight's suffix, per format
_PACKED = {"gemma": (".weight", ".embedding_quantized"), "compressed-tensors": (".weight_packed",)}
_DROPPED = (".weight_scale", ".embedding_scale", ".input_activation_scale", ".output_activation_scale",
            ".k_cache_scale", ".v_cache_scale", ".weight_shape", ".input_scale", ".output_scale", ".weight_zero_point")
_INTEGER = ("U8", "I8", "I32")


@dataclasses.dataclass(frozen=True)
class Planned:
    """A weight's lattice without its codes: what the encodings read (bits, scale groups)."""

    bits: int
    width: int
    groups: int

    @property
    def group(self) -> int:
        return self.width // self.groups


def headers(config: dict, tensors: dict[str, dict]) -> tuple[dict[str, dict], Lattice | None]:
    """(the headers as the float checkpoint's would read: packed tensors under their weight's name and shape,
    scales and activation scales left out; the planned Lattice), or (tensors, None) for a checkpoint whose lattice
    is not in its config (float, or Q4_0: that one is planned as its recipe's int4)."""
    qc = quantization_config(config)
    if qc is None:
        return tensors, None
    from .readers import format_of

    fmt = format_of(qc)
    out, weights = {}, {}
    for name, h in tensors.items():
        if name.endswith(_DROPPED):
            continue
        suffix = next((s for s in _PACKED[fmt] if name.endswith(s) and h["dtype"] in _INTEGER), None)
        if suffix is None:
            out[name] = h
            continue
        module = name.removesuffix(suffix)
        bits = _bits(qc, fmt, module)
        rows, cols = h["shape"]
        width = cols * (32 if fmt == "compressed-tensors" else 8) // bits
        scale = tensors.get(module + (".embedding_scale" if suffix == ".embedding_quantized" else ".weight_scale"))
        groups = int(scale["shape"][-1]) if scale and len(scale["shape"]) == 2 else 1
        out[module + ".weight"] = {**h, "dtype": "F32", "shape": [rows, width]}
        weights[key(module)] = Planned(bits, width, groups)
    return out, Lattice(fmt, weights)


def _bits(qc: dict, fmt: str, module: str) -> int:
    if fmt == "gemma":
        from .gemma import bits_of

        return bits_of(qc, module)
    from .compressed import _group_of

    return int(_group_of(qc, module)["weights"]["num_bits"])





def q4_0(tensors: dict[str, dict]) -> Lattice:
    """A Q4_0 checkpoint's lattice as export/lattice/q4_0.py reads it: 4 bits in blocks of 32 for every 2-D linear
    weight whose rows split into them (tables stay float)."""
    from .q4_0 import BLOCK

    weights = {key(n): Planned(4, h["shape"][1], h["shape"][1] // BLOCK) for n, h in tensors.items()
               if len(h["shape"]) == 2 and n.endswith(".weight") and "embed" not in n and h["shape"][1] % BLOCK == 0}
    return Lattice("q4_0", weights)


_ROUNDED = {"gemma": (".input_activation_scale", ".output_activation_scale"),
            "compressed-tensors": (".input_scale", ".output_scale")}


def roundings(folder, config: dict) -> int:
    """How many static int8 roundings the graphs compute: each nonzero activation scale of the checkpoint (read
    from its safetensors: scalars, no weight)."""
    from safetensors import safe_open

    from ..checkpoint import safetensors_files
    from .readers import format_of

    qc = quantization_config(config)
    suffixes = _ROUNDED.get(format_of(qc)) if qc is not None else None
    if not suffixes:
        return 0
    count = 0
    for path in safetensors_files(folder):
        with safe_open(str(path), "np") as f:
            count += sum(bool(f.get_tensor(k).any()) for k in f.keys() if k.endswith(suffixes))
    return count

