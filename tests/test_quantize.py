"""Quantized ONNX recipes: derived from the session's float exports (no re-export per recipe), recorded in the
manifest, run by the runtime with no flag of its own; a broken recipe fails the export's gate in one line."""

from __future__ import annotations

import collections
import dataclasses
import shutil

import numpy as np
import pytest

from conftest import VARIANTS

from mtpkit.export.recipes import recipe as recipe_named

pytestmark = pytest.mark.slow


def ops_float(src) -> collections.Counter:
    import onnx

    return collections.Counter(n.op_type for n in onnx.load(str(src / "target.onnx"), load_external_data=False).graph.node)


def _quantized_copy(src, dst, recipe, ple_bits: int = 8):
    """A copy of the float export src with its ONNX graphs quantized by `recipe` (a name, or a Recipe)."""
    from mtpkit.export import quant_report
    from mtpkit.export.backends import onnx as onnx_backend
    from mtpkit.runtime.manifest import load_manifest

    shutil.copytree(src, dst)
    manifest = load_manifest(dst)
    recipe = recipe_named(recipe) if isinstance(recipe, str) else recipe
    recipes = {"target": recipe, "drafter": recipe}
    plans = quant_report._plans(recipes, dst, manifest, None, ple_bits)  # int4's calibration, as the exporter's
    backend = onnx_backend.quantize(dst, manifest.backend("onnx"), recipes, plans=plans, ple_bits=ple_bits)
    dataclasses.replace(manifest, backends={**manifest.backends, "onnx": backend}).save(dst)
    return load_manifest(dst)  # checks every sha256 again


def assert_equal_but_near_ties(engine, ids: list[int], spec: list[int], plain: list[int], bound: float = 0.05):
    """Speculative greedy equals plain greedy, or first differs where the plain run's top-1 and top-2 logits lie
    within `bound`. A verified row differs from the same token decoded alone by ~1e-6 (summation order);
    MatMulNBits' int8 activations (accuracy_level 4) can turn that into a rounding step of ~2e-2 (docs/scale-bench.md)."""
    i = next((i for i, (a, b) in enumerate(zip(spec, plain)) if a != b), None)
    if i is None:
        assert len(spec) == len(plain)
        return
    logits = engine.target.forward(ids + plain[:i], 0)[0][-1]
    top2 = np.sort(logits)[-2:]
    assert top2[1] - top2[0] < bound, (i, float(top2[1] - top2[0]), spec, plain)


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("recipe", ["fp16", "int8", "int4"])
def test_every_recipe_runs_on_every_variant(tiny_exports, tmp_path, name, recipe):
    import onnx

    from mtpkit.runtime.engine import Engine, GenConfig

    src = tiny_exports(name)
    manifest = _quantized_copy(src, tmp_path / recipe, recipe)
    onnx_backend = manifest.backend("onnx")
    assert {g.recipe for g in onnx_backend.graphs.values()} == {recipe}
    ops = collections.Counter(n.op_type for n in onnx.load(str(manifest.path("target.onnx")),
                                                            load_external_data=False).graph.node)
    embedding = onnx_backend.options.embedding
    if recipe == "fp16":
        assert ops["Cast"] > 0 and embedding["dtype"] == "float16"
    else:  # the tied table too: lm_head MatMulNBits + GatherBlockQuantized, stored once
        assert ops["MatMulNBits"] > 0 and embedding["dtype"] == "int8"  # int4 keeps the tied table at 8 bits
        assert ops["GatherBlockQuantized"] == 2 and list(onnx_backend.options.lookup_tables.values()) == ["int8"]
        assert ops["Transpose"] < ops_float(src)["Transpose"]  # the lm_head's Transpose(W) is gone
        assert onnx_backend.options.min_onnxruntime == "1.21"  # GatherBlockQuantized's `bits` attribute
    if recipe == "int4":  # the MLP's gate / up compensated from calibration's second moment (GPTQ), nothing else
        labels = onnx_backend.options.quantization["target"]["tensors"]
        assert "int4/b32/gptq" in labels.values()
        assert not any(e.endswith("/gptq") for n, e in labels.items() if "gate_proj" not in n and "up_proj" not in n)
    float_bytes = sum(f.stat().st_size for f in (*src.glob("*.onnx*"), src / "embeddings.bin"))
    assert sum(g.bytes for g in onnx_backend.graphs.values()) < float_bytes
    engine = Engine(manifest.root)
    for ids in ([2, 80, 81, 82], [2] + list(range(40, 70))):
        plain = [t for t, _ in engine.generate(ids, GenConfig(max_new_tokens=12, mtp=False))]
        spec = [t for t, _ in engine.generate(ids, GenConfig(max_new_tokens=12, num_assistant_tokens=4))]
        assert len(plain) == 12 or plain[-1] in manifest.eos_ids  # a random model may stop at EOS
        assert_equal_but_near_ties(engine, ids, spec, plain)  # lossless on the quantized graphs themselves


