"""`mtpkit bench`: prompt files, the report's schema and files, the progress line, and -k auto on the CLI.

Speed is never asserted: only that every number the report promises is there and consistent.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from mtpkit.bench.report import Progress, to_markdown, write_report
from mtpkit.bench.sweep import BenchConfig, BenchPrompt, load_prompts


def test_prompts_file_lines_are_checked_and_named(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text('{"category": "code", "prompt": "def f(x):", "name": "f"}\n\n'
                    '{"category": "prose", "prompt": "Hi"}\n')
    assert load_prompts(good) == [BenchPrompt("code", "f", "def f(x):"), BenchPrompt("prose", "line3", "Hi")]
    for body, needle in [('{"category": "code", "prompt": "x"}\n{"prompt": "y"}\n', ":2: needs non-empty string"),
                         ('{"category": "code", "prompt": "x"}\nnot json\n', ":2: not valid JSON"),
                         ('["code", "x"]\n', ":1: needs non-empty string"),
                         ('{"category": "", "prompt": "x"}\n', ":1: needs"),
                         ("\n\n", "no prompts")]:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(body)
        with pytest.raises(ValueError, match=needle):
            load_prompts(bad)
    with pytest.raises(ValueError, match="no such file"):
        load_prompts(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("kwargs,needle", [
    (dict(repeats=0), "--repeats must be >= 1"),
    (dict(max_draft=0), "--max-draft must be >= 1"),
    (dict(num_assistant_tokens=0), "--num-assistant-tokens must be >= 1 or 'auto'"),
    (dict(num_assistant_tokens="auto", schedule="heuristic"), "contradict each other"),
    (dict(max_new_tokens=0), "--max-new-tokens must be >= 1"),
    (dict(max_new_tokens=2), "needs --max-new-tokens >= 3"),
])
def test_bench_config_validation(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        BenchConfig(**kwargs)


def test_max_draft_follows_a_static_verify_length():
    """`mtpkit bench DIR --backend litert` measures k = 1..the export's max_draft by default; an explicit
    --max-draft beyond it is refused up front instead of failing at its first run."""
    import types

    from mtpkit.runtime.engine import Engine

    def engine(kind, max_draft):
        engine = object.__new__(Engine)  # resolve() reads only these for an auto config
        engine.max_draft, engine.backend = max_draft, types.SimpleNamespace(kind=kind)
        return engine

    litert, onnx = engine("litert", 4), engine("onnx", None)
    assert BenchConfig().fitted(litert).max_draft == 4 and BenchConfig().fitted(onnx).max_draft == 8
    assert BenchConfig(max_draft=3).fitted(litert).max_draft == 3
    assert BenchConfig(max_draft=12).fitted(onnx).max_draft == 12
    with pytest.raises(ValueError, match=r"--max-draft 6: this litert export verifies at most 4 drafts .* "
                                         r"--max-draft <= 4"):
        BenchConfig(max_draft=6).fitted(litert)
    assert list(BenchConfig().fitted(litert).modes())[2:] == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="fit the config"):
        BenchConfig().modes()


def test_progress_only_on_a_terminal_and_not_quiet():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    for stream, quiet, shown in [(io.StringIO(), False, False), (Tty(), True, False), (Tty(), False, True)]:
        progress = Progress(quiet, stream)
        progress("prompt 1/2 code/fib: k=3 (1/3)")
        progress.close()
        assert ("k=3" in stream.getvalue()) == shown


@pytest.fixture(scope="module")
def report(tiny_exports):
    from mtpkit.bench.sweep import run_bench

    prompts = [BenchPrompt("code", "f", "def f(x):"), BenchPrompt("prose", "p", "Once upon a time")]
    return run_bench(tiny_exports("e2b_gemma4_centroid"), BenchConfig(repeats=1, max_new_tokens=8, max_draft=3), prompts,
                     threads=1)


@pytest.mark.slow
def test_report_schema(report):
    assert set(report) >= {"config", "backend", "threads", "rows", "categories", "median_speedup"}
    assert report["threads"] == {"target": 1, "drafter": 1} and report["config"]["max_draft"] == 3
    for row in report["rows"]:
        assert [k["k"] for k in row["ks"]] == [1, 2, 3]
        for k in row["ks"]:
            assert k["predicted_speedup"] > 0 and k["measured_speedup"] > 0 and k["predicted_tokens_per_round"] >= 1
        assert 0 <= row["chosen_k"] <= 3 and len(row["acceptance_by_position"]) == 3
        assert row["speedup"] == pytest.approx(row["plain_ms_per_token"] / row["speculative_ms_per_token"])
        assert set(row["costs_ms"]) == {"draft", "target", "round_host", "draft_host", "plain_host"}
        assert len(row["costs_ms"]["target"]) == 4
    assert set(report["categories"]) == {"code", "prose", "all"}
    assert report["categories"]["all"]["prompts"] == 2 and len(report["categories"]["all"]["predicted"]) == 3


@pytest.mark.slow
def test_report_files_and_a_missing_matplotlib(report, tmp_path, monkeypatch):
    assert write_report(report, tmp_path / "full") == []
    assert {p.name for p in (tmp_path / "full").iterdir()} == {"bench.json", "bench.md", "bench.png"}
    assert json.loads((tmp_path / "full" / "bench.json").read_text()) == json.loads(json.dumps(report))
    md = to_markdown(report)
    assert "| category | prompts | k=1 | k=2 | k=3 | auto | chosen k |" in md and "| f | code |" in md
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the runtime-only install has no matplotlib
    notes = write_report(report, tmp_path / "bare")
    assert len(notes) == 1 and "matplotlib is not installed" in notes[0]
    assert not (tmp_path / "bare" / "bench.png").exists() and (tmp_path / "bare" / "bench.md").exists()


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "mtpkit", *map(str, args)], capture_output=True, text=True)


@pytest.mark.slow
def test_bench_cli_prompts_file_and_output_folder(tiny_exports, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"category": "code", "prompt": "def f(x):"}\n')
    result = _cli("bench", tiny_exports("e2b_gemma4_centroid"), "--prompts", prompts, "--repeats", "1",
                  "--max-new-tokens", "6", "--max-draft", "2", "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert "k=1" in result.stdout and "k=2" in result.stdout and "median speedup" in result.stdout
    assert result.stderr == ""  # no progress line: stderr is not a terminal
    assert (tmp_path / "out" / "bench.md").exists() and (tmp_path / "out" / "bench.json").exists()
    prompts.write_text('{"category": "code", "prompt": "def f(x):"}\n{"category": "code"}\n')
    bad = _cli("bench", tiny_exports("e2b_gemma4_centroid"), "--prompts", prompts)
    assert bad.returncode == 2 and "p.jsonl:2: needs" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
@pytest.mark.parametrize("args,needle", [
    (["-k", "x"], "must be a positive integer or 'auto' (got 'x')"),
    (["-k", "auto", "--schedule", "constant"], "contradict each other"),
    (["-k", "3", "--schedule", "auto"], "contradict each other"),
    (["--max-draft", "0"], "--max-draft must be >= 1"),
])
def test_run_refuses_bad_draft_lengths(tiny_exports, args, needle):
    result = _cli("run", tiny_exports("e2b_gemma4_centroid"), "--prompt", "hi", *args)
    assert result.returncode == 2 and needle in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_greedy_output_is_the_same_for_plain_auto_and_every_k(tiny_exports):
    from mtpkit.runtime.engine import Engine, GenConfig

    engine = Engine(tiny_exports("e2b_gemma4_centroid"), threads=1)
    ids = engine.codec.encode("def fib(n):")

    def tokens(cfg):
        return [t for t, _ in engine.generate(ids, cfg)]

    want = tokens(GenConfig(max_new_tokens=20, mtp=False))
    assert tokens(GenConfig(max_new_tokens=20)) == want  # auto (the default)
    for k in range(1, 9):
        assert tokens(GenConfig(max_new_tokens=20, num_assistant_tokens=k, schedule="constant")) == want, k
    assert engine.run(ids, GenConfig(max_new_tokens=20, num_assistant_tokens="auto")).drafted >= 1


def test_chat_bench_times_each_turn_and_checks_it_against_a_fresh_prefill(tiny_exports, tmp_path):
    """--chat: a row per turn, medians of --repeats conversations; later turns find the earlier ones cached (the
    previous prompt and answer), and the run would have failed had any turn's tokens differed from a fresh
    prefill's."""
    out = tmp_path / "chat.json"
    result = _cli("bench", tiny_exports("e2b_gemma4_centroid"), "--chat", "--turns", "3", "--max-new-tokens", "4",
                  "--repeats", "2", "--threads", "1", "--json", out)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    turns = report["turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3] and turns[0]["cached_tokens"] == 0 and report["repeats"] == 2
    for before, turn in zip(turns, turns[1:]):
        assert before["prompt_tokens"] + before["new_tokens"] - 1 <= turn["cached_tokens"] < turn["prompt_tokens"]
    assert all(t["ttft_ms"] > 0 and t["fresh_ttft_ms"] > 0 for t in turns) and "| 3 |" in result.stdout
    refused = _cli("bench", tiny_exports("e2b_gemma4_centroid"), "--turns", "3")
    assert refused.returncode == 2 and "add --chat" in refused.stderr
