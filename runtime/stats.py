"""Run statistics: acceptance (overall and by draft position), calls, latencies and throughput."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator, TypeVar

import numpy as np

T = TypeVar("T")


def tokens_per_target_call(new_tokens: int, target_calls: int) -> float | None:
    """New tokens per target call, the prefill call included (it produces the first token).

    The one definition used by the runtime's stats, bench, the demo and the trained pair's measurement with
    transformers (pair.json), so the figures compare directly.
    """
    return new_tokens / target_calls if target_calls else None


@dataclass
class Stats:
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_at: list[int] = field(default_factory=list)  # index i: rounds that drafted position i+1
    accepted_at: list[int] = field(default_factory=list)  # index i: rounds whose draft i+1 was accepted
    target_calls: int = 0
    drafter_calls: int = 0
    new_tokens: int = 0
    ttft_s: float = 0.0
    total_s: float = 0.0
    token_latencies_s: list[float] = field(default_factory=list)
    drafts: list[list[int]] = field(default_factory=list)  # every round's drafted tokens, for parity with HF
    per_round: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted) of every round
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of the prompt, already in the KV cache (a conversation's earlier turns): not prefilled

    def round(self, drafted: int, accepted: int, drafts: list[int] | None = None) -> None:
        self.rounds += 1
        self.drafts.append(list(drafts or []))
        self.per_round.append((drafted, accepted))
        self.drafted += drafted
        self.accepted += accepted
        grow = drafted - len(self.drafted_at)
        if grow > 0:
            self.drafted_at += [0] * grow
            self.accepted_at += [0] * grow
        for i in range(drafted):
            self.drafted_at[i] += 1
            self.accepted_at[i] += i < accepted

    def summary(self) -> dict:
        lat = np.asarray(self.token_latencies_s or [0.0])
        return {
            "new_tokens": self.new_tokens, "rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else None,
            "acceptance_by_position": [a / d if d else None for a, d in zip(self.accepted_at, self.drafted_at)],
            "mean_accepted_per_round": self.accepted / self.rounds if self.rounds else None,
            "target_calls": self.target_calls, "drafter_calls": self.drafter_calls,
            "tokens_per_target_call": tokens_per_target_call(self.new_tokens, self.target_calls),
            "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
            "prefilled_tokens": self.prompt_tokens - self.cached_tokens,
            "ttft_ms": 1e3 * self.ttft_s, "total_ms": 1e3 * self.total_s,
            "latency_p50_ms": 1e3 * float(np.percentile(lat, 50)), "latency_p95_ms": 1e3 * float(np.percentile(lat, 95)),
            "tokens_per_s": (self.new_tokens - 1) / (self.total_s - self.ttft_s) if self.total_s > self.ttft_s and self.new_tokens > 1 else None,
        }


def conditional_acceptance(runs: list[Stats], n: int) -> list[float | None]:
    """Acceptance of draft i given drafts 1..i-1 were accepted, pooled over runs (None: never tried).

    Unlike summary()'s acceptance_by_position (the share of rounds that accepted at least i drafts), this does
    not depend on k, so runs of different draft lengths pool, and it is what the cost model multiplies.
    """
    hits, trials = [0] * n, [0] * n
    for stats in runs:
        for drafted, accepted in stats.per_round:
            for i in range(min(drafted, accepted + 1, n)):
                trials[i] += 1
                hits[i] += i < accepted
    return [h / t if t else None for h, t in zip(hits, trials)]


def timed(tokens: Iterable[T], stats: Stats) -> Iterator[T]:
    """Wrap a token generator: record time to first token, per-token latencies and total time."""
    start = last = time.perf_counter()
    for item in tokens:
        now = time.perf_counter()
        if stats.new_tokens == 0:
            stats.ttft_s = now - start
        else:
            stats.token_latencies_s.append(now - last)
        last = now
        stats.new_tokens += 1
        yield item
    stats.total_s = time.perf_counter() - start


def stats_line(s: dict, mtp: bool, prompt: bool = False) -> str:
    """The one-line summary of a run (Stats.summary()) that `mtpkit run` and `mtpkit chat` print to stderr; prompt:
    also the prompt's tokens reused from the cache and prefilled (a chat turn)."""
    line = f"mtpkit: {s['new_tokens']} tokens, {s['tokens_per_s'] or 0:.1f} tok/s, ttft {s['ttft_ms']:.1f} ms"
    if mtp and s["drafted"]:
        line += (f", accepted {s['accepted']}/{s['drafted']} drafts ({100 * s['acceptance_rate']:.0f}%), "
                 f"{s['tokens_per_target_call']:.2f} tokens per target call")
    if prompt:
        line += f", prompt {s['prompt_tokens']} tokens ({s['cached_tokens']} reused, {s['prefilled_tokens']} prefilled)"
    return line
