"""The cost model's arithmetic and the auto policy on hand-made costs and acceptances (no timing asserted)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mtpkit.runtime.auto import Acceptance, AutoPolicy, CostMeter, _fill
from mtpkit.runtime.cost_model import Costs, best_k, expected_tokens, predict, round_cost, time_per_token
from mtpkit.runtime.sampling import Sampler, SamplingConfig
from mtpkit.runtime.speculative import DraftSchedule, plain_generate, speculative_generate
from mtpkit.runtime.stats import Stats, conditional_acceptance
from test_speculative import V, FakeDrafter, FakeTarget, one_hot, rule  # the same fake pair, partly wrong below

COSTS = Costs(draft=1.0, target=(10.0, 11.0, 12.0), round_host=0.5, draft_host=0.25, plain_host=0.3)


def test_expected_tokens_is_one_plus_the_prefix_products():
    assert expected_tokens([0.5, 0.5, 0.5], 0) == 1.0
    assert expected_tokens([0.5, 0.5, 0.5], 2) == 1.75  # 1 + 0.5 + 0.25
    assert expected_tokens([1.0, 0.8, 0.5], 3) == pytest.approx(1 + 1.0 + 0.8 + 0.4)
    with pytest.raises(ValueError, match="acceptance for 3 draft positions"):
        expected_tokens([0.5], 3)


def test_round_cost_and_time_per_token():
    assert round_cost(COSTS, 0) == 10.3  # one plain decode step plus its own host work
    assert round_cost(COSTS, 2) == 2 * 1.25 + 12.0 + 0.5
    assert time_per_token(COSTS, [0.5, 0.5], 2) == pytest.approx(15.0 / 1.75)
    assert COSTS.target_call(5) == 14.0  # the last measured step (+1 per token) continues


def test_predict_rows_are_exact():
    rows = predict(COSTS, [0.5, 0.5], [0, 1, 2])
    assert [r["k"] for r in rows] == [0, 1, 2]
    assert rows[0]["speedup"] == 1.0 and rows[0]["ms_per_token"] == pytest.approx(10300.0)
    assert rows[1]["tokens_per_round"] == 1.5 and rows[1]["ms_per_token"] == pytest.approx(1e3 * 12.75 / 1.5)
    assert rows[2]["speedup"] == pytest.approx(10.3 / (15.0 / 1.75))


def test_best_k_picks_the_fastest_and_plain_when_drafting_cannot_pay():
    cheap = Costs(draft=0.05, target=(1.0, 1.02, 1.04, 1.06, 1.08, 1.10))
    acc = [0.9, 0.8, 0.7, 0.6, 0.5]
    times = [time_per_token(cheap, acc, k) for k in range(6)]
    assert best_k(cheap, acc, 5) == int(np.argmin(times)) > 0
    assert best_k(cheap, acc, 1) == 1  # max_draft caps it
    costly = Costs(draft=0.8, target=(1.0, 1.1, 1.2))
    assert best_k(costly, [0.5, 0.5], 2) == 0  # 1.9 per 1.5 tokens > 1.0 per token
    assert best_k(cheap, [0.0] * 5, 5) == 0  # nothing is ever accepted


def test_costs_validation():
    with pytest.raises(ValueError, match="at least one target call"):
        Costs(draft=1.0, target=())
    with pytest.raises(ValueError, match=">= 0"):
        Costs(draft=-1.0, target=(1.0,))


def test_fill_interpolates_and_extrapolates_call_costs():
    assert _fill({1: 1.0, 2: 1.2, 5: 1.5, 9: 2.1}, 11) == pytest.approx(
        (1.0, 1.2, 1.3, 1.4, 1.5, 1.65, 1.8, 1.95, 2.1, 2.25, 2.4))
    assert _fill({1: 1.0, 3: 0.8}, 5) == pytest.approx((1.0, 0.9, 0.8, 0.8, 0.8))  # never cheaper beyond
    assert _fill({1: 1.0}, 3) == (1.0, 1.0, 1.0)


def _rounds(meter: CostMeter, rounds: list[tuple[int, float]], step: float = 0.5, call: float = 1.0) -> None:
    """Feed the meter rounds of (k drafter steps, host seconds) on a synthetic clock."""
    now = 0.0
    meter.target(4, now, now + call, prefill=True)
    now += call
    for k, host in rounds:
        for _ in range(k):
            meter.draft(step)
            now += step
        now += host
        meter.target(k + 1, now, now + call)
        now += call


@pytest.mark.parametrize("alpha", [0.1, None])
def test_meter_fits_host_time_per_round_and_per_draft(alpha):
    meter = CostMeter(alpha=alpha, decay=1.0)
    _rounds(meter, [(0, 0.05), (2, 0.3), (0, 0.05), (2, 0.3), (4, 0.5)])
    assert meter.host() == pytest.approx((0.05, 0.1, 0.1))  # plain steps apart; drafting rounds 0.1 + 0.1 k
    costs = meter.costs(5)
    assert costs.draft == pytest.approx(0.5) and costs.target == pytest.approx((1.0,) * 5)
    assert (costs.plain_host, costs.round_host, costs.draft_host) == pytest.approx((0.05, 0.1, 0.1))
    drafting_only = CostMeter(alpha=alpha, decay=1.0)
    _rounds(drafting_only, [(3, 0.4)])
    assert drafting_only.host() == pytest.approx((0.4, 0.4, 0.0))  # no plain step seen: the intercept stands in


def test_meter_clips_outliers_and_seeds():
    meter = CostMeter(alpha=0.5)
    meter.seed(0.2, {1: 1.0, 3: 2.0})
    meter.target(1, 0.0, 100.0, prefill=False)  # one 100x call moves the estimate by alpha * (3x - x) only
    assert meter.value(1) == pytest.approx(2.0)
    assert meter.costs(3).target == pytest.approx((2.0, 2.0, 2.0))
    assert CostMeter().costs(3) is None  # nothing timed yet


def test_acceptance_is_conditional_and_stale_positions_drift_to_the_prior():
    acc = Acceptance(first=0.5, decay=1.0, weight=2.0, depth=0.9)
    acc.observe(accepted=1, drafted=3)  # 1 right, 2 wrong, 3 never tried
    assert acc.trials == [1.0, 1.0] and acc.hits == [1.0, 0.0]
    r = acc.rates(3)
    assert r[0] == pytest.approx((1 + 2 * 0.5) / 3) and r[1] == pytest.approx(2 * 0.9 * r[0] / 3)
    assert r[2] == pytest.approx(0.9 * r[1])  # untried: the prior only
    fading = Acceptance(first=0.5, decay=0.5, weight=2.0, depth=0.9)
    fading.observe(1, 2)  # position 2 tried and wrong
    assert fading.rates(2)[1] < 0.4
    for _ in range(30):
        fading.observe(1, 1)  # only position 1 is tried (and right): position 2's evidence fades
    r = fading.rates(2)
    assert r[0] == pytest.approx((2 + 2 * 0.5) / (2 + 2)) and r[1] == pytest.approx(0.9 * r[0], abs=1e-6)


def test_conditional_acceptance_pools_runs_of_any_k():
    a, b = Stats(), Stats()
    a.round(drafted=2, accepted=2)
    a.round(drafted=2, accepted=0)
    b.round(drafted=4, accepted=1)
    # position 1: 3 tries, 2 hits; position 2: tried in a's first round and b's round: 1 of 2; 3: never tried
    assert conditional_acceptance([a, b], 3) == [2 / 3, 1 / 2, None]


def _policy(draft: float, **kw) -> AutoPolicy:
    meter = CostMeter()
    meter.seed(draft, {1: 1.0, 2: 1.05, 3: 1.1, 5: 1.2, 9: 1.4})
    return AutoPolicy(8, meter, **kw)


def test_auto_picks_plain_when_drafting_cannot_pay():
    policy = _policy(draft=2.0)  # a drafter step costs twice a decode step: no acceptance can pay for it
    assert policy.start() == 1  # a run always opens with one drafting round
    assert policy.update(1, 1) == 1  # accepted: look again at once
    assert policy.update(1, 1) == 1
    assert policy.update(0, 1) == 0
    waits = [policy.update(0, 0) for _ in range(policy.wait - 1)]
    assert set(waits) == {0} and policy.update(0, 0) == 1  # the next probe comes after the budgeted wait


def test_auto_turns_drafting_off_then_back_on_when_acceptance_recovers():
    policy = _policy(draft=0.1)
    k = policy.start()
    assert k >= 1
    trace = []
    for _ in range(12):  # the drafter is always wrong
        k = policy.update(0, k) if k else policy.update(0, 0)
        trace.append(k)
    assert trace[-1] == 0 or 0 in trace[-3:], trace  # off
    off_at = len(trace)
    for _ in range(300):  # now every draft is right: plain rounds until a probe, then probes, then drafting
        k = policy.update(k, k)
        trace.append(k)
        if k >= 2:
            break
    assert k >= 2, trace
    assert len(trace) - off_at <= policy.max_wait + 10


def test_failed_probes_back_off_exponentially():
    policy = _policy(draft=0.3)
    k, gaps, plain = policy.start(), [], 0
    for _ in range(400):  # nothing is ever accepted
        k = policy.update(0, k)
        if k:
            gaps.append(plain)
            plain = 0
        else:
            plain += 1
    assert gaps == sorted(gaps) and len(gaps) <= 12 and gaps[-1] >= 64, gaps  # ~log2 of the rounds, not one per round


def test_probe_interval_keeps_the_expected_loss_within_budget():
    policy = _policy(draft=0.5, probe_budget=0.02)
    policy.acceptance.observe(0, 1)
    policy.start()
    costs, acc = policy.costs(), policy.acceptance.rates(1)
    plain = time_per_token(costs, acc, 0)
    loss = round_cost(costs, 1) - expected_tokens(acc, 1) * plain
    want = math.ceil(loss * (1 / (1 - acc[0])) / (0.02 * plain))  # a burst: 1 / (1 - a) probes on average
    assert policy.probe_interval() == min(want, policy.max_wait) > 1


def test_probes_draft_as_deep_as_the_verify_cost_makes_best():
    """A one-draft probe pays a whole verify for one position's evidence where the verify graph has one static
    length (LiteRT), so a probe drafts the k >= 1 the model rates best; where verify grows steeply, that is 1."""
    prior = (0.4, 0.8, 0.8, 0.8)
    for target, want in (({1: 1.0, 2: 2.0, 3: 2.0, 5: 2.0}, 4), ({1: 1.0, 2: 1.6, 3: 2.2, 5: 3.4}, 1)):
        meter = CostMeter()
        meter.seed(0.05, target)
        policy = AutoPolicy(4, meter, prior=prior)
        policy.acceptance.observe(0, 4)  # something seen: a run opens with the model's choice, not one draft
        assert policy.choose() == 0 and policy.start() == want  # no k pays: the run opens with a probe
        assert policy.update(0, want) == 0  # the probe failed: plain rounds, then the next probe
        while policy.wait > 1:
            assert policy.update(0, 0) == 0
        assert policy.update(0, 0) == want


def test_schedule_validation():
    with pytest.raises(ValueError, match="only it, takes a policy"):
        DraftSchedule("auto", 1, 4)
    with pytest.raises(ValueError, match="only it, takes a policy"):
        DraftSchedule("constant", 1, 4, policy=_policy(0.1))
    assert DraftSchedule("auto", 0, 4, policy=_policy(0.1)).k == 0  # auto may start on a plain round


class _Drafter(FakeDrafter):
    """Right except at every 5th position, so rounds accept partially and auto varies k."""

    def step(self, token, hidden, pos, view):
        at = int(hidden[0]) + 1
        guess = rule(token, at)
        return one_hot(guess if at % 5 else (guess + 1) % V), np.array([at], np.float32)


class _Scripted:
    """A policy that plays back a fixed sequence of k, 0 (plain rounds) included."""

    def __init__(self, ks):
        self.ks = iter(ks)

    def update(self, accepted, drafted):
        return next(self.ks, 3)


@pytest.mark.parametrize("ks", [[0, 0, 5, 0, 1, 8, 2, 0, 3], [0] * 40, [7, 1, 0, 6]])
def test_greedy_tokens_are_identical_whatever_k_the_policy_picks(ks):
    greedy = Sampler(SamplingConfig())
    want = list(plain_generate(FakeTarget(), [3, 4], greedy, 30, set()))
    schedule = DraftSchedule("auto", ks[0], 16, _Scripted(ks[1:]))
    stats = Stats()
    got = [t for t, _ in speculative_generate(FakeTarget(), _Drafter(), [3, 4], greedy, schedule, 30, set(), stats=stats)]
    assert got == want
    assert stats.drafted == sum(d for d, _ in stats.per_round) and all(d > 0 for d, _ in stats.per_round)



def test_a_failed_opening_draft_waits_only_the_first_backoff():
    """A run's first draft, right after the prompt, often fails on prompts that turn predictable; at the 1% probe
    budget the next probe came only after the budgeted interval (~90 plain rounds), so short runs never drafted."""
    policy = _policy(draft=0.8)
    policy.acceptance.observe(0, 1)  # an earlier run saw little: drafting does not pay by the estimate
    k = policy.start()
    assert k >= 1 and policy.probe_interval() > policy.first_wait  # the budget alone would wait longer
    assert policy.update(0, k) == 0 and policy.wait == policy.first_wait
    while policy.wait > 1:
        policy.update(0, 0)
    assert policy.update(0, 0) >= 1  # the second probe, first_wait rounds later
    assert policy.update(0, policy.k) == 0 and policy.wait >= policy.probe_interval()  # later failures: the budget
