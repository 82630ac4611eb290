"""Peak and current RSS of opening an export with the runtime's default per-graph thread pick.

usage: python tools/load_memory.py EXPORT current|both
  current: the runtime's pick (candidates timed one at a time, one session per graph held)
  both:    every candidate's sessions opened at once and timed side by side, for comparison
Run each mode in its own process (VmHWM is per process); docs/export-memory.md has the figures.
"""
import statistics
import sys
import time

from mtpkit.runtime.backends import onnx as ob


def pick_holding_all(manifest, backend, kv, embed, candidates, repeats=12):
    opened = [ob.OrtSession.open(manifest, backend, n) for n in candidates]
    times = {(n, g): [] for n in candidates for g in ("target", "drafter")}
    for n, session in zip(candidates, opened):
        t = ob._time_calls(session, kv, embed, repeats)
        times[n, "target"], times[n, "drafter"] = t["target"], t["drafter"]
    chosen, drafter_graph = {}, backend.signatures["draft"].graph
    for graph in backend.graphs:
        role = "drafter" if graph == drafter_graph else "target"
        best = min(candidates, key=lambda n: statistics.median(times[n, role]))
        keep = statistics.median(times[min(candidates), role]) <= 1.10 * statistics.median(times[best, role])
        chosen[graph] = min(candidates) if keep else best
    sessions = {g: opened[candidates.index(n)]._sessions[g] for g, n in chosen.items()}
    return ob.OrtSession(backend, sessions, chosen)


if sys.argv[2] == "both":
    ob.pick_threads = pick_holding_all
from mtpkit.runtime.engine import Engine
t = time.time()
e = Engine(sys.argv[1])
hwm = [l for l in open("/proc/self/status") if l.startswith(("VmHWM", "VmRSS"))]
print(sys.argv[2], f"load {time.time() - t:.1f} s", " ".join(" ".join(l.split()) for l in hwm), e.threads)
