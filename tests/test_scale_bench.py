"""tools/scale_bench.py and mtpkit/bench/bandwidth.py: the bytes accounting and the report's schema; no timing
asserted."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from mtpkit.bench import bandwidth
from mtpkit.runtime.manifest import load_manifest

NAME = "e2b_gemma4_centroid"


@pytest.fixture(scope="module")
def scale_bench(tool):
    return tool("scale_bench")


def test_bandwidth_is_positive_with_a_small_buffer():
    for bw in (bandwidth.read_bandwidth(threads=2, size=1 << 20, repeats=1),
               bandwidth.gemv_bandwidth(threads=1, size=1 << 20, repeats=1)):
        assert math.isfinite(bw.gbps) and bw.gbps > 0 and bw.median_gbps > 0
        assert bw.bytes >= (1 << 20) - 4096 * 4 and bw.method in ("reduce", "gemv")


def test_weight_bytes_follow_weight_ops_not_lookups(scale_bench):
    """MatMulNBits codes + scales count; a table only gathered does not; a tied head (Gather + Transpose ->
    MatMul) counts once; 4-bit tensors pack two values a byte."""
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.ones((10, 4), np.float32), "E")
    ple = numpy_helper.from_array(np.ones((10, 6), np.float32), "ple")
    codes = numpy_helper.from_array(np.ones((8, 1, 2), np.uint8), "w_q4")
    scales = numpy_helper.from_array(np.ones((8, 1), np.float32), "w_scales")
    nibbles = helper.make_tensor("w4", TensorProto.INT4, [4, 3], [1] * 12)
    nodes = [helper.make_node("Gather", ["E", "ids"], ["x"]), helper.make_node("Gather", ["ple", "ids"], ["p"]),
             helper.make_node("MatMulNBits", ["x", "w_q4", "w_scales"], ["h"], domain="com.microsoft",
                              K=4, N=8, bits=4, block_size=32),
             helper.make_node("Transpose", ["E"], ["Et"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "Et"], ["logits"]), helper.make_node("MatMul", ["x", "w4"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("h", "logits", "p", "y")],
                              [table, ple, codes, scales, nibbles])
    weights = scale_bench.weight_bytes(helper.make_model(graph))
    assert weights == {"E": 10 * 4 * 4, "w_q4": 16, "w_scales": 8 * 4, "w4": 6}


def _linear_weight_count(target_dir: Path) -> int:
    """Weights of every nn.Linear of the text model (LM head included), counted on the meta device from the
    checkpoint's config: the layers a decode step multiplies by, independently of the ONNX graph."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(target_dir).get_text_config()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.slow
def test_decode_bytes_are_the_linear_weights_and_the_kv_windows(tiny_exports, tiny_checkpoints, scale_bench):
    out, past = tiny_exports(NAME), 40
    manifest = load_manifest(out)
    decode = scale_bench.call_bytes(manifest, "decode", past)
    assert decode["weights"] == 4 * _linear_weight_count(tiny_checkpoints(NAME)[0])  # fp32
    sliding_past = manifest.kv_cache.sliding_past
    kv = sum(2 * d.kv_heads * d.head_dim * 4 * (past if d.type == "full_attention" else min(past, sliding_past))
             for d in manifest.kv_layers)
    assert decode["kv"] == kv and decode["total"] == decode["weights"] + kv
    draft = scale_bench.call_bytes(manifest, "draft", past)
    assert 0 < draft["weights"] < decode["weights"] and draft["kv"] > 0


@pytest.mark.slow
def test_report_schema_and_markdown(tiny_exports, scale_bench, tmp_path):
    out = tiny_exports(NAME)
    report = scale_bench.run(out, past=20, rounds=1, calls=1, threads=1, acceptance=[0.5] * 8,
                             acceptance_source="test", bandwidth_size=1 << 20)
    report = json.loads(json.dumps(report))  # what --json writes
    assert report["schema"] == scale_bench.SCHEMA and report["past"] == 20
    assert set(report["latency_ms"]["verify"]) == {str(k) for k in range(1, 9)} == set(report["verify_over_decode"])
    assert report["threads"] == {"target": 1, "drafter": 1}
    assert set(report["bandwidth"]) == {"1", str(report["machine"]["cores"])}
    assert report["bound"]["reported"]["threads"] == 1 and report["bound"]["reported"]["decode_bound_ms"] > 0
    assert [p["phase"] for p in report["export_cost"]["record"]["phases"]][0] == "load"
    assert report["export_cost"]["graphs"]["target"]["bytes"] > 0
    assert [row["k"] for row in report["cost_model"]["rows"]] == list(range(1, 9))
    assert len(report["machine"]["load_average_before"]) == 3
    text = scale_bench.markdown(report)  # renders from the JSON too (string keys)
    for heading in ("Export cost", "Bytes one call must read", "Per-call latency", "Bandwidth bound", "Cost model"):
        assert f"## {heading}" in text
    assert scale_bench.main([str(out), "--past", "20", "--rounds", "1", "--calls", "1", "--threads", "1",
                             "--bandwidth-mib", "1", "--json", str(tmp_path / "r.json"),
                             "--out", str(tmp_path / "r.md")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["cost_model"] is None  # no acceptance given


def test_litert_lm_memory_attributes_each_mapping_to_its_bundle_section(tool, tmp_path):
    """tools/litert_lm_memory.py: a mapping of the bundle counts toward the section its middle lies in, LiteRT-LM's
    weight caches beside the bundle and anonymous memory apart, libraries last."""
    memory = tool("litert_lm_memory")
    bundle = tmp_path / "model.litertlm"
    parts = [(16384, 65536, "tf_lite_embedder"), (65536, 1 << 20, "tf_lite_prefill_decode")]
    page = 4096

    def part(offset: int, pages: int, path: str) -> str:
        return memory._part((0, pages * page, offset, path), pages * 4, bundle, parts)

    assert part(16384, 4, str(bundle)) == "bundle: tf_lite_embedder"
    assert part(65536 - 2 * page, 8, str(bundle)) == "bundle: tf_lite_prefill_decode"  # its middle lies past 65536
    assert part(0, 1, str(bundle)) == "bundle: header"
    assert part(0, 1, str(tmp_path / "model.litertlm_123_456.xnnpack_cache")) == "weight cache"
    assert part(0, 1, str(tmp_path / "model.litertlm_1_2.mtp_drafter.xnnpack_cache")) == "weight cache (drafter)"
    assert part(0, 1, "") == part(0, 1, "[heap]") == part(0, 1, "[stack]") == "anonymous"
    assert part(0, 1, "/usr/lib/libc.so.6") == "other files (libraries)"


def test_litert_lm_memory_measures_what_a_row_read_maps(tool, tmp_path):
    """The probe behind the tool's first line: random one-byte reads of a mapped file leave at least a page each
    resident on average, and never more than the file."""
    memory = tool("litert_lm_memory")
    path = tmp_path / "table.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 255, 8 << 20, dtype=np.uint8).tobytes())
    assert 4 <= memory.mapped_per_read(path, reads=10) <= (8 << 20) / 1024 / 10 + 4
