"""`--num-assistant-tokens auto`: pick k each round from costs timed on the actual calls and observed acceptance.

CostMeter times every target and drafter call of a run (timing proxies around the backend objects) and fits the
host work per round outside the calls; Acceptance keeps decayed conditional acceptance by draft position;
AutoPolicy asks runtime/cost_model.py for the best k each round. k = 0 is a plain decoding round: when no k
pays the policy turns drafting off and runs occasional probe rounds (the k >= 1 the model rates best), spaced so
that their expected loss stays within `probe_budget` of plain decoding and twice as far apart after each probe
that fails; a probe whose drafts are all accepted is followed by another at once, so drafting comes back quickly
when acceptance recovers. After a fully accepted round the policy may draft one deeper than the model's best k
(if predicted at most `explore` slower): positions beyond the k in use are otherwise never tried, and their
estimates could not recover.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Generic, Sequence

import numpy as np

from .backends import Drafter, KVStore, Target, View
from .cost_model import Costs, best_k, expected_tokens, round_cost, time_per_token

CALIBRATION_LENGTHS = (1, 2, 3, 5, 9)  # target call lengths timed at start; others are interpolated


class CostMeter:
    """Per-call costs and host time per round, measured on the actual calls.

    A round ends with its target call: the time since the previous target call ended, less the drafter steps in
    between, is the round's host work (accept, sampling, bookkeeping, the caller's own work per token). Plain
    steps (k = 0) have their own figure; drafting rounds are fitted as h0 + h1 * k (a drafting round pays for a
    drafter view, stats and an accept loop that a plain step skips). alpha > 0: EWMAs with outliers clipped and
    a decayed fit, for a policy that must follow the machine. alpha None: every sample kept and medians used,
    for a bench summary.
    """

    def __init__(self, alpha: float | None = 0.1, decay: float = 0.95):
        self.alpha, self.decay = alpha, decay
        self.est: dict[str | int, float] = {}  # "draft", "plain_host" or call length t -> seconds (EWMA mode)
        self.samples: dict[str | int, list] | None = None if alpha else {}  # the same plus "host" -> [(k, s)] (median)
        self._fit = (0.0,) * 5  # decayed sums over drafting rounds: weight, k, k*k, host, k*host
        self._round_start: float | None = None  # end of the previous target call
        self._calls_s, self._steps = 0.0, 0  # drafter steps since then, and their time

    def seed(self, draft_s: float, target_s: dict[int, float]) -> None:
        """Start values (from a calibration); the calls of the runs refine them."""
        self.est["draft"] = draft_s
        self.est.update(target_s.items())

    def _add(self, key: str | int, x: float) -> None:
        if self.samples is not None:
            self.samples.setdefault(key, []).append(x)
            return
        old = self.est.get(key)
        assert self.alpha is not None  # EWMA mode: samples is None only when alpha > 0
        # one slow call (a page fault, another process) must not swing the estimate: clip at 3x
        self.est[key] = x if old is None else old + self.alpha * (min(x, 3 * old) - old)

    def value(self, key: str | int) -> float | None:
        if self.samples is not None and key in self.samples:
            return statistics.median(self.samples[key])
        return self.est.get(key)

    def draft(self, seconds: float) -> None:
        self._add("draft", seconds)
        self._calls_s += seconds
        self._steps += 1

    def target(self, t: int, start: float, end: float, prefill: bool = False) -> None:
        """A target call of t tokens ran from start to end (perf_counter); a prefill opens a run, no round."""
        if not prefill:
            self._add(t, end - start)
            if self._round_start is not None:
                self._round(self._steps, max(0.0, start - self._round_start - self._calls_s))
        self._round_start, self._calls_s, self._steps = end, 0.0, 0

    def _round(self, k: int, host: float) -> None:
        if self.samples is not None:
            self.samples.setdefault("host", []).append((k, host))
        elif k == 0:
            self._add("plain_host", host)
        else:
            w, sk, skk, sh, skh = self._fit
            d = self.decay
            self._fit = (d * w + 1.0, d * sk + k, d * skk + k * k, d * sh + host, d * skh + k * host)

    def host(self) -> tuple[float, float, float]:
        """(per plain step, per drafting round, per drafted token) host seconds; the slope is 0 until drafting
        rounds of different k were seen, and a plain step costs what a drafting round's intercept does until
        one was seen."""
        if self.samples is not None:  # medians per k; a line through those of k >= 1
            by_k: dict[int, list[float]] = {}
            for k, h in self.samples.get("host", []):
                by_k.setdefault(k, []).append(h)
            plain = statistics.median(by_k.pop(0)) if 0 in by_k else None
            fit: Sequence[float] = [0.0] * 5
            for k, hs in by_k.items():
                h = statistics.median(hs)
                fit = [s + x for s, x in zip(fit, (1.0, k, k * k, h, k * h))]
        else:
            plain, fit = self.est.get("plain_host"), self._fit
        w, sk, skk, sh, skh = fit
        var = w * skk - sk * sk
        slope = max(0.0, (w * skh - sk * sh) / var) if var > 1e-9 * w * w else 0.0
        intercept = max(0.0, (sh - slope * sk) / w) if w else (plain or 0.0)
        return (intercept if plain is None else plain), intercept, slope

    def costs(self, max_len: int) -> Costs | None:
        """Costs for target calls of 1..max_len tokens, interpolated between measured lengths; None until the
        drafter and a plain decode step have been timed."""
        draft, lengths = self.value("draft"), {k for k in (*self.est, *(self.samples or ())) if isinstance(k, int)}
        if draft is None or 1 not in lengths:
            return None
        plain_host, round_host, draft_host = self.host()
        measured = {t: v for t in lengths if (v := self.value(t)) is not None}
        return Costs(draft, _fill(measured, max_len), round_host, draft_host, plain_host)


def _fill(measured: dict[int, float], n: int) -> tuple[float, ...]:
    """Values at 1..n: linear between measured lengths, the last segment's slope (>= 0) beyond the longest."""
    xs, out, j = sorted(measured), [], 0
    for t in range(1, n + 1):
        while j + 2 < len(xs) and xs[j + 1] <= t:  # [xs[j], xs[j+1]]: the segment holding t, or the last one
            j += 1
        lo, hi = xs[j], xs[min(j + 1, len(xs) - 1)]
        slope = (measured[hi] - measured[lo]) / (hi - lo) if hi != lo else 0.0
        out.append(measured[hi] + max(0.0, slope) * (t - hi) if t > hi else measured[lo] + slope * (t - lo))
    return tuple(out)


