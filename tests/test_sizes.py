"""`mtpkit export --dry-run` (export/sizes.py): every file's bytes planned from the checkpoints' headers alone, held to
the files the suite's own exports wrote (the quantized LiteRT and ONNX files: tests/test_litert_quant.py)."""

from __future__ import annotations

import builtins

import pytest

from conftest import VARIANTS, planned_and_written
from mtpkit.errors import UsageError
from mtpkit.export.config import ExportConfig

TOLERANCE = 0.03  # of the written file's bytes


@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_plan_holds_every_onnx_file_and_the_runtimes_kv_cache(tiny_exports, tmp_path, name):
    """The float ONNX exports of every variant (e2b_text_kv_eq's layout was not among those the structure constants
    were measured on); the KV cache planned is what the runtime allocates."""
    from mtpkit.runtime.engine import Engine

    folder = tiny_exports(name)
    sizes, plan = planned_and_written(folder, "fp32", tmp_path / "plan")
    assert set(sizes) == {"target.onnx", "embeddings.bin", "drafter.onnx"}
    for file, (planned, written) in sizes.items():
        assert abs(planned - written) <= TOLERANCE * written, (file, planned, written)
    stores = Engine(folder, threads=1).kv.stores.values()  # before any call: sliding layers at their first ring
    assert plan.backends["onnx"].memory.kv == sum(s.k.nbytes + s.v.nbytes for s in stores)


class _Counted:
    """A file whose reads are recorded: the furthest byte read of each path."""

    def __init__(self, f, furthest: dict):
        self.f, self.furthest = f, furthest

    def read(self, *args):
        data = self.f.read(*args)
        self.furthest[self.f.name] = max(self.furthest.get(self.f.name, 0), self.f.tell())
        return data

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def test_a_dry_run_reads_only_the_headers_and_writes_nothing(tiny_checkpoints, tmp_path, monkeypatch, capsys):
    """Every checkpoint file is read up to the end of its safetensors header and no further; the loaders fail if
    called; --out is not created; the output names every file of both backends."""
    pytest.importorskip("litert_torch")
    import safetensors

    from mtpkit.cli import main
    from mtpkit.export import checkpoint
    from mtpkit.export.models import gemma4_assistant, gemma4_text

    def refuse(*args, **kwargs):
        raise AssertionError("a dry run read weights")

    for owner, name in ((safetensors, "safe_open"), (checkpoint, "load_tensors"), (gemma4_text, "load"),
                        (gemma4_assistant, "load")):
        monkeypatch.setattr(owner, name, refuse)
    furthest, real_open = {}, builtins.open

    def counted_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return _Counted(f, furthest) if str(file).endswith(".safetensors") else f

    monkeypatch.setattr(builtins, "open", counted_open)
    target, drafter = tiny_checkpoints("e2b_gemma4_centroid")
    out = tmp_path / "out"
    assert main(["export", str(target), "--drafter", str(drafter), "--out", str(out), "--backend", "onnx,litert",
                 "--quant", "int4", "--dry-run"]) == 0
    monkeypatch.undo()
    printed = capsys.readouterr().out
    assert not out.exists()
    for file in ("target.onnx", "embeddings.bin", "drafter.onnx", "target.tflite", "embedder.tflite",
                 "per_layer_embedder.tflite", "drafter.tflite", "model.litertlm", "KV cache"):
        assert file in printed
    headers = {str(p): 8 + int.from_bytes(p.read_bytes()[:8], "little")
               for p in (*target.glob("*.safetensors"), *drafter.glob("*.safetensors"))}
    assert furthest == headers  # each file read to the end of its header, none beyond


def test_the_centroid_tables_encoding_follows_the_use_its_adapter_declares(tiny_checkpoints, tmp_path, monkeypatch):
    """The drafter's centroid table is read through a lookup (its adapter says so): the plan encodes it as the
    LiteRT quantizer encodes an EMBEDDING_LOOKUP table; declared a gather, which no quantizer rewrites, it would be
    planned float32, with no planner change either way."""
    pytest.importorskip("litert_torch")
    from mtpkit.export.models import gemma4_assistant
    from mtpkit.export.pipeline import plan_export

    target, drafter = tiny_checkpoints("e2b_gemma4_centroid")
    cfg = ExportConfig(target=str(target), drafter=str(drafter), out=tmp_path / "out", backend="litert",
                       quant="int4", dry_run=True)

    def drafter_file():
        return next(f for f in plan_export(cfg).backends["litert"].files if f.name == "drafter.tflite")

    assert gemma4_assistant.CENTROID_TABLE_USE == "lookup"
    looked_up = drafter_file()
    monkeypatch.setattr(gemma4_assistant, "CENTROID_TABLE_USE", "gather")
    gathered = drafter_file()
    assert looked_up.encodings["int4/b32"] == gathered.encodings["int4/b32"] + 1
    assert looked_up.encodings["float32"] == gathered.encodings["float32"] - 1
    assert looked_up.bytes < gathered.bytes and looked_up.rows < gathered.rows


def test_a_dry_run_config_is_not_exported(tmp_path):
    from mtpkit.export.pipeline import export_model

    with pytest.raises(UsageError, match="a dry run writes nothing"):
        export_model(ExportConfig(target="t", drafter="d", out=tmp_path / "out", dry_run=True))
    assert not (tmp_path / "out").exists()
