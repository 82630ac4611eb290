"""Per-call costs of one or more exports (any backend, any recipe) through mtpkit's runtime, side by side in one
run, and the cost model's predicted speculative ms/token for a given acceptance profile. Not run in CI.

    .venv/bin/python tools/call_costs.py EXPORT[@BACKEND] [EXPORT[@BACKEND] ...] [--threads N] [--past 256]
        [--rounds 5] [--max-draft 4] [--acceptance 0.7,0.7,0.7,0.7] [--acceptance-from PAIR_EXPORT[@BACKEND]]
        [--sequential] [--no-bandwidth] [--out report.md] [--json out.json]

- calls, through the runtime's Target / Drafter (each backend's own KV handling included): decode (1 token),
  target calls of t = 2..max_draft + 1 tokens (verify of k drafts; a static-shape LiteRT target runs its one verify
  graph for each), and a round of max_draft drafter steps right after the longest verify, as speculative decoding
  runs them (a round's first step finds its inputs out of cache; later ones do not), at position --past. max_draft is
  the export's static max_draft, else --max-draft. A round of k drafts costs its first k steps' medians. Every
  export's calls are interleaved round by round, so all see the same machine load; --sequential
  times one export after the other instead (full-size exports that do not fit in memory together).
- weights a decode reads: the weights of every weight-multiplying op in the target's decode graph (LiteRT:
  FULLY_CONNECTED; ONNX: tools/scale_bench.py's accounting); gathered tables (embeddings, per-layer embeddings)
  are not counted. bound = those bytes / this machine's read bandwidth (mtpkit/bench/bandwidth.py, 1 GiB, best
  pass); bandwidth fraction = bound / measured decode.
- predicted (runtime/cost_model.py, host terms 0): per export the best k and its ms/token; "vs fastest plain"
  divides it by the lowest decode ms/token in the table, i.e. what speculation on that export gives against the
  best plain decoding measured beside it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

from mtpkit.runtime.cost_model import Costs, predict

TOOLS = Path(__file__).resolve().parent


def open_calls(folder: Path, backend: str | None, threads: int | None, past: int, max_draft: int):
    """(engine, {call kind: zero-argument callable}) at position past, on the runtime's own KV cache."""
    from mtpkit.runtime.engine import Engine

    engine = Engine(folder, threads=threads, backend=backend)
    target, drafter = engine.target, engine.drafter
    max_draft = target.max_draft or max_draft
    past = min(past, target.kv.capacity - max_draft - 2)
    _, hidden = target.forward(list(range(2, past + 2)), 0)  # a context to attend to
    view = target.kv.drafter_view(past, "clean")
    runs = {f"target{t}": (lambda t=t: target.forward([0] * t, past)) for t in range(1, max_draft + 2)}
    runs["draft"] = lambda: draft_round(drafter, hidden[-1], past, view, max_draft)
    return engine, runs, past


def draft_round(drafter, hidden, past: int, view, k: int) -> list[float]:
    """Seconds of each of k drafter steps in a row, as a speculative round runs them after a verify."""
    times = []
    for i in range(k):
        t0 = time.perf_counter()
        drafter.step(0, hidden, past + i, view)
        times.append(time.perf_counter() - t0)
    return times


def time_rounds(runs: dict, rounds: int) -> dict[str, float]:
    """Median ms per call kind (a kind whose call returns its steps' seconds: per step, as KIND.0, KIND.1, ...);
    round 0 warms up."""
    samples: dict[str, list[float]] = {}
    for r in range(rounds + 1):
        for kind, call in runs.items():
            t0 = time.perf_counter()
            steps = call()
            took = ({f"{kind}.{i}": s for i, s in enumerate(steps)} if isinstance(steps, list)
                    else {kind: time.perf_counter() - t0})
            for key, seconds in took.items():
                if r:
                    samples.setdefault(key, []).append(seconds)
    return {k: 1e3 * statistics.median(v) for k, v in samples.items()}


def describe(folder: Path, engine, past: int, ms: dict, prefix: str = "") -> dict:
    kinds = sorted(int(k.removeprefix(f"{prefix}target")) for k in ms if k.startswith(f"{prefix}target"))
    steps = [ms[f"{prefix}draft.{i}"] for i in range(len(kinds) - 1)]
    backend = engine.backend.kind
    graph = engine.manifest.backend(backend).graphs["target"]
    return {"export": str(folder), "backend": backend, "recipe": graph.recipe, "threads": engine.threads, "past": past,
            "decode_ms": ms[f"{prefix}target1"], "draft_steps_ms": steps, "draft_ms": sum(steps) / len(steps),
            "verify_ms": {t - 1: ms[f"{prefix}target{t}"] for t in kinds[1:]},
            "decode_weight_bytes": decode_weight_bytes(engine.manifest, backend)}