def test_mobile_is_4_bit_everywhere_in_blocks_of_128_and_stays_lossless(tiny_exports, tmp_path):
    """--quant mobile on ONNX: every MatMulNBits and every table 4-bit, in ONNX Runtime's largest block (its nearest
    to LiteRT's one scale per channel), no weight kept at 8 bits, the PLE table 4-bit by default; speculative output
    equals plain on the graphs."""
    import onnx

    from mtpkit.export.recipes import CHANNELWISE_ONNX_BLOCK
    from mtpkit.runtime.engine import Engine, GenConfig

    manifest = _quantized_copy(tiny_exports("e2b_gemma4_centroid"), tmp_path / "mobile", "mobile", ple_bits=4)
    onnx_backend = manifest.backend("onnx")
    for graph in ("target.onnx", "drafter.onnx"):
        nodes = onnx.load(str(manifest.path(graph)), load_external_data=False).graph.node
        quantized = [n for n in nodes if n.op_type in ("MatMulNBits", "GatherBlockQuantized")]
        assert quantized and all({a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}["bits"] == 4
                                 and {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}["block_size"]
                                 == CHANNELWISE_ONNX_BLOCK for n in quantized), graph
    labels = onnx_backend.options.quantization["target"]["tensors"]
    assert labels and all(e.startswith(f"int4/b{CHANNELWISE_ONNX_BLOCK}") for e in labels.values())
    assert set(onnx_backend.options.lookup_tables.values()) == {"int4"}
    engine = Engine(manifest.root)
    for ids in ([2, 80, 81, 82], [2] + list(range(40, 70))):
        plain = [t for t, _ in engine.generate(ids, GenConfig(max_new_tokens=12, mtp=False))]
        spec = [t for t, _ in engine.generate(ids, GenConfig(max_new_tokens=12, num_assistant_tokens=4))]
        assert_equal_but_near_ties(engine, ids, spec, plain)


def test_int8_dynamic_quantizes_every_weight_matmul_and_stays_lossless(tiny_exports, tmp_path):
    """int8-dynamic: ORT's quantize_dynamic on the weight MatMuls (MatMulInteger), the tied table at 8 bits once
    (lm_head MatMulNBits + GatherBlockQuantized over embeddings.bin), the PLE table at --ple-quant; the manifest
    records the recipe, the schema accepts it, and the runtime runs it with no flag.

    Speculative output is not asserted equal to plain, unlike the other recipes: activations get one scale per
    call, so a verified token's logits depend on the tokens verified with it (docs/scale-bench.md)."""
    import json

    import onnx

    from mtpkit.export import fidelity
    from mtpkit.runtime.manifest import Manifest
    from mtpkit.runtime.engine import Engine, GenConfig

    manifest = _quantized_copy(tiny_exports("e2b_gemma4_centroid"), tmp_path / "dyn", "int8-dynamic")
    Manifest.read(json.loads(manifest.path("manifest.json").read_text()))  # every field and reference checked
    onnx_backend = manifest.backend("onnx")
    assert {g.recipe for g in onnx_backend.graphs.values()} == {"int8-dynamic"}
    assert onnx_backend.options.embedding["dtype"] == "int8"
    assert list(onnx_backend.options.lookup_tables.values()) == ["int8"]
    for name in ("target", "drafter"):
        graph = onnx.load(str(manifest.path(f"{name}.onnx")), load_external_data=False).graph
        weights = {t.name for t in graph.initializer}
        weights |= {n.output[0] for n in graph.node if n.op_type == "Transpose" and n.input[0] in weights}
        assert not [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights]  # none left float
        ops = collections.Counter(n.op_type for n in graph.node)
        assert ops["MatMulInteger"] > 0 and ops["DynamicQuantizeLinear"] > 0
    assert (ops["MatMulNBits"], ops["GatherBlockQuantized"]) == (0, 1)  # no tied table; the centroid head's table
    target_ops = collections.Counter(n.op_type for n in onnx.load(str(manifest.path("target.onnx")),
                                                                    load_external_data=False).graph.node)
    assert (target_ops["MatMulNBits"], target_ops["GatherBlockQuantized"]) == (1, 2)  # lm_head; token + PLE lookups
    engine = Engine(manifest.root)
    for ids in ([2, 80, 81, 82], [2] + list(range(40, 70))):
        plain = [t for t, _ in engine.generate(ids, GenConfig(max_new_tokens=12, mtp=False))]
        spec = [t for t, _ in engine.generate(ids, GenConfig(max_new_tokens=12, num_assistant_tokens=4))]
        assert all(len(out) == 12 or out[-1] in manifest.eos_ids for out in (plain, spec))
        assert spec[0] == plain[0]  # the same prefill call
    missed = {"target_recipe": "int8-dynamic", "teacher_forced": {"top1_agreement": 0.9, "positions": 10}}
    message, = fidelity._gate_failure("onnx", missed)
    assert "below the int8-dynamic gate 0.95" in message and "--quant int8)" in message


