"""Scale benchmark of one ONNX export: per-call latency against the memory-bandwidth bound, the cost model's
speed-up per draft length, and what the export itself cost. Not run in CI.

    .venv/bin/python tools/scale_bench.py EXPORT_DIR [--acceptance-from PAIR_EXPORT | --acceptance 0.4,0.6,...]
        [--past 256] [--rounds 5] [--calls 10] [--threads N] [--out report.md] [--json report.json]

- latency: median per graph call (export/backends/onnx/bench.py time_interleaved: every kind timed in turn, each
  round) of target decode, verify of k + 1 tokens for k = 1..8 and the drafter step, at position --past, with random
  feeds shaped as the runtime passes them (bench._feeds); host work outside the call (KV windows, commits,
  sampling) is not in these figures. Threads per graph are the runtime's pick (backends/onnx.py pick_threads).
- bytes a decode call must read: every initializer a weight-multiplying op (MatMul, MatMulNBits, Gemm, ...)
  reads, the LM head included, plus the KV windows the call is fed. Embedding and per-layer-embedding tables
  that are only gathered (one row per token) are not counted. The drafter step is accounted the same way.
- bound = bytes / read bandwidth (mtpkit/bench/bandwidth.py, `reduce` method, best pass, over 2 GiB); decode's
  fraction of it = bound / measured. Also measured over a buffer the size of the decode's weights: when that
  figure is much higher, the weights fit in a cache and the DRAM bound understates what is reachable.
- export cost: manifest.json's `measured` entry (export/phases.py: per-phase wall time and peak RSS), file sizes.
- cost model (runtime/cost_model.py predict) with the measured call costs and the acceptance by position of
  another export (the trained tiny pair: random weights accept nothing meaningful), host terms 0.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from mtpkit.bench import bandwidth
from mtpkit.export.backends.onnx.bench import _feeds, time_interleaved
from mtpkit.runtime.backends import onnx as ort_backend
from mtpkit.runtime.cost_model import Costs, predict
from mtpkit.runtime.manifest import Manifest, load_manifest

SCHEMA = "mtpkit.scale_bench/1"
MAX_K = 8
# ops whose initializer inputs are weights streamed in full on every call (not row lookups)
WEIGHT_OPS = {"MatMul", "MatMulNBits", "Gemm", "FusedMatMul", "MatMulInteger", "DynamicQuantizeMatMul",
              "MatMulIntegerToFloat", "QLinearMatMul"}
# ops between an initializer and its MatMul that read each weight byte once (the tied LM head is Transpose(E))
PASS_THROUGH = {"Transpose", "Reshape", "Cast", "Identity", "Squeeze", "Unsqueeze", "DequantizeLinear"}
KV_ROLES = {"past_key", "past_value", "store_key", "store_value"}


def tensor_bytes(tensor) -> int:
    """Bytes of an initializer from its dims and type (external data is not loaded); 4-bit types pack two."""
    from onnx import TensorProto, helper

    count = math.prod(tensor.dims)
    four_bit = {getattr(TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1") if hasattr(TensorProto, n)}
    if tensor.data_type in four_bit:
        return (count + 1) // 2
    return count * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def weight_bytes(model) -> dict[str, int]:
    """Initializer name -> bytes, for every initializer a weight op reads (through PASS_THROUGH ops), once each."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}

    def source(name: str) -> str:
        while name not in inits and name in producers and producers[name].op_type in PASS_THROUGH:
            name = producers[name].input[0]
        return name

    weights = {}
    for node in graph.node:
        if node.op_type in WEIGHT_OPS:
            for name in filter(None, node.input):
                if source(name) in inits:
                    weights[source(name)] = tensor_bytes(inits[source(name)])
    return weights


def call_bytes(manifest: Manifest, signature: str, past: int) -> dict:
    """What one call at position `past` must read: its graph's weights and the KV windows it is fed."""
    import onnx

    backend = manifest.backend("onnx")
    graph = backend.graphs[backend.signatures[signature].graph]
    model = onnx.load(str(manifest.path(graph.file)), load_external_data=False)
    weights = weight_bytes(model)
    kv = sum(a.nbytes for (role, _), a in _feeds(manifest, signature, past).items() if role in KV_ROLES)
    return {"weights": sum(weights.values()), "weight_tensors": len(weights), "kv": kv,
            "total": sum(weights.values()) + kv}


