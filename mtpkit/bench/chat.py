"""`mtpkit bench --chat`: time to first token per turn of a scripted conversation, the KV cache kept between turns
(runtime/conversation.py) beside a fresh prefill of the same history on a second engine, interleaved turn by
turn; every turn's tokens are checked equal. Speed is reported, never asserted."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

from mtpkit.errors import CommandError, check_int
from mtpkit.runtime.conversation import Conversation
from mtpkit.runtime.engine import Engine, GenConfig
from mtpkit.runtime.stats import Stats

# Eight user turns the tiny pair (trained on Python source) answers at length; any model takes them.
TURNS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "Now make it iterative instead of recursive.",
    "Add a docstring and type hints.",
    "Write a unit test for it with pytest.",
    "Add a function that returns the first n Fibonacci numbers as a list.",
    "Make both functions raise ValueError for negative n.",
    "Put them in a class with a cache.",
    "Write a short example of using the class.",
)


@dataclass(frozen=True)
class ChatBenchConfig:
    max_new_tokens: int = 64  # per turn
    turns: int = len(TURNS)  # the first this many of TURNS
    repeats: int = 3  # whole conversations; each turn's median time is reported

    def __post_init__(self) -> None:
        check_int("--max-new-tokens", self.max_new_tokens, 1)
        check_int("--turns", self.turns, 1, len(TURNS))
        check_int("--repeats", self.repeats, 1)


def run_chat_bench(export: str, cfg: ChatBenchConfig, threads: int | None, backend: str | None,
                   tell: Callable[[str], None] = lambda _: None) -> dict:
    """Per turn: prompt tokens, tokens the cache held, new tokens, time to first token kept and fresh (ms, the
    median over cfg.repeats conversations)."""
    kept, fresh = Engine(export, threads, backend), Engine(export, threads, backend)
    for engine in (kept, fresh):  # first calls pay one-off costs (allocation, page faults): not turn 1's prefill
        list(engine.generate(engine.codec.encode(TURNS[0]), GenConfig(max_new_tokens=2)))
    runs = [_conversation(kept, fresh, cfg, lambda turn: tell(f"conversation {r}/{cfg.repeats}, {turn}"))
            for r in range(1, cfg.repeats + 1)]
    rows = [{**turn, **{key: statistics.median(run[i][key] for run in runs) for key in ("ttft_ms", "fresh_ttft_ms")}}
            for i, turn in enumerate(runs[0])]
    first = rows[0]["ttft_ms"]
    return {"export": str(export), "backend": kept.backend.kind, "threads": kept.threads, "repeats": cfg.repeats,
            "turns": rows, "last_over_first": rows[-1]["ttft_ms"] / first if first else None,
            "fresh_last_over_first": rows[-1]["fresh_ttft_ms"] / rows[0]["fresh_ttft_ms"],
            "median_new_tokens": statistics.median(r["new_tokens"] for r in rows)}


def _conversation(kept: Engine, fresh: Engine, cfg: ChatBenchConfig, tell: Callable[[str], None]) -> list[dict]:
    """One scripted conversation from an empty cache, each turn beside a fresh prefill of the same history."""
    gen = GenConfig(max_new_tokens=cfg.max_new_tokens)
    kept.held = ([], -1)  # nothing cached: turn 1 prefills its whole prompt
    conversation, rows = Conversation(kept), []
    for i, text in enumerate(TURNS[:cfg.turns], 1):
        tell(f"turn {i}/{cfg.turns}")
        stats, again = Stats(), Stats()
        tokens = list(conversation.send(text, gen, stats))
        if tokens != [t for t, _ in fresh.generate(conversation.prompt_ids, gen, again)]:
            raise CommandError(f"turn {i}: the kept cache gave other tokens than a fresh prefill of the same history")
        rows.append({"turn": i, "prompt_tokens": stats.prompt_tokens, "cached_tokens": stats.cached_tokens,
                     "new_tokens": stats.new_tokens, "ttft_ms": 1e3 * stats.ttft_s, "fresh_ttft_ms": 1e3 * again.ttft_s})
    return rows


def format_chat_bench(report: dict) -> str:
    lines = [f"mtpkit bench --chat: {report['export']} ({report['backend']}, threads {report['threads']}); every "
             f"turn's tokens equal a fresh prefill's; times: medians of {report['repeats']} conversations", "",
             "| turn | prompt tokens | of them cached | new tokens | time to first token, cache kept (ms) | "
             "fresh prefill (ms) |", "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['turn']} | {r['prompt_tokens']} | {r['cached_tokens']} | {r['new_tokens']} | {r['ttft_ms']:.1f} | "
              f"{r['fresh_ttft_ms']:.1f} |" for r in report["turns"]]
    lines += ["", f"last turn / first turn, time to first token: {report['last_over_first']:.2f}x with the cache kept, "
              f"{report['fresh_last_over_first']:.2f}x with a fresh prefill"]
    return "\n".join(lines)
