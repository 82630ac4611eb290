"""A checkpoint's 2- and 4-bit lookup tables on LiteRT, at their own bits and exact scales.

EMBEDDING_LOOKUP reads a table at 8 bits per value, or at 4 bits with float16 scales, so a QAT checkpoint's 2-bit
tied table would take 4x its bytes and a 4-bit table with float32 scales would lose them. Here the embedders
gather rows of the checkpoint's packed bytes (uint8, `code + 2^(bits-1)` with the first value in the lowest bits:
transformers' `gemma` packing) and their float32 scales, and unpack them with float ops that are exact on small
integers (multiply by a power of two, floor, subtract). The tensors take transformers' QuantizedEmbedding names,
`embedding_quantized` and `embedding_scale`, beside the table's `weight`, which the lookup then leaves unread.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from torch import nn

PACKED, SCALES = "embedding_quantized", "embedding_scale"
PACKED_BITS = (2, 4)  # a table at 8 bits stays an int8 EMBEDDING_LOOKUP (encodings.lattice_encoding), exact as it is


def packed(weight) -> bool:
    """Whether a lattice table is gathered packed (its bits are below 8)."""
    return weight is not None and weight.bits in PACKED_BITS


def packed_width(width: int, bits: int) -> int:
    return -(-width * bits // 8)


def pack_rows(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 [rows, packed_width]: codes + 2^(bits-1), 8 / bits per byte, the first in the lowest bits."""
    per = 8 // bits
    u = (codes.astype(np.int16) + (1 << (bits - 1))).astype(np.uint8)
    u = np.pad(u, ((0, 0), (0, (-u.shape[1]) % per))).reshape(len(u), -1, per)
    out = np.zeros(u.shape[:2], np.uint8)
    for i in range(per):
        out |= u[..., i] << (bits * i)
    return out


def packed_rows(weight, start: int, stop: int) -> np.ndarray:
    """A lattice table's rows start..stop in the packing above: a `gemma` checkpoint's own bytes as they are."""
    if getattr(weight, "layout", None) == "gemma":
        return np.asarray(weight.stored[start:stop], np.uint8)
    return pack_rows(weight.rows(start, stop), weight.bits)


def unpack(rows: torch.Tensor, bits: int, width: int) -> torch.Tensor:
    """float32 codes [..., width] of packed uint8 rows [..., packed_width], with ops LiteRT runs on any integer
    below 2^24 exactly: b / 2^(bits i), floored, less 2^bits times its own floor(/ 2^bits)."""
    per, base = 8 // bits, float(1 << bits)
    b = rows.to(torch.float32).unsqueeze(-1)
    shifts = torch.tensor([1.0 / (1 << (bits * i)) for i in range(per)], dtype=torch.float32)
    q = torch.floor(b * shifts)
    v = q - base * torch.floor(q * (1.0 / base))
    return (v - float(1 << (bits - 1))).flatten(-2)[..., :width]


def lookup(module: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    """The rows of `ids` dequantized: codes x their group's float32 scale, times the embedding's own scale."""
    flat = ids.reshape(-1)
    # indexing lowers to GATHER; index_select on uint8 to a SELECT_V2 that the converter refuses (litert-torch 0.10)
    codes = unpack(getattr(module, PACKED)[flat], module.packed_bits, module.embedding_dim)
    scales = getattr(module, SCALES)[flat]
    values = (codes.reshape(len(flat), scales.shape[1], -1) * scales.unsqueeze(-1)).reshape(len(flat), -1)
    out = values.reshape(*ids.shape, module.embedding_dim)
    scale = getattr(module, "embed_scale", None)
    return out if scale is None else out * scale.to(torch.float32)


class _Packed:
    """Mixed into an embedding's own class (Gemma4TextScaledWordEmbedding, nn.Embedding): the packed lookup."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return lookup(self, ids)


def attach(model: nn.Module, lattice) -> list:
    """Give every embedding of `model` whose lattice table is packed() its packed bytes and scales (parameters on
    the model's device, meta while export_hf converts: the graft fills them) and the packed lookup; returns what
    detach() undoes."""
    done = []
    for name, module in model.named_modules():
        weight = lattice.weight(name) if isinstance(module, nn.Embedding) else None
        if not packed(weight):
            continue
        rows, device = module.num_embeddings, module.weight.device
        module.register_parameter(PACKED, nn.Parameter(torch.empty(
            rows, packed_width(module.embedding_dim, weight.bits), dtype=torch.uint8, device=device),
            requires_grad=False))
        module.register_parameter(SCALES, nn.Parameter(torch.empty(rows, weight.groups, device=device),
                                                       requires_grad=False))
        cls = type(module)
        module.packed_bits = weight.bits
        module.__class__ = type(f"Packed{cls.__name__}", (_Packed, cls), {})
        done.append((module, cls))
    return done


def detach(done: list) -> None:
    for module, cls in done:
        module.__class__ = cls
        del module.packed_bits
        for name in (PACKED, SCALES):
            delattr(module, name)


@contextlib.contextmanager
def packed_tables(lattice):
    """While export_hf runs: the model it loads gathers the lattice's packed tables (attach); undone after.
    litert-torch 0.10.0 builds its model in export_lib.load_model, which every export calls once."""
    from litert_torch.generative.export_hf.core import export_lib

    from ...scoped import patched

    real, done = export_lib.load_model, []

    def load_model(*args, **kwargs):
        artifacts = real(*args, **kwargs)
        done.extend(attach(artifacts.model, lattice))
        return artifacts

    try:
        with patched(export_lib, "load_model", load_model):
            yield done
    finally:
        detach(done)
