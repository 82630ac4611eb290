"""A QAT checkpoint's 2- and 4-bit lookup tables on LiteRT (export/backends/litert/tables.py): the packing is the
checkpoint's own, the graph's unpacking ops give back its codes, and the packed lookup computes the dequantized
rows the PyTorch model holds, embedding scale included."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mtpkit.export.backends.litert import tables
from mtpkit.export.lattice import Lattice, Weight


def _codes(rows: int, width: int, bits: int, seed: int = 0) -> np.ndarray:
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return np.random.default_rng(seed).integers(lo, hi + 1, (rows, width)).astype(np.int8)


@pytest.mark.parametrize("bits", tables.PACKED_BITS)
@pytest.mark.parametrize("width", [8, 7, 33])
def test_unpacking_ops_give_back_the_codes(bits, width):
    codes = _codes(5, width, bits)
    packed = tables.pack_rows(codes, bits)
    assert packed.dtype == np.uint8 and packed.shape == (5, tables.packed_width(width, bits))
    unpacked = tables.unpack(torch.from_numpy(packed), bits, width)
    np.testing.assert_array_equal(unpacked.numpy(), codes.astype(np.float32))


@pytest.mark.parametrize("bits", tables.PACKED_BITS)
def test_the_packing_is_the_gemma_checkpoints(bits):
    """The bytes the graph gathers are those transformers' gemma format stores (its writer in mtpkit/tiny/qat.py),
    so a gemma checkpoint's table is copied, not re-packed."""
    from mtpkit.tiny.qat import _pack_uint8

    codes = _codes(6, 12, bits, seed=1)
    np.testing.assert_array_equal(tables.pack_rows(codes, bits), _pack_uint8(torch.from_numpy(codes), bits).numpy())


@pytest.mark.parametrize("groups", [1, 4])
def test_packed_lookup_equals_the_dequantized_rows(groups):
    """attach() gives a table module the packed lookup; its rows equal the lattice's dequantized rows times the
    embedding's scale, for per-row and per-block scales; detach() restores the module."""
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextScaledWordEmbedding

    rows, width, bits = 11, 16, 2
    codes = _codes(rows, width, bits, seed=2)
    scales = np.random.default_rng(3).uniform(0.01, 0.1, (rows, groups)).astype(np.float32)
    weight = Weight(codes, scales, bits)
    module = Gemma4TextScaledWordEmbedding(rows, width, 0, embed_scale=4.0)
    model = torch.nn.Module()
    model.embed_tokens = module
    done = tables.attach(model, Lattice("gemma", {"embed_tokens": weight}))
    assert len(done) == 1
    with torch.no_grad():
        getattr(module, tables.PACKED).copy_(torch.from_numpy(tables.pack_rows(codes, bits)))
        getattr(module, tables.SCALES).copy_(torch.from_numpy(scales))
    ids = torch.tensor([[3, 0, 10, 3]])
    expected = torch.from_numpy(weight.dequantized())[ids] * 4.0
    torch.testing.assert_close(module(ids), expected, rtol=0, atol=0)
    tables.detach(done)
    assert type(module) is Gemma4TextScaledWordEmbedding and not hasattr(module, tables.PACKED)


def test_an_8_bit_table_is_not_packed():
    weight = Weight(_codes(3, 4, 8), np.ones((3, 1), np.float32), 8)
    assert not tables.packed(weight) and not tables.packed(None)


@pytest.mark.parametrize("bits", tables.PACKED_BITS)
def test_a_gemma_tables_bytes_are_copied_as_they_are(bits):
    """packed_rows of a gemma-layout weight is its stored bytes; of any other layout, its codes packed the same way."""
    from mtpkit.tiny.qat import _pack_uint8

    codes = _codes(9, 13, bits, seed=4)
    scales = np.ones((9, 1), np.float32)
    stored = _pack_uint8(torch.from_numpy(codes), bits).numpy()
    gemma = Weight(stored, scales, bits, layout="gemma", width=13)
    plain = Weight(codes, scales, bits)
    np.testing.assert_array_equal(tables.packed_rows(gemma, 2, 7), stored[2:7])
    np.testing.assert_array_equal(tables.packed_rows(plain, 2, 7), stored[2:7])
