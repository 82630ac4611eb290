"""Fidelity on an export whose KV capacity is smaller than the reference: the reference prompts are measured cut
to fit, and the export says how many were cut."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from mtpkit.export.fidelity import MIN_NEW, fitted


def _engine(capacity: int, overhang: int = 0):
    """What fitted() reads of an Engine: the KV capacity and the positions a run needs."""
    target = SimpleNamespace(positions_needed=lambda prompt, new: prompt + new + overhang)
    return SimpleNamespace(kv=SimpleNamespace(capacity=capacity), target=target)


def _entry(name: str, prompt: int, greedy: int) -> dict:
    return {"name": name, "prompt_ids": list(range(prompt)), "greedy_ids": list(range(100, 100 + greedy))}


def test_a_reference_is_cut_to_the_capacity_keeping_greedy_prefixes():
    reference = {"prompts": [_entry("fits", 5, 5), _entry("long answer", 10, 20), _entry("long prompt", 30, 4)]}
    prompts, cut = fitted(reference, _engine(24, overhang=4))  # 20 ids per run
    assert cut == 2 and prompts[0] is reference["prompts"][0]
    assert prompts[1]["prompt_ids"] == list(range(10)) and prompts[1]["greedy_ids"] == list(range(100, 110))
    assert "text" not in prompts[1]  # a prefix of transformers' greedy output: still matched greedily
    assert prompts[2]["text"] and prompts[2]["prompt_ids"] == list(range(20 - MIN_NEW))
    assert prompts[2]["greedy_ids"] == list(range(20 - MIN_NEW, 20))  # the prompt's own next ids, forced as text
    assert all(len(p["prompt_ids"]) + len(p["greedy_ids"]) <= 20 for p in prompts)
    assert fitted(reference, _engine(64)) == (reference["prompts"], 0)


@pytest.mark.slow
def test_an_int4_export_with_a_small_kv_capacity_measures_its_fidelity(tmp_path):
    from mtpkit.tiny.train import ASSETS

    out = tmp_path / "int4-64"
    result = subprocess.run([sys.executable, "-m", "mtpkit", "export", str(ASSETS / "target"), "--drafter",
                             str(ASSETS / "drafter"), "--out", str(out), "--quant", "int4", "--max-cache-len", "64"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads((out / "quant_fidelity.json").read_text())["onnx"]
    reference = json.loads((out / "reference.json").read_text())["prompts"]
    cut = figures["runtime"]["prompts_cut"]
    assert 0 < cut <= len(reference) and figures["teacher_forced"]["prompts_cut"] == cut
    assert f"{cut} of {len(reference)} reference prompts cut to the KV capacity of 64" in result.stderr
    assert figures["teacher_forced"]["positions"] > 0 and figures["runtime"]["prompts"] > 0
    assert 0.0 <= figures["teacher_forced"]["top1_agreement"] <= 1.0
