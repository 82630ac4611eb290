"""Model.chat: a history gives one answer, the one a fresh load gives, whatever the model served before; the cache
still reuses the prefix it holds. Conversation: saved and restored, it continues with the live one's tokens."""

from __future__ import annotations

import json

import pytest

import mtpkit
from mtpkit.errors import UsageError

pytestmark = pytest.mark.slow

TURNS = ["def add(a, b):", "and a test", "in a class", "rename it", "add types", "a docstring", "faster", "done?"]
NEW = 4  # tokens per answer: eight turns of the tiny variants' answers, rendered as text, fit 512 positions


@pytest.fixture(scope="module")
def roomy(tiny_checkpoints, tmp_path_factory):
    """An ONNX export of the chat tests' variant with room for eight turns (KV capacity 1024)."""
    target, drafter = tiny_checkpoints("e2b_gemma4_centroid")
    return mtpkit.export_pair(target, drafter, tmp_path_factory.mktemp("roomy") / "out", reference_tokens=4,
                              max_cache_len=1024, check=False)


def _export(backend, request):
    """ONNX: `roomy`; LiteRT: the shared LiteRT export whose KV capacity adapts to its model's 512 positions."""
    if backend == "onnx":
        return request.getfixturevalue("roomy")
    return request.getfixturevalue("litert_exports")("e4b_text_dense_kv_eq")


@pytest.mark.parametrize("backend", ["onnx", "litert"])
def test_eight_turns_of_chat_give_a_fresh_loads_tokens_and_prefill_only_what_is_new(backend, request, tmp_path):
    export = _export(backend, request)
    model = mtpkit.load(export, backend=backend, threads=1)
    model.generate(TURNS[0], max_new_tokens=NEW)  # what the model served before must not matter
    history, replies, saved = [], [], tmp_path / "history.json"
    for text in TURNS:
        history.append({"role": "user", "content": text})
        reply = model.chat(history, max_new_tokens=NEW)
        saved.write_text(json.dumps(history))
        fresh = mtpkit.load(export, backend=backend, threads=1).chat(json.loads(saved.read_text()), max_new_tokens=NEW)
        assert (reply.prompt_ids, reply.token_ids) == (fresh.prompt_ids, fresh.token_ids), f"turn {len(replies) + 1}"
        replies.append(reply)
        history.append({"role": "assistant", "content": reply.text})
    last, before = replies[-1], replies[-2]
    # turn 8 prefills at most the previous answer and the new message, as the template renders them
    assert 0 < last.stats["prefilled_tokens"] <= len(last.prompt_ids) - len(before.prompt_ids)
    assert last.stats["prefilled_tokens"] + last.stats["cached_tokens"] == last.stats["prompt_tokens"]
    # the saved history answered again, latest turn first: the same tokens in any order of calls
    reloaded = json.loads(saved.read_text())
    for i in (7, 2, 5, 0):
        again = model.chat(reloaded[:2 * i + 1], max_new_tokens=NEW)
        assert (again.prompt_ids, again.token_ids) == (replies[i].prompt_ids, replies[i].token_ids), f"turn {i + 1}"


def test_a_conversation_renders_its_answers_as_their_ids_and_chat_as_their_text(roomy):
    model = mtpkit.load(roomy, threads=1)
    conversation = model.conversation()
    first, second = (conversation.send(text, max_new_tokens=NEW) for text in TURNS[:2])
    # the first answer renders as the ids generated, so the second turn reuses all of it but the newest id
    reused = len(first.prompt_ids) + len(first.token_ids) - 1
    assert second.stats["cached_tokens"] >= reused
    assert list(second.prompt_ids[:reused]) == [*first.prompt_ids, *first.token_ids][:reused]
    history = conversation.messages[:-1]
    reply = model.chat(history, max_new_tokens=NEW)  # the same messages, the answer rendered as text
    assert list(reply.prompt_ids) == model.engine.codec.encode_chat(history) != list(second.prompt_ids)
    assert "".join(model.stream_chat(history, max_new_tokens=NEW)) == reply.text


def test_a_restored_conversation_continues_with_the_live_ones_tokens(roomy, tmp_path):
    live = mtpkit.load(roomy, threads=1).conversation()
    for text in TURNS[:3]:
        live.send(text, max_new_tokens=NEW)
    live.save(tmp_path / "conversation.json")
    restored = mtpkit.load(roomy, threads=1).load_conversation(tmp_path / "conversation.json")
    assert restored.messages == live.messages and restored.dropped == live.dropped
    codec = restored.model.engine.codec
    for text in TURNS[3:5]:
        want, got = live.send(text, max_new_tokens=NEW), restored.send(text, max_new_tokens=NEW)
        assert (got.prompt_ids, got.token_ids) == (want.prompt_ids, want.token_ids)
        # the kept answers render as their generated ids, which their text does not re-tokenize to
        assert list(got.prompt_ids) != codec.encode_chat(restored.messages[:-1])


def test_a_conversation_file_from_elsewhere_is_refused_in_one_line(roomy, tmp_path):
    model = mtpkit.load(roomy, threads=1)
    conversation = model.conversation()
    conversation.send(TURNS[0], max_new_tokens=NEW)
    path = tmp_path / "conversation.json"
    conversation.save(path)
    good = json.loads(path.read_text())
    assert [k["message"] for k in good["kept"]] == [1]
    bad = {"another tokenizer": {**good, "tokenizer_sha256": "0" * 64},
           "a user message": {**good, "kept": [{"message": 0, "ids": [1]}]},
           "an id beyond the vocabulary": {**good, "kept": [{"message": 1, "ids": [10 ** 9]}]},
           "another format": {**good, "format": "x"}}
    for what, state in bad.items():
        path.write_text(json.dumps(state))
        with pytest.raises(UsageError, match="is not a conversation mtpkit can restore") as refused:
            model.load_conversation(path)
        assert "\n" not in str(refused.value), what
    path.write_text("{")
    with pytest.raises(UsageError, match="JSONDecodeError"):
        model.load_conversation(path)