class Acceptance:
    """Decayed conditional acceptance by draft position, shrunk towards a prior: the export's figure for the
    position when the manifest has one, else the rate of the position before it times `depth` (deeper drafts
    are harder; without the discount one lucky streak would promise every later position too)."""

    def __init__(self, prior: Sequence[float] = (), first: float = 0.5, decay: float = 0.9, weight: float = 1.0,
                 depth: float = 0.9):
        self.prior, self.first, self.decay, self.weight, self.depth = list(prior), first, decay, weight, depth
        self.hits: list[float] = []
        self.trials: list[float] = []

    def observe(self, accepted: int, drafted: int) -> None:
        """Position i was tried only if 1..i-1 were accepted: that is what makes the rates conditional. Every
        position's evidence decays each round, tried or not, so a deep position that went stale while k was
        short drifts back towards the one before it and gets tried again."""
        tried = min(drafted, accepted + 1)
        while len(self.trials) < tried:
            self.hits.append(0.0)
            self.trials.append(0.0)
        for i in range(len(self.trials)):
            self.trials[i] = self.decay * self.trials[i] + (i < tried)
            self.hits[i] = self.decay * self.hits[i] + (i < accepted)

    def rates(self, n: int) -> list[float]:
        out, prev = [], self.first / self.depth
        for i in range(n):
            prior = self.prior[i] if i < len(self.prior) else self.depth * prev
            hits, trials = (self.hits[i], self.trials[i]) if i < len(self.trials) else (0.0, 0.0)
            prev = (hits + self.weight * prior) / (trials + self.weight)
            out.append(prev)
        return out


