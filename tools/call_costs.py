"""Per-call costs of a static-shape backend of an export (LiteRT), through mtpkit's runtime (the Target / Drafter
protocols), and the cost model's predicted speed-up with a given acceptance profile: the graphs tools/scale_bench.py
(ONNX graph sessions) does not time. The verify lengths come from the target's static max_draft, which an ONNX
target has not, so an export whose first backend is ONNX needs --backend litert. Not run in CI.

    .venv/bin/python tools/call_costs.py EXPORT [--backend litert] [--threads N] [--past 256] [--rounds 5]
        [--acceptance-from PAIR_EXPORT | --acceptance 0.4,0.3,...] [--json out.json]

- calls, interleaved round by round, each timed alone: decode (1 token), target calls of t = 2..max_draft + 1
  tokens (verify of k = t - 1 drafts; a static-shape backend runs its one verify graph for each), the drafter step;
  at position --past, on the runtime's own KV cache; median per call kind (ms).
- cost model (runtime/cost_model.py predict): those costs and the acceptance by position of another export
  (the trained tiny pair: a random model's drafter accepts nothing), host terms 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def measure(folder: Path, backend: str | None, threads: int | None, past: int, rounds: int) -> dict:
    from mtpkit.runtime.engine import Engine

    engine = Engine(folder, threads=threads, backend=backend)
    target, drafter = engine.target, engine.drafter
    past = min(past, target.kv.capacity - target.max_draft - 2)
    _, hidden = target.forward(list(range(2, past + 2)), 0)  # a context to attend to
    view = target.kv.drafter_view(past, "clean")
    lengths = list(range(1, target.max_draft + 2))
    runs = {f"target{t}": (lambda t=t: target.forward([0] * t, past)) for t in lengths}
    runs["draft"] = lambda: drafter.step(0, hidden[-1], past, view)
    samples: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(rounds + 1):  # round 0 warms up
        for kind, call in runs.items():
            t0 = time.perf_counter()
            call()
            if r:
                samples[kind].append(time.perf_counter() - t0)
    ms = {k: 1e3 * statistics.median(v) for k, v in samples.items()}
    return {"export": str(folder), "backend": getattr(engine.backend, "kind", engine.backend), "threads": threads, "past": past, "rounds": rounds,
            "cores": os.cpu_count(), "load_average": os.getloadavg(),
            "decode_ms": ms["target1"], "draft_ms": ms["draft"],
            "verify_ms": {t - 1: ms[f"target{t}"] for t in lengths[1:]}}


def predicted(costs: dict, acceptance: list[float]) -> list[dict]:
    from mtpkit.runtime.cost_model import Costs, predict

    target = (costs["decode_ms"], *costs["verify_ms"].values())
    model = Costs(draft=costs["draft_ms"] / 1e3, target=tuple(t / 1e3 for t in target))
    return predict(model, acceptance, range(1, min(len(costs["verify_ms"]), len(acceptance)) + 1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("export", type=Path)
    p.add_argument("--backend", default=None, help="backend to time (default: the export's first)")
    p.add_argument("--threads", type=int, default=None, help="threads (default: the runtime's pick)")
    p.add_argument("--past", type=int, default=256, help="context length before each call (default 256)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--acceptance-from", type=Path, help="export whose manifest holds the acceptance by position")
    p.add_argument("--acceptance", help="acceptance by position, comma-separated")
    p.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = p.parse_args(argv)
    report = measure(args.export, args.backend, args.threads, args.past, args.rounds)
    acceptance = [float(a) for a in args.acceptance.split(",")] if args.acceptance else None
    if args.acceptance_from:
        from mtpkit.runtime.manifest import load_manifest

        acceptance = list(load_manifest(args.acceptance_from, verify=False).backend(args.backend)
                          .options.get("acceptance_by_position") or []) or None
    report["acceptance"], report["predicted"] = acceptance, predicted(report, acceptance) if acceptance else None
    report["command"] = " ".join(["python tools/call_costs.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"{report['backend']} at position {report['past']}: decode {report['decode_ms']:.1f} ms, drafter step "
          f"{report['draft_ms']:.1f} ms, " + ", ".join(f"verify(k={k}) {v:.1f}" for k, v in report["verify_ms"].items()))
    for row in report["predicted"] or []:
        print(f"  k={row['k']}: {row['tokens_per_round']:.2f} tokens/round, predicted {row['speedup']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
