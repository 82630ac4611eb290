"""mtpkit.tiny.grow: the e2b-shaped demo target is the shipped trained target with wider MLPs, nearly the same
function, deterministic, and every other tensor untouched (so the shipped drafter still fits it)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mtpkit.tiny.grow import GrowSpec, grow_pair
from mtpkit.tiny.train import ASSETS


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    return grow_pair(ASSETS, tmp_path_factory.mktemp("grown"), GrowSpec(factor=3))


def test_only_the_mlp_intermediate_axis_grows(grown):
    from safetensors.numpy import load_file

    target, _ = grown
    old, new = load_file(ASSETS / "target" / "model.safetensors"), load_file(target / "model.safetensors")
    assert old.keys() == new.keys()
    for name, w in old.items():
        kind = name.split(".")[-2]
        if kind in ("gate_proj", "up_proj"):
            assert new[name].shape == (3 * w.shape[0], w.shape[1]) and np.array_equal(new[name][: w.shape[0]], w)
        elif kind == "down_proj":
            assert new[name].shape == (w.shape[0], 3 * w.shape[1]) and np.array_equal(new[name][:, : w.shape[1]], w)
        else:
            assert np.array_equal(new[name], w), name
    config = json.loads((target / "config.json").read_text())
    assert config["intermediate_size"] == 3 * json.loads((ASSETS / "target" / "config.json").read_text())[
        "intermediate_size"]
    assert (grown[1] / "model.safetensors").read_bytes() == (ASSETS / "drafter" / "model.safetensors").read_bytes()


def test_growth_is_deterministic(grown, tmp_path):
    again, _ = grow_pair(ASSETS, tmp_path, GrowSpec(factor=3))
    record = json.loads((grown[0].parent / "pair.json").read_text())
    assert record["target_sha256"] == json.loads((tmp_path / "pair.json").read_text())["target_sha256"]
    assert record["spec"]["factor"] == 3 and record["target_parameters"] > 0


def test_grown_target_keeps_the_trained_greedy_output(grown):
    import torch
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[2, *range(40, 60)]])
    models = [AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32).eval() for p in (ASSETS / "target",
                                                                                             grown[0])]
    with torch.no_grad():
        logits = [m(ids).logits for m in models]
        outs = [m.generate(ids, max_new_tokens=24, do_sample=False)[0].tolist() for m in models]
    assert (logits[0] - logits[1]).abs().max().item() < 0.05  # near-silent new units, but not dead ones
    assert (logits[0] - logits[1]).abs().max().item() > 0
    assert outs[0] == outs[1]


def test_bad_factor_is_refused():
    with pytest.raises(ValueError, match="factor"):
        GrowSpec(factor=0)


def test_cached_pair_is_grown_once_and_kept(tmp_path, monkeypatch):
    """The demo's export records where its checkpoints are, so the grown pair must outlive the demo: it is grown
    into the cache once, reused after, and a killed growth's leftover folder is never taken for a pair."""
    from mtpkit.tiny import grow

    (tmp_path / ".growing-killed").mkdir()  # what a growth killed before its rename leaves
    target, drafter = grow.cached_pair(ASSETS, tmp_path, GrowSpec(factor=2))
    assert (target / "model.safetensors").is_file() and (drafter / "model.safetensors").is_file()
    assert target.parent.parent == tmp_path and not target.parent.name.startswith(".growing-")
    monkeypatch.setattr(grow, "grow_pair", lambda *a, **k: pytest.fail("grown again"))
    assert grow.cached_pair(ASSETS, tmp_path, GrowSpec(factor=2)) == (target, drafter)
    with pytest.raises(pytest.fail.Exception):  # another spec is another pair
        grow.cached_pair(ASSETS, tmp_path, GrowSpec(factor=3))
