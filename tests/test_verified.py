"""runtime/verified.py: an unchanged export file is hashed once; any change, or a damaged record, means hashing."""

from __future__ import annotations

import json
import os
import time

import pytest

from mtpkit.errors import ManifestError
from mtpkit.runtime import verified
from mtpkit.runtime.manifest import load_manifest


@pytest.fixture
def counted(monkeypatch):
    calls = []
    real = verified.sha256_file
    monkeypatch.setattr(verified, "sha256_file", lambda p: calls.append(p) or real(p))
    return calls


def test_digest_hashes_once_while_the_file_is_unchanged(tmp_path, counted, monkeypatch):
    monkeypatch.setattr(verified, "RACY_SECONDS", -1.0)  # ctime is now; the racy rule is tested below
    f = tmp_path / "g.onnx"
    f.write_bytes(b"abc" * 1000)
    first = verified.VerifiedFiles(tmp_path / "cache")
    assert first.digest(f) == verified.sha256_file(f) and len(counted) == 2
    first.save()
    again = verified.VerifiedFiles(tmp_path / "cache")
    assert again.digest(f) == first.digest(f) and len(counted) == 2  # no new hash: read from the record
    f.write_bytes(b"abd" * 1000)  # same size, new bytes
    t = time.time() - 3600
    os.utime(f, (t, t))  # even with mtime put back, ctime moved
    assert again.digest(f) == verified.sha256_file(f) != first.records[str(f.resolve())]["sha256"]


def test_a_file_modified_just_now_is_hashed_but_not_recorded(tmp_path, counted):
    f = tmp_path / "g.onnx"
    f.write_bytes(b"x" * 100)
    files = verified.VerifiedFiles(tmp_path / "cache")
    files.digest(f)
    files.digest(f)
    assert len(counted) == 2 and not files.records


@pytest.mark.parametrize("damage", ["{not json", "[1, 2]", '{"%s": {"stamp": "x"}}'])
def test_damaged_records_only_cost_hashing(tmp_path, damage, counted, monkeypatch):
    monkeypatch.setattr(verified, "RACY_SECONDS", -1.0)
    f = tmp_path / "g.onnx"
    f.write_bytes(b"y" * 100)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / verified.FILE_NAME).write_text(damage.replace("%s", str(f.resolve())))
    files = verified.VerifiedFiles(tmp_path / "cache")
    assert files.digest(f) == verified.sha256_file(f)
    files.save()
    assert json.loads((tmp_path / "cache" / verified.FILE_NAME).read_text())[str(f.resolve())]["stamp"]


def test_an_unwritable_cache_leaves_verification_working(tmp_path, monkeypatch):
    monkeypatch.setattr(verified, "RACY_SECONDS", -1.0)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    f = tmp_path / "g.onnx"
    f.write_bytes(b"z" * 100)
    files = verified.VerifiedFiles(blocker / "cache")  # mkdir under a file fails
    assert files.digest(f) == verified.sha256_file(f)
    files.save()  # no exception, nothing written
    assert blocker.read_text() == ""


def test_load_manifest_skips_unchanged_files_and_still_refuses_a_modified_one(tiny_exports, tmp_path, counted,
                                                                             monkeypatch):
    import shutil

    monkeypatch.setenv("MTPKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(verified, "RACY_SECONDS", -1.0)
    folder = tmp_path / "export"
    shutil.copytree(tiny_exports("e2b_gemma4_centroid"), folder)
    load_manifest(folder)
    hashed = len(counted)
    assert hashed >= 2  # every graph and data file once
    load_manifest(folder)
    assert len(counted) == hashed  # nothing re-hashed
    graph = next(folder.glob("target.onnx"))
    data = bytearray(graph.read_bytes())
    data[-1] ^= 1
    graph.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match="does not match the sha256"):
        load_manifest(folder)