def measure(specs: list[tuple[Path, str | None]], threads: int | None, past: int, rounds: int, max_draft: int,
            sequential: bool) -> list[dict]:
    """One row per export: its call costs (ms) and the bytes its decode reads."""
    rows: list[dict] = []
    if sequential:
        for folder, backend in specs:
            engine, runs, at = open_calls(folder, backend, threads, past, max_draft)
            rows.append(describe(folder, engine, at, time_rounds(runs, rounds)))
            del engine, runs
            gc.collect()
        return rows
    opened, runs = [], {}
    for i, (folder, backend) in enumerate(specs):
        engine, own, at = open_calls(folder, backend, threads, past, max_draft)
        opened.append((folder, engine, at))
        runs.update({f"{i}:{k}": call for k, call in own.items()})
    ms = time_rounds(runs, rounds)
    return [describe(folder, engine, at, ms, f"{i}:") for i, (folder, engine, at) in enumerate(opened)]


def decode_weight_bytes(manifest, backend: str) -> int:
    """Bytes of the weights a decode call multiplies (not the tables it only gathers rows from)."""
    if backend == "onnx":
        if str(TOOLS) not in sys.path:
            sys.path.insert(0, str(TOOLS))
        import scale_bench  # noqa: PLC0415 (a sibling script: its ONNX weight accounting)

        return scale_bench.call_bytes(manifest, "decode", 0)["weights"]
    sig = manifest.backend(backend).signatures["decode"]
    return litert_weight_bytes(manifest.path(manifest.backend(backend).graphs[sig.graph].file), sig.backend_name or "decode")


def litert_weight_bytes(path: Path, signature: str) -> int:
    """FULLY_CONNECTED weight buffers (and block scales) in one signature's subgraph of a .tflite, each once."""
    from ai_edge_litert import schema_py_generated as schema

    from mtpkit.export.backends.litert.graft import read_map

    model = schema.ModelT.InitFromPackedBuf(read_map(path), 0)
    sub = model.subgraphs[next(s.subgraphIndex for s in model.signatureDefs if s.signatureKey.decode() == signature)]
    seen: set[int] = set()
    total = 0
    for op in sub.operators:
        code = model.operatorCodes[op.opcodeIndex]
        if max(code.builtinCode, code.deprecatedBuiltinCode) != schema.BuiltinOperator.FULLY_CONNECTED:
            continue
        tensor = sub.tensors[op.inputs[1]]
        extra = []
        q = tensor.quantization
        if q is not None and getattr(q, "details", None) is not None and hasattr(q.details, "scales"):
            extra.append(sub.tensors[q.details.scales].buffer)  # blockwise int4: a scales tensor per weight
        for b in (tensor.buffer, *extra):
            if b and b not in seen:
                seen.add(b)
                buf = model.buffers[b]
                total += int(buf.size) if buf.size else (len(buf.data) if buf.data is not None else 0)
        if q is not None and q.scale is not None and len(q.scale) > 1:
            total += 4 * len(q.scale)  # channelwise scales, inline
    return total


def summarize(rows: list[dict], profiles: dict[str, list[float]], gbps: float | None) -> list[dict]:
    """Adds the verify/decode ratio, the bandwidth fraction and, per acceptance profile, the cost model's
    prediction and best k to every row."""
    fastest_plain = min(r["decode_ms"] for r in rows)
    for r in rows:
        max_draft = max(r["verify_ms"])
        r["verify_ratio"] = r["verify_ms"][max_draft] / r["decode_ms"]
        r["bandwidth_fraction"] = (r["decode_weight_bytes"] / gbps / 1e6 / r["decode_ms"]) if gbps else None
        r["predicted"], r["best"] = {}, {}
        for label, acceptance in profiles.items():
            rows_k = r["predicted"][label] = predicted(r, acceptance)
            best = min(rows_k, key=lambda p: p["ms_per_token"])
            r["best"][label] = {**best, "vs_fastest_plain": best["ms_per_token"] / fastest_plain}
    return rows


def predicted(costs: dict, acceptance: list[float]) -> list[dict]:
    """Per k, the cost model with that k's drafter step: the mean of a round's first k steps."""
    target = tuple(t / 1e3 for t in (costs["decode_ms"], *costs["verify_ms"].values()))
    steps = costs["draft_steps_ms"]
    return [predict(Costs(draft=sum(steps[:k]) / k / 1e3, target=target), acceptance, [k])[0]
            for k in range(1, min(len(costs["verify_ms"]), len(acceptance)) + 1)]