@pytest.mark.parametrize("recipe", ["int8", "int4", "int4-rtn", "int8-dynamic"])
def test_the_drafters_centroid_table_is_4_bit_under_every_int_recipe(tiny_exports, tmp_path, recipe):
    """The centroid head's table is read by a Gather alone, which no MatMul quantizer reaches: it becomes
    GatherBlockQuantized at the recipe's draft_table_bits (4) with float16 scales (its rows cast back to float32),
    named in the manifest, and the drafter is smaller than under the same recipe with that table float32 by 7/8 of
    it, less its scales."""
    import onnx

    src = tiny_exports("e2b_gemma4_centroid")
    manifest = _quantized_copy(src, tmp_path / recipe, recipe)
    onnx_backend = manifest.backend("onnx")
    graph = onnx.load(str(manifest.path("drafter.onnx")), load_external_data=False).graph
    lookup, = [n for n in graph.node if n.op_type == "GatherBlockQuantized"]
    assert {a.name: onnx.helper.get_attribute_value(a) for a in lookup.attribute} == dict(
        gather_axis=0, quantize_axis=1, block_size=32, bits=4)
    floats = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2}
    assert not [n for n in graph.node if n.op_type in ("Gather", "GatherND") and n.input[0] in floats]  # none left
    reshape = next(n for n in graph.node if lookup.input[0] in n.output)
    initializers = {t.name: t for t in graph.initializer}
    codes, scales = initializers[reshape.input[0]], initializers[lookup.input[2]]
    rows, blocks, blob = codes.dims
    assert codes.data_type == onnx.TensorProto.UINT8 and blob == 32 * 4 // 8 and list(scales.dims) == [rows, blocks]
    assert scales.data_type == onnx.TensorProto.FLOAT16  # a lookup-only table: half the scale bytes
    cast, = [n for n in graph.node if lookup.output[0] in n.input]
    assert cast.op_type == "Cast" and onnx.helper.get_attribute_value(cast.attribute[0]) == onnx.TensorProto.FLOAT
    tables = onnx_backend.options.quantization["drafter"]["tables"]
    assert list(tables.values()) == ["int4/b32"] and onnx_backend.options.min_onnxruntime == "1.21"
    kept = _quantized_copy(src, tmp_path / "kept", dataclasses.replace(recipe_named(recipe), draft_table_bits=None))
    assert "tables" not in (kept.backend("onnx").options.quantization or {}).get("drafter", {})
    saved = kept.backend("onnx").graphs["drafter"].bytes - onnx_backend.graphs["drafter"].bytes
    width = blocks * 32  # the tiny drafter's hidden size is a multiple of the block
    expected = 4 * rows * width * 7 // 8 - 2 * rows * blocks  # 4-bit codes, a float16 scale per block of 32
    assert abs(saved - expected) < 4096 + 1024, (saved, expected)  # the external data's alignment, the new nodes


