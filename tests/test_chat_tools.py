"""Tool calls and thinking in chat: tools and enable_thinking render as transformers renders them, and an answer's
thought and tool calls come apart from its text, whole and streamed. The tiny models write random text, so the
answers here are scripted: the sampler picks the ids of a given text, through the real Model.chat path."""

from __future__ import annotations

from pathlib import Path

import pytest

import mtpkit

TEMPLATE = Path(__file__).with_name("data") / "gemma4_tools.jinja"  # Gemma 4's markup for tools and thinking
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "City name"}, "days": {"type": "integer", "description": "Days"}}}}}
CALL = '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>'
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "reasoning_content": "Ask the tool.", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
    {"role": "tool", "name": "get_weather", "content": "sunny"},
    {"role": "assistant", "content": "<|channel>thought\nIt said sunny.<channel|>Sunny."},
    {"role": "user", "content": "And tomorrow?"},
]


def _codec_and_transformers(tmp_path):
    """The runtime's TextCodec and transformers' tokenizer on the same tiny tokenizer files and template."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from mtpkit.runtime.tokenizer import TextCodec
    from mtpkit.tiny.make import BOS_ID, build_tokenizer, write_tokenizer

    write_tokenizer(tmp_path, build_tokenizer(), TEMPLATE.read_text())
    codec = TextCodec.__new__(TextCodec)  # no export: only what rendering reads
    codec.tokenizer, codec.bos, codec.add_bos = Tokenizer.from_file(str(tmp_path / "tokenizer.json")), BOS_ID, True
    codec.template, codec.template_path = TEMPLATE.read_text(), TEMPLATE
    return codec, AutoTokenizer.from_pretrained(str(tmp_path))


@pytest.mark.parametrize("thinking", [None, False, True])
@pytest.mark.parametrize("cut", [2, 4, 6])  # after the user, after the tool's answer (no new turn), at the end
def test_tools_and_thinking_render_as_transformers_renders_them(tmp_path, thinking, cut):
    codec, hf = _codec_and_transformers(tmp_path)
    messages = HISTORY[:cut]
    extra = {} if thinking is None else {"enable_thinking": thinking}
    for tools in (None, [WEATHER]):
        want = hf.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True, **extra)
        assert codec.render_chat(messages, tools=tools, **extra) == want
        assert codec.encode_chat(messages, tools=tools, enable_thinking=thinking) == \
            hf(want, add_special_tokens=False)["input_ids"]
    text = codec.render_chat(HISTORY, tools=[WEATHER], enable_thinking=thinking)
    assert "declaration:get_weather{" in text and CALL in text and "It said sunny" not in text
    assert ("<|think|>" in text) == bool(thinking) and "Ask the tool." not in text  # an earlier turn's thoughts


def test_an_answer_streamed_a_character_at_a_time_splits_as_it_does_whole():
    from mtpkit.runtime.channels import Splitter, split

    raw = (f'<|channel>thought\nHot<eos>.<channel|>Sure<pad>.{CALL}<|tool_call>call:f{{"a b":[1,{{x:null}}],'
           f'q:"say \\"hi\\"",ok:false,n:<|"|>a, b: c<|"|>}}<tool_call|>done<eos>')
    specials = ["<eos>", "<pad>", '<|"|>']  # Gemma 4's string delimiter is a special token: kept inside a call
    whole = split(raw, specials)
    assert (whole.thought, whole.text, whole.tool_call_error) == ("Hot.", "Sure.done", None)
    assert whole.tool_calls == [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}},
                                {"name": "f", "arguments": {"a b": [1, {"x": None}], "q": 'say "hi"', "ok": False,
                                                             "n": "a, b: c"}}]
    splitter = Splitter(specials)
    streamed = [p for ch in raw for p in splitter.feed(ch)] + list(splitter.finish())
    assert splitter.split == whole and all("<" not in p for p in streamed if p.kind == "text")


@pytest.fixture(scope="module")
def model(tiny_exports):
    model = mtpkit.load(tiny_exports("e2b_gemma4_centroid"), threads=1)
    model.engine.codec.template = TEMPLATE.read_text()
    return model


@pytest.fixture
def scripted(model, monkeypatch):
    """script(text): the next answer is text's ids, then EOS, whatever the logits say; returns how many ids."""
    from mtpkit.runtime import engine

    answers: list[list[int]] = []

    class Scripted:
        def __init__(self, cfg):
            self.ids = iter(answers.pop(0))

        def pick(self, logits):
            return next(self.ids)

    def script(text: str) -> int:
        answers.append([*model.engine.codec._ids(text), model.engine.manifest.eos_ids[0]])
        return len(answers[-1])

    monkeypatch.setattr(engine, "Sampler", Scripted)
    return script


def _pieces(stream) -> dict[str, list]:
    pieces = list(stream)
    return {kind: [p.call if kind == "tool_call" else str(p) for p in pieces if p.kind == kind]
            for kind in ("text", "thought", "tool_call")}