def time_graphs(manifest: Manifest, past: int, rounds: int, calls: int, threads: int | None) -> tuple[dict, dict]:
    """(latency in seconds: decode, draft, verify {k: s}; threads per graph), sessions as the runtime opens them."""
    target, _ = ort_backend.load(manifest, manifest.backend("onnx"), threads)
    session = target.session
    kinds = {"decode": ("decode", 1), "draft": ("draft", 1)}
    kinds.update({f"verify{k}": ("verify", k + 1) for k in range(1, MAX_K + 1)})
    runs = {}
    for kind, (signature, tokens) in kinds.items():
        feeds = _feeds(manifest, signature, past, tokens)
        runs[kind] = lambda sig=signature, f=feeds: session.run(sig, f)
    seconds = time_interleaved(runs, rounds, calls)
    latency = {"decode": seconds["decode"], "draft": seconds["draft"],
               "verify": {k: seconds[f"verify{k}"] for k in range(1, MAX_K + 1)}}
    return latency, dict(session.threads)


def export_cost(manifest: Manifest, folder: Path) -> dict:
    """The exporter's own record (phases, peak RSS, preflight) and the size of every file in the folder."""
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
    graphs = {name: {"file": g.file, "recipe": g.recipe,
                     "bytes": files.get(g.file, 0) + sum(files.get(d, 0) for d in g.data_files)}
              for name, g in manifest.backend("onnx").graphs.items()}
    # exports written before the `measured` entry kept the phases under `export`
    measured = manifest.measured or (manifest.export if "phases" in manifest.export else None)
    return {"record": measured, "files": files, "total_bytes": sum(files.values()), "graphs": graphs,
            "backends": list(manifest.backends)}


def bounds(nbytes: dict, latency: dict, bw: dict, threads: dict, draft_graph: str) -> dict:
    """Per thread count measured: bound time for decode and draft, and the fraction of it each call reaches."""
    out = {}
    for n, methods in bw.items():
        gbps = methods["reduce"]["gbps"]
        row = {"gbps": gbps}
        for kind in ("decode", "draft"):
            bound = nbytes[kind]["total"] / (gbps * 1e9)
            row[f"{kind}_bound_ms"] = 1e3 * bound
            row[f"{kind}_fraction"] = bound / latency[kind]
        out[n] = row
    picked = threads["target"]
    return {"per_threads": out, "runtime_threads": {"target": picked, "drafter": threads[draft_graph]},
            "reported": {"threads": picked, **out[picked]}}


def acceptance_of(args) -> tuple[list[float] | None, str | None]:
    if args.acceptance:
        return [float(a) for a in args.acceptance.split(",")], "--acceptance"
    if args.acceptance_from:
        recorded = load_manifest(args.acceptance_from, verify=False).backend().options.acceptance_by_position
        return (list(recorded), str(args.acceptance_from)) if recorded else (None, None)
    return None, None


def cost_model(latency: dict, acceptance: list[float] | None, source: str | None) -> dict | None:
    if not acceptance:
        return None
    costs = Costs(draft=latency["draft"],
                  target=(latency["decode"], *(latency["verify"][k] for k in range(1, MAX_K + 1))))
    ks = range(1, min(MAX_K, len(acceptance)) + 1)
    return {"acceptance": acceptance, "source": source, "rows": predict(costs, acceptance, ks)}


