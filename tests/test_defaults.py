"""Defaults adapt to the checkpoint and the export; only values the user gave may be refused."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from mtpkit.errors import UsageError
from mtpkit.export.config import DEFAULT_MAX_DRAFT, ExportConfig


def _cfg(tmp_path, **kw) -> ExportConfig:
    return ExportConfig(target="t", drafter="d", out=tmp_path / "out", **kw)


def test_shape_defaults_adapt_to_a_model_with_few_positions(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="mtpkit"):
        cfg = _cfg(tmp_path).fitted(max_positions=512, drafter_k=4)
    assert (cfg.max_cache_len, cfg.prefill_len, cfg.max_draft) == (512, 128, 3)  # at most DEFAULT_MAX_DRAFT
    assert "--max-cache-len 512 (the default 4096 exceeds the target's max_position_embeddings (512))" in caplog.text
    small = _cfg(tmp_path, max_cache_len=16).fitted(max_positions=512, drafter_k=20)
    assert (small.max_cache_len, small.prefill_len, small.max_draft) == (16, 16, 3)  # prefill capped by the cache
    assert _cfg(tmp_path).fitted(max_positions=8192, drafter_k=4).max_cache_len == 4096  # the default when it fits


def test_the_default_verify_length_is_xnnpacks_row_tile_and_says_so_for_litert(tmp_path, caplog):
    """LiteRT verifies max_draft + 1 tokens per static call; XNNPACK's int8 / int4 kernels take 4 rows per pass
    on ARM64 and AVX2, so the default stops at 3 drafts, below a drafter's larger k, and logs it."""
    with caplog.at_level(logging.INFO, logger="mtpkit"):
        lite = _cfg(tmp_path, backend="litert").fitted(max_positions=8192, drafter_k=6)
    assert lite.max_draft == DEFAULT_MAX_DRAFT == 3
    assert "--max-draft 3 (LiteRT verify calls of 4 tokens" in caplog.text
    assert _cfg(tmp_path, backend="litert").fitted(max_positions=8192, drafter_k=2).max_draft == 2  # the drafter's
    assert _cfg(tmp_path, backend="litert", max_draft=6).fitted(max_positions=8192, drafter_k=6).max_draft == 6
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mtpkit"):
        _cfg(tmp_path, backend="onnx").fitted(max_positions=8192, drafter_k=6)  # ONNX verifies any length
    assert "--max-draft" not in caplog.text


def test_the_reference_covers_a_static_verifys_longest_round():
    """Parity replays only reference draft lengths an export can verify: a LiteRT export verifying 3 drafts gets
    k = 3 recorded, so its parity covers the rounds it runs."""
    from mtpkit.export import reference

    assert reference.draft_lengths(3) == (1, 2, 3, 4, 8) and reference.draft_lengths(8) == reference.DRAFT_LENGTHS
    assert reference.draft_lengths(None) == reference.DRAFT_LENGTHS  # ONNX: any length
    assert ExportConfig(target="t", drafter="d", out="o", backend="onnx,litert").static_verify
    assert not ExportConfig(target="t", drafter="d", out="o", backend="onnx").static_verify


def test_the_drafters_k_adapts_to_a_shorter_static_verify_and_an_explicit_k_is_refused(caplog):
    """A default export verifies 4 tokens while a drafter's generation_config says k = 4: a constant-schedule run
    without -k drafts 3 (and says so); only a -k the user gave is refused."""
    import types

    from mtpkit.runtime.engine import Engine, GenConfig
    from mtpkit.runtime.records import Generation

    def engine(max_draft):
        engine = object.__new__(Engine)  # schedule() reads only these
        engine.manifest = types.SimpleNamespace(generation=Generation(num_assistant_tokens=4))
        engine.max_draft, engine.backend = max_draft, types.SimpleNamespace(kind="litert")
        return engine

    litert = engine(3)
    with caplog.at_level(logging.INFO, logger="mtpkit"):
        schedules = [litert.schedule(GenConfig(schedule="constant")) for _ in range(3)]
    assert [(s.kind, s.k, s.max_draft) for s in schedules] == [("constant", 3, 3)] * 3
    said = "k = 3: the drafter's num_assistant_tokens (4) capped by this litert export's verify length"
    assert caplog.text.count(said) == 1  # once per engine: `mtpkit bench` runs many requests
    with pytest.raises(UsageError, match="verifies at most 3 drafts per round"):
        litert.schedule(GenConfig(num_assistant_tokens=4))
    assert engine(None).schedule(GenConfig(schedule="constant")).k == 4  # ONNX: any length


