"""Where `--num-assistant-tokens auto` loses against the best constant k, with timing noise taken out.

    .venv/bin/python tools/auto_replay.py EXPORT_DIR [--max-new-tokens 64] [--prompts heldout|bench]
                                          [--backend onnx|litert]

Greedy decoding with the clean hand-off makes a round's outcome a function of where it starts: drafted from
committed position p, a round of k drafts accepts min(k, L(p)), where L(p) is how many of 8 drafts from p match
the target's greedy continuation (8, or as many as a static verify graph takes: LiteRT's 4 by default). So the
script records L(p) at every position of each prompt's greedy output once (the oracle), measures the export's
call costs once, and then replays the auto policy (runtime/auto.py, the real class, one instance across prompts
as in `mtpkit bench`) and every constant k against the same oracle, pricing each run's rounds with the same
costs (runtime/cost_model.py round_cost). What remains between auto and
the best constant k is the policy's own loss; a measured run adds timing noise on top (docs/performance.md).
Prompts: the held-out prompts of the shipped pair (mtpkit demo's), or the bench's built-in set.
"""

from __future__ import annotations

import argparse
import statistics


K_ORACLE = 8


def oracle_depth(engine) -> int:
    """Drafts per oracle round: K_ORACLE, or fewer where the export's verify graph has a static length."""
    from mtpkit.runtime.engine import GenConfig

    return engine.resolve(GenConfig(num_assistant_tokens=K_ORACLE, schedule="constant"), adapt=True).num_assistant_tokens


def accepted_runs(engine, ids: list[int], max_new_tokens: int) -> list[int]:
    """L(p) for every committed position p of the greedy output of ids (index 0: the first decode round)."""
    from mtpkit.runtime.engine import GenConfig
    from mtpkit.runtime.sampling import Sampler
    from mtpkit.runtime.speculative import _draft

    greedy = [t for t, _ in engine.generate(ids, GenConfig(max_new_tokens=max_new_tokens, mtp=False))]
    seq, (target, drafter), depth = ids + greedy, engine.untimed, oracle_depth(engine)
    hidden = [None] * (len(ids) - 1) + list(target.forward(ids, 0)[1][-1:])  # the prompt's last row is all used
    for start in range(len(ids), len(seq) - 1, depth + 1):  # the cache and activations of every position
        hidden += list(target.forward(seq[start:start + depth + 1], start)[1])
    sampler, runs = Sampler(GenConfig().sampling), []
    for p in range(len(ids), len(seq) - 1):
        drafts, _ = _draft(drafter, target.kv, "clean", seq[p], hidden[p - 1], p, depth, sampler)
        n = 0
        while n < depth and p + 1 + n < len(seq) and drafts[n] == seq[p + 1 + n]:
            n += 1
        runs.append(n)
    return runs


def replay(costs, runs: list[int], new_tokens: int, first_k: int, update) -> tuple[float, list[tuple[int, int]]]:
    """Seconds of one run's decode phase and its (drafted, accepted) rounds; update(accepted, drafted) -> next k."""
    from mtpkit.runtime.cost_model import round_cost

    pos, produced, seconds, k, rounds = 0, 1, 0.0, first_k, []
    while produced < new_tokens:
        k = min(k, new_tokens - produced - 1)
        n = min(k, runs[pos]) if pos < len(runs) else 0
        seconds += round_cost(costs, k)
        rounds.append((k, n))
        k = update(n, k)
        pos, produced = pos + n + 1, produced + n + 1
    return seconds, rounds


def measured_costs(engine, prompts: list[list[int]], max_new_tokens: int):
    """The export's call costs from constant-k and plain runs of the first prompts (medians of every call)."""
    from mtpkit.runtime.auto import CostMeter
    from mtpkit.bench.sweep import metered
    from mtpkit.runtime.engine import GenConfig

    depth = oracle_depth(engine)
    with metered(engine, CostMeter(alpha=None)) as meter:
        for ids in prompts[:4]:
            for k in sorted(k for k in {1, 2, 4, 6, 8, depth} if k <= depth):
                engine.run(ids, GenConfig(max_new_tokens=max_new_tokens, num_assistant_tokens=k))
            engine.run(ids, GenConfig(max_new_tokens=max_new_tokens, mtp=False))
    return meter.costs(depth + 1)


