"""Sampling config, processed distributions, and statistical losslessness of the
speculative accept/reject rule (plus a demonstration that the transformers
argmax-draft scheme is not lossless)."""
import math

import numpy as np
import pytest

from mtpkit.runtime.sampling import Sampler, SamplingConfig

V = 6
# Target and drafter disagree on purpose: different argmax and, under top-k=3,
# top-3 sets that overlap in one token only, so accept, reject-with-residual and
# p[d] == 0 all occur.
TARGET = np.array([1.2, 0.4, 2.0, -0.5, 0.9, -1.5])
DRAFTER = np.array([1.5, 1.8, 0.3, 1.0, -0.7, 0.6])
# Second-position logits conditioned on the first emitted token (row = first token).
_table_rng = np.random.default_rng(1234)
TARGET2 = _table_rng.normal(scale=1.5, size=(V, V))
DRAFTER2 = _table_rng.normal(scale=1.5, size=(V, V))

N = 30_000  # samples per losslessness test; ~1-2 s each on one core
# The naive scheme's bias (TV ~0.2-0.27 here) dwarfs even the looser bound at 10k (~0.033).
N_NAIVE = 10_000

SETTINGS = [
    pytest.param(dict(temperature=1.0), id="t1.0"),
    pytest.param(dict(temperature=0.7, top_k=3), id="t0.7-k3"),
    pytest.param(dict(temperature=1.0, top_p=0.8), id="t1.0-p0.8"),
]


def tv(samples: np.ndarray, p: np.ndarray) -> float:
    emp = np.bincount(samples, minlength=p.size) / samples.size
    return 0.5 * float(np.abs(emp - p).sum())


def tv_bound(p: np.ndarray, n: int, delta: float = 1e-6) -> float:
    """Upper bound that TV(empirical of n iid draws from p, p) exceeds with prob <= delta.

    Mean: E|p_hat_i - p_i| <= sqrt(Var p_hat_i) = sqrt(p_i(1-p_i)/n) (Jensen), so
    E[TV] <= 0.5 * sum_i sqrt(p_i(1-p_i)/n) <= 0.5 * sqrt(V/n).
    Tail: changing one of the n samples moves TV by at most 1/n, so McDiarmid gives
    P(TV >= E[TV] + t) <= exp(-2 n t^2); t = sqrt(ln(1/delta) / (2n)).
    With delta = 1e-6 a correct sampler fails for ~no seed; the fixed seed makes it
    deterministic anyway. For V=6, n=30k this is ~0.02 (about 1.5 * sqrt(V/n)).
    """
    mean = 0.5 * float(np.sqrt(p * (1 - p) / n).sum())
    return mean + math.sqrt(math.log(1 / delta) / (2 * n))


def softmax(x):
    e = np.exp(x - np.max(x))
    return e / e.sum()


def naive_accept_hf(target_logits, draft_logits, sampler: Sampler) -> int:
    """What transformers 5.24 does with do_sample=True for Gemma 4 MTP drafters:
    the draft token is the ARGMAX of the drafter logits while q = softmax(raw drafter
    logits) (no temperature/top-k/top-p); p = processed target probs; accept with
    prob min(1, p[d]/q[d]), else sample normalize(max(p - q, 0)). Returns the emitted token.
    Not lossless: the p/q correction assumes d ~ q, but d is deterministic."""
    d = int(np.argmax(draft_logits))
    q = softmax(np.asarray(draft_logits, dtype=np.float64))
    p = sampler.probs(target_logits)
    if sampler.rng.random() < min(1.0, p[d] / q[d]):
        return d
    r = np.maximum(p - q, 0.0)
    if r.sum() <= 0:
        r = p
    return int(np.searchsorted(np.cumsum(r), sampler.rng.random() * r.sum(), side="right"))


def emit_one(s: Sampler, target_logits, drafter_logits) -> int:
    """One speculative position: the drafted token if accepted, else the replacement."""
    d, q = s.draft(drafter_logits)
    ok, r = s.accept(target_logits, d, q)
    return d if ok else r


# --- 1. config validation -------------------------------------------------------

