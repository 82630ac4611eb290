"""`mtpkit demo`, the README's main job, on the shipped trained pair."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_demo_exports_proves_parity_and_reports_speed(tmp_path):
    out = tmp_path / "demo"
    result = subprocess.run([sys.executable, "-m", "mtpkit", "-q", "demo", str(out), "--repeats", "1",
                             "--max-new-tokens", "24", "--pair", "small"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "parity (onnx): PASS" in result.stdout and "median speedup" in result.stdout
    report = json.loads((out / "demo_onnx.json").read_text())
    assert report["prompts"] == 12
    # the runtime's hf hand-off reproduces transformers' drafts, so its tokens per target call are transformers'
    # own figure on the same prompts up to the shorter generation length here (24 vs 64 new tokens)
    assert report["tokens_per_target_call"]["hf"] > 1.5
    assert all(0 < r["hf"]["new_tokens"] <= 24 for r in report["rows"])
    assert report["median_predicted_speedup"] > 0 and report["call_ms"]["drafter_step"] > 0  # values: not asserted
    assert all(r["bench"]["predicted_k"] >= 0 for r in report["rows"])
    # the export records the trained drafter's acceptance by position: auto's prior (68% at position 1 in pair.json)
    prior = json.loads((out / "manifest.json").read_text())["backends"]["onnx"]["options"]["acceptance_by_position"]
    assert len(prior) == 8 and prior[0] > 0.3
    assert json.loads((out / "demo_pair.json").read_text())["pair"] == "small"
