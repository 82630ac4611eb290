"""`mtpkit demo`, the README's main job, on the shipped trained pair."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_demo_exports_proves_parity_and_reports_speed(tmp_path):
    """Default flags: parity on the float LiteRT export, speed and exactness on the LiteRT int8 recipe derived from
    it, then LiteRT-LM on that recipe's bundle."""
    out = tmp_path / "demo"
    result = subprocess.run([sys.executable, "-m", "mtpkit", "-q", "demo", str(out), "--repeats", "1",
                             "--max-new-tokens", "24", "--pair", "small"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "parity (litert, fp32 vs transformers): PASS" in result.stdout and "median speedup" in result.stdout
    assert "k in [1, 2, 3]" in result.stdout  # the reference covers the export's longest round
    report = json.loads((out / "demo_litert.json").read_text())
    assert report["prompts"] == 12 and report["recipe"] == "int8" and report["export"] == str(out / "int8")
    timed = json.loads((out / "int8" / "manifest.json").read_text())["backends"]["litert"]["options"]
    assert {q["recipe"] for q in timed["quantization"].values()} == {"int8"}
    # the LiteRT int8 recipe is exact: every speculative run gives plain decoding's tokens, and LiteRT-LM's text
    assert report["same_tokens"] == report["runs"] == 36
    assert report["litert_lm"]["same_text"] == 12
    # the runtime's hf hand-off reproduces transformers' drafts on float graphs; on int8 ones its tokens per target
    # call stay near transformers' own figure (2.67 in pair.json at 64 new tokens; 24 here)
    assert report["tokens_per_target_call"]["hf"] > 1.5
    assert all(0 < r["hf"]["new_tokens"] <= 24 for r in report["rows"])
    assert report["median_predicted_speedup"] > 0 and report["call_ms"]["drafter_step"] > 0  # values: not asserted
    assert all(r["bench"]["predicted_k"] >= 0 for r in report["rows"])
    # the export records the trained drafter's acceptance by position: auto's prior (68% at position 1 in pair.json)
    assert len(timed["acceptance_by_position"]) == 3 and timed["acceptance_by_position"][0] > 0.3
    # the product's default export: a LiteRT verify of 4 tokens, so the hand-off checks run k = 3 (pair.json: 4)
    assert timed["max_draft"] == report["k"] == 3 and report["transformers_k"] == 4
    assert json.loads((out / "demo_pair.json").read_text())["pair"] == "small"
    # the cost shape is printed beside E2B's on the same recipe and CPU kind, where that was measured
    from mtpkit.tiny.demo import E2B_COST_RATIO, cpu_kind

    assert report["cpu"] == cpu_kind() and report["e2b_cost_ratio"] == E2B_COST_RATIO[("litert", "int8")].get(cpu_kind())
    e2b = f"E2B on litert int8, {cpu_kind()}: 1/{report['e2b_cost_ratio']}" if report["e2b_cost_ratio"] else "E2B not"
    assert e2b in result.stdout

