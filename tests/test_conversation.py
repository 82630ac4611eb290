"""Conversations that keep their KV cache: each turn prefills only what is new, and every turn's tokens are those
a fresh prefill of the whole conversation gives (both backends, every structural variant); an edited or
regenerated history rewinds; a conversation that outgrows the cache drops its oldest turns or stops in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import LITERT_VARIANTS, VARIANTS

pytestmark = pytest.mark.slow

TURNS = ["def add(a, b):", "and a test", "in a class", "rename it"]
# the tiny variants' random weights answer in ids whose text re-tokenizes to several times as many: three turns of
# short answers fit their 256-slot cache
SHORT = 6


def _engines(export, backend):
    from mtpkit.runtime.engine import Engine

    return Engine(export, threads=1, backend=backend), Engine(export, threads=1, backend=backend)


def _fresh(engine, ids, cfg) -> list[int]:
    return [t for t, _ in engine.generate(ids, cfg)]  # from position 0: nothing reused


def _converse(export, backend, cfg, turns=TURNS[:3]):
    """Each turn through a Conversation and through a fresh prefill of the same rendered history."""
    from mtpkit.runtime.conversation import Conversation
    from mtpkit.runtime.stats import Stats

    kept, fresh = _engines(export, backend)
    conversation, seen = Conversation(kept), []
    for text in turns:
        stats = Stats()
        got = list(conversation.send(text, cfg, stats))
        seen.append((got, _fresh(fresh, conversation.prompt_ids, cfg), stats))
    return conversation, seen


def _check_turns(seen) -> None:
    """Every turn's tokens are a fresh prefill's; a later turn reuses the previous turn's prompt and answer (the
    answer renders as the ids generated; the cache holds all but the newest)."""
    for i, (got, want, stats) in enumerate(seen):
        assert got == want, f"turn {i + 1} differs from a fresh prefill"
        before = seen[i - 1][2].prompt_tokens + seen[i - 1][2].new_tokens - 1 if i else 0
        assert stats.cached_tokens >= before and (stats.cached_tokens > 0) == (i > 0)


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("mtp", [True, False])
def test_every_turn_is_a_fresh_prefills_on_onnx(tiny_exports, name, mtp):
    from mtpkit.runtime.engine import GenConfig

    conversation, seen = _converse(tiny_exports(name), "onnx", GenConfig(max_new_tokens=SHORT, mtp=mtp))
    _check_turns(seen)
    assert [m["role"] for m in conversation.messages] == ["user", "assistant"] * 3


@pytest.mark.parametrize("name", LITERT_VARIANTS)
def test_every_turn_is_a_fresh_prefills_on_litert(litert_exports, name):
    """Across the sliding window (8) and LiteRT's static prefill chunks (16): turns start mid-chunk."""
    from mtpkit.runtime.engine import GenConfig

    _, seen = _converse(litert_exports(name), "litert", GenConfig(max_new_tokens=SHORT))
    _check_turns(seen)
    assert any((s.prompt_tokens - s.cached_tokens) % 16 for _, _, s in seen[1:])


def test_seeded_sampling_is_reproducible_across_turns(tiny_exports):
    from mtpkit.runtime.engine import GenConfig
    from mtpkit.runtime.sampling import SamplingConfig

    cfg = GenConfig(max_new_tokens=SHORT, sampling=SamplingConfig(temperature=0.9, seed=7), num_assistant_tokens=2)
    _, seen = _converse(tiny_exports("e2b_gemma4_centroid"), "onnx", cfg, TURNS[:3])
    _check_turns(seen)


@pytest.mark.parametrize("backend", ["onnx", "litert"])
def test_an_edited_history_and_a_regenerated_answer_rewind_to_where_they_differ(litert_exports, backend):
    from mtpkit.runtime.conversation import Conversation
    from mtpkit.runtime.engine import GenConfig
    from mtpkit.runtime.stats import Stats

    cfg = GenConfig(max_new_tokens=SHORT)
    kept, fresh = _engines(litert_exports("e2b_gemma4_centroid"), backend)
    conversation = Conversation(kept)
    for text in TURNS[:3]:
        list(conversation.send(text, cfg))
    before = list(conversation.prompt_ids)
    conversation.messages.pop()  # regenerate the last answer
    stats = Stats()
    regenerated = list(conversation.reply(cfg, stats))
    assert regenerated == _fresh(fresh, conversation.prompt_ids, cfg) and conversation.prompt_ids == before
    assert stats.cached_tokens == len(before) - 1  # nothing new: only the last id runs again
    conversation.messages[2]["content"] = "a different second question"  # edit an earlier user turn
    conversation.messages.pop()
    differs = next(i for i, (a, b) in enumerate(zip(before, conversation.fit(cfg))) if a != b)
    # ONNX's sliding layers keep a ring of the last answer and its window: an edit before it prefills again
    # (tests/test_window_kv.py); LiteRT keeps every position
    resumable = kept.kv.resumable(differs)
    assert resumable or backend == "onnx"
    stats = Stats()
    edited = list(conversation.reply(cfg, stats))
    assert edited == _fresh(fresh, conversation.prompt_ids, cfg)
    assert stats.cached_tokens == (differs if resumable else 0)  # rewound to the first id that changed


def test_a_call_between_turns_voids_the_cached_prefix(tiny_exports):
    """Anything else the engine runs (a plain generate here) overwrites the cache: the next turn prefills all."""
    from mtpkit.runtime.conversation import Conversation
    from mtpkit.runtime.engine import GenConfig
    from mtpkit.runtime.stats import Stats

    cfg = GenConfig(max_new_tokens=8)
    kept, fresh = _engines(tiny_exports("e2b_gemma4_centroid"), "onnx")
    conversation = Conversation(kept)
    list(conversation.send(TURNS[0], cfg))
    kept.untimed[0].forward([5, 6, 7], 0)  # a tool's direct call
    stats = Stats()
    got = list(conversation.send(TURNS[1], cfg, stats))
    assert stats.cached_tokens == 0 and got == _fresh(fresh, conversation.prompt_ids, cfg)


