"""The Python runtime's reference for ConversationParityTest: a greedy multi-turn Conversation on an ONNX export,
then an edited earlier turn answered again; per turn the messages answered, their rendering in the chat template,
the rendered prompt ids, the output ids and the cached prefix length, as JSON (ChatTurnsTest reads the messages
and their rendering). Usage: conversation_reference.py EXPORT OUT.json"""

import json
import sys

from mtpkit.runtime.conversation import Conversation
from mtpkit.runtime.engine import Engine, GenConfig
from mtpkit.runtime.stats import Stats

TURNS = ["def fibonacci(n):", "now with memoization", "add a docstring", "and a test"]
MAX_NEW_TOKENS = 20


def turn(conversation: Conversation, cfg: GenConfig, text: str | None) -> dict:
    stats = Stats()
    messages = [dict(m) for m in conversation.messages] + ([{"role": "user", "content": text}] if text else [])
    out = list(conversation.send(text, cfg, stats) if text is not None else conversation.reply(cfg, stats))
    return {"messages": messages, "rendered": conversation.engine.codec.render_chat(messages),
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
        json.dump({"max_new_tokens": MAX_NEW_TOKENS, "bos_token": bos, "turns": turns, "edited": edited}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
