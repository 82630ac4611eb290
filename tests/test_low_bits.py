"""--max-size and the size-first recipe's lower width: 2-bit weights (one scale per channel on LiteRT, ONNX
Runtime's blocks of 128 on ONNX), chosen by the size plan in the target adapter's order until the export fits."""

from __future__ import annotations

import numpy as np
import pytest

from mtpkit.errors import UsageError
from mtpkit.export import int4
from mtpkit.export.recipes import recipe


def test_2_bit_codes_lie_in_their_range_and_compensation_lowers_the_weighted_error():
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((16, 64)).astype(np.float32)
    x = (rng.standard_normal((512, 8)) @ rng.standard_normal((8, 64)) + 0.1 * rng.standard_normal((512, 64)))
    x = x.astype(np.float32)  # correlated channels, as activations are: what compensation exploits
    moment = x.T @ x / len(x)
    errors = {}
    for name, importance in (("plain", None), ("gptq", moment)):
        codes, scales = int4.encode(rows, 64, importance, bits=2)
        assert codes.min() >= -2 and codes.max() <= 1 and (scales > 0).all()
        e = x @ (int4.decode(codes, scales) - rows).T
        errors[name] = float(np.square(e).mean())
    assert errors["gptq"] < 0.9 * errors["plain"]
    assert int4.code_range(2) == (-2, 1) and int4.code_range(4) == (-8, 7)


def test_a_plan_lowers_exactly_the_named_layers():
    plan = int4.plan(recipe("mobile"), (), low_bit=("layers.1.mlp",))
    assert plan.bits("model.layers.1.mlp.down_proj.weight") == 2
    assert plan.bits("w:model.language_model.layers.1.mlp.gate_proj.weight") == 2
    assert plan.bits("model.layers.11.mlp.down_proj.weight") == 4  # not a prefix match on the number
    assert plan.bits("model.layers.1.self_attn.q_proj.weight") == 4
    with pytest.raises(ValueError, match="no lower width"):
        int4.plan(recipe("int4"), (), low_bit=("layers.1.mlp",))


def _dry_run(tiny_checkpoints, tmp_path, **flags):
    from mtpkit.export.config import ExportConfig
    from mtpkit.export.pipeline import plan_export

    target, drafter = tiny_checkpoints("e2b_gemma4_centroid")
    return plan_export(ExportConfig(target=str(target), drafter=str(drafter), out=tmp_path / "x", dry_run=True,
                                    max_cache_len=256, **flags))


def test_max_size_lowers_the_fewest_kv_shared_mlps_first_first(tiny_checkpoints, tmp_path):
    """The plan lowers the KV-shared layers' MLPs, the first of them first, only as far as the budget needs; a
    budget already met lowers nothing; one no choice meets is refused in one line naming the smallest plan."""
    from mtpkit.export.sizes import downloads

    full = _dry_run(tiny_checkpoints, tmp_path, quant="mobile")
    onnx = full.backends["onnx"].total
    assert _dry_run(tiny_checkpoints, tmp_path, quant="mobile", max_size=onnx / 1e9).low_bit == ()
    lowered = _dry_run(tiny_checkpoints, tmp_path, quant="mobile", max_size=(onnx - 1) / 1e9)
    assert lowered.low_bit and lowered.low_bit[0].endswith(".mlp")
    assert downloads(lowered.backends)["onnx files"] <= onnx - 1
    first = int(lowered.low_bit[0].split(".")[1])
    assert [int(g.split(".")[1]) for g in lowered.low_bit] == list(range(first, first + len(lowered.low_bit)))
    assert "--max-size" in lowered.render() and lowered.low_bit[0] in lowered.render()
    with pytest.raises(UsageError, match=r"^--max-size 0.001 GB: onnx files plans .* raise --max-size") as e:
        _dry_run(tiny_checkpoints, tmp_path, quant="mobile", max_size=0.001)
    assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match="no lower width"):  # int4 has no 2-bit width to fall back on
        _dry_run(tiny_checkpoints, tmp_path, quant="int4", max_size=0.001)
    with pytest.raises(UsageError, match="--max-size must be"):
        _dry_run(tiny_checkpoints, tmp_path, quant="mobile", max_size=-1)