def test_litert_takes_int8_dynamic_as_its_int8(tmp_path, monkeypatch):
    """LiteRT's int8 (dynamic range) quantizes activations at run time already: its int8 runs."""
    from mtpkit.export.backends.litert import quantization as litert_quant
    from mtpkit.runtime.manifest import Backend, GraphFile, LiteRtOptions

    class Quantized(Exception):
        pass

    def quantize_tflite(path, name, recipe, block_size, ple_bits=8, plan=None):
        raise Quantized(name, recipe.name)

    monkeypatch.setattr(litert_quant, "_quantize_tflite", quantize_tflite)
    options = LiteRtOptions(max_draft=3, mask={"hidden": -1e9}, prefill=[{"num_tokens": 8, "signature": "prefill_8"}],
                            bundle={"file": "model.litertlm"})
    backend = Backend("litert", "state", {"target": GraphFile("target.tflite", "0", 1, "litert")}, {}, options)
    with pytest.raises(Quantized) as seen:
        dynamic = recipe_named("int8-dynamic")
        litert_quant.quantize(tmp_path, backend, {"target": dynamic, "drafter": dynamic})
    assert seen.value.args == ("target", "int8")


def test_fp16_embedding_is_read_by_the_host_from_the_same_bytes(tiny_exports, tmp_path):
    from mtpkit.runtime.backends.onnx import Embeddings

    manifest = _quantized_copy(tiny_exports("e2b_gemma4_centroid"), tmp_path / "fp16", "fp16")
    e = manifest.backend("onnx").options.embedding
    table = np.fromfile(manifest.path(e["file"]), dtype=np.float16).reshape(e["shape"])
    lookup = Embeddings(manifest, manifest.backend("onnx"))
    np.testing.assert_array_equal(lookup(7)[0, 0], table[7].astype(np.float32) * np.float32(e["scale"]))


