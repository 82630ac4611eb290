"""`mtpkit run` as a user sees it: streaming, --json, and clear refusals of bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def _run(*args):
    return subprocess.run([sys.executable, "-m", "mtpkit", "run", *map(str, args)], capture_output=True, text=True)


def test_json_output_has_ids_text_and_stats(tiny_exports):
    out = tiny_exports("e2b_gemma4_centroid")
    result = _run(out, "--prompt", "def fib(n):", "--max-new-tokens", "12", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["prompt_ids"][0] == 2 and len(data["output_ids"]) <= 12
    stats = data["stats"]
    for key in ("rounds", "drafted", "accepted", "acceptance_by_position", "tokens_per_target_call", "ttft_ms",
                "latency_p50_ms", "latency_p95_ms", "tokens_per_s", "mean_accepted_per_round"):
        assert key in stats
    plain = json.loads(_run(out, "--prompt", "def fib(n):", "--max-new-tokens", "12", "--json", "--no-mtp").stdout)
    assert plain["output_ids"] == data["output_ids"]  # greedy speculative == greedy plain
    assert plain["stats"]["drafted"] == 0


def test_streaming_text_and_summary(tiny_exports):
    result = _run(tiny_exports("e2b_gemma4_centroid"), "--prompt", "hello", "--chat", "--max-new-tokens", "8",
                  "--temperature", "0.7", "--top-p", "0.9", "--seed", "1")
    assert result.returncode == 0, result.stderr
    assert "tokens per target call" in result.stderr and "tok/s" in result.stderr
    assert result.stderr.endswith("\n") and result.stdout.endswith("\n")  # nothing glued to the next output


def test_sampling_is_reproducible_with_a_seed(tiny_exports):
    args = ("--prompt", "abc", "--max-new-tokens", "16", "--temperature", "1.0", "--seed", "7", "--json")
    first = json.loads(_run(tiny_exports("e2b_gemma4_centroid"), *args).stdout)["output_ids"]
    again = json.loads(_run(tiny_exports("e2b_gemma4_centroid"), *args).stdout)["output_ids"]
    assert first == again


@pytest.mark.parametrize("args,needle", [
    (["--schedule", "fast"], "unknown schedule 'fast'"),
    (["-k", "0"], "--num-assistant-tokens must be >= 1"),
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--kv-handoff", "x"], "unknown --kv-handoff"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
])
def test_bad_arguments_are_refused(tiny_exports, args, needle):
    result = _run(tiny_exports("e2b_gemma4_centroid"), "--prompt", "hi", *args)
    assert result.returncode == 2 and needle in result.stderr and "Traceback" not in result.stderr


def test_prompt_longer_than_the_cache_is_refused(tiny_exports):
    result = _run(tiny_exports("e2b_gemma4_centroid"), "--prompt", "x" * 300, "--max-new-tokens", "4")
    assert result.returncode == 2 and "exceeds the export's KV capacity of 256" in result.stderr


def test_modified_graph_is_refused(tiny_exports, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_exports("e2b_gemma4_centroid"), bad)
    data = bytearray((bad / "drafter.onnx").read_bytes())
    data[-10] ^= 0xFF
    (bad / "drafter.onnx").write_bytes(bytes(data))
    result = _run(bad, "--prompt", "hi")
    assert result.returncode == 2 and "does not match the sha256 in manifest.json" in result.stderr


def test_not_an_export_folder(tmp_path):
    result = _run(tmp_path, "--prompt", "hi")
    assert result.returncode == 2 and "has no manifest.json" in result.stderr


def test_bench_reports_both_modes_and_a_ratio(tiny_exports, tmp_path):
    result = subprocess.run([sys.executable, "-m", "mtpkit", "bench", str(tiny_exports("e2b_gemma4_centroid")),
                             "--repeats", "1", "--max-new-tokens", "8", "--json", str(tmp_path / "b.json")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "b.json").read_text())
    assert len(report["rows"]) >= 4 and report["median_speedup"] > 0
    for row in report["rows"]:
        assert row["plain_ms_per_token"] > 0 and row["speculative_ms_per_token"] > 0
        assert row["speedup"] == pytest.approx(row["plain_ms_per_token"] / row["speculative_ms_per_token"])
    assert "median speedup" in result.stdout


def test_help_teaches(tmp_path):
    top = subprocess.run([sys.executable, "-m", "mtpkit", "--help"], capture_output=True, text=True)
    assert top.returncode == 0
    for cmd in ("make-tiny", "export", "run", "parity", "bench"):
        assert cmd in top.stdout
    export = subprocess.run([sys.executable, "-m", "mtpkit", "export", "--help"], capture_output=True, text=True)
    assert "--drafter" in export.stdout and "example" in export.stdout
