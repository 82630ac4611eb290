"""The Python API (mtpkit.load / Model) and `mtpkit chat`, against the CLI and the raw tokenizer."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import mtpkit

pytestmark = pytest.mark.slow

PROMPT = "def fib(n):"
STATS_LINE = re.compile(r"mtpkit: \d+ tokens, [\d.]+ tok/s, ttft [\d.]+ ms[^\n]*\n")


@pytest.fixture(scope="module")
def export_dir(tiny_exports):
    return tiny_exports("e2b_gemma4_centroid")


@pytest.fixture(scope="module")
def model(export_dir):
    return mtpkit.load(export_dir, threads=1)


def _cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "mtpkit", *map(str, args)], input=stdin, capture_output=True,
                          text=True)


def test_greedy_generate_matches_plain_decoding_and_the_cli(model, export_dir):
    spec = model.generate(PROMPT, max_new_tokens=12)
    plain = model.generate(PROMPT, max_new_tokens=12, mtp=False)
    assert spec.stats["drafted"] > 0 and plain.stats["drafted"] == 0  # both paths really ran
    assert spec.token_ids == plain.token_ids and len(spec.token_ids) > 0
    result = _cli("run", export_dir, "--prompt", PROMPT, "--max-new-tokens", "12", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert list(spec.token_ids) == data["output_ids"] and list(spec.prompt_ids) == data["prompt_ids"]
    assert spec.text == data["text"]


def test_stream_deltas_join_to_the_generated_text(model):
    full = model.generate(PROMPT, max_new_tokens=16, num_assistant_tokens=2)
    deltas = list(model.stream(PROMPT, max_new_tokens=16, num_assistant_tokens=2))
    assert "".join(deltas) == full.text and len(deltas) > 1
    assert model.last_stats["new_tokens"] == len(full.token_ids)


def test_stream_stopped_early_still_records_stats(model):
    it = model.stream(PROMPT, max_new_tokens=16, mtp=False)
    next(it)
    it.close()
    assert 1 <= model.last_stats["new_tokens"] < 16 and model.last_stats["target_calls"] >= 1


def test_bad_options_fail_at_the_call(model):
    with pytest.raises(ValueError, match="top_p"):
        model.stream(PROMPT, top_p=0)  # before iteration, not at the first next()
    # the request check too: a prompt beyond the KV capacity (it fired only at the first next())
    with pytest.raises(ValueError, match="exceeds the export's KV capacity"):
        model.stream(PROMPT, max_new_tokens=100_000)


def test_chat_renders_the_history_with_the_exports_template(model, export_dir):
    import jinja2
    from tokenizers import Tokenizer

    history = [{"role": "user", "content": "def add(a, b):"}, {"role": "assistant", "content": "return a + b"}]
    manifest = json.loads((export_dir / "manifest.json").read_text())
    template = (export_dir / manifest["tokenizer"]["chat_template_file"]).read_text()
    text = jinja2.Template(template).render(messages=history, add_generation_prompt=True, bos_token="<bos>")
    assert "<start_of_turn>model\nreturn a + b<end_of_turn>" in text and text.endswith("<start_of_turn>model\n")
    tokenizer = Tokenizer.from_file(str(export_dir / manifest["tokenizer"]["file"]))
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    reply = model.chat(history, max_new_tokens=8)
    assert list(reply.prompt_ids) == ids
    with_ids = [t for t, _ in model.engine.generate(ids, mtpkit.api.gen_config(max_new_tokens=8))]
    assert list(reply.token_ids) == with_ids
    assert "".join(model.stream_chat(history, max_new_tokens=8)) == reply.text


def test_import_mtpkit_loads_no_torch_and_no_runtime():
    code = ("import sys, mtpkit; from mtpkit.export.config import ExportConfig; assert callable(mtpkit.export_pair); "
            "print(sorted(n for n in sys.modules if n.split('.')[0] in "
            "('torch', 'transformers', 'onnxruntime', 'numpy', 'tokenizers')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_chat_cli_keeps_the_conversation(model, export_dir):
    result = _cli("chat", export_dir, "--max-new-tokens", "8", "--threads", "1", stdin="hello\nagain\n")
    assert result.returncode == 0, result.stderr
    assert len(STATS_LINE.findall(result.stderr)) == 2 and STATS_LINE.sub("", result.stderr) == ""
    prompts = re.findall(r"prompt (\d+) tokens \((\d+) reused, (\d+) prefilled\)", result.stderr)
    assert [int(reused) > 0 for _, reused, _ in prompts] == [False, True]  # the second turn reuses the first
    assert all(int(p) == int(r) + int(f) for p, r, f in prompts)
    conversation = model.conversation()  # what the CLI keeps: answers as the ids generated
    first, second = (conversation.send(text, max_new_tokens=8).text for text in ("hello", "again"))
    assert result.stdout == f"{first}\n{second}\n"


def test_chat_cli_survives_a_full_cache_and_resets(export_dir):
    result = _cli("chat", export_dir, "--max-new-tokens", "8", stdin="x" * 300 + "\n/reset\nhi\n\nnot read\n")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert any("KV capacity of 256" in ln and "shorten it" in ln for ln in lines) and "Traceback" not in result.stderr
    assert "mtpkit: history cleared" in lines and len(STATS_LINE.findall(result.stderr)) == 1  # ended at the empty line


def test_generation_options_are_one_keyword_set_and_one_constructor():
    """The API's keywords and the CLI's flags build a GenConfig the same way (GenConfig.from_options); an unknown
    keyword is a TypeError naming the known ones."""
    import argparse

    from mtpkit.api import GENERATION_OPTIONS, gen_config
    from mtpkit.runtime import commands
    from mtpkit.runtime.engine import GenConfig
    from mtpkit.runtime.sampling import SamplingConfig

    cfg = gen_config(max_new_tokens=8, temperature=0.5, seed=3)
    assert cfg == GenConfig(max_new_tokens=8, sampling=SamplingConfig(temperature=0.5, seed=3))
    parser = argparse.ArgumentParser()
    commands.add_arguments(parser, "run")
    args = parser.parse_args(["DIR", "--prompt", "x", "--max-new-tokens", "8", "--temperature", "0.5", "--seed", "3"])
    assert commands.generation_config(args) == cfg
    assert set(GENERATION_OPTIONS) <= set(commands.GENERATION_FLAGS)
    with pytest.raises(TypeError, match="unknown keyword 'temprature'; the generation keywords are max_new_tokens"):
        gen_config(temprature=0.5)
    with pytest.raises(TypeError, match="unknown generation option 'k'"):
        GenConfig.from_options(k=3)