def compare(costs, oracle: list[tuple[list[int], int]], prior, repeats: int = 2, depth: int = K_ORACLE,
            policy_class=None) -> dict:
    """Speed-up over plain decoding per prompt: auto (after a warm-up run of each prompt) and each constant k."""
    from mtpkit.runtime.auto import AutoPolicy
    from mtpkit.runtime.cost_model import round_cost

    class FixedMeter:
        def costs(self, max_len):
            return costs

    policy = (policy_class or AutoPolicy)(depth, FixedMeter(), prior=prior)
    rows = []
    for runs, new_tokens in oracle:
        plain = round_cost(costs, 0) * (new_tokens - 1)
        for _ in range(repeats):
            auto, rounds = replay(costs, runs, new_tokens, policy.start(), policy.update)
        const = {k: replay(costs, runs, new_tokens, k, lambda n, d, k=k: k)[0] for k in range(1, depth + 1)}
        best = min(const, key=const.get)
        rows.append({"auto": plain / auto, "best_k": best, "best": plain / const[best],
                     "constant": {k: plain / t for k, t in const.items()}, "auto_ks": [d for d, _ in rounds]})
    return {"rows": rows, "auto_median": statistics.median(r["auto"] for r in rows),
            "best_median": statistics.median(r["best"] for r in rows),
            "auto_over_best": statistics.median(r["auto"] / r["best"] for r in rows)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("export")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompts", choices=("heldout", "bench"), default="heldout")
    p.add_argument("--backend", default="onnx", help="onnx (default) or litert")
    args = p.parse_args()
    from mtpkit.runtime.engine import Engine

    engine = Engine(args.export, 1, args.backend)
    prompts = [engine.codec.encode(text) for text in _texts(args.prompts)]
    oracle = [(runs, len(runs) + 1) for runs in (accepted_runs(engine, ids, args.max_new_tokens) for ids in prompts)]
    costs = measured_costs(engine, prompts, args.max_new_tokens)
    depth = oracle_depth(engine)
    report = compare(costs, oracle, engine.backend.options.acceptance_by_position or (), depth=depth)
    print(f"costs: decode {1e3 * costs.target[0]:.3f} ms, verify(5) {1e3 * costs.target_call(5):.3f} ms, "
          f"draft {1e3 * costs.draft:.3f} ms")
    shown = [k for k in (1, 2, 3, 4, 5) if k <= depth][-3:]
    print(f"| prompt | auto | best constant k | its speed-up | {' | '.join(f'k={k}' for k in shown)} |\n"
          f"|---|---|---|---|{'---|' * len(shown)}")
    for i, r in enumerate(report["rows"]):
        c = r["constant"]
        print(f"| {i} | {r['auto']:.2f}x | {r['best_k']} | {r['best']:.2f}x | "
              f"{' | '.join(f'{c[k]:.2f}x' for k in shown)} |")
    print(f"median: auto {report['auto_median']:.3f}x, best constant k per prompt {report['best_median']:.3f}x, "
          f"auto / best {report['auto_over_best']:.3f}")


def _texts(which: str) -> list[str]:
    if which == "bench":
        from mtpkit.bench.sweep import PROMPTS

        return [q.text for q in PROMPTS]
    import json

    from mtpkit.tiny.train import ASSETS
    from mtpkit.tiny.training.corpus import load_corpus
    from mtpkit.tiny.training.measure import eval_prompts

    pair = json.loads((ASSETS / "pair.json").read_text())
    return [text for _, text in eval_prompts(load_corpus().heldout, pair["config"]["eval_prompts"])]


if __name__ == "__main__":
    main()
