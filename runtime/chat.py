"""`mtpkit chat`: a multi-turn conversation in the terminal (torch-free)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from mtpkit.errors import MtpkitError, UsageError

from .commands import draft_length, export_arguments

from .channels import Piece, pieces

if TYPE_CHECKING:
    from .conversation import Conversation
    from .engine import GenConfig

EPILOG = """Type a message and press Enter: the answer streams to stdout, then the stats line of `mtpkit run` goes
to stderr with the prompt's tokens reused from the cache and prefilled. The KV cache is kept between turns: each
turn prefills only the new message (the answers are the ones a fresh prefill of the whole conversation gives). The
conversation must fit the export's KV capacity together with --max-new-tokens: when it no longer does, --drop-oldest
drops the oldest whole turns (and says so), otherwise the turn is refused and /reset clears the history. An empty
line or end of input (Ctrl-D) ends the session. Greedy by default; --temperature > 0 samples losslessly.

--tools FILE declares tools (a JSON list of function declarations, as transformers' apply_chat_template takes
them) to the chat template. A tool call the model makes prints as one JSON line on stdout,
{"tool_call": {"name": ..., "arguments": {...}}}; answer it with `/tool NAME RESULT`, which adds the tool's
result to the history and lets the model go on. A call that does not parse prints as text, with the reason on
stderr. --thinking turns the template's thinking on; the thought streams to stderr, the answer to stdout.

examples:
  mtpkit chat DIR
  mtpkit chat DIR --drop-oldest --max-new-tokens 256
  mtpkit chat DIR --temperature 0.8 --top-p 0.95 --seed 1 --max-new-tokens 256
  printf 'hello\\nand again\\n' | mtpkit chat DIR --no-mtp 2>/dev/null
  mtpkit chat DIR --tools tools.json --thinking
"""


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.epilog = EPILOG
    export_arguments(p)
    p.add_argument("--max-new-tokens", type=int, default=64, help="longest answer per turn")
    p.add_argument("--num-assistant-tokens", "-k", type=draft_length, default=None,
                   help="draft length k per round, or auto (the default)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None, help="reseeds every turn, so a replayed session repeats")
    p.add_argument("--no-mtp", dest="mtp", action="store_false", help="plain decoding, no drafter")
    p.add_argument("--drop-oldest", action="store_true",
                   help="when a turn no longer fits the KV cache, drop the oldest whole turns instead of refusing it")
    p.add_argument("--tools", type=Path, default=None, metavar="FILE",
                   help="a JSON file with the list of tool (function) declarations the template renders")
    p.add_argument("--thinking", dest="enable_thinking", action="store_const", const=True, default=None,
                   help="pass enable_thinking=True to the chat template; the thought streams to stderr")


def run(args: argparse.Namespace) -> int:
    from .commands import generation_config
    from .conversation import Conversation
    from .engine import Engine

    cfg = generation_config(args)  # bad flags fail (exit 2) before the export opens, not after the first message
    tools = _read_tools(args.tools) if args.tools is not None else None
    conversation = Conversation(Engine(args.dir, args.threads, args.backend), drop_oldest=args.drop_oldest,
                                tools=tools, enable_thinking=args.enable_thinking)
    while (text := _read_line()) is not None:
        if text == "/reset":
            conversation.reset()
            print("mtpkit: history cleared", file=sys.stderr, flush=True)
        elif text.startswith("/tool "):
            name, _, result = text.removeprefix("/tool ").strip().partition(" ")
            message = {"role": "tool", "name": name, "content": result}
            conversation.messages.append(message)
            if not _answer(conversation, None, cfg) and conversation.messages[-1] is message:
                conversation.messages.pop()  # a turn that cannot run never happened, as for a user message
        else:
            _answer(conversation, text, cfg)
    return 0


def _read_tools(path: Path) -> list[dict]:
    """--tools FILE: a JSON list of function declarations."""
    try:
        tools = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"cannot read the tools file {path} ({type(e).__name__}: {e}); pass a JSON list of "
                         "function declarations") from None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise UsageError(f"the tools file {path} must hold a JSON list of function declarations (objects)")
    return tools


def _read_line() -> str | None:
    """The next user message; None at an empty line or end of input. The prompt goes to stderr, and only for a
    person at a terminal, so piped stdout holds nothing but answers."""
    if sys.stdin.isatty():
        sys.stderr.write("> ")
        sys.stderr.flush()
    try:
        line = sys.stdin.readline()
    except UnicodeDecodeError as e:
        raise UsageError(f"the input is not valid UTF-8 ({e.reason} at byte {e.start} of the line); "
                         "send UTF-8 text") from e
    text = line.rstrip("\r\n")
    return text if text.strip() else None


def _answer(conversation: Conversation, text: str | None, cfg: GenConfig) -> bool:
    """Streams the assistant's answer to `text` (None: to the history as it stands) to stdout, then its stats
    line to stderr; a turn that cannot run (the conversation no longer fits the KV cache) is one line on stderr,
    and the history stays as it was. False when the turn did not run."""
    from .conversation import ConversationFullError
    from .stats import Stats, stats_line
    from .tokenizer import text_deltas

    stats, dropped, streamed = Stats(), conversation.dropped, False
    try:
        tokens = conversation.send(text, cfg, stats) if text is not None else conversation.reply(cfg, stats)
        if conversation.dropped > dropped:
            print(f"mtpkit chat: dropped the oldest {conversation.dropped - dropped} turn(s) to fit the KV cache",
                  file=sys.stderr, flush=True)
        last = "\n"
        codec = conversation.engine.codec
        for piece in pieces(text_deltas(codec, tokens, marked=True), codec.specials):
            streamed, last = True, _show(piece, last)
        answer = conversation.split
        if answer is not None and answer.thought:
            sys.stderr.write("\n")  # the thought's line ends before the stats line
        if answer is not None and answer.tool_call_error:
            sys.stderr.write(f"mtpkit chat: a tool call did not parse ({answer.tool_call_error})\n")
    except MtpkitError as e:  # the session survives: the user can /reset and go on
        if streamed:
            print(flush=True)
        hint = "" if isinstance(e, ConversationFullError) else "; type /reset to clear the history"
        print(f"mtpkit chat: {e}{hint}", file=sys.stderr, flush=True)
        return False
    print(flush=True)  # end the streamed answer before the stats line on stderr
    sys.stderr.write(stats_line(stats.summary(), cfg.mtp, prompt=True) + "\n")
    sys.stderr.flush()
    return True


def _show(piece: Piece, last: str) -> str:
    """Text to stdout, a call as a JSON line on stdout, a thought to stderr; returns the last character stdout
    got (a call's line starts on a line of its own)."""
    if piece.kind == "thought":
        sys.stderr.write(piece)
        sys.stderr.flush()
        return last
    if piece.kind == "tool_call":
        piece = Piece(("" if last == "\n" else "\n") + json.dumps({"tool_call": piece.call}, ensure_ascii=False)
                      + "\n")
    sys.stdout.write(piece)
    sys.stdout.flush()
    return piece[-1:] or last