class AutoPolicy:
    """The draft length for the next round from the cost model: update(accepted, drafted) -> k (0: plain round).

    Lives as long as the engine, so what one run learned (costs, acceptance) seeds the next; acceptance decays
    so each prompt soon speaks for itself.
    """

    def __init__(self, max_draft: int, meter: CostMeter | None = None, prior: Sequence[float] = (),
                 probe_budget: float = 0.01, max_wait: int = 256, explore: float = 0.05):
        self.max_draft = max_draft  # longest draft the policy may ask for (the schedule's cap)
        self.meter = meter or CostMeter()
        self.acceptance = Acceptance(prior)
        self.probe_budget = probe_budget  # share of plain decoding time that probes may cost, expected
        self.max_wait = max_wait  # most plain rounds between probes, however costly drafting looks
        self.explore = explore  # after a fully accepted round, one draft deeper if predicted at most this much slower
        self.refresh = 8  # rounds between re-reading the meter: its estimates move slowly, re-reading is not free
        self.k, self.wait, self.probes = 0, 0, 0
        self.first_wait = 16  # least plain rounds after drafting stops; doubles with every probe that fails
        self.backoff = self.first_wait
        self._costs: Costs | None = None
        self._age = 0
        self._opening = False  # the run's first round is under way (see _next)

    def start(self) -> int:
        """A new run: it always opens with a drafting round, since the last prompt's acceptance may not hold; one
        draft while nothing at all has been observed (a prior alone should not buy a long first draft)."""
        self._costs, self.wait, self.backoff, self._opening = None, 0, self.first_wait, True
        self.k = (self.choose() or self._probe()) if self.acceptance.trials else self._probe(1)
        return self.k

    def update(self, accepted: int, drafted: int) -> int:
        if drafted:
            self.acceptance.observe(accepted, drafted)
        self.k, self._opening = self._next(accepted, drafted), False
        return self.k

    def costs(self) -> Costs | None:
        if self._costs is None or self._age >= self.refresh:
            self._costs, self._age = self.meter.costs(self.max_draft + 1), 0
        self._age += 1
        return self._costs

    def choose(self) -> int:
        """Best k by the cost model now (0: plain decoding); 1 while costs are still unknown."""
        costs = self.costs()
        return 1 if costs is None else best_k(costs, self.acceptance.rates(self.max_draft), self.max_draft)

    def _next(self, accepted: int, drafted: int) -> int:
        if not drafted and self.wait > 0:  # plain rounds until the next probe: no new evidence, nothing to decide
            self.wait -= 1
            return 0 if self.wait else self._probe()
        costs = self.costs()
        if costs is None:
            return 1
        acc = self.acceptance.rates(self.max_draft)
        k = best_k(costs, acc, self.max_draft)
        if drafted and accepted == drafted and k <= drafted < self.max_draft and (
                time_per_token(costs, acc, drafted + 1) <= (1 + self.explore) * time_per_token(costs, acc, k)):
            return drafted + 1  # positions beyond k are never tried otherwise, so their estimates could not recover
        if k:
            self.backoff = self.first_wait
            return k
        if drafted and accepted == drafted:  # the draft was right: look again at once instead of waiting
            self.backoff = self.first_wait
            return self._probe()
        # drafting stopped paying, or a probe failed: an estimate near break-even would allow probing every round,
        # so failed probes also back off exponentially (log2 of the plain rounds probes, when nothing is accepted).
        # A run's opening draft, right after the prompt, often fails where the text is predictable later on: it
        # waits only the first backoff, not the budgeted interval (~90 rounds at 1%, longer than short runs)
        self.wait = self.backoff if self._opening else max(self.probe_interval(), self.backoff)
        self.backoff = min(2 * self.backoff, self.max_wait)
        return 0

    def _probe(self, k: int | None = None) -> int:
        self.probes += 1
        return k or self.probe_k(self.costs())

    def probe_k(self, costs: Costs | None) -> int:
        """A probe's draft length: the k >= 1 the model rates best now (1 while costs are unknown). Where a verify
        costs the same at every length (LiteRT's static verify graph), a one-draft probe would pay a full verify
        for one position's evidence and, for a prompt that pays only at longer k, never show it."""
        if costs is None:
            return 1
        acc = self.acceptance.rates(self.max_draft)
        return min(range(1, self.max_draft + 1), key=lambda k: time_per_token(costs, acc, k))

    def probe_interval(self) -> int:
        """Plain rounds between probes so that a probe burst's expected loss is probe_budget of their time."""
        costs = self.costs()
        if costs is None:
            return 1
        k = self.probe_k(costs)
        acc = self.acceptance.rates(k)
        plain = time_per_token(costs, acc, 0)
        loss = round_cost(costs, k) - expected_tokens(acc, k) * plain  # seconds one probe costs over plain
        burst = 1 / max(1e-3, 1 - math.prod(acc))  # a probe whose drafts are all accepted is followed by another
        return max(1, min(self.max_wait, math.ceil(loss * burst / (self.probe_budget * plain))))


