"""`mtpkit parity` on every structural variant: speculative greedy == plain greedy == transformers,
k in {1,2,4,8}, both schedules, prompts longer than the sliding window, and drafts == transformers' in hf mode."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import VARIANTS
from mtpkit.runtime.parity import run_parity

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parity_passes(tiny_exports, name):
    report = run_parity(tiny_exports(name))
    assert report["ok"], [r for r in report["results"] if not r["ok"]][:3]
    assert report["draft_lengths"] == [1, 2, 4, 8]
    kinds = {r["name"].split(" == ")[0] for r in report["results"]}
    for k in (1, 2, 4, 8):
        assert {f"speculative k={k} constant", f"speculative k={k} heuristic", f"drafts k={k} hf-handoff"} <= kinds
    assert "long" in report["prompts"]


def test_parity_cli_writes_report_and_fails_on_a_tampered_reference(tiny_exports, tmp_path):
    import shutil

    src = tiny_exports("e2b_gemma4_centroid")
    ok = subprocess.run([sys.executable, "-m", "mtpkit", "parity", str(src), "--json", str(tmp_path / "r.json")],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and "parity PASS" in ok.stdout
    assert json.loads((tmp_path / "r.json").read_text())["failed"] == 0
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    ref = json.loads((bad / "reference.json").read_text())
    ref["prompts"][0]["greedy_ids"][3] ^= 1  # transformers "said" something else
    (bad / "reference.json").write_text(json.dumps(ref))
    refused = subprocess.run([sys.executable, "-m", "mtpkit", "parity", str(bad)], capture_output=True, text=True)
    assert refused.returncode == 2 and "reference.json does not match the sha256" in refused.stderr  # modified file
    from mtpkit.runtime.manifest import sha256_file

    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["reference"]["sha256"] = sha256_file(bad / "reference.json")  # signed again: parity itself must fail
    (bad / "manifest.json").write_text(json.dumps(manifest))
    failed = subprocess.run([sys.executable, "-m", "mtpkit", "parity", str(bad)], capture_output=True, text=True)
    assert failed.returncode == 1 and "parity FAIL" in failed.stdout and "MISMATCH" in failed.stderr
