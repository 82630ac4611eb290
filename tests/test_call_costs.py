"""tools/call_costs.py and tools/drafter_round.py: recipes side by side in one table; the LiteRT bytes accounting
against the checkpoint; a drafter round with held inputs; no timing asserted."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ai_edge_litert")

from conftest import LITERT_VARIANTS  # noqa: E402
from mtpkit.runtime.manifest import load_manifest  # noqa: E402
from test_scale_bench import _linear_weight_count  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.litert]
NAME = LITERT_VARIANTS[0]


@pytest.fixture(scope="module")
def call_costs(tool):
    return tool("call_costs")


def test_decode_weights_are_the_linear_weights_on_both_backends(litert_exports, tiny_checkpoints, call_costs):
    """The float LiteRT decode multiplies every nn.Linear weight once (the tied LM head included), as ONNX does:
    gathered tables are not counted."""
    manifest = load_manifest(litert_exports(NAME))
    want = 4 * _linear_weight_count(tiny_checkpoints(NAME)[0])
    assert call_costs.decode_weight_bytes(manifest, "litert") == want
    assert call_costs.decode_weight_bytes(manifest, "onnx") == want


def test_one_table_compares_every_export_given(litert_exports, call_costs, tmp_path):
    out = litert_exports(NAME)
    argv = [f"{out}@onnx", f"{out}@litert", "--threads", "1", "--past", "20", "--rounds", "1", "--max-draft", "3",
            "--acceptance", "0.7,0.7,0.7", "--acceptance", "0.4,0.3", "--no-bandwidth", "--json", str(tmp_path / "r.json"),
            "--out", str(tmp_path / "r.md")]
    assert call_costs.main(argv) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    onnx, litert = report["rows"]
    assert (onnx["backend"], litert["backend"]) == ("onnx", "litert")
    assert list(onnx["verify_ms"]) == ["1", "2", "3"]  # dynamic shapes: --max-draft
    assert list(litert["verify_ms"]) == [str(k) for k in range(1, 9)]  # the export's static max_draft
    fastest = min(onnx["decode_ms"], litert["decode_ms"])
    assert (len(onnx["draft_steps_ms"]), len(litert["draft_steps_ms"])) == (3, 8)  # a round of max_draft steps
    for row in (onnx, litert):
        assert row["draft_ms"] == pytest.approx(sum(row["draft_steps_ms"]) / len(row["draft_steps_ms"]))
        # k drafts cost the round's first k steps: k = 1 is charged the first step alone
        first = {**row, "draft_steps_ms": row["draft_steps_ms"][:1], "verify_ms": {1: row["verify_ms"]["1"]}}
        assert row["predicted"]["0.4,0.3"][0] == call_costs.predicted(first, [0.4])[0]
        assert row["verify_ratio"] == pytest.approx(row["verify_ms"][str(max(map(int, row["verify_ms"])))]
                                                    / row["decode_ms"])
        assert [p["k"] for p in row["predicted"]["0.7,0.7,0.7"]] == [1, 2, 3]
        assert [p["k"] for p in row["predicted"]["0.4,0.3"]] == [1, 2]  # as many drafts as the profile has
        for label, rows_k in row["predicted"].items():
            best = min(rows_k, key=lambda p: p["ms_per_token"])
            assert row["best"][label]["vs_fastest_plain"] == pytest.approx(best["ms_per_token"] / fastest)
    table = (tmp_path / "r.md").read_text().splitlines()
    assert table[0].startswith("| export | backend | recipe | decode ms") and len(table[2:4]) == 2
    assert "vs fastest plain (0.7,0.7,0.7)" in table[0] and "vs fastest plain (0.4,0.3)" in table[0] and "command: `python tools/call_costs.py" in (tmp_path / "r.md").read_text()


def test_drafter_round_tool_drafts_the_same_with_held_inputs(litert_exports, tool, capsys):
    """tools/drafter_round.py asserts held-input rounds draft what rounds setting every input draft; at position
    40 the runtime runs the 64-slot full-prefix signature."""
    assert tool("drafter_round").main([str(litert_exports(NAME)), "--past", "40", "--rounds", "1", "--held-vs-set"]) == 0
    out = capsys.readouterr().out
    assert "(draft_masked_64)" in out and "every input set every step" in out and "held after step 1" in out


def test_heldout_vs_times_two_exports_and_checks_exactness(litert_exports, tool, capsys):
    """tools/heldout_vs.py: one row per export (EXPORT@BACKEND picks its backend) with its static verify length,
    every speculative run's tokens against plain decoding's (its exit status), and each speculative run against
    the fastest plain one."""
    out = str(litert_exports(NAME))
    assert tool("heldout_vs").main([out, f"{out}@onnx", "--max-new-tokens", "4", "--repeats", "1"]) == 0
    printed = capsys.readouterr().out.splitlines()
    table = [line for line in printed if line.startswith(("| 1: ", "| 2: "))]
    assert len(table) == 2 and all(row.endswith(" 12/12 |") for row in table)
    assert [row.split(" | ")[1] for row in table] == ["8", "None"]  # LiteRT's static verify; ONNX verifies any k
    assert "against the fastest plain" in printed[-1]