def test_a_broken_recipe_fails_the_gate_in_one_line(tiny_checkpoints, tmp_path, monkeypatch, capsys):
    from mtpkit import cli
    from mtpkit.export import int4

    real = int4.encode

    def broken(*args, **kwargs):  # int4 with every block scale negated and tripled
        codes, scales = real(*args, **kwargs)
        return codes, -3 * scales

    monkeypatch.setattr(int4, "encode", broken)
    target, drafter = tiny_checkpoints("e2b_gemma4_centroid")
    out = tmp_path / "broken"
    code = cli.main(["-q", "export", str(target), "--drafter", str(drafter), "--out", str(out), "--quant", "int4",
                     "--max-cache-len", "128", "--reference-tokens", "8", "--no-check"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "int4 target: teacher-forced top-1 agreement" in err and "--no-quality-gate" in err
    assert not out.exists() and not list(tmp_path.glob(".broken.partial-*"))  # nothing half-written


def test_quant_report_derives_pairs_from_one_float_export_and_tabulates_them(tiny_exports, tmp_path):
    from mtpkit.export import quant_report
    from mtpkit.runtime.manifest import load_manifest

    float_dir = tiny_exports("e2b_gemma4_centroid")
    assert quant_report.derive_quantized(float_dir, tmp_path, ("fp32", "fp32"), 32) == float_dir
    folder = quant_report.derive_quantized(float_dir, tmp_path, ("int4", "int8"), 64)
    graphs = load_manifest(folder).backend("onnx").graphs
    assert (graphs["target"].recipe, graphs["drafter"].recipe) == ("int4", "int8")
    row = {"bytes": {"target": 2e6, "drafter": 1e6}, "teacher_forced": {"top1_agreement": 0.9, "mean_kl": 0.01,
                                                                        "max_abs_logit": 1.0},
           "runtime": {"greedy_prefix_match": 0.5, "acceptance": 0.25, "tokens_per_target_call": 2.0},
           "plain_ms_per_token": 2.0, "speculative_ms_per_token": 1.0}
    rows = [{**row, "backend": kind, "target_recipe": t, "drafter_recipe": d, "plain_ms_per_token": ms}
            for kind, t, d, ms in [("onnx", "fp32", "fp32", 2.0), ("onnx", "int4", "int8", 0.5),
                                   ("litert", "fp32", "fp32", 3.0), ("litert", "int8", "fp32", 1.0)]]
    rows[1]["heldout"] = {"teacher_forced": {"top1_agreement": 0.954, "top1_stderr": 0.0041, "mean_kl": 0.003},
                          "runtime": {"greedy_prefix_match": 0.7}}  # held-out top-1 with its standard error
    table = quant_report.markdown({"rows": rows}).splitlines()
    assert len(table) == 6 and table[3].startswith("| onnx | int4 | int8 | 3.00 | 0.900 |") and "| 4.00x |" in table[3]
    assert table[3].endswith("| 0.954 ± 0.004 | 3.0e-03 | 0.70 |") and table[2].endswith("| - | - | - |")
    assert table[5].startswith("| litert | int8 | fp32 |") and "| 3.00x |" in table[5]  # against LiteRT's own fp32
    quant_report._plots(rows, tmp_path)
    assert (tmp_path / "size_vs_top1.png").stat().st_size > 0 and (tmp_path / "acceptance.png").stat().st_size > 0


def test_unknown_recipe_names_are_refused_in_one_line():
    from mtpkit.export.config import ExportConfig

    with pytest.raises(ValueError, match=r"unknown --drafter-quant recipe 'int44' \(did you mean 'int4'\?\)"):
        ExportConfig(target="t", drafter="d", out="/nonexistent/x", drafter_quant="int44")
    with pytest.raises(ValueError, match="--block-size must be one of 32, 64, 128"):
        ExportConfig(target="t", drafter="d", out="/nonexistent/x", quant="int4", block_size=48)


def test_int8_dynamic_is_accepted_and_its_memory_estimated():
    from types import SimpleNamespace

    from mtpkit.export import preflight
    from mtpkit.export.config import ExportConfig

    with pytest.raises(ValueError, match=r"unknown --quant recipe 'int8-dynamc' \(did you mean 'int8-dynamic'\?\)"):
        ExportConfig(target="t", drafter="d", out="/nonexistent/x", quant="int8-dynamc")
    cfg = ExportConfig(target="t", drafter="d", out="/nonexistent/x", quant="int8-dynamic")
    assert (cfg.quant, cfg.drafter_quant) == ("int8-dynamic", "int4")  # the drafter's default under 8 bits
    w = preflight.Weights(target=10**8, drafter=10**6, ple=4 * 10**7, converted=0)
    plans = {q: SimpleNamespace(backend=("onnx",), quant=q, drafter_quant=q, ple_quant="int8", check=True,
                                block_size=32, recipes={"target": recipe_named(q), "drafter": recipe_named(q)},
                                quantized=True) for q in ("int8", "int8-dynamic")}
    quantize = {q: preflight.phases(plan, w)["quantize"] for q, plan in plans.items()}
    assert quantize["int8-dynamic"] > quantize["int8"]  # quantize_dynamic reads its own copy of the float graph


def test_a_4_bit_ple_table_only_when_asked_and_its_cost_is_measured(tiny_exports, tiny_checkpoints, tmp_path):
    """--ple-quant int4: the PLE table's GatherBlockQuantized at 4 bits, recorded; the fidelity figures of both."""
    import json

    from mtpkit.export import fidelity, quant_report
    from mtpkit.export.config import ExportConfig
    from mtpkit.export.checkpoint import resolve
    from mtpkit.export.models import target_adapter
    from mtpkit.runtime.engine import Engine, GenConfig
    from mtpkit.runtime.manifest import load_manifest

    src = tiny_exports("e2b_gemma4_centroid")
    folders = {bits: quant_report.derive_quantized(src, tmp_path, ("int4", "int4"), 32, ple_bits=bits)
               for bits in (8, 4)}
    tables = {bits: load_manifest(f).backend("onnx").options.lookup_tables for bits, f in folders.items()}
    assert list(tables[8].values()) == ["int8"] and list(tables[4].values()) == ["int4"]
    graph_bytes = {bits: sum(g.bytes for g in load_manifest(f).backend("onnx").graphs.values())
                   for bits, f in folders.items()}
    assert graph_bytes[4] < graph_bytes[8]  # the PLE table's codes at half the bytes
    target = target_adapter(source := resolve(str(tiny_checkpoints("e2b_gemma4_centroid")[0]), "target")).load(source)
    reference = json.loads((src / "reference.json").read_text())
    figures = {bits: fidelity.teacher_forced(f, target, reference) for bits, f in folders.items()}
    assert all(0 < f["top1_agreement"] <= 1 for f in figures.values())
    assert figures[4]["mean_kl"] != figures[8]["mean_kl"]  # the 4-bit table changed the logits: a cost to read
    ids = [2] + list(range(40, 70))
    engine = Engine(folders[4])
    plain = [t for t, _ in engine.generate(ids, GenConfig(max_new_tokens=12, mtp=False))]
    spec = [t for t, _ in engine.generate(ids, GenConfig(max_new_tokens=12, num_assistant_tokens=4))]
    assert_equal_but_near_ties(engine, ids, spec, plain)
    with pytest.raises(ValueError, match=r"unknown --ple-quant recipe 'int2'"):
        ExportConfig(target="t", drafter="d", out="/nonexistent/x", quant="int4", ple_quant="int2")