def test_onnx_2_bit_weights_run_as_their_codes_say():
    """MatMulNBits at 2 bits (code + 2, four per byte along K, lowest bits first) gives x @ W2 for W2 the codes
    times the scales export/int4.py chose."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from mtpkit.export.backends.onnx.stream import _searched

    rng = np.random.default_rng(1)
    k, n, block = 256, 48, 128
    w = rng.standard_normal((k, n)).astype(np.float32)
    packed, scales = _searched(w, block, None, bits=2)
    codes, want_scales = int4.encode(np.ascontiguousarray(w.T), block, bits=2)
    np.testing.assert_array_equal(scales, want_scales.astype(np.float32))
    node = helper.make_node("MatMulNBits", ["x", "w", "s"], ["y"], domain="com.microsoft", K=k, N=n, bits=2,
                            block_size=block)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n])],
                              [numpy_helper.from_array(packed, "w"), numpy_helper.from_array(scales.reshape(-1), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    x = rng.standard_normal((2, k)).astype(np.float32)
    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, x @ int4.decode(codes, want_scales).T, rtol=1e-4, atol=1e-4)


@pytest.mark.litert
def test_litert_2_bit_weights_run_as_their_codes_say(tmp_path):
    """A FULLY_CONNECTED weight grafted at 2 bits, one float32 scale per row: LiteRT (XNNPACK, and its built-in
    kernel) computes x @ W2^T within the int8 rounding of the activations, and far from a wrong bit order."""
    pytest.importorskip("litert_torch")
    import torch
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from conftest import grafted_linear
    from mtpkit.export.backends.litert import graft

    torch.manual_seed(0)
    linear = torch.nn.Linear(128, 16, bias=False)
    path, done, skeleton = grafted_linear(linear, graft.Encoding("int2"), tmp_path)
    assert done == {"weight": "int2/b128"}
    w = linear.weight.detach().numpy()
    codes, scales = int4.encode(w, 128, bits=2)
    want = int4.decode(codes, scales)
    assert path.stat().st_size < skeleton.stat().st_size + w.size // 4 + 8192
    x = np.random.default_rng(0).standard_normal((1, 128)).astype(np.float32)
    for kind in (OpResolverType.AUTO, OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES):
        runner = Interpreter(model_path=str(path), experimental_op_resolver_type=kind).get_signature_runner("fc")
        y = next(iter(runner(input=x).values()))
        assert np.abs(y - x @ want.T).max() < 0.05 * np.abs(x @ want.T).max(), kind


@pytest.mark.slow
@pytest.mark.litert
def test_2_bit_kv_shared_mlps_run_on_both_backends_and_in_litert_lm(litert_exports, tmp_path_factory, capfd):
    """--quant mobile with every KV-shared MLP lowered (what --max-size chooses at full size; at the tiny widths
    per-channel parameters outweigh the bits saved, so the plan would not choose them): derived from the float
    export, those weights and only those are 2-bit on both backends, every file is within 3% of the size plan for
    that choice, speculation equals plain greedy on both backends, and LiteRT-LM runs the bundle with speculation
    on and off, giving mtpkit's tokens."""
    from tokenizers import Tokenizer

    from conftest import litertlm_texts
    from mtpkit.export import quant_report, sizes
    from mtpkit.export.config import ExportConfig
    from mtpkit.export.pipeline import prepare
    from mtpkit.runtime.engine import Engine, GenConfig
    from mtpkit.runtime.manifest import load_manifest

    float_export = litert_exports("e2b_gemma4_centroid")
    root = tmp_path_factory.mktemp("low_bits")
    flags = dict(load_manifest(float_export).export["flags"])
    cfg, sources, adapters, configs = prepare(ExportConfig(**{**flags, "quant": "mobile", "drafter_quant": None,
                                                              "ple_quant": None, "out": root / "plan", "dry_run": True}))
    low_bit = adapters[0].low_bit_order(configs[0])
    assert low_bit
    folder = quant_report.derive_quantized(float_export, root, ("mobile", "mobile"), 32, low_bit=low_bit)
    manifest = load_manifest(folder)
    for backend in sizes.backend_plans(cfg, sources, adapters, configs, low_bit).values():
        for f in backend.files:
            data = folder / f"{f.name}.data"
            written = (folder / f.name).stat().st_size + (data.stat().st_size if data.exists() else 0)
            assert abs(f.bytes - written) <= 0.03 * written, (f.name, f.bytes, written)
    for kind, two in (("litert", "int2/b"), ("onnx", "int2/b128")):
        tensors = manifest.backend(kind).options.quantization["target"]["tensors"]
        lowered = {n for n, label in tensors.items() if label.startswith(two)}
        want = {n for n in tensors if (int4.weight_key(n) or "").rsplit(".", 1)[0] in low_bit}
        assert lowered == want and want, kind
    ids = [2, 80, 81, 82, 83]
    for kind in ("onnx", "litert"):
        engine = Engine(folder, backend=kind)
        plain_ids = [t for t, _ in engine.generate(ids, GenConfig(max_new_tokens=12, mtp=False))]
        spec = [t for t, _ in engine.generate(ids, GenConfig(max_new_tokens=12, num_assistant_tokens=3))]
        assert spec == plain_ids, kind
    texts = litertlm_texts(str(folder / manifest.backend("litert").graphs["bundle"].file), 12, capfd)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    want_ids = [t for t, _ in Engine(folder, backend="litert").generate(
        [2] + tok.encode("Hello, world", add_special_tokens=False).ids, GenConfig(max_new_tokens=13, mtp=False))]
    texts = {mode: text.replace("<unk>", "") for mode, text in texts.items()}  # LiteRT-LM 0.18.1's unknown token
    assert texts[False] == tok.decode(want_ids[:12])
    assert texts[True] in (texts[False], tok.decode(want_ids))
