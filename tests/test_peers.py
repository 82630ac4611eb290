"""`mtpkit bench --peers`: the peers section's arithmetic and schema (with fakes), one small end-to-end run on a
tiny ONNX export, and the one-line refusal without the [export] extra. Speed is never asserted."""

from __future__ import annotations

import json

import pytest

from mtpkit import cli, extras
from mtpkit.bench import peer_timing as lib
from mtpkit.bench.peer_timing import Peer, PeerOutput, PeerPrompt

PROMPTS = [PeerPrompt("code/a", "a", (2, 10)), PeerPrompt("prose/b", "b", (2, 11))]
REFERENCE = "mtpkit onnx plain"  # the first of mtpkit's own rows: every other row's tokens are compared with it


class Clock:
    """A fake perf_counter that only the fake peers move: each call "takes" its peer's given seconds."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def fake(clock, name, seconds: dict, tokens=(5, 6, 7, 8), baseline=None, text=None, calls=None) -> Peer:
    """A peer taking seconds[prompt][repeat] per call and returning `tokens` (or only `text`)."""
    done = {}

    def run(prompt):
        i = done[prompt.name] = done.get(prompt.name, -1) + 1
        clock.t += seconds[prompt.name][i]
        if calls is not None:
            calls.append((name, prompt.name))
        return PeerOutput(len(tokens), None if text else tuple(tokens), text)
    return Peer(name, run, 1, baseline)


def test_ratios_medians_and_token_checks_with_fakes():
    clock, calls = Clock(), []
    ref = fake(clock, REFERENCE, {"code/a": [0.004, 0.008, 0.006], "prose/b": [0.002, 0.002, 0.002]}, calls=calls)
    slow = fake(clock, "transformers plain", {"code/a": [0.06, 0.06, 0.09], "prose/b": [0.04, 0.05, 0.04]},
                baseline=REFERENCE, calls=calls)
    wrong = fake(clock, "other", {"code/a": [0.004] * 3, "prose/b": [0.004] * 3}, tokens=(5, 6, 0, 0),
                 baseline="missing row", calls=calls)
    texty = fake(clock, "litert-lm plain", {"code/a": [0.004] * 3, "prose/b": [0.004] * 3}, tokens=(1,) * 5,
                 text="w5 w6 w7 w8 extra", baseline=REFERENCE, calls=calls)
    peers = [ref, slow, wrong, texty]
    runs = lib.measure(peers, PROMPTS, repeats=3, clock=clock)
    # interleaved: every repeat runs every prompt on every peer, in the order given
    assert calls[:8] == [(p.name, q.name) for q in PROMPTS for p in peers]
    sec = lib.section(peers, PROMPTS, runs, lambda ids: " ".join(f"w{i}" for i in ids), 4, 3, ["a note"])
    assert sec["timing"] == lib.TIMING and sec["prompts"] == ["code/a", "prose/b"] and sec["notes"] == ["a note"]
    rows = {r["name"]: r for r in sec["rows"]}
    assert rows[REFERENCE]["per_prompt"][0]["ms_per_token"] == pytest.approx(1.5)  # median 6 ms / 4 tokens
    assert rows[REFERENCE]["ms_per_token"] == pytest.approx((1.5 + 0.5) / 2)  # then median over prompts
    t = rows["transformers plain"]
    assert [p["ratio"] for p in t["per_prompt"]] == pytest.approx([15.0 / 1.5, 10.0 / 0.5])
    assert t["ratio"] == pytest.approx((10.0 + 20.0) / 2)  # median of the per-prompt ratios
    assert lib.verdict(t) == "mtpkit onnx plain is 15.0x faster than transformers plain"
    assert (t["same_tokens"], t["compared"]) == (2, 2)
    assert rows["other"]["ratio"] is None and lib.verdict(rows["other"]) == ""  # its baseline did not run
    assert (rows["other"]["same_tokens"], rows["other"]["compared"]) == (0, 2)
    assert rows["litert-lm plain"]["same_tokens"] == 2  # text-only: begins with mtpkit's decoded text
    words = lambda ids: " ".join(f"w{i}" for i in ids)  # noqa: E731
    ref_out = PeerOutput(4, (5, 6, 7, 8))
    assert [lib._same(PeerOutput(4, None, t), ref_out, words) for t in ("w5 w6 w7", "w5 w6", "w5 w6 w7 w9", "")] == [
        True, False, False, False]  # the last token's text may be held back; nothing else may differ
    assert lib.verdict({**t, "ratio": 0.5}) == "mtpkit onnx plain is 2.0x slower than transformers plain"
    assert rows[REFERENCE]["same_tokens"] is None and rows[REFERENCE]["ratio"] is None
    json.dumps(sec)  # JSON-ready for bench.json
    md = "\n".join(lib.to_markdown(sec))
    assert "## Peers" in md and "| transformers plain | 1 | " in md and "| reference |" in md and "- a note" in md


@pytest.mark.slow
def test_bench_peers_end_to_end_on_a_tiny_onnx_export(tiny_exports, tmp_path, capfd, monkeypatch):
    folder = tiny_exports("e2b_gemma4_centroid")
    capfd.readouterr()  # what building the export fixture printed is not the bench's
    real = extras.importlib.util.find_spec  # as without the [llama-cpp] extra (tests/test_llama_cpp_peer.py: with)
    monkeypatch.setattr(extras.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    argv = ["bench", str(folder), "--peers", "--prompt", "def f(x):", "--repeats", "1", "--max-draft", "1",
            "--max-new-tokens", "4", "--threads", "1", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    out, err = capfd.readouterr()
    assert err == ""  # no third-party noise (stderr is no terminal, so no progress line either)
    assert "mtpkit onnx plain is" in out and "than transformers plain" in out
    sec = json.loads((tmp_path / "bench.json").read_text())["peers"]
    assert sec["max_new_tokens"] == 4 and sec["repeats"] == 1 and sec["prompts"] == ["custom/prompt0"]
    rows = {r["name"]: r for r in sec["rows"]}
    assert list(rows) == ["mtpkit onnx plain", "transformers plain", "mtpkit onnx spec", "transformers assisted"]
    assert rows["transformers plain"]["baseline"] == "mtpkit onnx plain"
    assert rows["transformers assisted"]["baseline"] == "mtpkit onnx spec"
    for r in rows.values():
        assert r["ms_per_token"] > 0 and r["per_prompt"][0]["new_tokens"] == 4
        assert r["threads"] == 1 or r["threads"] == {"target": 1, "drafter": 1}
    assert rows["transformers plain"]["ratio"] > 0
    assert rows["transformers plain"]["same_tokens"] == 1  # greedy: transformers' tokens are mtpkit's
    assert any("no LiteRT-LM rows: this export has no litert graphs" in n for n in sec["notes"])
    skipped = [n for n in sec["notes"] if "llama.cpp" in n]
    assert len(skipped) == 1 and "pip install 'mtpkit[llama-cpp]'" in skipped[0]
    assert out.count("note: llama.cpp rows skipped") == 1
    assert "## Peers" in (tmp_path / "bench.md").read_text()


def test_peers_without_the_export_extra_is_one_line(monkeypatch, capsys, tmp_path):
    real = extras.importlib.util.find_spec
    monkeypatch.setattr(extras.importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    assert cli.main(["bench", str(tmp_path), "--peers"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--peers" in err and "[export] extra (torch not installed)" in err, err


def test_peer_checkpoints_are_checked_before_the_bench(tmp_path):
    from types import SimpleNamespace

    from mtpkit.errors import CheckpointError
    from mtpkit.bench.peers import resolve_sources

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    entry = {"ref": str(tmp_path / "ckpt"), "revision": None, "config_sha256": "0" * 64}
    gone = {"ref": "./no/such/folder", "revision": None}
    with pytest.raises(CheckpointError, match=r"'./no/such/folder' \(manifest.json source.target.ref\), is not found"):
        resolve_sources(SimpleNamespace(source={"target": gone, "drafter": entry}))
    with pytest.raises(CheckpointError, match="is not the one this export was made from"):
        resolve_sources(SimpleNamespace(source={"target": {**entry, "config_sha256": None}, "drafter": entry}))


def test_peer_checkpoints_are_found_from_any_working_directory(tmp_path, monkeypatch):
    """manifest source.*.folder (absolute) is used when the ref was a path relative to where export ran."""
    from types import SimpleNamespace

    from mtpkit.bench.peers import resolve_sources

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    entry = {"ref": "ckpt", "revision": None, "folder": str(tmp_path / "ckpt")}
    target, _ = resolve_sources(SimpleNamespace(source={"target": entry, "drafter": entry}))
    assert target.folder.resolve() == (tmp_path / "ckpt").resolve()
