"""tools/auto_replay.py: its premise (a greedy round accepts min(k, L(p))) against real runs, and its arithmetic."""

from __future__ import annotations


import pytest

from mtpkit.runtime.cost_model import Costs, round_cost

NAME = "e2b_gemma4_centroid"


@pytest.fixture(scope="module")
def replay_tool(tool):
    return tool("auto_replay")


def test_replayed_rounds_equal_a_real_greedy_run_at_every_constant_k(replay_tool, tiny_exports):
    from mtpkit.runtime.engine import Engine, GenConfig

    engine = Engine(tiny_exports(NAME), 1)
    ids = engine.codec.encode("def add(a, b):\n    return a + b\n")
    runs = replay_tool.accepted_runs(engine, ids, 20)
    costs = Costs(draft=1e-4, target=(1e-3,) * 9)
    for k in (1, 3, 8):
        real = engine.run(ids, GenConfig(max_new_tokens=len(runs) + 1, num_assistant_tokens=k))
        _, rounds = replay_tool.replay(costs, runs, len(runs) + 1, k, lambda n, d, k=k: k)
        assert [r for r in rounds if r[0]] == real.per_round, k


def test_replay_prices_rounds_and_counts_tokens(replay_tool):
    costs = Costs(draft=1e-4, target=(1e-3, 1.1e-3, 1.2e-3, 1.3e-3))
    seconds, rounds = replay_tool.replay(costs, [2, 0, 3, 3, 3, 3, 3, 3, 3], 8, 2, lambda n, d: 2)
    # 1 (prefill) + 3 + 3 tokens, then one left: a plain step, as the loop never drafts past max_new_tokens
    assert rounds == [(2, 2), (2, 2), (0, 0)]
    assert seconds == pytest.approx(2 * round_cost(costs, 2) + round_cost(costs, 0))
    perfect = replay_tool.compare(costs, [([8] * 40, 41)], prior=(0.9,) * 8)
    row = perfect["rows"][0]
    assert row["best"] >= max(row["constant"].values()) and row["best"] > 1 and 0 < row["auto"] <= row["best"] + 1e-9


def test_replay_premise_holds_on_a_static_verify_graph(replay_tool, litert_exports):
    """On LiteRT (verify graph of one static length, prefill returning only its last row) the oracle drafts as
    deep as the verify takes, and its rounds still equal a real greedy run's."""
    from mtpkit.runtime.engine import Engine, GenConfig

    engine = Engine(litert_exports(NAME), 1, "litert")
    depth = replay_tool.oracle_depth(engine)
    assert depth == min(engine.max_draft, replay_tool.K_ORACLE)
    ids = engine.codec.encode("def add(a, b):\n    return a + b\n")
    runs = replay_tool.accepted_runs(engine, ids, 16)
    assert max(runs) <= depth
    costs = Costs(draft=1e-4, target=(1e-3,) * (depth + 1))
    for k in (1, depth):
        real = engine.run(ids, GenConfig(max_new_tokens=len(runs) + 1, num_assistant_tokens=k))
        _, rounds = replay_tool.replay(costs, runs, len(runs) + 1, k, lambda n, d, k=k: k)
        assert [r for r in rounds if r[0]] == real.per_round, k
