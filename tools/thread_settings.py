"""Time ONNX Runtime session settings on an export, interleaved: per-call costs and ms/token (docs/performance.md).

    .venv/bin/python tools/thread_settings.py EXPORT_DIR [--repeats 7]

Each repeat visits every setting once (per-call medians, then one plain, one k=4 and one auto run of a reference
prompt), so the settings share the machine's load; medians over repeats are printed as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import onnxruntime as ort

from mtpkit.bench.sweep import ms_per_token
from mtpkit.runtime.backends import onnx as ob
from mtpkit.runtime.engine import Engine, GenConfig


def fixed(manifest, backend, target: tuple[int, str], drafter: tuple[int, str]) -> ob.OrtSession:
    """Sessions with explicit (threads, allow_spinning) per graph."""
    sessions, threads = {}, {}
    drafter_graph = backend.signatures["draft"].graph
    for name, graph in backend.graphs.items():
        n, spin = drafter if name == drafter_graph else target
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = n, 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.add_session_config_entry("session.intra_op.allow_spinning", spin)
        opts.log_severity_level = 3
        sessions[name] = ort.InferenceSession(str(manifest.path(graph.file)), opts, providers=["CPUExecutionProvider"])
        threads[name] = n
    return ob.OrtSession(backend, sessions, threads)


def engine_with(export: str, setting) -> Engine:
    if setting is None:
        return Engine(export)  # the runtime's default
    real = ob.OrtSession.open
    ob.OrtSession.open = classmethod(lambda cls, m, b, t, options=None: fixed(m, b, *setting))
    try:
        return Engine(export, threads=1)  # threads given: no pick, and `open` builds the fixed setting
    finally:
        ob.OrtSession.open = real


def per_call(engine: Engine, ids: list[int]) -> dict[str, float]:
    target, drafter = engine.untimed
    _, hidden = target.forward(ids, 0)
    pos, out = len(ids), {"decode": [], "verify 5": [], "draft": []}
    view = target.kv.drafter_view(pos, "clean")
    for _ in range(10):  # alternate like a k=4 round: four draft steps, one verify, then a decode
        for _ in range(4):
            t0 = time.perf_counter()
            drafter.step(5, hidden[-1], pos, view)
            out["draft"].append(time.perf_counter() - t0)
        for name, ids_ in (("verify 5", [5, 6, 7, 8, 9]), ("decode", [5])):
            t0 = time.perf_counter()
            target.forward(ids_, pos)
            out[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("export")
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    cores = os.cpu_count() or 1
    settings = {"1 thread": ((1, "0"), (1, "0")), f"{cores} threads, spinning off (old default)": ((cores, "0"),) * 2,
                f"{cores} threads, spinning on": ((cores, "1"),) * 2,
                f"target {cores} / drafter 1 thread": ((cores, "0"), (1, "0")), "default (per-graph pick)": None}
    engines = {name: engine_with(args.export, s) for name, s in settings.items()}
    ref = json.loads((engines["1 thread"].manifest.root / "reference.json").read_text())
    ids = ref["prompts"][1]["prompt_ids"]
    modes = {"plain": GenConfig(mtp=False), "k=4": GenConfig(num_assistant_tokens=4, schedule="constant"),
             "auto": GenConfig()}
    rows = {name: {} for name in settings}
    for rep in range(args.repeats + 1):  # the first pass warms up
        for name, engine in engines.items():
            results = {**per_call(engine, ids), **{m: ms_per_token(engine.run(ids, c)) / 1e3
                                                   for m, c in modes.items()}}
            for key, value in results.items():
                if rep:
                    rows[name].setdefault(key, []).append(1e3 * value)
    keys = ["decode", "verify 5", "draft", "plain", "k=4", "auto"]
    print(f"| setting ({cores} cores) | threads picked | " + " | ".join(f"{k} ms" for k in keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for name, r in rows.items():
        picked = engines[name].threads
        print(f"| {name} | {picked} | " + " | ".join(f"{statistics.median(r[k]):.2f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
