"""The shipped trained pair (mtpkit/tiny/assets/tiny_pair) and the `mtpkit train-tiny` recipe that makes it."""

from __future__ import annotations

import json

import pytest

from mtpkit.tiny.train import ASSETS, TrainConfig, file_hashes, train_tiny

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# Held-out style prompts (bisect.py / textwrap.py are held out of training); fixed here so the test does not
# depend on the local Python's copy of the stdlib.
PROMPTS = [
    'def insort_left(a, x, lo=0, hi=None, *, key=None):\n    """Insert item x in list a, and keep it sorted'
    ' assuming a is sorted.\n    """\n    if key is None:\n        lo = bisect_left(a, x, lo, hi)\n',
    "class TextWrapper:\n    \"\"\"\n    Object for wrapping/filling text.  The public interface consists of\n"
    "    the wrap() and fill() methods; the other methods are just there for\n",
]


def _pair() -> dict:
    return json.loads((ASSETS / "pair.json").read_text())


def _load(folder):
    from transformers import Gemma4AssistantForCausalLM, Gemma4ForCausalLM

    target = Gemma4ForCausalLM.from_pretrained(folder / "target").eval()
    drafter = Gemma4AssistantForCausalLM.from_pretrained(folder / "drafter").eval()
    return target, drafter


def test_shipped_files_match_pair_json():
    recorded = _pair()["files"]
    assert file_hashes(ASSETS) == recorded  # every file hashed, none missing, none extra
    assert {"target/model.safetensors", "drafter/model.safetensors", "target/tokenizer.json"} <= set(recorded)
    total = sum((ASSETS / name).stat().st_size for name in recorded)
    assert total <= 25 * 1024 * 1024


def test_shipped_pair_is_lossless_and_drafts_are_accepted():
    from tokenizers import Tokenizer

    from mtpkit.tiny.training.measure import run_prompt

    target, drafter = _load(ASSETS)
    assert drafter.generation_config.num_assistant_tokens == 4
    tok = Tokenizer.from_file(str(ASSETS / "target" / "tokenizer.json"))
    hits = total = 0
    for text in PROMPTS:
        ids = torch.tensor([[2] + tok.encode(text, add_special_tokens=False).ids])
        result = run_prompt(target, drafter, ids, new_tokens=24)
        assert result["lossless"], "assisted generate differs from plain greedy"
        assert result["new_tokens"] == 24
        hits, total = hits + result["first_hits"], total + result["first_total"]
    assert total > 0 and hits / total >= 0.5, f"drafter acceptance at position 1 is only {hits}/{total}"


def test_pair_json_records_the_recipe():
    pair = _pair()
    cfg = TrainConfig(**pair["config"])  # the recorded config is valid input to the recipe
    assert cfg.vocab_size % cfg.num_centroids == 0
    assert pair["figures"]["all"]["lossless"] is True
    corpus = pair["corpus"]
    assert len(corpus["file_sha256"]) == len(corpus["train_files"]) + len(corpus["heldout_files"])


@pytest.mark.parametrize("bad", [{"hidden": 100}, {"vocab_size": 2048, "num_centroids": 48},
                                 {"centroid_top_k": 0}, {"prompt_len": 126}, {"target_steps": 0}])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        TrainConfig(**bad)


def test_cli_flags_build_the_config():
    from mtpkit.cli import build_parser

    args = build_parser().parse_args(["train-tiny", "--out", "x", "--target-steps", "7", "--max-train-files", "2"])
    assert args.target_steps == 7 and args.max_train_files == 2 and args.drafter_steps == TrainConfig().drafter_steps


SMOKE = dict(vocab_size=512, hidden=64, intermediate=64, drafter_hidden=32, drafter_intermediate=32,
             num_centroids=16, centroid_top_k=2, sliding_window=8, seq_len=40, prompt_len=16, batch=2,
             drafter_batch=2, target_steps=2, drafter_steps=2, warmup=1, max_train_files=2, eval_prompts=1,
             eval_new_tokens=8, log_every=1)


def test_recipe_smoke_run_writes_loadable_pair(tmp_path):
    out = train_tiny(TrainConfig(out=tmp_path / "pair", **SMOKE))
    pair = json.loads((out / "pair.json").read_text())
    assert file_hashes(out) == pair["files"]
    target, drafter = _load(out)
    assert target.config.vocab_size == 512 and drafter.config.num_centroids == 16
    assert sorted(drafter.masked_embedding.token_ordering.tolist()) == list(range(512))  # a permutation
    assert pair["figures"]["all"]["lossless"] is True
    assert len(pair["corpus"]["train_files"]) == 2  # the listing names what was actually read
    with pytest.raises(FileExistsError):  # no silent overwrite of a trained pair
        train_tiny(TrainConfig(out=out, **SMOKE))