@pytest.mark.parametrize("flags, message", [
    (dict(max_cache_len=600), "--max-cache-len 600 exceeds the target's max_position_embeddings (512); choose at most 512"),
    (dict(max_cache_len=64, prefill_len=65), "--prefill-len 65 exceeds the KV capacity (64); choose at most 64"),
    (dict(max_cache_len=64, max_draft=64), "--max-draft 64 exceeds the KV capacity (64) less the verified token"),
])
def test_values_the_user_gave_are_refused_when_they_do_not_fit(tmp_path, flags, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _cfg(tmp_path, **flags).fitted(max_positions=512, drafter_k=4)


def test_a_model_with_fewer_positions_than_any_cache_is_refused_in_one_line(tmp_path):
    with pytest.raises(UsageError, match="holds only 8 positions"):
        _cfg(tmp_path).fitted(max_positions=8, drafter_k=4)


@pytest.mark.slow
@pytest.mark.parametrize("capacity", [16, 17])
def test_the_default_schedule_runs_on_the_smallest_cache(tmp_path, tiny_exports, capacity):
    """auto's start-up calibration wrote past a 16- or 17-slot cache ('KV cache full: 18 > 16'). ONNX graphs do
    not depend on the capacity (the host allocates it from the manifest), so a copy with a smaller capacity is
    what `mtpkit export --max-cache-len 16` writes."""
    from mtpkit.runtime.engine import Engine, GenConfig

    folder = tmp_path / "export"
    shutil.copytree(tiny_exports("e2b_gemma4_centroid"), folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["kv_cache"]["capacity"] = capacity
    (folder / "manifest.json").write_text(json.dumps(manifest))
    engine = Engine(folder)
    prompt, cfg = [2, 80, 81], GenConfig(max_new_tokens=capacity - 3)
    assert cfg.auto
    tokens = [t for t, _ in engine.generate(prompt, cfg)]
    plain = [t for t, _ in engine.generate(prompt, GenConfig(max_new_tokens=capacity - 3, mtp=False))]
    assert tokens == plain and len(tokens) == capacity - 3
    from mtpkit import cli  # and `mtpkit run` with default flags

    assert cli.main(["-q", "run", str(folder), "--prompt", "hi", "--max-new-tokens", "8"]) == 0


def test_the_ple_bit_width_comes_from_a_table_not_from_the_recipe_name(tmp_path):
    """export/pipeline.py sliced the recipe string (int(ple_quant[3:])) for the PLE table's bits."""
    from mtpkit.export.config import PLE_RECIPES

    assert {r: _cfg(tmp_path, ple_quant=r).ple_bits for r in PLE_RECIPES} == {"int8": 8, "int4": 4}


def test_the_default_int4_export_passes_on_a_word_level_tokenizer_and_says_it_compensated(tmp_path, tiny_checkpoints,
                                                                                        caplog):
    """A valid E4B-structured pair whose tokenizer is word-level with <unk>: the built-in calibration maps mostly to
    <unk> runs, which once matched the reference prompts' <unk> runs and refused the export. The default int4
    export passes, and its log and manifest say which weights were error-compensated."""
    import mtpkit
    from mtpkit.runtime.manifest import load_manifest
    from tests.test_int4 import _word_level_tokenizer

    src_target, src_drafter = tiny_checkpoints("e4b_text_dense_kv_eq")
    target, drafter = tmp_path / "target", tmp_path / "drafter"
    shutil.copytree(src_target, target)
    shutil.copytree(src_drafter, drafter)
    for folder in (target, drafter):
        _word_level_tokenizer(folder, ["the", "a", "def", "return", "and", "of", "to", "is", "in", "river", "town"])
    with caplog.at_level(logging.INFO, logger="mtpkit"):
        out = mtpkit.export_pair(target, drafter, tmp_path / "out", quant="int4", quality_gate=False,
                                 reference_tokens=8, max_cache_len=128)
    labels = load_manifest(out).backend("onnx").options.quantization["target"]["tensors"]
    compensated = {n for n, e in labels.items() if e.endswith("/gptq")}
    assert compensated and all(("gate_proj" in n or "up_proj" in n) for n in compensated)
    assert f"int4 error compensation (GPTQ) on for {len(compensated)} weights" in caplog.text


def test_export_flags_are_exportconfigs_fields_with_the_same_defaults():
    """`mtpkit export`'s flags are generated from ExportConfig: one flag per field, and with only the required
    arguments given, the parsed flags build the same config as ExportConfig's own defaults; a default shown in
    --help is the field's."""
    import argparse
    import dataclasses

    from mtpkit.export import commands

    parser = argparse.ArgumentParser()
    commands.add_arguments(parser, "export")
    dests = {a.dest for a in parser._actions} - {"help", "verify"}
    assert dests == {f.name for f in dataclasses.fields(ExportConfig)}
    args = parser.parse_args(["T", "--drafter", "D", "--out", "O"])
    given = ExportConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ExportConfig)})
    assert given == ExportConfig(target="T", drafter="D", out="O")
    for action in parser._actions:
        field = next((f for f in dataclasses.fields(ExportConfig) if f.name == action.dest), None)
        if field is not None and field.default not in (dataclasses.MISSING, None) and not isinstance(field.default, bool):
            shown = ",".join(field.default) if isinstance(field.default, tuple) else field.default
            assert action.help.endswith(f"(default {shown})"), action.help
