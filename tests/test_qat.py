"""Pre-quantized (QAT) checkpoints: each format read back to the writer's own codes and scales, PyTorch on the read
model equal to transformers on the QAT checkpoint, hostile files refused in one line, and an export with the default
flags that keeps the lattice: every graph weight's codes and scales equal to the checkpoint's, parity with the
checkpoint's transformers reference."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from mtpkit.errors import CheckpointError, UsageError

FORMATS = ("gemma", "compressed-tensors", "q4_0")


@pytest.fixture(scope="session")
def qat_pairs(tmp_path_factory, tiny_checkpoints):
    """fmt -> (target, drafter) QAT pair of the e2b_text_kv_eq tiny pair (mobile widths, static activations)."""
    from mtpkit.tiny.qat import write_pair

    root, cache = tmp_path_factory.mktemp("qat"), {}

    def get(fmt: str):
        if fmt not in cache:
            cache[fmt] = write_pair(*tiny_checkpoints("e2b_text_kv_eq"), root / fmt, fmt)
        return cache[fmt]

    return get


def _load(folder):
    from mtpkit.export.checkpoint import resolve
    from mtpkit.export.models import gemma4_text

    return gemma4_text.load(resolve(str(folder), "target"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_reader_returns_the_writers_codes_and_scales(qat_pairs, fmt):
    from mtpkit.tiny.qat import mobile_bits, snap

    target, _ = qat_pairs(fmt)
    model = _load(target)
    lattice = model.lattice
    assert lattice is not None and lattice.format == fmt
    down = lattice.weights["layers.9.mlp.down_proj"]  # a KV-shared layer's MLP: 2 bits (4 in Q4_0)
    assert down.bits == (4 if fmt == "q4_0" else 2)
    if fmt != "q4_0":
        assert lattice.weights["layers.0.mlp.up_proj"].bits == 4
        assert lattice.weights["layers.0.per_layer_projection"].bits == 8
        assert any(a[0] > 0 and a[1] > 0 for a in lattice.activations.values())  # static activation scales
        assert mobile_bits(json.loads((target / "config.json").read_text()))  # the widths the writer used
    w = model.model.layers[0].mlp.gate_proj.weight.detach().numpy()
    mine = lattice.weights["layers.0.mlp.gate_proj"]
    exact = slice(1, None) if fmt == "q4_0" else slice(None)  # Q4_0: row 0 holds the blocks left off the lattice
    np.testing.assert_array_equal(mine.dequantized()[exact], w[exact])  # the model computes the lattice's values
    if fmt != "q4_0":
        codes, scales = snap(torch.from_numpy(mine.dequantized()), mine.bits)
        np.testing.assert_array_equal(codes.numpy(), mine.codes)
    else:
        assert sum(off for off, _ in lattice.off_lattice.values()) == 3  # counted, re-encoded
        assert lattice.off_lattice["layers.0.mlp.gate_proj"] == (2, mine.scales.size)
        assert not np.array_equal(mine.dequantized()[0], w[0])


@pytest.mark.parametrize("fmt", ("gemma", "q4_0"))
def test_read_model_computes_what_transformers_computes_on_the_checkpoint(qat_pairs, fmt):
    """transformers loads the gemma layout with its own GemmaQuantizer (apply_srq included) and Q4_0 as bf16."""
    from transformers import AutoModelForCausalLM

    target, _ = qat_pairs(fmt)
    ours = _load(target)
    theirs = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    ids = torch.tensor([[2, *range(10, 300, 9)]])
    with torch.no_grad():
        diff = (ours(ids).logits - theirs(ids).logits).abs().max().item()
    assert diff <= 1e-4, diff  # the fp32 graph check's tolerance: eager vs sdpa attention


def test_compressed_tensors_reads_the_same_lattice_as_gemma(qat_pairs):
    """The same snapped linear weights written in both layouts read back the same codes and scales (the
    compressed-tensors layout keeps the tables float, so its activation scales are measured on another model)."""
    a, b = _load(qat_pairs("gemma")[0]).lattice, _load(qat_pairs("compressed-tensors")[0]).lattice
    linear = [k for k in a.weights if "embed" not in k]
    assert sorted(linear) == sorted(b.weights) and len(linear) > 40
    for k in linear:
        np.testing.assert_array_equal(a.weights[k].codes, b.weights[k].codes, err_msg=k)
        np.testing.assert_array_equal(a.weights[k].scales, b.weights[k].scales, err_msg=k)
        assert (a.activations[k][0] > 0) == (b.activations[k][0] > 0), k  # measured on each layout's own model


def _edit(src, dst, change_config=None, change_state=None):
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    if change_config:
        cfg = json.loads((dst / "config.json").read_text())
        change_config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    if change_state:
        state = load_file(str(dst / "model.safetensors"))
        change_state(state)
        save_file(state, str(dst / "model.safetensors"))
    return dst


def test_hostile_checkpoints_are_refused_in_one_line(qat_pairs, tmp_path):
    target, _ = qat_pairs("gemma")
    key = "model.layers.0.mlp.down_proj"
    cases = {
        "truncated": (None, lambda s: s.__setitem__(key + ".weight", s[key + ".weight"][:, :-1].contiguous()),
                      f"{key}.weight is uint8"),
        "scales": (None, lambda s: s.__setitem__(key + ".weight_scale", s[key + ".weight_scale"][:-2].contiguous()),
                   f"{key}.weight_scale has shape"),
        "bits": (lambda c: c["quantization_config"].__setitem__("num_bits", 3), None, "3 bits are not supported"),
        "method": (lambda c: c["quantization_config"].__setitem__("quant_method", "awq"), None,
                   "quant_method 'awq' is not supported"),
    }
    for name, (config, state, message) in cases.items():
        folder = _edit(target, tmp_path / name, config, state)
        with pytest.raises(CheckpointError) as e:
            _load(folder)
        assert message in str(e.value) and "\n" not in str(e.value), (name, str(e.value))
        assert "config expects" not in str(e.value)


def test_default_quant_adapts_and_checkpoint_on_a_float_target_is_refused(qat_pairs, tiny_checkpoints, tmp_path):
    from mtpkit.export.config import ExportConfig
    from mtpkit.export.pipeline import prepare

    target, drafter = qat_pairs("gemma")
    assert ExportConfig(str(target), str(drafter), tmp_path / "a").quant == "checkpoint"
    float_target, float_drafter = tiny_checkpoints("e2b_text_kv_eq")
    assert ExportConfig(str(float_target), str(float_drafter), tmp_path / "b").quant == "fp32"
    # LiteRT does not write a lattice yet: the default adapts (and says so), the explicit recipe is refused
    assert ExportConfig(str(target), str(drafter), tmp_path / "d", backend="litert").quant == "mobile"
    with pytest.raises(UsageError, match="--quant checkpoint is written by --backend onnx only"):
        ExportConfig(str(target), str(drafter), tmp_path / "e", backend="litert", quant="checkpoint")
    with pytest.raises(UsageError, match="is a float checkpoint"):
        prepare(ExportConfig(str(float_target), str(float_drafter), tmp_path / "c", quant="checkpoint"))


@pytest.mark.slow
def test_default_export_keeps_the_lattice_and_matches_the_checkpoint(qat_pairs, tmp_path):
    """ONNX, default flags: every MatMul weight of the checkpoint is a MatMulNBits whose codes and scales decode to
    the checkpoint's exactly (the manifest says so per weight), and greedy tokens, plain and speculative, equal the
    reference transformers recorded on the QAT checkpoint."""
    import onnx
    from onnx import numpy_helper

    import mtpkit
    from mtpkit.runtime.parity import run_parity

    target, drafter = qat_pairs("gemma")
    out = mtpkit.export_pair(target, drafter, tmp_path / "qat", reference_tokens=12, max_cache_len=128)
    manifest = json.loads((out / "manifest.json").read_text())
    tensors = manifest["backends"]["onnx"]["options"]["quantization"]["target"]["tensors"]
    assert manifest["quantization"]["recipe"] == "checkpoint"
    lattice = _load(target).lattice
    labels = {k: v for k, v in tensors.items() if "checkpoint" in v}
    assert len(labels) >= len([k for k in lattice.weights if "embed" not in k])
    graph = onnx.load(str(out / "target.onnx"))
    inits = {t.name: numpy_helper.to_array(t) for t in graph.graph.initializer}
    nodes = [n for n in graph.graph.node if n.op_type == "MatMulNBits"]
    checked = 0
    for node in nodes:
        from mtpkit.export.lattice import key

        weight = lattice.weight(node.input[1].rsplit("_Q", 1)[0])
        if weight is None:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        packed, scales = inits[node.input[1]], inits[node.input[2]]
        bits, block = attrs["bits"], attrs["block_size"]
        per = 8 // bits
        u = np.stack([(packed >> (bits * i)) & ((1 << bits) - 1) for i in range(per)], -1).reshape(len(packed), -1)
        codes = u.astype(np.int16)[:, :weight.codes.shape[1]] - (1 << (bits - 1))
        np.testing.assert_array_equal(codes, weight.codes, err_msg=key(node.input[1]))
        per_block = np.repeat(scales, block, axis=1)[:, :weight.codes.shape[1]]
        np.testing.assert_array_equal(per_block, np.repeat(weight.scales, weight.group, axis=1))
        checked += 1
    assert checked == len([k for k in lattice.weights if "embed" not in k])
    report = run_parity(out)
    assert report["ok"], [r for r in report["results"] if not r["ok"]][:3]
