"""The speculative cost model: predicted time per token for each draft length k, from measured costs.

A round drafts k tokens (k drafter steps), verifies k + 1 tokens in one target call, and yields the accepted
prefix plus one target token. With a_i the acceptance of draft i given drafts 1..i-1 were accepted:

    tokens per round  E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i
    time per round    C(k) = k * (draft + draft_host) + target(k + 1) + round_host
    time per token    C(k) / E(k);   plain decoding (k = 0): target(1) + plain_host

Pure arithmetic on plain numbers (seconds): the measuring lives in runtime/auto.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Costs:
    """Measured per-call costs in seconds (graph call plus the host work inside the call: feeds, KV writes)."""

    draft: float  # one drafter step
    target: tuple[float, ...]  # target call of t tokens at index t - 1 (t = 1: one plain decode step)
    round_host: float = 0.0  # host work per drafting round outside the calls: accept, drafter view, bookkeeping
    draft_host: float = 0.0  # host work per drafted token outside the step call (sampling the draft)
    plain_host: float = 0.0  # host work per plain decoding step outside the call (sampling, yielding the token)

    def __post_init__(self) -> None:
        if not self.target:
            raise ValueError("Costs.target needs the cost of at least one target call (t = 1)")
        if min(self.draft, *self.target, self.round_host, self.draft_host, self.plain_host) < 0:
            raise ValueError(f"costs must be >= 0 (got {self})")

    def target_call(self, t: int) -> float:
        """Cost of a t-token target call; beyond the measured lengths, the last step's slope continues."""
        if t <= len(self.target):
            return self.target[t - 1]
        slope = self.target[-1] - self.target[-2] if len(self.target) > 1 else 0.0
        return self.target[-1] + max(0.0, slope) * (t - len(self.target))


def expected_tokens(acceptance: Sequence[float], k: int) -> float:
    """Tokens one round yields: 1 + sum_{j<=k} prod_{i<=j} a_i (a_i conditional acceptance at position i)."""
    if k > len(acceptance):
        raise ValueError(f"need acceptance for {k} draft positions, got {len(acceptance)}")
    total, run = 1.0, 1.0
    for a in acceptance[:k]:
        run *= a
        total += run
    return total


def round_cost(costs: Costs, k: int) -> float:
    """Seconds one round with k drafts takes (k = 0: one plain decode step)."""
    if k == 0:
        return costs.target_call(1) + costs.plain_host
    return k * (costs.draft + costs.draft_host) + costs.target_call(k + 1) + costs.round_host


def time_per_token(costs: Costs, acceptance: Sequence[float], k: int) -> float:
    """Predicted seconds per generated token with k drafts per round (k = 0: plain decoding)."""
    return round_cost(costs, k) / expected_tokens(acceptance, k)


def predict(costs: Costs, acceptance: Sequence[float], ks: Sequence[int]) -> list[dict]:
    """Per k: tokens per round, predicted ms per token and speed-up over plain decoding (k = 0)."""
    plain = time_per_token(costs, acceptance, 0)
    rows = []
    for k in ks:
        t = time_per_token(costs, acceptance, k)
        rows.append({"k": k, "tokens_per_round": expected_tokens(acceptance, k), "ms_per_token": 1e3 * t,
                     "speedup": plain / t})
    return rows


def best_k(costs: Costs, acceptance: Sequence[float], max_draft: int) -> int:
    """The k in 0..max_draft with the least predicted time per token; 0 (plain decoding) when no k pays."""
    best, best_t = 0, time_per_token(costs, acceptance, 0)
    total, run = 1.0, 1.0
    for k in range(1, min(max_draft, len(acceptance)) + 1):  # incremental E(k): this runs once per round
        run *= acceptance[k - 1]
        total += run
        t = round_cost(costs, k) / total
        if t < best_t:
            best, best_t = k, t
    return best
