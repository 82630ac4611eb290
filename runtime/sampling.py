"""Token sampling and the speculative accept/reject rule (numpy only).

The draft-verify loop is lossless only if the drafter's token is a *sample*
from the same processed distribution q that the acceptance test divides by.
Drafting the argmax while using q = softmax(raw logits), as transformers does
for Gemma 4 MTP drafters with do_sample=True, biases the output; see
tests/test_sampling.py for the statistical check.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from mtpkit.errors import ModelOutputError, check_int, check_number

# a graph that yields NaN is damaged or quantized too far; parity says which graph
NAN_LOGITS = ("the model's logits contain NaN: the export is damaged or quantized too far; run `mtpkit parity DIR` "
              "or re-export it")


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    seed: int | None = None

    def __post_init__(self) -> None:
        check_number("temperature", self.temperature, 0, hint="; use 0 for greedy")  # NaN and inf are refused
        check_int("top_k", self.top_k, 0, hint="; use 0 to disable top-k")
        check_number("top_p", self.top_p, 0, 1, low_open=True, hint="; use 1.0 to disable top-p")
        if self.seed is not None:
            check_int("seed", self.seed, 0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _as_logits(logits: ArrayLike) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"logits must be a non-empty 1-D array (got shape {x.shape}); pass one position at a time")
    m = x.max()  # max propagates NaN, so one reduction checks both cases (this runs per token)
    if m != m:
        raise ModelOutputError(NAN_LOGITS)
    if m == -np.inf:
        raise ValueError("all logits are -inf; at least one token must be allowed")
    return x


def _argmax(logits: ArrayLike) -> int:
    """Greedy pick in one pass over the logits as they are: no float64 copy, no sort, no one-hot."""
    x = np.asarray(logits)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"logits must be a non-empty 1-D array (got shape {x.shape}); pass one position at a time")
    i = int(x.argmax())
    if not x[i] > -np.inf:  # argmax stops at the first NaN, so one read of x[i] checks NaN and all -inf
        raise ModelOutputError(NAN_LOGITS) if x[i] != x[i] else ValueError(
            "all logits are -inf; at least one token must be allowed")
    return i


def _softmax(x: np.ndarray) -> np.ndarray:
    m = x.max()
    # +inf logits (e.g. a huge logit divided by a tiny temperature) share all the mass.
    e = (x == np.inf).astype(np.float64) if m == np.inf else np.exp(x - m)
    return e / e.sum()


def _descending(p: np.ndarray) -> np.ndarray:
    # Stable sort on -p: equal probabilities keep index order, so ties go to the lower id.
    return np.argsort(-p, kind="stable")


def _top_k(p: np.ndarray, k: int) -> np.ndarray:
    if 0 < k < p.size:
        p = p.copy()
        p[_descending(p)[k:]] = 0.0  # exactly k survive, even with ties
    return p


def _top_p(p: np.ndarray, top_p: float) -> np.ndarray:
    if top_p >= 1.0:
        return p
    order = _descending(p)
    mass = np.cumsum(p[order])
    # Smallest prefix whose mass >= top_p of what is left (p may be un-normalized after top-k).
    n = min(int(np.searchsorted(mass, top_p * mass[-1], side="left")) + 1, p.size)
    p = p.copy()
    p[order[n:]] = 0.0
    return p


class Sampler:
    def __init__(self, cfg: SamplingConfig) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)

    def probs(self, logits: ArrayLike) -> np.ndarray:
        """Processed float64 distribution: temperature, then top-k, then top-p (HF order)."""
        x = _as_logits(logits)
        if self.cfg.greedy:  # a one-hot; never np.eye(V): that is V*V floats (549 GB at Gemma's 262k vocab)
            one_hot = np.zeros(x.size, dtype=np.float64)
            one_hot[int(np.argmax(x))] = 1.0
            return one_hot
        with np.errstate(over="ignore"):  # overflow to +inf is handled by _softmax
            p = _softmax(x / self.cfg.temperature)
        if 0 < self.cfg.top_k < p.size or self.cfg.top_p < 1.0:
            p = _top_p(_top_k(p, self.cfg.top_k), self.cfg.top_p)
            p /= p.sum()
        return p

    def _sample(self, p: np.ndarray) -> int:
        # Inverse CDF; side="right" can never land on a zero-probability token.
        cdf = np.cumsum(p)
        i = int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"))
        return i if i < p.size else int(np.flatnonzero(p)[-1])  # u*total rounded up to total

    def pick(self, logits: ArrayLike) -> int:
        if self.cfg.greedy:
            return _argmax(logits)
        return self._sample(self.probs(logits))

    def draft(self, logits: ArrayLike) -> tuple[int, np.ndarray | None]:
        """Drafter side: (token, q) with token ~ q; the verifier must get this same q (None when greedy)."""
        if self.cfg.greedy:  # greedy acceptance never reads q, so skip building it
            return _argmax(logits), None
        q = self.probs(logits)
        return self._sample(q), q

    def accept(self, target_logits: ArrayLike, draft_token: int, q: np.ndarray | None) -> tuple[bool, int | None]:
        """One draft position. Returns (accepted, replacement or None)."""
        if self.cfg.greedy:
            best = _argmax(target_logits)
            return (True, None) if draft_token == best else (False, best)
        p = self.probs(target_logits)
        q = np.asarray(q, dtype=np.float64)
        if q.shape != p.shape:
            raise ValueError(f"q has shape {q.shape} but target logits give {p.shape}; pass the q returned by draft()")
        pd, qd = p[draft_token], q[draft_token]
        ratio = pd / qd if qd > 0 else (1.0 if pd > 0 else 0.0)
        if self.rng.random() < ratio:  # accept with probability min(1, p/q)
            return True, None
        # On rejection sample the part of p that q under-covers; this makes the output exactly p.
        residual = np.maximum(p - q, 0.0)
        return False, self._sample(residual if residual.sum() > 0 else p)

    def bonus(self, target_logits: ArrayLike) -> int:
        """Token after all drafts were accepted: a plain sample from the target."""
        return self.pick(target_logits)