def run(folder: Path, past: int = 256, rounds: int = 5, calls: int = 10, threads: int | None = None,
        acceptance: list[float] | None = None, acceptance_source: str | None = None,
        bandwidth_size: int = 2 * bandwidth.GIB) -> dict:
    """The whole report as a JSON-ready dict (schema SCHEMA)."""
    manifest = load_manifest(folder)
    if past + MAX_K + 1 > int(manifest.kv_cache.capacity):
        raise SystemExit(f"--past {past} + {MAX_K + 1} tokens exceed the export's KV capacity "
                         f"{manifest.kv_cache.capacity}; pass a smaller --past")
    nbytes = {kind: call_bytes(manifest, kind, past) for kind in ("decode", "draft")}
    load_before = os.getloadavg()
    latency, picked = time_graphs(manifest, past, rounds, calls, threads)
    load_after = os.getloadavg()
    cores = os.cpu_count() or 1
    bw = {n: {m: b.as_dict() for m, b in r.items()}
          for n, r in bandwidth.measure(sorted({1, cores, *picked.values()}), bandwidth_size).items()}
    working_set = bandwidth.read_bandwidth(picked["target"], max(1 << 20, nbytes["decode"]["weights"]))
    draft_graph = manifest.backend("onnx").signatures["draft"].graph
    return {"schema": SCHEMA, "export": str(folder), "past": past, "rounds": rounds, "calls": calls,
            "machine": {"cores": cores, "load_average_before": load_before, "load_average_after": load_after,
                        "load_average_end": os.getloadavg()},
            "model": manifest.model.to_json(), "kv_cache": {k: getattr(manifest.kv_cache, k) for k in ("capacity", "sliding_past")},
            "export_cost": export_cost(manifest, Path(folder)), "bytes": nbytes,
            "latency_ms": _ms(latency), "verify_over_decode": {k: v / latency["decode"]
                                                              for k, v in latency["verify"].items()},
            "threads": picked, "bandwidth": bw, "working_set_bandwidth": working_set.as_dict(),
            "bound": bounds(nbytes, latency, bw, picked, draft_graph),
            "cost_model": cost_model(latency, acceptance, acceptance_source)}


