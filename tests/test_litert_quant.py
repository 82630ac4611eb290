"""Quantized LiteRT graphs: fp16 / int8 / int4 derived from ONE float LiteRT export by
export.backends.litert.quantize, run by the mtpkit runtime (plain and speculative) and, for int8 / int4, by the
LiteRT-LM runtime from the rebuilt .litertlm with speculative decoding on."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")
pytest.importorskip("litert_torch")

from conftest import LITERT_VARIANTS, litertlm_texts, load_tool, planned_and_written  # noqa: E402
from mtpkit.export.backends import litert as backend  # noqa: E402
from mtpkit.export import quant_report  # noqa: E402
from mtpkit.export.backends.litert import bundle as litert_bundle  # noqa: E402
from mtpkit.export.backends.litert import quantization as litert_quant  # noqa: E402
from mtpkit.runtime.engine import Engine, GenConfig  # noqa: E402
from mtpkit.runtime.manifest import load_manifest  # noqa: E402
from mtpkit.runtime.stats import Stats  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.litert]
PROMPTS = [[2, 80, 81, 82], [2] + list(range(40, 70))]  # the second crosses the sliding window (8)
MAX_NEW = 12
TFLITE = ("target", "embedder", "per_layer_embedder", "drafter")
# what each recipe leaves in each graph, with --drafter-quant's default: int4 keeps the per-layer-embedding table and
# the tied embedding table at 8 bits (so the embedder, which holds only the latter, is int8); int8's drafter is int4
EXPECTED = {"fp16": dict.fromkeys(TFLITE, "fp16"), "int8": {**dict.fromkeys(TFLITE, "int8"), "drafter": "int4"},
            "int4": {"target": "int4", "embedder": "int8", "per_layer_embedder": "int8", "drafter": "int4"},
            "mobile": dict.fromkeys(TFLITE, "mobile")}  # every table 4-bit, one scale per row
# embedding tables are nearly all weights: their files shrink about as the bits do (4-bit blocks carry fp16 scales)
TABLE_RATIO = {"fp16": 0.55, "int8": 0.40, "int4": 0.25, "mobile": 0.25}


@pytest.fixture(scope="module", params=LITERT_VARIANTS)
def float_export(request, litert_exports):
    """The float LiteRT export every recipe below is derived from (shared with test_litert_runtime.py)."""
    return litert_exports(request.param)


def derive(float_export, root, recipes: dict, block_size: int = 32):
    """quant-report's derivation: copy the float export and quantize every backend in it (ONNX and LiteRT), then
    reload the manifest (sha256 re-checked). Returns (folder, manifest)."""
    folder = quant_report.derive_quantized(float_export, root, (recipes["target"], recipes["drafter"]), block_size)
    return folder, load_manifest(folder)


@pytest.fixture(scope="module", params=list(EXPECTED))
def quantized(request, float_export, tmp_path_factory):
    from mtpkit.export.recipes import drafter_default
    from mtpkit.export.recipes import recipe as recipe_named

    recipe = request.param  # with the drafter's default recipe, as `mtpkit export --quant RECIPE` writes it
    return recipe, *derive(float_export, tmp_path_factory.mktemp(f"litert_{recipe}"),
                           {"target": recipe, "drafter": drafter_default(recipe_named(recipe))})


def greedy(folder, ids: list[int], mtp: bool, stats: Stats | None = None, max_new: int = MAX_NEW) -> list[int]:
    cfg = GenConfig(max_new_tokens=max_new, mtp=mtp, num_assistant_tokens=3)
    return [t for t, _ in Engine(folder, backend="litert").generate(ids, cfg, stats)]


def test_graphs_carry_the_recipe_and_shrink(quantized, float_export):
    recipe, folder, manifest = quantized
    lite, float_lite = manifest.backend("litert"), load_manifest(float_export).backend("litert")
    sizes = {}
    for name in TFLITE:
        graph, before = lite.graphs[name], float_lite.graphs[name]
        assert graph.recipe == EXPECTED[recipe][name]
        assert graph.bytes == (folder / graph.file).stat().st_size < before.bytes
        sizes[name] = (before.bytes, graph.bytes)
    print(recipe, sizes)
    for table in ("embedder", "per_layer_embedder"):
        float_bytes, q_bytes = sizes[table]
        assert q_bytes < TABLE_RATIO[EXPECTED[recipe][table]] * float_bytes, (table, sizes[table])
    assert lite.graphs["bundle"].recipe == recipe
    assert lite.graphs["bundle"].bytes < float_lite.graphs["bundle"].bytes
    assert lite.options.bundle["section_recipes"]["tf_lite_mtp_drafter"] == EXPECTED[recipe]["drafter"]
    assert {lite.options.quantization[n]["recipe"] for n in TFLITE} == set(EXPECTED[recipe].values())
    # weights only: every signature (names, shapes, dtypes, roles; the KV cache float32) is the float one
    assert lite.signatures == float_lite.signatures
    assert {t.dtype for t in lite.signatures["decode"].inputs if t.role.startswith("kv_")} == {"float32"}


def test_the_drafters_centroid_table_is_4_bit_under_the_int_recipes(quantized, float_export, tmp_path):
    """The centroid head reads its table through EMBEDDING_LOOKUP, which the graft quantizes: INT4 blockwise under
    the int recipes (each one's draft_table_bits), float16 under fp16, named in the manifest. The drafter is smaller
    than the same recipe with that table float32 by 7/8 of the table, less its float16 scales."""
    import dataclasses
    import shutil

    from ai_edge_litert import schema_py_generated as schema

    from mtpkit.export.backends.litert import graft, sources
    from mtpkit.export.recipes import recipe as recipe_named

    recipe, folder, manifest = quantized
    lite, file = manifest.backend("litert"), load_manifest(float_export).backend("litert").graphs["drafter"].file
    model = schema.ModelT.InitFromPackedBuf(graft.read_map(float_export / file), 0)
    uses = graft.weight_uses(model, graft.find_weights(model))
    tables = [name for name, used in uses.items() if used == {litert_quant.LOOKUP}]
    if not tables:  # a dense head: its lm_head is a FULLY_CONNECTED weight like the others
        assert "tables" not in lite.options.quantization["drafter"]
        return
    table, = tables
    drafter_recipe = recipe_named(EXPECTED[recipe]["drafter"])  # the drafter's own (int4 under int8)
    bits = drafter_recipe.draft_table_bits
    data = (folder / lite.graphs["drafter"].file).read_bytes()
    quantized_model = schema.ModelT.InitFromPackedBuf(data, 0)
    tensor = next(t for t in quantized_model.subgraphs[0].tensors if t.name.decode() == graft.WEIGHT + table)
    rows, width = (int(x) for x in tensor.shape)
    if bits is None:
        assert tensor.type == schema.TensorType.FLOAT16
        assert lite.options.quantization["drafter"]["tables"] == {table: "float16"}
        return
    block = width if drafter_recipe.channelwise else 32  # mobile: one block per row
    assert bits == 4 and tensor.type == schema.TensorType.INT4 and tensor.quantization.details.blockSize == block
    assert quantized_model.buffers[tensor.buffer].size == rows * width // 2
    assert lite.options.quantization["drafter"]["tables"] == {table: f"int4/b{block}"}
    kept = tmp_path / "kept.tflite"  # the same recipe, the table alone float32
    shutil.copy(float_export / file, kept)
    float_table = dataclasses.replace(drafter_recipe, draft_table_bits=None)
    graft.graft(kept, kept, sources.GraftedSource(kept, schema.ModelT.InitFromPackedBuf(graft.read_map(kept), 0)),
                litert_quant.encoding_for(float_table, "drafter", 32, 8))
    saved = kept.stat().st_size - len(data)
    expected = 4 * rows * width * 7 // 8 - 2 * rows * width // block  # 4-bit codes, a float16 scale per block
    # the rest: alignment, and the scales' tensor entry in each signature's subgraph
    assert abs(saved - expected) < 256 * len(quantized_model.subgraphs), (saved, expected)


TABLE = "model.model.language_model.embed_tokens.weight"  # the tied table: the embedder's lookup, the lm_head


def _sections(path) -> dict[str, tuple[int, int]]:
    from ai_edge_quantizer.utils import litertlm_utils

    bundle = litertlm_utils.LiteRTLMFile(path)
    return {bundle.get_model_type(i): (s.beginOffset, s.endOffset) for i, s in enumerate(bundle.sections)
            if s.dataType == litertlm_utils.AnySectionDataType.TFLiteModel}


def _decode_outputs(**model) -> dict[str, np.ndarray]:
    """The decode signature's outputs for fixed inputs (a small random cache and embeddings, position 3)."""
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(**model).get_signature_runner("decode")
    rng = np.random.default_rng(0)
    feeds = {name: (rng.standard_normal(d["shape"]) * 0.1).astype(d["dtype"]) if np.issubdtype(d["dtype"], np.floating)
             else np.full(d["shape"], 3, d["dtype"]) for name, d in runner.get_input_details().items()}
    return runner(**feeds)


def test_the_bundle_stores_the_tied_table_once_and_each_section_runs_as_its_file(quantized):
    from ai_edge_litert import schema_py_generated as schema

    recipe, folder, manifest = quantized
    lite = manifest.backend("litert")
    path = folder / lite.graphs["bundle"].file
    sections, raw = _sections(path), path.read_bytes()
    assert set(sections) == set(litert_bundle.BUNDLE_SECTIONS.values())
    shared = lite.options.bundle["shared"]  # the tied table's data (and a 4-bit table's scales buffer)
    assert set(shared) == {"tf_lite_prefill_decode"} and set(shared["tf_lite_prefill_decode"]) == {"tf_lite_embedder"}
    assert TABLE in shared["tf_lite_prefill_decode"]["tf_lite_embedder"]
    for name, section in litert_bundle.BUNDLE_SECTIONS.items():
        begin, end = sections[section]
        file = (folder / lite.graphs[name].file).read_bytes()
        if section not in shared:
            assert raw[begin:end] == file, section
    begin, end = sections["tf_lite_prefill_decode"]
    assert end == sections["tf_lite_embedder"][1]  # the target's range reaches over the embedder's table
    target = folder / lite.graphs["target"].file
    model = schema.ModelT.InitFromPackedBuf(raw[begin:end], 0)
    places = {t.name.decode(): int(model.buffers[t.buffer].offset) for sg in model.subgraphs for t in sg.tensors}
    assert places["w:" + TABLE] > sections["tf_lite_embedder"][0] - begin  # read from the embedder's section
    want, got = _decode_outputs(model_path=str(target)), _decode_outputs(model_content=raw[begin:end])
    assert set(want) == set(got) and all(np.array_equal(want[k], got[k]) for k in want)


def test_a_weight_whose_bytes_differ_is_not_shared(litert_exports, tmp_path):
    import shutil
    from pathlib import Path

    folder = litert_exports(LITERT_VARIANTS[0])  # the float export: its bundle stores the float32 table once
    assert TABLE in load_manifest(folder).backend("litert").options.bundle["shared"]["tf_lite_prefill_decode"][
        "tf_lite_embedder"]
    copy = Path(shutil.copytree(folder, tmp_path / "copy"))
    embedder = bytearray((copy / "embedder.tflite").read_bytes())
    embedder[-1] ^= 0xFF  # the table's last byte: same name and size, other bytes
    (copy / "embedder.tflite").write_bytes(bytes(embedder))
    files = {s: copy / f"{n}.tflite" for n, s in litert_bundle.BUNDLE_SECTIONS.items()}
    assert litert_bundle.rebuild_bundle(copy / "model.litertlm", files).shared == {}
    begin, end = _sections(copy / "model.litertlm")["tf_lite_prefill_decode"]
    assert (copy / "model.litertlm").read_bytes()[begin:end] == (copy / "target.tflite").read_bytes()
    assert not list(copy.glob(".*"))  # no temporary left


def test_speculative_equals_plain_on_the_quantized_graphs(quantized, float_export):
    recipe, folder, _ = quantized
    if recipe in ("int8", "int4"):  # per-row activation scales, integer accumulation: exact, no near-tie exception
        assert verified_rows_differing(folder, "litert") == 0
    for ids in PROMPTS:
        plain = greedy(folder, ids, mtp=False)
        stats = Stats()
        assert len(plain) == MAX_NEW or plain[-1] in load_manifest(folder).eos_ids  # a random model may stop early
        assert greedy(folder, ids, mtp=True, stats=stats) == plain
        assert stats.drafter_calls > 0 or len(plain) == 1
        if recipe == "fp16":  # float16 weights move logits by ~1e-2: greedy may only flip at a float near-tie
            want = greedy(float_export, ids, mtp=False)
            i = next((i for i, (a, b) in enumerate(zip(plain, want)) if a != b), None)
            assert i is None or _float_margin(float_export, ids + want[:i]) < 0.05, (i, plain, want)


def _float_margin(folder, ids: list[int]) -> float:
    """Top-1 minus top-2 logit of the float LiteRT target after ids."""
    logits = Engine(folder, backend="litert").target.forward(ids, 0)[0][-1]
    top2 = np.sort(logits)[-2:]
    return float(top2[1] - top2[0])


def test_fidelity_is_measured_and_gated_on_the_litert_graphs(quantized):
    """The export's gate applies to each backend: teacher-forced figures through the LiteRT graphs themselves."""
    from mtpkit.export import fidelity
    from mtpkit.export.checkpoint import resolve
    from mtpkit.export.models import target_adapter

    recipe, folder, manifest = quantized
    source = resolve(manifest.source["target"]["ref"], "target")
    target = target_adapter(source).load(source)
    reference = json.loads((folder / "reference.json").read_text())
    lite = fidelity.teacher_forced(folder, target, reference, "litert")
    onnx = fidelity.teacher_forced(folder, target, reference, "onnx")
    assert lite["positions"] == onnx["positions"] == sum(len(p["greedy_ids"]) for p in reference["prompts"])
    assert 0 < lite["top1_agreement"] <= 1 and 0 < lite["max_abs_logit"] and lite["mean_kl"] >= 0
    if recipe == "fp16":  # a random tiny model's logits are near-flat: near-ties may flip (0.990 measured)
        assert lite["top1_agreement"] >= 0.95
    failing = {"target_recipe": recipe, "teacher_forced": {**lite, "top1_agreement": 0.5}}
    message, = fidelity._gate_failure("litert", failing)
    assert message.startswith(f"litert {recipe} target: teacher-forced top-1 agreement with the float model is 0.500")
    assert "--no-quality-gate" in message and "\n" not in message
    assert fidelity._gate_failure("litert", {"target_recipe": recipe, "teacher_forced": {**lite, "top1_agreement": 1.0}}) == []


def _within_tolerance(sizes: dict) -> None:
    for file, (planned, written) in sizes.items():
        assert abs(planned - written) <= 0.03 * written, (file, planned, written)


def test_the_size_plan_holds_every_float_file(float_export, tmp_path):
    """`mtpkit export --dry-run` with the flags the float export was made with: every file of both backends within
    3% of the written one."""
    sizes, _ = planned_and_written(float_export, "fp32", tmp_path / "plan")
    assert {"target.tflite", "model.litertlm", "target.onnx", "embeddings.bin"} <= set(sizes)
    _within_tolerance(sizes)


def test_the_size_plan_holds_every_quantized_file_and_encoding(quantized, tmp_path):
    """The same under each recipe: every file within 3%, and each graph's weights encoded as its quantizer
    encoded them (LiteRT's counts per encoding; under int4, ONNX's MatMul weights and tables), the int4 plan's
    8-bit choices included."""
    recipe, folder, manifest = quantized
    sizes, plan = planned_and_written(folder, recipe, tmp_path / "plan")
    _within_tolerance(sizes)
    planned = {f.name: f.encodings for b in plan.backends.values() for f in b.files}
    for name in TFLITE:
        recorded = collections.Counter()
        for label, n in manifest.backend("litert").options.quantization[name]["weights"].items():
            recorded[label.removesuffix("/gptq")] += n
        assert planned[f"{name}.tflite"] == dict(recorded), name
    options = manifest.backend("onnx").options
    if "target" in (options.quantization or {}):  # int4 / mobile: each MatMul weight's and table's encoding recorded
        from mtpkit.export.recipes import CHANNELWISE_ONNX_BLOCK
        from mtpkit.export.recipes import recipe as recipe_named

        block = CHANNELWISE_ONNX_BLOCK if recipe_named(recipe).channelwise else 32
        labels = options.quantization["target"]["tensors"].values()
        recorded = collections.Counter(label.removesuffix("/gptq") for label in labels)
        recorded.update(f"{bits}/b{block}" for bits in options.lookup_tables.values())
        quantized_files = collections.Counter(planned["target.onnx"]) + collections.Counter(planned["embeddings.bin"])
        assert {k: v for k, v in quantized_files.items() if k.startswith("int")} == dict(recorded)


def test_quantizing_again_changes_nothing(quantized):
    from mtpkit.export.recipes import recipe as recipe_named

    recipe, folder, manifest = quantized
    lite = manifest.backend("litert")
    before = {n: (folder / g.file).read_bytes() for n, g in lite.graphs.items()}
    same = {"target": recipe_named(recipe), "drafter": recipe_named(EXPECTED[recipe]["drafter"])}
    assert backend.quantize(folder, lite, same) == lite
    assert {n: (folder / g.file).read_bytes() for n, g in lite.graphs.items()} == before


@pytest.mark.parametrize("recipe", ["int8", "int4", "mobile"])
def test_litertlm_runs_the_quantized_bundle_with_speculation(recipe, float_export, tmp_path_factory, capfd):
    from tokenizers import Tokenizer

    folder, manifest = derive(float_export, tmp_path_factory.mktemp(f"litertlm_{recipe}"),
                              {"target": recipe, "drafter": recipe})
    path = str(folder / manifest.backend("litert").graphs["bundle"].file)
    texts = litertlm_texts(path, MAX_NEW, capfd)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = [2] + tok.encode("Hello, world", add_special_tokens=False).ids  # what LiteRT-LM prefills (bos added)
    want = greedy(folder, ids, mtp=False, max_new=MAX_NEW + 1)  # mtpkit's runtime on the same quantized .tflite
    print(recipe, "plain", repr(texts[False]), "speculative", repr(texts[True]))
    # LiteRT-LM 0.18.1 writes the unknown token as "<unk>", which tokenizers' decode skips as special
    texts = {mode: text.replace("<unk>", "") for mode, text in texts.items()}
    assert texts[False] == tok.decode(want[:MAX_NEW])
    # LiteRT-LM 0.18.1 may emit one token past max_output_tokens with speculation (it commits whole rounds).
    assert texts[True] in (texts[False], tok.decode(want))


def test_int4_picks_the_block_per_tensor_where_the_width_is_not_a_multiple(float_export, tmp_path_factory):
    """Block 128 on the tiny pair: the drafter's inputs are 32 and 64 wide (int4 blockwise needs whole blocks);
    those weights fall back to the largest block that divides them."""
    folder, manifest = derive(float_export, tmp_path_factory.mktemp("litert_int4_b128"),
                              {"target": "int4", "drafter": "int4"}, block_size=128)
    detail = manifest.backend("litert").options.quantization["drafter"]
    assert detail["block_size"] == 128
    int4 = {k for k in detail["weights"] if k.startswith("int4")}
    assert {"int4/b32", "int4/b64"} <= int4 <= {"int4/b32", "int4/b64", "int4/b128"}  # 32 / 64: hidden, backbone
    ids = PROMPTS[1]
    assert greedy(folder, ids, mtp=True) == greedy(folder, ids, mtp=False)


def test_zero_int4_blocks_get_a_positive_scale(tmp_path):
    """XNNPACK refuses an INT4 weight with a zero scale (the pad row of the tied embedding): an all-zero block is
    written with the smallest positive float16 scale and values exactly zero, and the graph runs."""
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.interpreter import Interpreter
    import torch

    from conftest import grafted_linear
    from mtpkit.export.backends.litert import graft

    linear = torch.nn.Linear(64, 8, bias=False)
    with torch.no_grad():
        linear.weight[0] = 0  # an all-zero output channel: two all-zero blocks of 32
    path, done, _ = grafted_linear(linear, graft.Encoding("int4", 32), tmp_path)
    assert done == {"weight": "int4/b32"}
    data = path.read_bytes()
    model = schema.ModelT.InitFromPackedBuf(data, 0)
    tensors = model.subgraphs[0].tensors
    weight = next(t for t in tensors if t.type == schema.TensorType.INT4)
    scales = tensors[weight.quantization.details.scales]
    at = model.buffers[scales.buffer]
    assert (np.frombuffer(data, np.float16, 16, at.offset)[:2] == np.finfo(np.float16).tiny).all()
    at = model.buffers[weight.buffer]
    assert not np.frombuffer(data, np.uint8, 32, at.offset).any()  # row 0: 64 int4 values, two per byte
    runner = Interpreter(model_content=data).get_signature_runner("fc")
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    y = next(iter(runner(input=x).values()))
    assert y[0, 0] == 0 and np.abs(y[0, 1:] - (x @ linear.weight.detach().numpy().T)[0, 1:]).max() < 0.5


def test_litert_accepts_quantized_recipes(tmp_path):
    from mtpkit.export.config import ExportConfig

    cfg = ExportConfig(target="t", drafter="d", out=tmp_path / "out", backend="litert", quant="int4",
                       drafter_quant="int8", block_size=64)
    assert cfg.backend == ("litert",) and (cfg.quant, cfg.drafter_quant) == ("int4", "int8")


def verified_rows_differing(folder, backend: str, trials: int = 8, k: int = 4) -> int:
    """Logit rows of verify calls (k + 1 tokens) that differ, in any bit, from the same tokens decoded one at a time
    at the same positions (tools/lossless_check.py rows_differing): 0 means speculation cannot change a greedy
    token, not even at a near-tie."""
    rows_differing = load_tool("lossless_check").rows_differing
    target = Engine(folder, backend=backend).target
    rng, vocab, differing = np.random.default_rng(0), load_manifest(folder).model.vocab_size, 0
    for trial in range(trials):
        ids = [2, *rng.integers(3, vocab, 20 + trial + k + 1).tolist()]  # a prompt, then k + 1 tokens to verify
        differing += rows_differing(target, ids, k)[0]
    return differing


def test_a_4_bit_ple_table_on_litert_only_when_asked(float_export, tmp_path_factory):
    """--ple-quant int4 on LiteRT: the per-layer embedder and the target's per-layer projections at 4 bits,
    recorded; the graphs run and speculation stays lossless on them."""
    folder = quant_report.derive_quantized(float_export, tmp_path_factory.mktemp("litert_ple4"), ("int4", "int4"), 32,
                                           ple_bits=4)
    lite = load_manifest(folder).backend("litert")
    assert lite.graphs["per_layer_embedder"].recipe == "int4"
    target = lite.options.quantization["target"]["tensors"]
    assert {e for name, e in target.items() if name.endswith("per_layer_projection.weight")} == {"int4/b32"}
    eight_folder = quant_report.derive_quantized(float_export, tmp_path_factory.mktemp("litert_ple8"),
                                                 ("int4", "int4"), 32)
    eight = load_manifest(eight_folder).backend("litert")
    assert lite.graphs["per_layer_embedder"].bytes < 0.7 * eight.graphs["per_layer_embedder"].bytes
    labels = eight.options.quantization["target"]["tensors"]  # gate / up compensated (GPTQ), the rest not
    assert {e for n, e in labels.items() if n.endswith(("gate_proj.weight", "up_proj.weight"))} == {"int4/b32/gptq"}
    assert {e for n, e in labels.items() if n.endswith("down_proj.weight")} == {"int4/b32"}
    # XNNPACK quantizes activations per row and accumulates in integers: int4 verify rows equal decodes bit for bit
    assert verified_rows_differing(eight_folder, "litert") == 0
    ids = PROMPTS[1]
    assert greedy(folder, ids, mtp=True) == greedy(folder, ids, mtp=False)