class TimedTarget(Generic[View]):
    """The backend target, every call timed into a CostMeter; its other members read through."""

    def __init__(self, target: Target[View], meter: CostMeter):
        self._inner, self._meter = target, meter
        # the next call opens a run (Engine.generate sets it): a prefill even where it starts past 0, after a
        # conversation's cached turns, so neither its length nor the pause before it reaches the cost model
        self.opening = False

    @property
    def kv(self) -> KVStore[View]:
        return self._inner.kv

    @property
    def calls(self) -> int:
        return self._inner.calls

    @property
    def max_draft(self) -> int | None:
        return self._inner.max_draft

    @property
    def threads(self) -> dict[str, int]:
        return self._inner.threads

    def positions_needed(self, prompt_len: int, max_new_tokens: int) -> int:
        return self._inner.positions_needed(prompt_len, max_new_tokens)

    def forward(self, ids: list[int], pos: int) -> tuple[np.ndarray, np.ndarray]:
        t0 = time.perf_counter()
        out = self._inner.forward(ids, pos)
        prefill, self.opening = pos == 0 or self.opening, False
        self._meter.target(len(ids), t0, time.perf_counter(), prefill=prefill)
        return out


class TimedDrafter(Generic[View]):
    def __init__(self, drafter: Drafter[View], meter: CostMeter):
        self._inner, self._meter = drafter, meter

    @property
    def calls(self) -> int:
        return self._inner.calls

    def step(self, token: int, activations: np.ndarray, pos: int, view: View) -> tuple[np.ndarray, np.ndarray]:
        t0 = time.perf_counter()
        out = self._inner.step(token, activations, pos, view)
        self._meter.draft(time.perf_counter() - t0)
        return out


def calibrate(target: Target[View], drafter: Drafter[View], max_draft: int,
              repeats: int = 3) -> tuple[float, dict[int, float]]:
    """Time target calls of a few lengths and drafter steps on scratch cache slots: (a drafter step, {call length t:
    seconds}), the least of each call's samples (a CostMeter's seeds; runtime/timings.py keeps them between starts).

    Timing noise only ever adds (another process, a page fault), so the least of a few samples is the call's own
    cost; a median of three can still be a spike on a busy machine, and a spiky length that runs seldom (t = 2
    while drafting is off) would mislead the model for long. The slots written lie beyond any position a run has
    committed when it reads them (prefill starts at 0), the same reason rollback needs no cleanup.
    """
    limit = min(max_draft + 1, target.kv.capacity - 1)  # a small cache: the longest call that fits after position 1
    lengths = sorted({t for t in CALIBRATION_LENGTHS if t <= limit} | {limit})
    pos = max(1, min(64, target.kv.capacity - limit))
    _, hidden = target.forward([0], pos)
    view = target.kv.drafter_view(pos, "clean")
    samples: dict = {t: [] for t in (*lengths, "draft")}
    for rep in range(repeats + 1):  # the first pass only warms up (allocations, kernel selection)
        for t in lengths:
            t0 = time.perf_counter()
            target.forward([0] * t, pos)
            samples[t].append(time.perf_counter() - t0)
        for _ in range(2):
            t0 = time.perf_counter()
            drafter.step(0, hidden[-1], pos, view)
            samples["draft"].append(time.perf_counter() - t0)
    return min(samples.pop("draft")[2:]), {t: min(s[1:]) for t, s in samples.items()}
