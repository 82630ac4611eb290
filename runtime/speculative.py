"""The draft-verify loop (one screen), the plain baseline on the same graphs, and draft-length schedules.

Per round: the drafter proposes k tokens from the target's activations and store-layer K/V, the target
verifies [newest, d1..dk] in one call, the sampler accepts a prefix plus one target token. Rollback of the
rejected drafts is `pos` moving forward by only n + 1: their K/V slots are simply overwritten later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Container, Iterator, Protocol

import numpy as np

from .backends import Drafter, KVStore, Target, View
from .sampling import Sampler
from .stats import Stats

SCHEDULES = ("constant", "heuristic", "auto")
DEFAULT_NUM_ASSISTANT_TOKENS = 4  # the draft length when a drafter's generation_config names none


def fit_draft(k: int, max_draft: int | None) -> int:
    """A draft length capped by the most drafts one verify call takes (None: a dynamic verify takes any); applied
    where a generation config meets an export (Engine.resolve) and nowhere else."""
    return k if max_draft is None else min(k, max_draft)


class DraftPolicy(Protocol):
    def update(self, accepted: int, drafted: int) -> int:
        """The next round's k (0: a plain decoding round) after a round that accepted `accepted` of `drafted`."""


@dataclass
class DraftSchedule:
    """constant: always k. heuristic: +2 after a round where every draft was accepted, -1 otherwise (>= 1).
    auto: `policy` (runtime/auto.py AutoPolicy) picks k each round from measured costs; k = 0 is a plain round."""

    kind: str = "constant"
    k: int = DEFAULT_NUM_ASSISTANT_TOKENS
    max_draft: int = 16  # the most drafts a round may take
    policy: DraftPolicy | None = None

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.kind!r}; use one of {', '.join(SCHEDULES)}")
        if (self.kind == "auto") != (self.policy is not None):
            raise ValueError("the auto schedule, and only it, takes a policy (runtime/auto.py AutoPolicy)")
        if self.k < (0 if self.policy else 1):
            raise ValueError(f"number of draft tokens must be >= 1 (got {self.k}); use --no-mtp to disable drafting")
        if self.max_draft < self.k:
            raise ValueError(f"max_draft {self.max_draft} is below the initial draft length {self.k}")

    def update(self, accepted: int, drafted: int) -> None:
        if self.policy is not None:
            self.k = min(self.max_draft, self.policy.update(accepted, drafted))
        elif self.kind == "heuristic" and drafted:  # drafted == 0 only in a run's clipped last round
            self.k = min(self.max_draft, self.k + 2) if accepted == drafted else max(1, self.k - 1)


def speculative_generate(target: Target[View], drafter: Drafter[View], prompt: list[int], sampler: Sampler,
                         schedule: DraftSchedule, max_new_tokens: int, eos_ids: Container[int],
                         kv_handoff: str = "clean", stats: Stats | None = None,
                         start: int = 0) -> Iterator[tuple[int, bool]]:
    """Yields (token, from_draft) until EOS or max_new_tokens; the output distribution is the target's. The cache
    already holds prompt[:start] (a conversation's earlier turns): only the rest is prefilled."""
    stats = stats or Stats()
    logits, hidden = target.forward(prompt[start:], start)
    pos, token, h = len(prompt), sampler.pick(logits[-1]), hidden[-1]  # newest token sits at pos, uncached
    produced = 1
    yield token, False
    while produced < max_new_tokens and token not in eos_ids:
        k = min(schedule.k, max_new_tokens - produced - 1)  # never draft past max_new_tokens
        drafts, qs = _draft(drafter, target.kv, kv_handoff, token, h, pos, k, sampler)
        logits, hidden = target.forward([token, *drafts], pos)
        n, next_token = _accept(sampler, logits, drafts, qs)
        if k:
            stats.round(drafted=k, accepted=n, drafts=drafts)
        schedule.update(n, k)
        for d in drafts[:n]:
            yield d, True
            if d in eos_ids:
                return
        yield next_token, False
        pos, token, h, produced = pos + n + 1, next_token, hidden[n], produced + n + 1


def _draft(drafter: Drafter[View], kv: KVStore[View], kv_handoff: str, token: int, h: np.ndarray, pos: int, k: int,
           sampler: Sampler) -> tuple[list[int], list[np.ndarray | None]]:
    """k drafter steps at a constant position, each fed its own sampled token and projected activations."""
    drafts: list[int] = []
    qs: list[np.ndarray | None] = []
    if not k:  # a plain round (auto): no drafter view to slice
        return drafts, qs
    view = kv.drafter_view(pos, kv_handoff)
    for _ in range(k):
        logits, h = drafter.step(token, h, pos, view)
        token, q = sampler.draft(logits)
        drafts.append(token)
        qs.append(q)
    return drafts, qs


def _accept(sampler: Sampler, logits: np.ndarray, drafts: list[int], qs: list[np.ndarray | None]) -> tuple[int, int]:
    """Accepted prefix length n and the target's token after it (correction or bonus)."""
    for i, (d, q) in enumerate(zip(drafts, qs)):
        ok, replacement = sampler.accept(logits[i], d, q)
        if not ok:
            assert replacement is not None  # a rejection always brings the target's own token
            return i, replacement
    return len(drafts), sampler.bonus(logits[len(drafts)])


def plain_generate(target: Target[object], prompt: list[int], sampler: Sampler, max_new_tokens: int,
                   eos_ids: Container[int], start: int = 0) -> Iterator[int]:
    """The baseline: one target call per token on the same graphs (prompt[:start] already cached)."""
    logits, _ = target.forward(prompt[start:], start)
    pos, token = len(prompt), sampler.pick(logits[-1])
    yield token
    for _ in range(max_new_tokens - 1):
        if token in eos_ids:
            return
        logits, _ = target.forward([token], pos)
        pos, token = pos + 1, sampler.pick(logits[-1])
        yield token
