"""Which reader a pre-quantized checkpoint needs, and the dispatch to it."""

from __future__ import annotations

import numpy as np

from mtpkit.errors import CheckpointError

from . import compressed, gemma, q4_0
from .types import Lattice

# quant_method -> reader module (each with FORMAT, check(qc) and read(qc, state, expected, prefix))
READERS = {"gemma": gemma, "compressed-tensors": compressed}
FORMATS = ("gemma", "compressed-tensors", "q4_0")


def format_of(qc: dict) -> str:
    method = qc.get("quant_method")
    if method not in READERS:
        raise CheckpointError(f"quantization_config quant_method {method!r} is not supported; mtpkit reads "
                              f"pre-quantized checkpoints of quant_method {' / '.join(map(repr, READERS))} and bf16 "
                              "weights on a Q4_0 lattice")
    READERS[method].check(qc)
    return READERS[method].FORMAT


def read(qc: dict, state: dict, expected: dict, prefix: str) -> tuple[dict, Lattice]:
    """(state, Lattice) of the tensors `state` (keys renamed from `prefix` to "model."), the state's quantized
    weights as their Weight (export/lattice.read dequantizes them); `expected`: the model's parameter shapes by
    the same keys, which every packed tensor must agree with."""
    format_of(qc)
    return READERS[qc["quant_method"]].read(qc, state, expected, prefix)


def recover_q4_0(state: dict, expected: dict) -> tuple[dict, Lattice]:
    """The Q4_0 lattice of a float checkpoint's linear weights (bf16 on a lattice of blocks of 32)."""
    return q4_0.read(state, expected)


def looks_q4_0(tensor) -> bool:
    """Whether a 2-D weight lies on a Q4_0 lattice (blocks of 32) in at least 90% of its blocks (a float weight: almost none): how a float
    checkpoint is recognised as a Q4_0 QAT one."""
    w = np.asarray(tensor.float().numpy() if hasattr(tensor, "float") else tensor, np.float32)
    if w.ndim != 2 or w.shape[1] % q4_0.BLOCK:
        return False
    sample = w[: min(len(w), 64)]
    _, _, on = q4_0.blocks_on_lattice(sample)
    filled = sample.reshape(len(sample), -1, q4_0.BLOCK).any(axis=2)  # an all-zero block lies on every lattice
    return bool(filled.any() and on[filled].mean() >= 0.9)
