"""A lattice Weight keeps the checkpoint's packed rows and unpacks only the rows asked for: every packing (int8, the
gemma layout's uint8, compressed-tensors' int32 words) at every width, per channel and grouped, gives the writer's
codes row range by row range; a pre-quantized checkpoint loads into the held dtype (bf16 asked, or auto beside bf16
float tensors) with the values the fp32 load rounds to."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from mtpkit.export.lattice import Weight, pack, types


def _packed(layout: str, codes: torch.Tensor, bits: int) -> np.ndarray:
    """codes in a checkpoint layout, packed by the format's own writer (mtpkit/tiny/qat.py, compressed-tensors)."""
    from mtpkit.tiny.qat import _pack_uint8

    if layout == "codes":
        return codes.numpy()
    if layout == "gemma":
        return _pack_uint8(codes, bits).numpy()
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    return pack_to_int32(codes, bits).numpy()


@pytest.mark.parametrize("layout", ["codes", "gemma", "compressed"])
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("groups", [1, 3])
def test_rows_unpack_each_packing_as_the_whole(layout, bits, groups, monkeypatch):
    width = 72 if groups > 1 else 70  # a row that leaves a partly filled byte / 32-value word group
    g = torch.Generator().manual_seed(bits * 10 + groups)
    hi = (1 << (bits - 1)) - 1
    codes = torch.randint(-hi - 1, hi + 1, (37, width), generator=g, dtype=torch.int8)
    scales = torch.rand(37, groups, generator=g).numpy() + 0.01
    w = Weight(_packed(layout, codes, bits), scales, bits, layout, width)
    assert w.shape == (37, width) and w.group == width // groups
    np.testing.assert_array_equal(w.codes, codes.numpy())
    for a, b in ((0, 1), (5, 19), (30, 37), (0, 37)):
        np.testing.assert_array_equal(w.rows(a, b), codes.numpy()[a:b])
        np.testing.assert_array_equal(w.dequantized(a, b), w.dequantized()[a:b])
    want = codes.float().reshape(37, groups, -1) * torch.from_numpy(scales)[..., None]
    monkeypatch.setattr(types, "_CHUNK", 3 * width)  # several chunks, the last one short
    assert torch.equal(w.tensor(torch.float32), want.reshape(37, width))
    assert torch.equal(w.tensor(torch.bfloat16), want.reshape(37, width).bfloat16())
    monkeypatch.setattr(pack, "_CHUNK", 5 * width)
    block = 48 if groups > 1 else width  # 48: two groups a block, the last block half padding
    packed, block_scales = pack.nbits(w, max(bits, 4), block)  # the ONNX layout, built a few rows at a time
    decoded = _decode(packed, max(bits, 4))[:, :width]
    np.testing.assert_array_equal(decoded, codes.numpy())
    assert block_scales.shape == (37, -(-width // block))


def _decode(packed: np.ndarray, bits: int) -> np.ndarray:
    per = 8 // bits
    u = np.stack([(packed >> (bits * i)) & ((1 << bits) - 1) for i in range(per)], -1).reshape(len(packed), -1)
    return u.astype(np.int16) - (1 << (bits - 1))


@pytest.fixture(scope="module")
def gemma_target(tiny_checkpoints, tmp_path_factory):
    from mtpkit.tiny.qat import write

    return write(tiny_checkpoints("e2b_text_kv_eq")[0], tmp_path_factory.mktemp("rows") / "target", "gemma", srq=False)


def _load(folder, dtype):
    from mtpkit.export.checkpoint import resolve
    from mtpkit.export.models import gemma4_text

    return gemma4_text.load(resolve(str(folder), "target"), dtype)


def test_a_lattice_checkpoint_loads_into_the_held_dtype(gemma_target, tmp_path):
    from safetensors.torch import load_file, save_file

    full = dict(_load(gemma_target, "fp32").named_parameters())
    assert {p.dtype for p in full.values()} == {torch.float32}
    assert {p.dtype for p in _load(gemma_target, "auto").parameters()} == {torch.float32}  # fp32 floats beside it
    held = dict(_load(gemma_target, "bf16").named_parameters())
    assert {p.dtype for p in held.values()} == {torch.bfloat16}
    for name, p in held.items():
        assert torch.equal(p, full[name].bfloat16()), name
    bf16 = shutil.copytree(gemma_target, tmp_path / "bf16")  # the float tensors in bf16, as Google's are
    state = load_file(str(bf16 / "model.safetensors"))
    scales = (".weight_scale", ".embedding_scale", "_activation_scale")
    state = {k: v.bfloat16() if v.dtype == torch.float32 and not k.endswith(scales) else v for k, v in state.items()}
    save_file(state, str(bf16 / "model.safetensors"), metadata={"format": "pt"})
    assert "quantization_config" in json.loads((bf16 / "config.json").read_text())
    auto = dict(_load(bf16, "auto").named_parameters())
    assert {p.dtype for p in auto.values()} == {torch.bfloat16}
    for name, p in auto.items():
        assert torch.equal(p, full[name].bfloat16()), name


def test_released_frees_the_weights_made_from_codes_and_makes_them_again_bit_for_bit(gemma_target):
    from mtpkit.export import lattice

    model = _load(gemma_target, "bf16")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    quantized = {n for n in before if model.lattice.weight(n) is not None}
    assert "model.embed_tokens_per_layer.weight" in quantized and len(quantized) > 10
    with lattice.released(model) as freed:
        assert freed == len(quantized)
        sizes = {n: p.numel() for n, p in model.named_parameters()}
        assert all(sizes[n] == 0 for n in quantized) and all(sizes[n] > 0 for n in before if n not in quantized)
    for name, p in model.named_parameters():
        assert p.dtype == torch.bfloat16 and torch.equal(p, before[name]), name
