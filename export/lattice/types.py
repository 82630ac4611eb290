"""What a pre-quantized checkpoint fixes, as data: a weight's codes and scales (Weight), a checkpoint's lattice
(Lattice) and the key that names a weight the same way in checkpoints, modules and graphs. Every reader imports
these from here, so the package's entry (export/lattice/__init__.py) can import the readers."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from mtpkit.errors import CheckpointError

from .unpack import LAYOUTS

if TYPE_CHECKING:
    import torch

BITS = (2, 4, 8)  # the widths every backend writes exactly (export/lattice: supported())


@dataclasses.dataclass(frozen=True)
class Weight:
    """One quantized weight as the checkpoint holds it: codes [out, in] in -2^(bits-1)..2^(bits-1)-1 and float32
    scales [out, groups] (one group per row: per channel), value = code * scale of the code's group. The codes stay
    in the checkpoint's own packing (`layout`, export/lattice/unpack.py) and are unpacked by rows (`rows`), so a
    full-size table costs its packed bytes only."""

    stored: np.ndarray  # [out, *]: int8 codes ("codes") or the checkpoint's packed rows
    scales: np.ndarray  # float32 [out, groups]
    bits: int
    layout: str = "codes"  # unpack.LAYOUTS: "codes", "gemma" (uint8), "compressed" (int32 words)
    width: int = 0  # input channels; 0: the stored row's (layout "codes")

    def __post_init__(self):
        if self.layout not in LAYOUTS or len(self.stored) != len(self.scales) or self.shape[1] % self.groups:
            raise ValueError(f"a {self.layout} weight {self.stored.shape} with scales {self.scales.shape}")
        if self.layout == "codes" and self.bits < 8:  # packed fields decode into range by construction
            check_codes("codes", self.stored, self.bits)

    @property
    def shape(self) -> tuple[int, int]:
        """(out, in) of the float weight."""
        return len(self.stored), self.width or self.stored.shape[1]

    @property
    def group(self) -> int:
        """Input channels per scale (the row's width: per channel)."""
        return self.shape[1] // self.groups

    @property
    def groups(self) -> int:
        """Scales per row (1: per channel)."""
        return self.scales.shape[1]

    @property
    def codes(self) -> np.ndarray:
        """int8 codes [out, in], every row unpacked on each call (small weights and tests; the export reads rows)."""
        return self.rows(0, self.shape[0])

    def rows(self, start: int, stop: int) -> np.ndarray:
        """int8 codes [stop - start, in] of rows start..stop, only those unpacked."""
        return LAYOUTS[self.layout](self.stored[start:stop], self.bits, self.shape[1])

    def dequantized(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """float32 [rows, in] of rows start..stop (default all), as transformers computes it (int x float32 scale)."""
        stop = self.shape[0] if stop is None else stop
        n, k = stop - start, self.shape[1]
        codes = self.rows(start, stop).reshape(n, -1, self.group)
        return (codes.astype(np.float32) * self.scales[start:stop, :, None]).reshape(n, k)

    def tensor(self, dtype) -> torch.Tensor:
        """The dequantized weight as a torch tensor of `dtype`, filled a few rows at a time: never a float32 copy
        of a whole table."""
        import torch

        n, k = self.shape
        out = torch.empty((n, k), dtype=dtype)
        step = max(1, _CHUNK // max(k, 1))
        for start in range(0, n, step):
            out[start:start + step] = torch.from_numpy(self.dequantized(start, min(start + step, n)))
        return out

    def label(self) -> str:
        """How the manifest records the weight: "int2/checkpoint/channel", "int4/checkpoint/g32"."""
        how = "channel" if self.scales.shape[1] == 1 else f"g{self.group}"
        return f"int{self.bits}/checkpoint/{how}"


_CHUNK = 1 << 22  # values dequantized at a time by Weight.tensor: 16 MB of float32


@dataclasses.dataclass(frozen=True)
class Lattice:
    """What a pre-quantized checkpoint fixes, keyed by `key()` of the weight's name ("layers.3.mlp.up_proj",
    "per_layer_model_projection", "embed_tokens_per_layer"). activations: module key -> (input, output) static int8
    scales (0: none); kv_scales: layer key -> (k, v) scales; off_lattice: weights (Q4_0) some of whose blocks do not
    lie on the lattice -> (blocks off, blocks in all): they are not in `weights` and take the recipe's encoder."""

    format: str
    weights: Mapping[str, Weight] = dataclasses.field(default_factory=dict)
    activations: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    kv_scales: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    off_lattice: Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict)

    def weight(self, name: str) -> Weight | None:
        """The checkpoint's lattice of a graph or module weight name, or None (a float weight)."""
        return self.weights.get(key(name))

    def summary(self) -> str:
        widths: dict[int, int] = {}
        for w in self.weights.values():
            widths[w.bits] = widths.get(w.bits, 0) + 1
        parts = [f"{n} at {b} bits" for b, n in sorted(widths.items())]
        srq = sum(1 for a in self.activations.values() if any(a))
        if srq:
            parts.append(f"{srq} with static activation scales")
        if self.off_lattice:
            off = sum(o for o, _ in self.off_lattice.values())
            parts.append(f"{len(self.off_lattice)} weights with {off} blocks off the lattice (re-encoded)")
        return f"{self.format} lattice: " + ", ".join(parts or ["no quantized weights"])


_PREFIX = re.compile(r"^(?:w:|drafter\.|model\.|language_model\.)+")
_SUFFIX = re.compile(r"(?:\.weight|\.T|\.embedding_quantized|\.weight_packed)+$")


def key(name: str) -> str:
    """A weight's key, the same for checkpoint keys ("model.language_model.layers.3.mlp.up_proj.weight"), module
    names ("model.layers.3.mlp.up_proj"), ONNX initializers ("model.model.layers.3.mlp.up_proj.weight.T") and
    LiteRT tensors ("w:model.model.language_model.layers.3.mlp.up_proj.weight", "w:drafter.model.layers.0...")."""
    return _SUFFIX.sub("", _PREFIX.sub("", name))


def quantization_config(config: dict) -> dict | None:
    """The checkpoint's quantization_config (top level or inside text_config), or None for a float checkpoint."""
    found = config.get("quantization_config")
    if found is None and isinstance(config.get("text_config"), dict):
        found = config["text_config"].get("quantization_config")
    if found is not None and not isinstance(found, dict):
        raise CheckpointError(f"quantization_config is a JSON {type(found).__name__}, not an object")
    return found


def check_codes(name: str, codes: np.ndarray, bits: int) -> None:
    """Refuse codes outside a `bits`-wide signed range (a corrupt or foreign tensor), naming the tensor."""
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if codes.size and (codes.min() < lo or codes.max() > hi):
        raise CheckpointError(f"{name} holds codes outside int{bits}'s {lo}..{hi}; the checkpoint is damaged")


def supported_bits(name: str, bits, method: str) -> int:
    """bits, when it is a width mtpkit writes; else refused naming the tensor, the method and what is supported."""
    if isinstance(bits, bool) or bits not in BITS:
        raise CheckpointError(f"{name}: {method} weights of {bits!r} bits are not supported; mtpkit reads "
                              f"{', '.join(f'int{b}' for b in BITS)}")
    return int(bits)
