"""ONNX export of every structural variant: graphs, manifest contract and built-in graph parity."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import VARIANTS
from mtpkit.runtime.manifest import load_manifest, sha256_file

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", list(VARIANTS))
def test_export_writes_manifest_and_passes_graph_parity(tiny_exports, name):
    out = tiny_exports(name)
    manifest = load_manifest(out)  # verifies every sha256
    checks = json.loads((out / "graph_parity.json").read_text())
    names = {c["signature"] for c in checks}
    assert {"prefill", "decode", "verify", "draft[0]", "draft[1]"} <= names
    logits = [c for c in checks if "." not in c["signature"]]
    assert len(logits) == 5 and all(c["max_abs"] <= 1e-4 and c["argmax_agree"] == 1.0 for c in logits)
    assert all(c["ok"] and c["max_abs"] <= c["tolerance"] for c in checks)
    assert set(manifest.backend("onnx").signatures) == {"prefill", "decode", "verify", "draft"}
    assert manifest.backend("onnx").graphs["target"].sha256 == sha256_file(out / manifest.backend("onnx").graphs["target"].file)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_kv_layout_lists_only_kv_owning_layers(tiny_exports, name):
    manifest = load_manifest(tiny_exports(name))
    layers = manifest.kv_layers
    n_layers = manifest.model.num_layers
    shared = 5 if VARIANTS[name]["shape"] == "e2b" else 6
    assert [d.layer for d in layers] == list(range(n_layers - shared))
    heads = {d.type: d.head_dim for d in layers}
    assert heads == {"sliding_attention": 32, "full_attention": 64}  # dual head dims survive
    store = manifest.kv_cache.drafter_layers
    owners = {t: max(d.layer for d in layers if d.type == t) for t in heads}
    assert store == owners  # the drafter reads the last owner of each type
    target_inputs = {t.name for t in manifest.backend("onnx").signatures["verify"].inputs}
    assert f"past_window.{n_layers - 1}.key" not in target_inputs  # no inputs for KV-shared layers
    if VARIANTS[name].get("k_eq_v"):
        full = [d for d in layers if d.type == "full_attention"]
        assert all(d.kv_heads == 1 for d in full)


def test_embedding_table_is_stored_once_and_shared_with_the_host(tiny_exports):
    import onnx

    out = tiny_exports("e2b_gemma4_centroid")
    manifest = load_manifest(out)
    emb = manifest.backend("onnx").options.embedding
    table = np.fromfile(out / emb["file"], dtype=np.float32).reshape(emb["shape"])
    model = onnx.load(str(out / "target.onnx"), load_external_data=False)
    external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    location = {t.name: next(e.value for e in t.external_data if e.key == "location") for t in external}
    assert location[emb["initializer"]] == emb["file"]  # the table alone in the shared file, weights in .data
    assert {n for n, f in location.items() if f == emb["file"]} == {emb["initializer"]}
    assert set(location.values()) == {emb["file"], "target.onnx.data"}
    inline = [t for t in model.graph.initializer if tuple(t.dims) == tuple(emb["shape"])]
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in inline)  # no second inline copy
    assert emb["scale"] == pytest.approx(np.sqrt(manifest.model.hidden_size))
    assert manifest.backend("onnx").graphs["target"].data_files == {
        f: sha256_file(out / f) for f in (emb["file"], "target.onnx.data")}
    assert table.std() > 0


def test_reference_covers_long_prompts_and_all_draft_lengths(tiny_exports):
    out = tiny_exports("e2b_gemma4_centroid")
    manifest = load_manifest(out)
    ref = json.loads((out / manifest.reference["file"]).read_text())
    window = manifest.model.sliding_window
    assert max(len(p["prompt_ids"]) for p in ref["prompts"]) > window + 8
    assert min(len(p["prompt_ids"]) for p in ref["prompts"]) < window
    for entry in ref["prompts"]:
        assert set(entry["assisted"]) == {"1", "2", "4", "8"}
        assert entry["assisted"]["4"]["output_ids"] == entry["greedy_ids"]  # transformers greedy MTP is lossless
        assert entry["assisted"]["4"]["drafts"], "no draft rounds recorded"


def test_manifest_records_sources_tokens_and_template(tiny_exports, tiny_checkpoints):
    manifest = load_manifest(tiny_exports("e2b_gemma4_centroid"))
    target, drafter = tiny_checkpoints("e2b_gemma4_centroid")
    assert manifest.source["target"]["ref"] == str(target)
    assert manifest.source["target"]["model_type"] == "gemma4"
    assert manifest.source["drafter"]["model_type"] == "gemma4_assistant"
    assert manifest.tokens.eos == [1, 6] and manifest.tokens.bos == 2
    assert (manifest.root / manifest.tokenizer["chat_template_file"]).read_text().startswith("{{ bos_token }}")
    assert manifest.generation.num_assistant_tokens == 4
    assert manifest.quantization.to_json() == {"recipe": "fp32", "drafter_recipe": "fp32", "ple_recipe": "int8",
                                     "block_size": 32, "accuracy_level": 4, "kv_cache": "float32"}
    assert {g.recipe for g in manifest.backend("onnx").graphs.values()} == {"fp32"}
    assert (manifest.root / manifest.hf_files["config"]).is_file()
    assert (manifest.root / manifest.hf_files["generation_config"]).is_file()


# 926 target nodes over 10 decoder layers and 274 drafter nodes over 4 on the trained tiny pair before
# fusion; a fused decoder layer may cost at most 40% of that
FUSED_OPS = {"SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "RotaryEmbedding",
             "MultiHeadAttention", "Gelu"}
UNFUSED_OPS = {"Pow", "ReduceMean", "Softmax", "Neg", "Sqrt", "Reciprocal"}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_graphs_are_fused_within_the_node_budget(tiny_exports, name):
    from mtpkit.export.backends.onnx.bench import node_counts

    out = tiny_exports(name)
    manifest = load_manifest(out)
    counts = node_counts(out)
    assert manifest.backend("onnx").options.nodes == {g: c["nodes"] for g, c in counts.items()}
    assert counts["target"]["layers"] == manifest.model.num_layers
    assert counts["target"]["per_layer"] <= 0.4 * 926 / 10
    assert counts["drafter"]["per_layer"] <= 0.4 * 274 / 4
    for graph, c in counts.items():
        assert FUSED_OPS <= set(c["ops"]) and not UNFUSED_OPS & set(c["ops"]), (graph, c["ops"])


@pytest.fixture(scope="module")
def unfused_export(tiny_checkpoints, tmp_path_factory):
    """e2b_gemma4_centroid exported with --no-fuse (standard ONNX ops only), parity-checked like any export."""
    import mtpkit

    target, drafter = tiny_checkpoints("e2b_gemma4_centroid")
    return mtpkit.export_pair(target, drafter, tmp_path_factory.mktemp("unfused") / "out", fuse=False,
                              reference_tokens=8, max_cache_len=256)


def test_no_fuse_exports_standard_ops_that_run_on_older_runtimes(unfused_export, tiny_exports):
    from mtpkit.export.backends.onnx.bench import node_counts

    for graph, c in node_counts(unfused_export).items():
        assert UNFUSED_OPS & set(c["ops"]) and not FUSED_OPS - {"Gelu"} & set(c["ops"]), (graph, c["ops"])
    assert load_manifest(unfused_export).backend("onnx").options.min_onnxruntime is None
    assert load_manifest(tiny_exports("e2b_gemma4_centroid")).backend("onnx").options.min_onnxruntime == "1.20"
    from mtpkit.cli import main

    assert main(["--quiet", "parity", str(unfused_export)]) == 0  # token-for-token with transformers


@pytest.mark.parametrize("installed, needed, ok", [("1.17.3", "1.20", False), ("1.19.2", "1.20", False),
                                                   ("1.20.0", "1.20", True), ("1.27.0+cpu", "1.20", True),
                                                   ("1.17.3", None, True)])
def test_fused_graphs_on_an_older_onnxruntime_are_one_line(installed, needed, ok):
    from mtpkit.errors import ManifestError
    from mtpkit.runtime.backends.onnx import _check_version

    if ok:
        _check_version(installed, needed)
    else:
        with pytest.raises(ManifestError, match=r"need onnxruntime >= 1\.20 \(installed .*--no-fuse"):
            _check_version(installed, needed)


def test_graph_bench_reports_nodes_and_call_times(tiny_exports, unfused_export, capsys):
    from mtpkit.export.backends.onnx import bench as graph_bench

    out = tiny_exports("e2b_gemma4_centroid")
    args = [str(unfused_export), str(out), str(out), "--past", "20", "--rounds", "1", "--calls", "3",
            "--baseline-threads", "2"]
    assert graph_bench.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("(baseline sessions at 2 threads)")
    assert [line.split()[0] for line in lines] == [str(unfused_export), "target", "most", "drafter", "most", "decode",
                                                   "draft", "floor", "fixed", "rest"] * 2
    per_layer = [line.split()[7:10:2] for line in lines if line.split()[0] in ("target", "drafter")]
    assert all(float(after) <= 0.5 * float(before) for before, after in per_layer)  # what fusion removes


def test_export_records_the_drafters_acceptance_prior(tiny_exports):
    """backends.onnx.options.acceptance_by_position: what `--num-assistant-tokens auto` starts from."""
    manifest = load_manifest(tiny_exports("e2b_gemma4_centroid"))
    acceptance = manifest.backend("onnx").options.acceptance_by_position
    assert len(acceptance) == 8 and all(0.0 <= a <= 1.0 for a in acceptance)
