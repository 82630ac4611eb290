"""The draft-verify loop on fake numpy sessions: acceptance, stops, limits and schedules."""

from __future__ import annotations

import numpy as np
import pytest

from mtpkit.runtime.sampling import Sampler, SamplingConfig
from mtpkit.runtime.speculative import DraftSchedule, plain_generate, speculative_generate
from mtpkit.runtime.stats import Stats

V = 50


def rule(token: int, pos: int) -> int:
    """The fake target's greedy next token after `token` sitting at `pos`."""
    return (7 * token + 3 * pos + 1) % V


def one_hot(i: int) -> np.ndarray:
    x = np.full(V, -5.0, np.float32)
    x[i] = 5.0
    return x


class FakeKV:
    def __init__(self):
        self.views = []

    def drafter_view(self, pos, mode):
        self.views.append((pos, mode))
        return {}


class FakeTarget:
    """Row i of a call at pos predicts rule(ids[i], pos + i); its hidden state carries its position."""

    def __init__(self):
        self.kv = FakeKV()
        self.calls = []

    def forward(self, ids, pos):
        self.calls.append((list(ids), pos))
        logits = np.stack([one_hot(rule(t, pos + i)) for i, t in enumerate(ids)])
        hidden = np.array([[pos + i] for i in range(len(ids))], np.float32)
        return logits, hidden


class FakeDrafter:
    """Knows the target's rule (optionally always wrong); hidden = position of the row that produced `token`."""

    def __init__(self, wrong: bool = False):
        self.wrong = wrong
        self.positions = []

    def step(self, token, hidden, pos, view):
        self.positions.append(pos)
        at = int(hidden[0]) + 1  # `token` sits one after the row that produced it
        guess = rule(token, at)
        return one_hot((guess + 1) % V if self.wrong else guess), np.array([at], np.float32)


GREEDY = Sampler(SamplingConfig())


def _plain(prompt, n, eos=()):
    return list(plain_generate(FakeTarget(), prompt, GREEDY, n, set(eos)))


def _spec(prompt, n, k=4, kind="constant", wrong=False, eos=(), stats=None):
    target, drafter = FakeTarget(), FakeDrafter(wrong)
    out = list(speculative_generate(target, drafter, prompt, GREEDY, DraftSchedule(kind, k, 16), n, set(eos),
                                    stats=stats))
    return out, target, drafter


def test_exact_drafter_accepts_everything_and_matches_plain_greedy():
    stats = Stats()
    out, target, drafter = _spec([3, 4, 5], 21, k=4, stats=stats)
    assert [t for t, _ in out] == _plain([3, 4, 5], 21)
    assert stats.accepted == stats.drafted == 16 and stats.rounds == 4
    assert len(target.calls) == 1 + 4  # prefill + one verify per round of 5 tokens
    assert all(len(ids) == 5 for ids, _ in target.calls[1:])
    assert [f for _, f in out] == [False] + [True, True, True, True, False] * 4
    assert set(drafter.positions[:4]) == {3}  # the drafter's position is constant within a round


def test_always_wrong_drafter_gives_exactly_one_token_per_round():
    stats = Stats()
    out, target, _ = _spec([1, 2], 12, k=3, wrong=True, stats=stats)
    assert [t for t, _ in out] == _plain([1, 2], 12)
    assert stats.accepted == 0 and len(target.calls) == 12  # one target call per emitted token
    assert stats.rounds == 10  # the last call drafts nothing: only one token was left to emit
    assert [pos for _, pos in target.calls] == [0] + list(range(2, 2 + 11))  # pos advances by 1: rejected drafts rewound
    assert not any(f for _, f in out)


def test_max_new_tokens_reached_mid_round_is_never_exceeded():
    for n in range(1, 12):
        out, target, _ = _spec([9], n, k=4)
        assert [t for t, _ in out] == _plain([9], n)
        assert len(out) == n
        assert all(len(ids) <= n for ids, _ in target.calls[1:])  # drafts past the limit are not even proposed


def test_eos_reached_mid_round_stops_at_eos():
    ref = _plain([3, 4, 5], 30)
    eos = ref[6]  # an accepted draft in the second round
    out, _, _ = _spec([3, 4, 5], 30, k=4, eos=[eos])
    tokens = [t for t, _ in out]
    assert tokens == ref[: ref.index(eos) + 1]
    assert _plain([3, 4, 5], 30, eos=[eos]) == tokens


def test_heuristic_schedule_grows_after_full_acceptance_and_shrinks_otherwise():
    schedule = DraftSchedule("heuristic", 4, 9)
    schedule.update(4, 4)
    assert schedule.k == 6
    schedule.update(6, 6)
    assert schedule.k == 8
    schedule.update(8, 8)
    assert schedule.k == 9  # capped
    schedule.update(3, 9)
    assert schedule.k == 8
    for _ in range(20):
        schedule.update(0, schedule.k)
    assert schedule.k == 1  # never below 1
    constant = DraftSchedule("constant", 4, 16)
    constant.update(4, 4)
    assert constant.k == 4


def test_heuristic_schedule_in_the_loop_changes_draft_lengths():
    _, good, _ = _spec([3], 40, k=2, kind="heuristic")
    assert [len(ids) - 1 for ids, _ in good.calls[1:4]] == [2, 4, 6]  # grows by 2 while everything is accepted
    _, bad, _ = _spec([3], 10, k=4, kind="heuristic", wrong=True)
    assert [len(ids) - 1 for ids, _ in bad.calls[1:6]] == [4, 3, 2, 1, 1]  # shrinks by 1 to the floor


@pytest.mark.parametrize("kind,k", [("constant", 0), ("sometimes", 4)])
def test_bad_schedule_arguments(kind, k):
    with pytest.raises(ValueError):
        DraftSchedule(kind, k, 16)


def test_acceptance_by_position_is_counted_per_round():
    stats = Stats()
    stats.round(4, 2, [1, 2, 3, 4])
    stats.round(2, 2, [5, 6])
    s = stats.summary()
    assert s["acceptance_by_position"] == [1.0, 1.0, 0.0, 0.0]
    assert s["acceptance_rate"] == pytest.approx(4 / 6)
    assert stats.drafts == [[1, 2, 3, 4], [5, 6]]