@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(temperature=-1), "use 0 for greedy"),
        (dict(temperature=float("nan")), "temperature must be >= 0"),
        (dict(top_k=-1), "top_k must be >= 0"),
        (dict(top_p=0.0), "top_p must be in (0, 1]"),
        (dict(top_p=1.5), "use 1.0 to disable top-p"),
    ],
)
def test_config_validation(kwargs, needle):
    with pytest.raises(ValueError) as e:
        SamplingConfig(**kwargs)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg
    assert "(got " in msg  # echoes the bad value


def test_config_greedy_flag():
    assert SamplingConfig().greedy
    assert not SamplingConfig(temperature=0.5).greedy


# --- 2. processed distributions ---------------------------------------------------

def test_probs_greedy_one_hot_first_max():
    p = Sampler(SamplingConfig()).probs([1.0, 3.0, 3.0, -np.inf])
    assert p.dtype == np.float64
    np.testing.assert_array_equal(p, [0, 1, 0, 0])


def test_probs_temperature():
    x = np.array([2.0, 1.0, 0.0, -1.0])
    for t in (0.5, 1.0, 2.0):
        p = Sampler(SamplingConfig(temperature=t)).probs(x)
        np.testing.assert_allclose(p, softmax(x / t), rtol=1e-12)
        assert p.sum() == pytest.approx(1.0, abs=1e-12)
    cold = Sampler(SamplingConfig(temperature=0.5)).probs(x)
    hot = Sampler(SamplingConfig(temperature=2.0)).probs(x)
    assert cold[0] > hot[0] and cold[-1] < hot[-1]


def test_top_k_keeps_exactly_k_with_ties():
    # Three-way tie for the top: exactly 2 survive, lower indices win.
    p = Sampler(SamplingConfig(temperature=1.0, top_k=2)).probs([1.0, 2.0, 2.0, 2.0, 0.0])
    np.testing.assert_allclose(p, [0, 0.5, 0.5, 0, 0])
    # k >= V is a no-op.
    x = np.array([0.3, -0.2, 1.0])
    np.testing.assert_allclose(Sampler(SamplingConfig(temperature=1.0, top_k=5)).probs(x), softmax(x))


@pytest.mark.parametrize(
    "top_p, kept",
    [(0.75, [0, 1]), (0.81, [0, 1, 2]), (0.4, [0]), (1e-9, [0]), (1.0, [0, 1, 2, 3])],
)
def test_top_p_minimal_prefix(top_p, kept):
    base = np.array([0.5, 0.3, 0.15, 0.05])
    p = Sampler(SamplingConfig(temperature=1.0, top_p=top_p)).probs(np.log(base))
    assert np.flatnonzero(p).tolist() == kept
    np.testing.assert_allclose(p[kept], base[kept] / base[kept].sum(), rtol=1e-12)


def test_top_k_before_top_p_hf_order():
    # After top-3 the mass renormalizes to [.526, .316, .158]: the first two reach 0.82.
    # Applying top-p to the un-renormalized distribution would keep three (0.8 < 0.82).
    p = Sampler(SamplingConfig(temperature=1.0, top_k=3, top_p=0.82)).probs(np.log([0.5, 0.3, 0.15, 0.05]))
    assert np.flatnonzero(p).tolist() == [0, 1]


def test_probs_inf_and_extreme_logits():
    s = Sampler(SamplingConfig(temperature=0.5, seed=0))
    p = s.probs(np.array([0.0, -np.inf, 1.0, -3e38], dtype=np.float32))
    assert p.dtype == np.float64 and p.sum() == pytest.approx(1.0)
    assert p[1] == 0 and p[3] == 0 and p[2] > p[0] > 0
    assert all(s.pick([-np.inf, 0.0, -np.inf]) == 1 for _ in range(20))
    np.testing.assert_array_equal(s.probs([1e308, 0.0]), [1.0, 0.0])  # 1e308/0.5 overflows to +inf
    with pytest.raises(ValueError, match="-inf"):
        s.probs([-np.inf, -np.inf])
    with pytest.raises(ValueError, match="NaN"):
        s.probs([0.0, np.nan])
    with pytest.raises(ValueError, match="1-D"):
        s.probs(np.zeros((2, 3)))


# --- 3. reproducibility -------------------------------------------------------------

def _picks(seed, n=200):
    s = Sampler(SamplingConfig(temperature=1.0, top_p=0.95, seed=seed))
    return [s.pick(TARGET) for _ in range(n)] + [emit_one(s, TARGET, DRAFTER) for _ in range(n)]


