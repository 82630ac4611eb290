"""What a pre-quantized checkpoint fixes, as data: a weight's codes and scales (Weight), a checkpoint's lattice
(Lattice) and the key that names a weight the same way in checkpoints, modules and graphs. Every reader imports
these from here, so the package's entry (export/lattice/__init__.py) can import the readers."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import numpy as np

from mtpkit.errors import CheckpointError

BITS = (2, 4, 8)  # the widths every backend writes exactly (export/lattice: supported())


@dataclasses.dataclass(frozen=True)
class Weight:
    """One quantized weight as the checkpoint holds it: codes [out, in] in -2^(bits-1)..2^(bits-1)-1 and float32
    scales [out, groups] (one group per row: per channel), value = code * scale of the code's group."""

    codes: np.ndarray  # int8 [out, in]
    scales: np.ndarray  # float32 [out, groups]
    bits: int

    @property
    def group(self) -> int:
        """Input channels per scale (the row's width: per channel)."""
        return self.codes.shape[1] // self.scales.shape[1]

    @property
    def groups(self) -> int:
        """Scales per row (1: per channel)."""
        return self.scales.shape[1]

    def dequantized(self) -> np.ndarray:
        """float32 [out, in], as transformers computes it (int x float32 scale)."""
        n, k = self.codes.shape
        return (self.codes.reshape(n, -1, self.group).astype(np.float32) * self.scales[..., None]).reshape(n, k)

    def label(self) -> str:
        """How the manifest records the weight: "int2/checkpoint/channel", "int4/checkpoint/g32"."""
        how = "channel" if self.scales.shape[1] == 1 else f"g{self.group}"
        return f"int{self.bits}/checkpoint/{how}"


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
