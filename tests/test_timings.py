"""runtime/timings.py: the auto schedule's calibration kept between starts, keyed by what the costs depend on, read
back only when it parses as costs."""

from __future__ import annotations

import types

import pytest

from mtpkit.runtime import timings

NAME = "e2b_gemma4_centroid"


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A fresh user cache folder (conftest's is shared by the session)."""
    monkeypatch.setenv("MTPKIT_CACHE_DIR", str(tmp_path / "user"))
    return tmp_path / "user"


def _backend(kind="onnx", **graphs):
    return types.SimpleNamespace(kind=kind, graphs={n: types.SimpleNamespace(sha256=s) for n, s in graphs.items()})


def test_the_key_follows_the_graphs_bytes_the_backend_the_threads_and_the_longest_draft():
    base = timings.key(_backend(target="a", drafter="b"), {"target": 2}, 3)
    assert base == timings.key(_backend(drafter="b", target="a"), {"target": 2}, 3)
    others = [timings.key(_backend(target="a", drafter="c"), {"target": 2}, 3),
              timings.key(_backend("litert", target="a", drafter="b"), {"target": 2}, 3),
              timings.key(_backend(target="a", drafter="b"), {"target": 1}, 3),
              timings.key(_backend(target="a", drafter="b"), {"target": 2}, 4)]
    assert base not in others and len(set(others)) == 4


def test_costs_come_back_as_written_and_anything_else_reads_as_none(cache):
    costs = (0.002, {1: 0.09, 2: 0.12, 4: 0.15})
    assert timings.load("k") is None
    timings.save("k", costs)
    assert timings.load("k") == costs
    assert [p.name for p in (cache / "timings").iterdir()] == ["k.json"]  # no temporary left behind
    for text in ("{", '{"draft": 0.1}', '{"draft": "x", "target": {"1": 0.1}}', '{"draft": 0.1, "target": {}}',
                 '{"draft": 0.1, "target": {"1": -1}}', "[]"):
        (cache / "timings" / "k.json").write_text(text)
        assert timings.load("k") is None, text


def test_an_unwritable_cache_folder_keeps_nothing_and_raises_nothing(cache):
    cache.parent.mkdir(exist_ok=True)
    cache.write_text("a file where the folder would be")
    timings.save("k", (0.1, {1: 0.1}))
    assert timings.load("k") is None


def test_a_second_start_seeds_the_auto_schedule_from_the_first_ones_calibration(tiny_exports, cache, monkeypatch):
    from mtpkit.runtime import engine as engine_module
    from mtpkit.runtime.engine import Engine

    calibrated = []
    real = engine_module.calibrate

    def counted(*args, **kwargs):
        calibrated.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_module, "calibrate", counted)
    first = Engine(tiny_exports(NAME), threads=1)
    first.auto_policy(3)
    second = Engine(tiny_exports(NAME), threads=1)
    second.auto_policy(3)
    assert calibrated == [1]
    assert second.meter.est == first.meter.est and {"draft", 1} <= set(second.meter.est)
    Engine(tiny_exports(NAME), threads=1).auto_policy(2)  # another longest draft: timed again
    assert calibrated == [1, 1]
