"""mtpkit never loads what it was not given: no unpickling anywhere, never trust_remote_code, and hub downloads are
pinned to the commit recorded in the manifest. Checked on the source (ast), so a new call site cannot slip in."""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for folder in ("mtpkit", "export", "runtime") for p in (ROOT / folder).rglob("*.py"))
UNPICKLERS = {"pickle", "cPickle", "dill", "cloudpickle", "joblib", "marshal", "shelve", "_pickle"}


def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node, ast.unparse(node.func)


def _keyword(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_unpickling_and_no_remote_code(path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            assert not {str(n).split(".")[0] for n in names} & UNPICKLERS, f"{path}:{node.lineno} imports an unpickler"
    for call, func in _calls(tree):
        where = f"{path}:{call.lineno}: {func}"
        assert func not in ("torch.load", "load_state_dict_from_url", "torch.hub.load"), where
        if func in ("np.load", "numpy.load"):
            flag = _keyword(call, "allow_pickle")
            assert isinstance(flag, ast.Constant) and flag.value is False, f"{where} needs allow_pickle=False"
        for name in ("trust_remote_code", "weights_only"):
            value = _keyword(call, name)
            wanted = name == "weights_only"  # trust_remote_code must stay False, weights_only True
            assert value is None or (isinstance(value, ast.Constant) and value.value is wanted), f"{where} {name}"


def test_the_scan_sees_the_sources():
    assert len(SOURCES) > 30 and ROOT / "export" / "checkpoint.py" in SOURCES


def test_hub_downloads_are_pinned_to_the_commit_the_manifest_records(tmp_path, monkeypatch):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from mtpkit.export import checkpoint, pipeline

    commit = "0123456789abcdef0123456789abcdef01234567"
    calls = []

    def snapshot_download(repo_id, revision=None, allow_patterns=None, **kwargs):
        calls.append(dict(repo_id=repo_id, revision=revision, allow_patterns=allow_patterns, **kwargs))
        folder = tmp_path / "hub" / "snapshots" / commit  # the hub cache names snapshot folders by commit
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text('{"model_type": "gemma4_assistant"}')
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    src = checkpoint.resolve("google/gemma-4-E2B-it-assistant", "drafter", "main")
    assert src.revision == commit and pipeline._source_entry(src)["revision"] == commit
    assert src.folder == tmp_path / "hub" / "snapshots" / commit  # later reads use this folder, never the hub
    assert calls[0]["revision"] == "main" and not {"trust_remote_code"} & set(calls[0])
    patterns = calls[0]["allow_patterns"]
    for name in ("modeling_gemma4.py", "tokenizer.py", "pytorch_model.bin", "model.pt", "weights.pkl", "x.ckpt"):
        assert not any(fnmatch.fnmatch(name, p) for p in patterns), (name, patterns)