def test_seeded_reproducible():
    assert _picks(7) == _picks(7)
    assert _picks(7) != _picks(8)


def test_bonus_is_pick():
    a, b = Sampler(SamplingConfig(temperature=0.8, seed=3)), Sampler(SamplingConfig(temperature=0.8, seed=3))
    assert [a.bonus(TARGET) for _ in range(50)] == [b.pick(TARGET) for _ in range(50)]


# --- 4. statistical losslessness ----------------------------------------------------

@pytest.mark.parametrize("kwargs", SETTINGS)
def test_speculative_position_is_lossless(kwargs):
    s = Sampler(SamplingConfig(seed=11, **kwargs))
    p = s.probs(TARGET)
    out = np.fromiter((emit_one(s, TARGET, DRAFTER) for _ in range(N)), dtype=np.int64, count=N)
    d, bound = tv(out, p), tv_bound(p, N)
    print(f"lossless {kwargs}: TV={d:.4f} bound={bound:.4f}")
    assert d < bound, f"TV {d:.4f} >= bound {bound:.4f}: speculative output is not distributed as p"


def test_two_position_chain_is_lossless():
    """Draft two tokens, verify left to right, stop at the first rejection and emit the
    replacement; the token after a rejection comes from a fresh round conditioned on it.
    The first two emitted tokens must follow p1(a) * p2(b | a)."""
    s = Sampler(SamplingConfig(temperature=0.8, top_k=4, seed=5))
    joint = s.probs(TARGET)[:, None] * np.array([s.probs(TARGET2[a]) for a in range(V)])
    out = np.empty(N, dtype=np.int64)
    for i in range(N):
        d1, q1 = s.draft(DRAFTER)
        d2, q2 = s.draft(DRAFTER2[d1])  # drafter conditions on its own first draft
        ok1, r1 = s.accept(TARGET, d1, q1)
        if ok1:
            ok2, r2 = s.accept(TARGET2[d1], d2, q2)
            a, b = d1, (d2 if ok2 else r2)
        else:  # d2 is discarded; the next round starts from the replacement
            a, b = r1, emit_one(s, TARGET2[r1], DRAFTER2[r1])
        out[i] = a * V + b
    d, bound = tv(out, joint.ravel()), tv_bound(joint.ravel(), N)
    print(f"lossless chain: TV={d:.4f} bound={bound:.4f}")
    assert d < bound, f"TV {d:.4f} >= bound {bound:.4f}: two-token sequence is not distributed as the target's"


# --- 5. the transformers argmax-draft scheme is biased ---------------------------------

@pytest.mark.parametrize("kwargs", SETTINGS)
def test_naive_hf_argmax_draft_is_not_lossless(kwargs):
    s = Sampler(SamplingConfig(seed=13, **kwargs))
    p = s.probs(TARGET)
    draws = (naive_accept_hf(TARGET, DRAFTER, s) for _ in range(N_NAIVE))
    out = np.fromiter(draws, dtype=np.int64, count=N_NAIVE)
    d, bound = tv(out, p), tv_bound(p, N_NAIVE)
    print(f"naive HF {kwargs}: TV={d:.4f} bound={bound:.4f}")
    assert d > bound, f"TV {d:.4f} <= bound {bound:.4f}: expected the argmax-draft scheme to be detectably biased"


# --- 6. greedy ------------------------------------------------------------------------

def test_greedy_accept_and_replacement():
    s = Sampler(SamplingConfig())
    state = s.rng.bit_generator.state
    d, q = s.draft(DRAFTER)
    assert d == 1 and q is None  # greedy acceptance never reads q, so none is built (V-sized at real vocab)
    assert s.probs(DRAFTER).tolist() == [0, 1, 0, 0, 0, 0]
    assert s.accept(TARGET, 2, q) == (True, None)  # argmax(TARGET) == 2
    assert s.accept(TARGET, d, q) == (False, 2)
    assert s.accept([0.0, 5.0, 5.0], 2, None) == (False, 1)  # ties: first max wins
    assert s.pick(TARGET) == 2 and s.bonus(TARGET) == 2
    assert s.rng.bit_generator.state == state  # greedy never consumes randomness
