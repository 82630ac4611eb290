"""Pre-quantized (quantization-aware-trained) checkpoints: one reader per published format turns a checkpoint into
float weights for the PyTorch side and a Lattice, the checkpoint's own codes, scales and bit widths per weight,
which `--quant checkpoint` writes into the graphs unchanged (never re-rounded).

Formats (`FORMATS`):
- `gemma`: transformers' `quant_method: gemma` (Google's `*-qat-mobile-transformers`), export/lattice/gemma.py;
- `compressed-tensors`: `pack-quantized` (Google's `*-qat-mobile-ct`, `*-qat-w4a16-ct`), export/lattice/compressed.py;
- `q4_0`: bf16 weights on a Q4_0 lattice, blocks of 32 (Google's `*-qat-q4_0-unquantized`, target and assistant),
  recovered from the weights themselves, export/lattice/q4_0.py.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping

import numpy as np

from mtpkit.errors import CheckpointError

log = logging.getLogger("mtpkit")

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


def format_of(config: dict) -> str | None:
    """The reader a checkpoint config needs ("gemma", "compressed-tensors", "q4_0"), None for a float checkpoint;
    an unknown quant_method or format is refused in one line naming it and what is supported."""
    from . import readers

    qc = quantization_config(config)
    if qc is None:
        return None
    return readers.format_of(qc)


def read(config: dict, state: dict, prefix: str, expected: dict) -> tuple[dict, Lattice | None]:
    """(float state for the PyTorch model, the Lattice) of a checkpoint's tensors `state` (keys after `prefix` was
    renamed to "model."), `expected` the model's parameter shapes by the same keys; a float checkpoint's state comes
    back unchanged with no Lattice, unless its linear weights lie on a Q4_0 lattice."""
    from . import readers

    qc = quantization_config(config)
    if qc is not None:
        state, lattice = readers.read(qc, state, expected, prefix)
    elif _q4_0_sample(state) is not None and readers.looks_q4_0(_q4_0_sample(state)):
        state, lattice = readers.recover_q4_0(state, expected)
    else:
        return state, None
    log.info("  %s", lattice.summary())
    return state, lattice


def _q4_0_sample(state: dict):
    """A linear weight that decides whether a float checkpoint is a Q4_0 QAT one: the first MLP projection."""
    return next((t for n, t in state.items() if n.endswith("mlp.gate_proj.weight") and t.dim() == 2), None)


def detect_folder(folder, weights: bool = False) -> str | None:
    """The lattice format of a local checkpoint folder ("gemma", "compressed-tensors", or with `weights` "q4_0"), or
    None (a float checkpoint, or not a local folder yet: a hub id resolves later). Reads config.json; a Q4_0
    lattice lies in the weights alone, so it is looked for (one weight read) only where `weights` asks: a dry run
    and the default reads no weight."""
    import json
    from pathlib import Path

    path = Path(folder).expanduser() / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # resolve() refuses a missing or damaged checkpoint in its own words
    if not isinstance(config, dict):
        return None
    found = format_of(config)
    return found or ("q4_0" if weights and _folder_q4_0(path.parent) else None)


def _folder_q4_0(folder) -> bool:
    from safetensors import safe_open

    from ..checkpoint import safetensors_files
    from . import readers

    try:
        files = safetensors_files(folder)
    except CheckpointError:
        return False
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            name = next((k for k in sf.keys() if k.endswith("mlp.gate_proj.weight")), None)
            if name is not None:
                return readers.looks_q4_0(sf.get_tensor(name))
    return False


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


def check_recipes(recipes: Mapping, folders: Mapping) -> None:
    """Before any weight loads: --quant checkpoint on a float checkpoint is refused in one line; another recipe on
    a pre-quantized one re-quantizes its dequantized weights, with a warning that says what that loses."""
    from mtpkit.errors import UsageError

    for side, recipe in recipes.items():
        found = detect_folder(folders[side], weights=recipe.lattice)
        flag = "--quant" if side == "target" else "--drafter-quant"
        if recipe.lattice and found is None:
            raise UsageError(f"{flag} checkpoint writes a pre-quantized checkpoint's own lattice, but the {side} "
                             f"{folders[side]} is a float checkpoint; choose another {flag} (mobile: the smallest)")
        if found and not recipe.lattice and recipe.quantized:
            log.warning("%s %s re-quantizes the %s's dequantized %s weights: the lattice its quantization-aware "
                        "training fitted is lost; %s checkpoint keeps it", flag, recipe.name, side, found, flag)
        elif found and not recipe.lattice:
            log.info("  %s %s stores the %s's dequantized %s weights as floats; %s checkpoint keeps its lattice",
                     flag, recipe.name, side, found, flag)


def plans(recipes: Mapping, models: Mapping) -> dict:
    """export/int4.Int4Plan per side whose recipe writes the checkpoint's lattice (--quant checkpoint)."""
    from ..int4 import Int4Plan

    return {side: Int4Plan(recipe, lattice=models[side].lattice) for side, recipe in recipes.items()
            if recipe.lattice}