def table(rows: list[dict], profiles: dict[str, list[float]]) -> list[str]:
    head = ["export", "backend", "recipe", "decode ms", "longest verify ms (tokens)", "verify / decode",
            "drafter ms (steps of a round)", "decode weights GB", "bandwidth fraction"]
    for label in profiles:
        head += [f"best k ({label})", f"spec ms/token ({label})", f"vs fastest plain ({label})"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        max_draft = max(r["verify_ms"])  # each export's own: LiteRT verifies a static length, --max-draft + 1
        cells = [Path(r["export"]).name, r["backend"], r["recipe"], f"{r['decode_ms']:.1f}",
                 f"{r['verify_ms'][max_draft]:.1f} ({max_draft + 1})", f"{r['verify_ratio']:.2f}",
                 f"{r['draft_ms']:.2f} ({' / '.join(f'{x:.2f}' for x in r['draft_steps_ms'])})",
                 f"{r['decode_weight_bytes'] / 1e9:.3f}",
                 f"{r['bandwidth_fraction']:.2f}" if r["bandwidth_fraction"] else "-"]
        for label in profiles:
            b = r["best"][label]
            cells += [str(b["k"]), f"{b['ms_per_token']:.1f}", f"{b['vs_fastest_plain']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def profiles_of(args) -> dict[str, list[float]]:
    """Acceptance profiles by label: each --acceptance as given, each --acceptance-from's recorded profile."""
    from mtpkit.runtime.manifest import load_manifest

    profiles = {text: [float(a) for a in text.split(",")] for text in args.acceptance or []}
    for spec in args.acceptance_from or []:
        folder, _, backend = spec.partition("@")
        recorded = load_manifest(Path(folder), verify=False).backend(backend or None).options.acceptance_by_position or []
        if not recorded:
            raise SystemExit(f"call_costs: {spec} records no acceptance_by_position; export it with a reference")
        profiles[f"{Path(folder).name}{'@' + backend if backend else ''}"] = list(recorded)
    return profiles


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("exports", nargs="+", help="EXPORT or EXPORT@BACKEND (default: the export's first backend)")
    p.add_argument("--threads", type=int, default=None, help="threads (default: the runtime's pick)")
    p.add_argument("--past", type=int, default=256, help="context length before each call (default 256)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--max-draft", type=int, default=4, help="drafts to time where the export has no static verify length")
    p.add_argument("--acceptance-from", action="append", metavar="EXPORT[@BACKEND]",
                   help="export whose manifest holds an acceptance by position (repeatable)")
    p.add_argument("--acceptance", action="append", help="acceptance by position, comma-separated (repeatable)")
    p.add_argument("--sequential", action="store_true", help="time one export after the other, not interleaved")
    p.add_argument("--no-bandwidth", action="store_true", help="skip the read-bandwidth measurement")
    p.add_argument("--out", type=Path, help="write the table as Markdown here")
    p.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = p.parse_args(argv)
    specs = [(Path(e.split("@")[0]), e.split("@")[1] if "@" in e else None) for e in args.exports]
    rows = measure(specs, args.threads, args.past, args.rounds, args.max_draft, args.sequential)
    gbps = None
    if not args.no_bandwidth:
        from mtpkit.bench import bandwidth

        gbps = bandwidth.read_bandwidth(threads=args.threads or 1, size=1 << 30, repeats=3).gbps
    profiles = profiles_of(args)
    summarize(rows, profiles, gbps)
    command = " ".join(["python tools/call_costs.py", *(argv if argv is not None else sys.argv[1:])])
    lines = table(rows, profiles)
    notes = [f"command: `{command}`", f"position {rows[0]['past']}, threads {args.threads or 'runtime pick'}, "
             f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}, read bandwidth "
             f"{f'{gbps:.1f} GB/s' if gbps else 'not measured'}, acceptance by position {profiles}"]
    print("\n".join(lines + [""] + notes))
    for r in rows:
        print(f"{Path(r['export']).name} {r['backend']}: " + ", ".join(
            f"verify(k={k}) {v:.1f}" for k, v in r["verify_ms"].items()))
    if args.out:
        args.out.write_text("\n".join(lines + [""] + [f"- {n}" for n in notes]) + "\n")
    if args.json:
        args.json.write_text(json.dumps({"command": command, "bandwidth_gbps": gbps, "acceptance": profiles,
                                         "load_average": os.getloadavg(), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
