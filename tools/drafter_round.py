"""A LiteRT drafter round as speculative decoding runs it: a verify, then k drafter steps at the same view, each
step timed; several exports interleaved round by round in one process. --held-vs-set also runs every round a
second time with all inputs set on every step (what the runtime did before it held a round's caches, windows and
masks after its first step) and asserts both draft the same logits. Not run in CI.

    .venv/bin/python tools/drafter_round.py EXPORT [EXPORT ...] [--past 256] [--k 4] [--rounds 40] [--threads 1]
        [--held-vs-set]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def open_round(folder: str, threads: int, past: int):
    from mtpkit.runtime.engine import Engine

    engine = Engine(folder, threads=threads, backend="litert")
    target, drafter = engine.target, getattr(engine.drafter, "_inner", engine.drafter)
    _, hidden = target.forward(list(range(2, past + 2)), 0)  # a context to attend to
    return target, drafter, hidden[-1], target.kv.drafter_view(past, "clean")


def one_round(target, drafter, hidden, view, past: int, k: int, set_every_step: bool) -> tuple[list, list]:
    """(seconds per step, logits per step) of k drafter steps right after a verify of k + 1 tokens."""
    target.forward([0] * (k + 1), past)
    times, logits = [], []
    for i in range(k):
        drafter._held = drafter._held and not set_every_step
        t0 = time.perf_counter()
        logits.append(drafter.step(i, hidden, past + i, view)[0])
        times.append(time.perf_counter() - t0)
    return times, logits


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("exports", nargs="+")
    p.add_argument("--past", type=int, default=256, help="position of the round (default 256)")
    p.add_argument("--k", type=int, default=4, help="drafter steps per round (default 4)")
    p.add_argument("--rounds", type=int, default=40, help="timed rounds after one warm-up (default 40)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--held-vs-set", action="store_true", help="also time rounds that set every input every step")
    args = p.parse_args(argv)
    modes = [False, True] if args.held_vs_set else [False]
    opened = {f: open_round(f, args.threads, args.past) for f in args.exports}
    steps = {(f, m): [[] for _ in range(args.k)] for f in opened for m in modes}
    for r in range(args.rounds + 1):
        for folder, (target, drafter, hidden, view) in opened.items():
            drafts = {}
            for mode in modes:
                times, drafts[mode] = one_round(target, drafter, hidden, view, args.past, args.k, mode)
                for i, t in enumerate(times if r else []):
                    steps[(folder, mode)][i].append(t)
            assert all(np.array_equal(a, b) for a, b in zip(drafts[False], drafts[modes[-1]])), folder
    print(f"position {args.past}, {args.k} steps per round, {args.rounds} rounds, threads {args.threads}")
    for (folder, mode), samples in steps.items():
        ms = [1e3 * statistics.median(s) for s in samples]
        label = "every input set every step" if mode else "round inputs held after step 1"
        print(f"{folder} ({opened[folder][1]._round[2]}), {label}: steps {' / '.join(f'{x:.3f}' for x in ms)} ms, "
              f"round {sum(ms):.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
