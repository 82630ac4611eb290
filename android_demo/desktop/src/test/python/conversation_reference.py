"""The Python runtime's reference for ConversationParityTest: a greedy multi-turn Conversation on an ONNX export,
then an edited earlier turn answered again; per turn the messages answered, their rendering in the chat template
and in Gemma 4's turn format (gemma4_text_chat.jinja), the rendered prompt ids, the output ids and the cached prefix
length, as JSON (ChatTurnsTest reads the messages and their renderings). Usage: conversation_reference.py EXPORT
OUT.json"""

import json
import sys
from pathlib import Path

from mtpkit.runtime.chat_template import render
from mtpkit.runtime.conversation import Conversation
from mtpkit.runtime.engine import Engine, GenConfig
from mtpkit.runtime.stats import Stats

GEMMA4 = Path(__file__).with_name("gemma4_text_chat.jinja")
# a system turn and an answer with a thought channel, which Gemma 4's template strips
EXTRA = [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "hi"},
         {"role": "assistant", "content": "<|channel>thought\nsay hello<channel|>\nHello! "},
         {"role": "user", "content": "again"}]

TURNS = ["def fibonacci(n):", "now with memoization", "add a docstring", "and a test"]
MAX_NEW_TOKENS = 20


def turn(conversation: Conversation, cfg: GenConfig, text: str | None) -> dict:
    stats = Stats()
    messages = [dict(m) for m in conversation.messages] + ([{"role": "user", "content": text}] if text else [])
    out = list(conversation.send(text, cfg, stats) if text is not None else conversation.reply(cfg, stats))
    codec = conversation.engine.codec
    gemma4 = render(GEMMA4.read_text(), GEMMA4, messages=messages, add_generation_prompt=True, bos_token="")
    return {"messages": messages, "rendered": codec.render_chat(messages), "gemma4_rendered": gemma4,
            "prompt_ids": conversation.prompt_ids, "output_ids": out, "cached_tokens": stats.cached_tokens}


def main(export: str, out: str) -> None:
    cfg = GenConfig(max_new_tokens=MAX_NEW_TOKENS)  # greedy, mtp on with the runtime's default schedule
    conversation = Conversation(Engine(export, threads=1, backend="onnx"))
    turns = [turn(conversation, cfg, text) for text in TURNS]
    # an earlier user turn edited, the last answer dropped: the history differs from the second user message on
    conversation.messages[2]["content"] = "now iteratively, without recursion"
    conversation.messages.pop()
    edited = turn(conversation, cfg, None)
    with open(out, "w") as f:
        bos = conversation.engine.codec.tokenizer.id_to_token(conversation.engine.manifest.tokens.bos)
        json.dump({"max_new_tokens": MAX_NEW_TOKENS, "bos_token": bos, "turns": turns, "edited": edited,
                   "gemma4_extra": {"messages": EXTRA, "rendered": render(GEMMA4.read_text(), GEMMA4, messages=EXTRA,
                                                                         add_generation_prompt=True, bos_token="")}}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
