"""XNNPACK weight caches of the LiteRT backend (runtime/backends/litert_cache.py): where they go, that a second
start maps the first one's instead of packing again, that they change nothing, and that none is loaded unless
this user's mtpkit wrote it."""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pytest

from mtpkit.runtime.backends import litert_cache
from mtpkit.runtime.backends.litert_cache import SUFFIX, cache_name, weight_cache

SHA = "ab" * 32


@pytest.fixture
def user_cache(tmp_path, monkeypatch):
    """A fresh user cache folder (conftest's MTPKIT_CACHE_DIR is shared by the session)."""
    monkeypatch.setenv("MTPKIT_CACHE_DIR", str(tmp_path / "user"))
    return tmp_path / "user" / "xnnpack"


@pytest.fixture
def graph(tmp_path):
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "target.tflite").write_bytes(b"graph")
    return folder / "target.tflite"


def read_only(monkeypatch, folder):
    """`folder` refuses new files, also to root (whom chmod does not stop)."""
    os.chmod(folder, 0o555)
    mkstemp = tempfile.mkstemp

    def refusing(*a, dir=None, **k):  # type: ignore[no-untyped-def]
        if dir is not None and os.path.samefile(dir, folder):
            raise PermissionError(13, "Permission denied", str(dir))
        return mkstemp(*a, dir=dir, **k)

    monkeypatch.setattr(litert_cache.tempfile, "mkstemp", refusing)


def test_the_first_start_packs_into_a_temporary_beside_the_graph_then_renames_it(graph, user_cache):
    cache = weight_cache(graph, SHA, 5)
    assert cache is not None and cache.building
    assert cache.path.parent == graph.parent and cache.path.name.endswith(SUFFIX) and cache.path.exists()
    assert cache.final == graph.parent / cache_name("target.tflite", SHA) and not cache.final.exists()
    cache.path.write_bytes(b"packed")  # what XNNPACK writes
    cache.commit()
    assert cache.final.read_bytes() == b"packed" and not cache.path.exists()
    assert [p.name for p in graph.parent.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_a_second_start_maps_the_cache_the_first_wrote(graph, user_cache):
    first = weight_cache(graph, SHA, 5)
    first.path.write_bytes(b"packed")
    first.commit()
    second = weight_cache(graph, SHA, 5)
    assert not second.building and second.path == second.final == first.final
    second.commit()  # nothing to rename: the file stays as it was
    assert first.final.read_bytes() == b"packed"


def test_a_changed_graph_gets_another_cache(graph, user_cache):
    assert cache_name("target.tflite", SHA) != cache_name("target.tflite", "cd" * 32)
    first = weight_cache(graph, SHA, 5)
    first.path.write_bytes(b"packed")
    first.commit()
    assert weight_cache(graph, "cd" * 32, 5).building


def test_a_cache_this_user_did_not_write_is_packed_over(graph, user_cache, tmp_path):
    """An export folder copied from elsewhere may bring a file under the cache's name: XNNPACK trusts a cache's
    offsets, so only a file whose stamp the user cache folder recorded when mtpkit wrote it is mapped."""
    first = weight_cache(graph, SHA, 5)
    first.path.write_bytes(b"packed")
    first.commit()
    shutil.copy(first.final, tmp_path / "elsewhere")
    os.replace(tmp_path / "elsewhere", first.final)  # same name and bytes, another file
    again = weight_cache(graph, SHA, 5)
    assert again.building and again.path != again.final
    again.discard()
    assert not again.path.exists()


def test_a_read_only_export_folder_caches_in_the_user_folder(graph, user_cache, monkeypatch):
    read_only(monkeypatch, graph.parent)
    cache = weight_cache(graph, SHA, 5)
    assert cache.building and cache.final.parent == user_cache
    cache.path.write_bytes(b"packed")
    cache.commit()
    assert not weight_cache(graph, SHA, 5).building  # mapped from the user folder next time
    assert sorted(p.name for p in graph.parent.iterdir()) == ["target.tflite"]


def test_no_writable_folder_means_no_cache(graph, user_cache, monkeypatch):
    read_only(monkeypatch, graph.parent)
    monkeypatch.setattr(litert_cache, "_writable", lambda folder: False)
    assert weight_cache(graph, SHA, 5) is None


def test_no_room_for_the_packed_weights_means_no_cache_there(graph, user_cache):
    """XNNPACK aborts the process when a write to its cache fails: a folder without room for about twice the
    graph is not used."""
    assert weight_cache(graph, SHA, shutil.disk_usage(graph.parent).free) is None


def test_a_temporary_a_killed_process_left_is_swept_after_an_hour(graph, user_cache):
    name = cache_name(graph.name, SHA)
    old, fresh = (graph.parent / f".{name}.{x}.partial{SUFFIX}" for x in ("old", "new"))
    for p in (old, fresh):
        p.write_bytes(b"half")
    os.utime(old, (0, 0))
    weight_cache(graph, SHA, 5).discard()
    assert not old.exists() and fresh.exists()


@pytest.mark.slow
@pytest.mark.litert
def test_a_second_engine_maps_the_cache_and_decodes_the_same(litert_exports, tmp_path, user_cache, monkeypatch):
    """End to end on a tiny export (copied: the caches are written beside its graphs): the first Engine packs into
    a cache per graph, the second maps them without rewriting any, and greedy tokens and logits are those of an
    engine without a cache. A read-only copy of the export still loads, caching in the user folder."""
    pytest.importorskip("ai_edge_litert")
    from conftest import LITERT_VARIANTS
    from mtpkit.runtime.backends import LoadOptions
    from mtpkit.runtime.engine import Engine, GenConfig

    export = tmp_path / "export"
    # without the caches other tests' engines wrote beside the shared export
    shutil.copytree(litert_exports(LITERT_VARIANTS[0]), export, ignore=shutil.ignore_patterns(f"*{SUFFIX}"))
    prompt, cfg = [2] + list(range(40, 60)), GenConfig(max_new_tokens=12, mtp=True, num_assistant_tokens=3)

    def decode(**options):  # type: ignore[no-untyped-def]
        engine = Engine(export, backend="litert", options=LoadOptions(**options))
        logits = engine.untimed[0].forward(prompt, 0)[0]
        engine = Engine(export, backend="litert", options=LoadOptions(**options))  # fresh caches for generate
        return [t for t, _ in engine.generate(prompt, cfg)], logits

    plain = decode(weight_cache=False)
    assert not list(export.glob(f"*{SUFFIX}"))
    built = decode()
    caches = {p: (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size) for p in export.glob(f"*{SUFFIX}")}
    assert {p.name.split(".")[0] for p in caches} >= {"target", "drafter"}
    mapped = decode()
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size) for p in export.glob(f"*{SUFFIX}")} == caches
    for got in (built, mapped):
        assert got[0] == plain[0] and np.array_equal(got[1], plain[1])

    for p in caches:
        p.unlink()
    read_only(monkeypatch, export)
    assert decode()[0] == plain[0]
    assert not list(export.glob(f"*{SUFFIX}")) and list(user_cache.glob(f"target*{SUFFIX}"))