def _ms(latency: dict) -> dict:
    return {"decode": 1e3 * latency["decode"], "draft": 1e3 * latency["draft"],
            "verify": {k: 1e3 * v for k, v in latency["verify"].items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("export", type=Path, help="export folder (ONNX) to measure")
    p.add_argument("--past", type=int, default=256, help="context length before each call (default 256)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--calls", type=int, default=10, help="calls per kind and round (default 10)")
    p.add_argument("--threads", type=int, help="intra-op threads (default: the runtime's pick per graph)")
    p.add_argument("--acceptance-from", type=Path, help="export whose manifest holds the acceptance by position "
                   "to feed the cost model (an export of mtpkit/tiny/assets/tiny_pair)")
    p.add_argument("--acceptance", help="acceptance by position, comma-separated (instead of --acceptance-from)")
    p.add_argument("--bandwidth-mib", type=int, default=2048, help="bandwidth buffer, MiB (default 2048)")
    p.add_argument("--out", type=Path, help="write the Markdown report here (default: stdout)")
    p.add_argument("--json", type=Path, help="write the JSON report here")
    args = p.parse_args(argv)
    acceptance, source = acceptance_of(args)
    report = run(args.export, args.past, args.rounds, args.calls, args.threads, acceptance, source,
                 args.bandwidth_mib << 20)
    report["command"] = " ".join(["python tools/scale_bench.py", *(argv if argv is not None else sys.argv[1:])])
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    text = markdown(report)
    args.out.write_text(text) if args.out else sys.stdout.write(text)
    return 0


def markdown(r: dict) -> str:
    """The report as Markdown tables (the JSON holds the same figures unrounded)."""
    lines = [f"# Scale bench: `{r['export']}`", "", f"`{r.get('command', '')}`", "",
             f"{r['machine']['cores']} cores; load average (1, 5, 15 min) {_load(r['machine']['load_average_before'])} "
             f"before the timed calls, {_load(r['machine']['load_average_after'])} after; context: {r['past']} past "
             f"positions; {r['rounds']} interleaved rounds x {r['calls']} calls per kind; intra-op threads "
             f"{', '.join(f'{g} {n}' for g, n in r['threads'].items())}.", ""]
    for section in (_export_lines, _bytes_lines, _latency_lines, _bound_lines, _cost_lines):
        lines += section(r) + [""]
    return "\n".join(lines)


def _load(values) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def _export_lines(r: dict) -> list[str]:
    cost, lines = r["export_cost"], ["## Export cost (manifest.json `measured`, written by export/phases.py)", ""]
    record = cost["record"]
    if record:
        lines += ["| phase | wall s | peak RSS MB |", "|---|---:|---:|"]
        lines += [f"| {p['phase']} | {p['seconds']:.1f} | {p['peak_rss_mb']:.0f} |" for p in record["phases"]]
        lines += [f"| **total** | **{record['seconds']:.1f}** | **{record['peak_rss_mb']:.0f}** |", ""]
        if record.get("preflight"):
            lines += [f"Preflight estimate: {record['preflight']['estimated_peak_mb']:.0f} MB peak.", ""]
    else:
        lines += ["This export has no `export` record (exported before export/phases.py).", ""]
    lines += ["| graph | recipe | bytes on disk (incl. external data) |", "|---|---|---:|"]
    lines += [f"| {name} | {g['recipe']} | {g['bytes']:,} |" for name, g in cost["graphs"].items()]
    lines += ["", f"Folder total {cost['total_bytes']:,} bytes; backends: {', '.join(cost['backends'])} "
              "(only ONNX is timed here)."]
    return lines


def _bytes_lines(r: dict) -> list[str]:
    lines = ["## Bytes one call must read", "", "| call | weight tensors | weights | KV windows | total |",
             "|---|---:|---:|---:|---:|"]
    for kind, b in r["bytes"].items():
        lines.append(f"| {kind} | {b['weight_tensors']} | {b['weights']:,} | {b['kv']:,} | {b['total']:,} |")
    return lines


def _latency_lines(r: dict) -> list[str]:
    ms, ratio = r["latency_ms"], r["verify_over_decode"]
    lines = ["## Per-call latency (median, ms)", "", f"decode {ms['decode']:.3f} ms; drafter step "
             f"{ms['draft']:.3f} ms ({ms['draft'] / ms['decode']:.2f} x decode).", "",
             "| k | verify(k+1) ms | / decode |", "|---:|---:|---:|"]
    lines += [f"| {k} | {ms['verify'][k]:.3f} | {ratio[k]:.2f} |" for k in ms["verify"]]
    return lines


def _bound_lines(r: dict) -> list[str]:
    lines = ["## Bandwidth bound (mtpkit/bench/bandwidth.py)", "",
             "| threads | reduce GB/s (median) | gemv GB/s (median) | decode bound ms | decode / bound | "
             "draft bound ms | draft / bound |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for n, row in r["bound"]["per_threads"].items():
        bw = r["bandwidth"][n]
        gemv = f"{bw['gemv']['gbps']:.1f} ({bw['gemv']['median_gbps']:.1f})" if "gemv" in bw else "-"
        mark = " (runtime's pick)" if str(n) == str(r["bound"]["runtime_threads"]["target"]) else ""
        lines.append(f"| {n}{mark} | {bw['reduce']['gbps']:.1f} ({bw['reduce']['median_gbps']:.1f}) | {gemv} | "
                     f"{row['decode_bound_ms']:.3f} | {row['decode_fraction']:.0%} | {row['draft_bound_ms']:.3f} | "
                     f"{row['draft_fraction']:.0%} |")
    ws = r["working_set_bandwidth"]
    lines += ["", f"`decode / bound` = bound time / measured time. Read bandwidth over a buffer the size of the "
              f"decode's weights ({ws['bytes']:,} bytes, {ws['threads']} thread(s)): {ws['gbps']:.1f} GB/s; well "
              "above the large-buffer figure means those weights fit in a cache and the bound above is DRAM's."]
    return lines


def _cost_lines(r: dict) -> list[str]:
    model = r["cost_model"]
    if not model:
        return ["## Cost model", "", "No acceptance given (--acceptance-from or --acceptance): not predicted."]
    lines = ["## Cost model (runtime/cost_model.py, measured call costs, host terms 0)", "",
             f"Acceptance by position from {model['source']}: {', '.join(f'{a:.2f}' for a in model['acceptance'])}",
             "", "| k | tokens/round | ms/token | speed-up vs plain |", "|---:|---:|---:|---:|"]
    lines += [f"| {row['k']} | {row['tokens_per_round']:.2f} | {row['ms_per_token']:.3f} | {row['speedup']:.2f} |"
              for row in model["rows"]]
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