@pytest.mark.slow
def test_a_generated_tool_call_is_returned_parsed_and_renders_back(model, scripted):
    call = {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}
    user = [{"role": "user", "content": "Paris?"}]
    n = scripted(f"Let me check.{CALL}")
    reply = model.chat(user, tools=[], mtp=False, max_new_tokens=n)
    assert (reply.text, reply.tool_calls, reply.tool_call_error) == ("Let me check.", [call], None)
    n = scripted(f"Let me check.{CALL}")
    pieces = _pieces(model.stream_chat(user, mtp=False, max_new_tokens=n))
    assert "".join(pieces["text"]) == "Let me check." and pieces["tool_call"] == [call]
    assert model.last_generation.tool_calls == [call]
    conversation = model.conversation(user)  # the call and the tool's answer render in the next prompt
    n = scripted(CALL)
    conversation.reply(mtp=False, max_new_tokens=n)
    assert conversation.messages[-1] == {"role": "assistant", "content": "",
                                         "tool_calls": [{"type": "function", "function": call}]}
    conversation.messages.append({"role": "tool", "name": "get_weather", "content": "sunny"})
    n = scripted("Sunny.")
    answer = conversation.reply(mtp=False, max_new_tokens=n)
    prompt = model.engine.codec.decode_marked(list(answer.prompt_ids))
    assert prompt.endswith(f'{CALL}<|tool_response>response:get_weather{{value:<|"|>sunny<|"|>}}<tool_response|>')
    assert answer.text == "Sunny." and answer.tool_calls == []


@pytest.mark.slow
def test_a_malformed_call_comes_back_as_text_with_the_reason(model, scripted):
    bad = '<|tool_call>call:get_weather{city:<|"|>Paris}<tool_call|>'  # the string is never closed
    n = scripted(f"Checking {bad}")
    reply = model.chat([{"role": "user", "content": "Paris?"}], mtp=False, max_new_tokens=n)
    assert reply.text == f"Checking {bad}" and reply.tool_calls == []
    assert reply.tool_call_error == 'a string in the call has no closing <|"|>'
    n = scripted("<|tool_call>call:get_weather{city:1")  # cut off before its end
    reply = model.chat([{"role": "user", "content": "Paris?"}], mtp=False, max_new_tokens=n)
    assert reply.tool_call_error == "the call has no closing <tool_call|>" and reply.text.startswith("<|tool_call>")


@pytest.mark.slow
def test_the_thought_comes_apart_from_the_text_and_leaves_the_history(model, scripted, tmp_path):
    answer = "<|channel>thought\nIt is July.<channel|>Sunny."
    conversation = model.conversation(enable_thinking=True)
    n = scripted(answer)
    reply = conversation.send("Paris?", mtp=False, max_new_tokens=n)
    assert "<|think|>" in model.engine.codec.decode_marked(list(reply.prompt_ids))
    assert (reply.text, reply.thought) == ("Sunny.", "It is July.")
    assert conversation.messages[-1] == {"role": "assistant", "content": "Sunny.", "reasoning_content": "It is July."}
    n = scripted("Rain.")
    later = conversation.send("Lyon?", mtp=False, max_new_tokens=n)
    assert "It is July." not in model.engine.codec.decode_marked(list(later.prompt_ids))  # the template strips it
    n = scripted(answer)
    pieces = _pieces(model.stream_chat([{"role": "user", "content": "Paris?"}], enable_thinking=True, mtp=False,
                                       max_new_tokens=n))
    assert ("".join(pieces["thought"]), "".join(pieces["text"])) == ("It is July.", "Sunny.")
    assert len(pieces["thought"]) > 1  # streamed as it came, not at the end
    conversation.state.tools = [WEATHER]
    conversation.save(tmp_path / "chat.json")  # a restored conversation renders its tools and thinking again
    restored = model.load_conversation(tmp_path / "chat.json")
    assert (restored.state.tools, restored.state.enable_thinking, restored.messages) == \
        ([WEATHER], True, conversation.messages)


@pytest.mark.slow
def test_chat_cli_passes_tools_and_thinking_and_prints_calls_and_thoughts_apart(model, scripted, monkeypatch,
                                                                                  capsys, tmp_path):
    import io
    import json

    from mtpkit.cli import main
    from mtpkit.runtime import tokenizer

    seen = []
    render = tokenizer.render
    monkeypatch.setattr(tokenizer, "render", lambda *a, **kw: seen.append(kw) or render(*a, **kw))
    (tmp_path / "tools.json").write_text(json.dumps([WEATHER]))
    n = scripted(f"<|channel>thought\nHot.<channel|>Checking.{CALL}")
    n = max(n, scripted("Sunny."))
    monkeypatch.setattr("sys.stdin", io.StringIO("Paris?\n/tool get_weather sunny\n"))
    assert main(["chat", str(model.engine.manifest.root), "--tools", str(tmp_path / "tools.json"), "--thinking",
                 "--no-mtp", "--max-new-tokens", str(n), "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    call = {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}
    assert out == f'Checking.\n{json.dumps({"tool_call": call})}\n\nSunny.\n'
    assert err.startswith("Hot.\n") and "<|" not in out + err
    assert {(kw["tools"] == [WEATHER], kw["enable_thinking"]) for kw in seen} == {(True, True)}
    assert seen[-1]["messages"][-1] == {"role": "tool", "name": "get_weather", "content": "sunny"}


@pytest.mark.parametrize("content, reason", [('{"name": "f"}', "must hold a JSON list"), ("[{", "JSONDecodeError")])
def test_a_tools_file_that_is_not_a_list_of_declarations_is_refused_in_one_line(tmp_path, capsys, content, reason):
    from mtpkit.cli import main

    (tmp_path / "tools.json").write_text(content)
    assert main(["chat", str(tmp_path / "no-export"), "--tools", str(tmp_path / "tools.json")]) == 2
    err = capsys.readouterr().err
    assert reason in err and len(err.strip().splitlines()) == 1
