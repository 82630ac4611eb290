"""Bad input to `mtpkit export`: one clear line, exit code 2, and no output folder left behind."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from mtpkit.export.checkpoint import CheckpointError
from mtpkit.export.config import ExportConfig
from mtpkit.export.pipeline import export_model


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "mtpkit", *map(str, args)], capture_output=True, text=True)


def _assert_clean_failure(result, out, *needles):
    assert result.returncode == 2, result.stderr
    lines = [ln for ln in result.stderr.strip().splitlines() if ln.startswith("mtpkit export: error:")]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0]
    assert "Traceback" not in result.stderr
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}.partial-*"))


def test_missing_path(tmp_path, tiny_checkpoints):
    _, drafter = tiny_checkpoints("e2b_gemma4_centroid")
    out = tmp_path / "out"
    _assert_clean_failure(_cli("export", tmp_path / "nope", "--drafter", drafter, "--out", out), out, "does not exist")


def test_non_gemma4_checkpoint(tmp_path, tiny_checkpoints):
    target, drafter = tiny_checkpoints("e2b_gemma4_centroid")
    llama = tmp_path / "llama"
    shutil.copytree(target, llama)
    (llama / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    out = tmp_path / "out"
    _assert_clean_failure(_cli("export", llama, "--drafter", drafter, "--out", out), out, "llama", "Gemma 4 target")
    # a drafter passed as the target is refused too
    _assert_clean_failure(_cli("export", drafter, "--drafter", drafter, "--out", out), out, "gemma4_assistant")


def test_mismatched_drafter(tmp_path, tiny_checkpoints):
    target, _ = tiny_checkpoints("e2b_gemma4_centroid")  # 1 kv head
    _, other = tiny_checkpoints("e4b_text_dense_kv_eq")  # 2 kv heads
    out = tmp_path / "out"
    _assert_clean_failure(_cli("export", target, "--drafter", other, "--out", out), out,
                          "drafter does not match the target", "num_key_value_heads")


@pytest.mark.parametrize("field,value,needle", [
    ("backbone_hidden_size", 96, "backbone_hidden_size 96"),
    ("vocab_size", 1024, "vocab_size 1024"),
    ("head_dim", 16, "head_dim 16"),
])
def test_drafter_config_mismatch_is_named(tmp_path, tiny_checkpoints, field, value, needle):
    target, drafter = tiny_checkpoints("e2b_gemma4_centroid")
    bad = tmp_path / "bad"
    shutil.copytree(drafter, bad)
    cfg = json.loads((bad / "config.json").read_text())
    (cfg if field == "backbone_hidden_size" else cfg["text_config"])[field] = value
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=needle):
        export_model(ExportConfig(target=str(target), drafter=str(bad), out=tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_existing_dir_needs_force(tmp_path, tiny_checkpoints):
    target, drafter = tiny_checkpoints("e2b_gemma4_centroid")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = _cli("export", target, "--drafter", drafter, "--out", out)
    assert result.returncode == 2 and "already exists; pass --force" in result.stderr
    assert (out / "keep.txt").read_text() == "mine"


def test_pickle_only_checkpoint_is_refused(tmp_path, tiny_checkpoints):
    target, drafter = tiny_checkpoints("e2b_gemma4_centroid")
    pickled = tmp_path / "pickled"
    shutil.copytree(target, pickled)
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pickle checkpoints are refused"):
        export_model(ExportConfig(target=str(pickled), drafter=str(drafter), out=tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_failed_graph_parity_leaves_nothing_behind(tmp_path, tiny_checkpoints, monkeypatch):
    from mtpkit.export import verify

    monkeypatch.setattr(verify, "ATOL", -1.0)  # no graph can pass: the export must fail loudly and clean up
    target, drafter = tiny_checkpoints("e2b_gemma4_centroid")
    out = tmp_path / "out"
    with pytest.raises(verify.GraphParityError, match="do not match PyTorch"):
        export_model(ExportConfig(target=str(target), drafter=str(drafter), out=out, reference_tokens=4))
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_unknown_backend_and_recipe():
    with pytest.raises(ValueError, match="did you mean 'onnx'"):
        ExportConfig(target="t", drafter="d", out="/nonexistent/x", backend="onx")
    with pytest.raises(ValueError, match="unknown --quant recipe .int3."):
        ExportConfig(target="t", drafter="d", out="/nonexistent/x", quant="int3")