@pytest.fixture(scope="module")
def small_cache(tiny_checkpoints, tmp_path_factory):
    """An ONNX export with a 128-slot KV cache."""
    import mtpkit

    target, drafter = tiny_checkpoints("e2b_gemma4_centroid")
    return mtpkit.export_pair(target, drafter, tmp_path_factory.mktemp("small") / "out", reference_tokens=4,
                              max_cache_len=128, check=False)


def test_a_full_cache_drops_the_oldest_turns_exactly_or_names_both_ways_out(small_cache):
    from mtpkit.runtime.conversation import Conversation, ConversationFullError
    from mtpkit.runtime.engine import GenConfig

    cfg = GenConfig(max_new_tokens=24)
    kept, fresh = _engines(small_cache, "onnx")
    conversation = Conversation(kept, drop_oldest=True)
    for text in TURNS * 2:
        got = list(conversation.send(text, cfg))
        assert got == _fresh(fresh, conversation.prompt_ids, cfg)
        assert conversation.messages[-2]["content"] == text  # the new turn is never what goes
    assert conversation.dropped > 0 and conversation.messages[0]["role"] == "user"
    strict = Conversation(kept, messages=conversation.messages)
    with pytest.raises(ConversationFullError, match="--drop-oldest.*/reset") as refused:
        for text in TURNS:
            list(strict.send(text, cfg))
    assert "\n" not in str(refused.value) and strict.messages[-1]["role"] == "assistant"  # the refused turn undone
    with pytest.raises(ConversationFullError, match="the last message alone"):
        Conversation(kept, drop_oldest=True).send("x " * 200, cfg)


def test_the_chat_cli_drops_the_oldest_turns_or_stops_in_one_line(small_cache):
    lines = "".join(f"{t}\n" for t in TURNS * 2)
    for flags, expected in ((["--drop-oldest"], "dropped the oldest"), ([], "--drop-oldest")):
        result = subprocess.run([sys.executable, "-m", "mtpkit", "chat", str(small_cache), "--max-new-tokens", "24",
                                 "--threads", "1", *flags], input=lines, capture_output=True, text=True)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        notes = [ln for ln in result.stderr.splitlines() if ln.startswith("mtpkit chat:")]
        assert notes and all(expected in ln for ln in notes), result.stderr


def test_a_generated_answer_renders_as_its_ids_only_where_the_template_inserts_its_text(tiny_exports):
    from mtpkit.runtime.manifest import load_manifest
    from mtpkit.runtime.tokenizer import TextCodec

    codec = TextCodec(load_manifest(tiny_exports(sorted(VARIANTS)[0])))
    answer = "\n    return a + b\n"  # what a template's `| trim` changes
    ids = [7, 8, 9]  # not what the text tokenizes to: the splice is visible
    history = [{"role": "user", "content": "def add(a, b):"}, {"role": "assistant", "content": answer},
               {"role": "user", "content": "and a test"}]
    head = codec.encode_chat(history[:1])  # the first turn's prompt
    spliced = codec.encode_chat(history, {1: ids})
    assert spliced[:len(head) + len(ids)] == head + ids and spliced != codec.encode_chat(history)
    rest = codec.encode_chat(history)[len(codec.encode_chat(history[:1])) + len(codec._ids(answer.strip())):]
    assert spliced[len(head) + len(ids):] == rest  # what follows the answer renders as text
    codec.template = codec.template.replace("| trim", "| trim | upper")  # the template changes the text: no splice
    assert codec.encode_chat(history, {1: ids}) == codec.encode_chat(history)
    codec.template = codec.template.replace("| trim | upper", "| trim")
    history[0]["content"] = "\ue000" + history[0]["content"]  # a message holding the mark's character: no splice
    assert codec.encode_chat(history, {1: ids}) == codec.encode_chat(history)


def test_an_edited_answer_renders_as_text(tiny_exports):
    from mtpkit.runtime.conversation import Conversation
    from mtpkit.runtime.engine import Engine, GenConfig

    conversation = Conversation(Engine(tiny_exports(sorted(VARIANTS)[0]), threads=1, backend="onnx"))
    list(conversation.send(TURNS[0], GenConfig(max_new_tokens=SHORT)))
    assert conversation._kept() == {1: conversation.answers[conversation.messages[1]["content"]]}
    conversation.messages[1] = {"role": "assistant", "content": "edited"}
    assert conversation._kept() == {}


def test_gemma4s_turn_format_splices_an_answer_unless_its_thought_is_stripped(tiny_exports):
    from pathlib import Path

    from mtpkit.runtime.manifest import load_manifest
    from mtpkit.runtime.tokenizer import TextCodec

    codec = TextCodec(load_manifest(tiny_exports(sorted(VARIANTS)[0])))
    codec.template = (Path(__file__).parents[1] / "android_demo/desktop/src/test/python/gemma4_text_chat.jinja").read_text()
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " Hello! "},
               {"role": "user", "content": "again"}]
    head = codec.encode_chat(history[:1])
    assert codec.encode_chat(history, {1: [7, 8]})[:len(head) + 2] == head + [7, 8]
    history[1]["content"] = "<|channel>thought\nsay hello<channel|>Hello!"  # the template drops the thought
    assert codec.encode_chat(history, {1: [7, 8]}) == codec.encode_chat(history)
