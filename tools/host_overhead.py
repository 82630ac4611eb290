"""Host overhead of the decode loop: wall time of generate() against the time inside ONNX Runtime's C run call.

    .venv/bin/python tools/host_overhead.py EXPORT_DIR [--modes plain,k4,k1,auto] [--profile k4]

Runs the export's reference prompts (64 new tokens, 1 intra-op thread, so threads do not blur the split) 8 times
per mode, interleaved; host = total - in-ORT, as a share of in-ORT time, in wall-clock time and in this thread's
CPU time (with one intra-op thread ORT computes on the calling thread; CPU time leaves out the waits for a core
that other processes cause on a shared machine). --profile adds a cProfile of one mode.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time

from mtpkit.runtime.engine import Engine, GenConfig

MODES = {"plain": GenConfig(mtp=False), "k4": GenConfig(num_assistant_tokens=4, schedule="constant"),
         "k1": GenConfig(num_assistant_tokens=1, schedule="constant"), "auto": GenConfig()}


def time_graph_calls(engine: Engine, clock: list[float]) -> None:
    """Wrap the C-level run of every session: its wall time adds up in clock[0], its CPU time in clock[1]."""
    if engine.backend.kind != "onnx":
        raise SystemExit(f"host_overhead.py times ONNX Runtime's own calls; {engine.backend.kind} has none")

    def wrap(run):
        def timed(*args):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return run(*args)
            finally:
                clock[0] += time.perf_counter() - t0
                clock[1] += time.thread_time() - c0
        return timed

    engine.untimed[0].session.wrap_graph_calls(wrap)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("export")
    p.add_argument("--modes", default="plain,k4,k1,auto")
    p.add_argument("--profile", default=None, help="also cProfile this mode")
    args = p.parse_args()
    engine, clock = Engine(args.export, threads=1), [0.0, 0.0]
    time_graph_calls(engine, clock)
    prompts = [q["prompt_ids"] for q in json.loads((engine.manifest.root / "reference.json").read_text())["prompts"]]
    modes = args.modes.split(",")
    totals = {m: [0.0] * 4 for m in modes}  # wall, wall in ORT, CPU, CPU in ORT
    for rep in range(9):  # the first pass warms up
        for m in modes:
            for ids in prompts:
                clock[:] = [0.0, 0.0]
                cpu = time.thread_time()
                stats = engine.run(ids, MODES[m])
                if rep:
                    for i, x in enumerate((stats.total_s, clock[0], time.thread_time() - cpu, clock[1])):
                        totals[m][i] += x
    print("| mode | wall ms | in ORT ms | host / ORT (wall) | CPU ms | in ORT ms | host / ORT (CPU) |")
    print("|---|---|---|---|---|---|---|")
    for m, (wall, graph, cpu, cpu_graph) in totals.items():
        print(f"| {m} | {1e3 * wall:.0f} | {1e3 * graph:.0f} | {100 * (wall - graph) / graph:.1f}% | {1e3 * cpu:.0f} | "
              f"{1e3 * cpu_graph:.0f} | {100 * (cpu - cpu_graph) / cpu_graph:.1f}% |")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for ids in prompts * 3:
            engine.run(ids, MODES[args.profile])
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
