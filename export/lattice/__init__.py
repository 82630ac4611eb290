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

import contextlib
import logging
from collections.abc import Mapping

from mtpkit.errors import CheckpointError

from .types import BITS, Lattice, Weight, check_codes, key, quantization_config, supported_bits

__all__ = ["BITS", "Lattice", "Weight", "check_codes", "key", "quantization_config", "supported_bits",
           "check_recipes", "detect_folder", "format_of", "plans", "read", "released"]
log = logging.getLogger("mtpkit")

def format_of(config: dict) -> str | None:
    """The reader a checkpoint config needs ("gemma", "compressed-tensors", "q4_0"), None for a float checkpoint;
    an unknown quant_method or format is refused in one line naming it and what is supported."""
    from . import readers

    qc = quantization_config(config)
    if qc is None:
        return None
    return readers.format_of(qc)


def read(config: dict, state: dict, prefix: str, expected: dict, dtype=None) -> tuple[dict, Lattice | None]:
    """(float state for the PyTorch model, the Lattice) of a checkpoint's tensors `state` (keys after `prefix` was
    renamed to "model."), `expected` the model's parameter shapes by the same keys; a float checkpoint's state comes
    back unchanged with no Lattice, unless its linear weights lie on a Q4_0 lattice. Quantized weights are
    dequantized into `dtype` (a torch dtype; None: the one the checkpoint's float tensors share, else float32)."""
    from . import readers

    qc = quantization_config(config)
    if qc is not None:
        state, lattice = readers.read(qc, state, expected, prefix)
        state = _dequantized(state, dtype)
    elif _q4_0_sample(state) is not None and readers.looks_q4_0(_q4_0_sample(state)):
        state, lattice = readers.recover_q4_0(state, expected)
    else:
        return state, None
    log.info("  %s", lattice.summary())
    return state, lattice


def _dequantized(state: dict, dtype) -> dict:
    """The state with each Weight a tensor of `dtype` (None: as the float tensors beside it, as --dtype auto holds
    a float checkpoint), filled by rows: a bf16-held model never holds a float32 copy of a table."""
    import torch

    if dtype is None:
        floats = {t.dtype for t in state.values() if not isinstance(t, Weight) and t.is_floating_point()}
        dtype = next(iter(floats)) if len(floats) == 1 else torch.float32
    return {k: v.tensor(dtype) if isinstance(v, Weight) else v for k, v in state.items()}


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


# formats whose float weights the loader made from the codes (export/lattice.read): made again, they are equal
_MADE_FROM_CODES = ("gemma", "compressed-tensors")


@contextlib.contextmanager
def released(model):
    """Free the model's weights that were dequantized from a gemma / compressed-tensors checkpoint's codes for the
    block, and make them again from the codes after it, bit for bit. The quantize phase's graft reads the codes,
    not these floats, which at E2B are 10 GB of bf16 held beside the graphs being rewritten."""
    import torch

    found = getattr(model, "lattice", None)
    freed = [] if found is None or found.format not in _MADE_FROM_CODES else [
        (p, w) for name, p in model.named_parameters()
        if (w := found.weight(name)) is not None and tuple(p.shape) == w.shape]
    for p, _ in freed:
        p.data = torch.empty(0, dtype=p.dtype)
    try:
        yield len(freed)
    finally:
        for p, w in freed:
            p.data = w.tensor(p.dtype)
