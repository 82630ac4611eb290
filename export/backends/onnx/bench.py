"""Compare the ONNX graphs of two exports: node counts, and the time of one target decode call and one drafter
draft call, the two exports interleaved round by round in one process so both see the same machine load.

    python -m mtpkit.export.backends.onnx.bench BASELINE_DIR NEW_DIR [NEW_DIR ...] [--past 100] [--rounds 15]
        [--calls 100]

e.g. what fusion and int8 weights buy on the trained tiny pair (docs/performance.md):

    mtpkit export $PAIR/target --drafter $PAIR/drafter --out plain --no-fuse
    mtpkit export $PAIR/target --drafter $PAIR/drafter --out fused
    mtpkit export $PAIR/target --drafter $PAIR/drafter --out fused-int8 --quant int8
    python -m mtpkit.export.backends.onnx.bench plain fused fused-int8

Sessions are the runtime's own (runtime/backends/onnx.py OrtSession.open) with 1 intra-op thread (the baseline's
decode and draft sessions: --baseline-threads). `floor` is the time of the target's weight MatMuls alone (same
weights, run back to back): on CPU a decode call cannot get below it by fusing the other ops, because streaming
fp32 weights from memory is what it measures. `fixed` is a session run with the decode call's feeds and as many
outputs that computes nothing (Identity nodes): the cost of a run call itself. What fusion can still shrink is
decode - floor - fixed (`rest`, printed per export).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from pathlib import Path

import numpy as np

from mtpkit.runtime.manifest import Manifest, load_manifest


# one per decoder layer, fused or not: how a graph's layers are counted (the drafter's are not in the manifest)
ATTENTION_OPS = ("Softmax", "MultiHeadAttention", "GroupQueryAttention", "Attention")


def node_counts(folder: Path) -> dict[str, dict]:
    """Per graph: nodes, decoder layers (attention ops), nodes per layer, and the most frequent op types."""
    import onnx

    manifest = load_manifest(folder)
    counts = {}
    for name, graph in manifest.backend("onnx").graphs.items():
        model = onnx.load(str(manifest.path(graph.file)), load_external_data=False)
        ops = collections.Counter(n.op_type for n in model.graph.node)
        layers = sum(ops[op] for op in ATTENTION_OPS) or 1
        counts[name] = {"nodes": len(model.graph.node), "layers": layers,
                        "per_layer": len(model.graph.node) / layers, "ops": dict(ops.most_common())}
    return counts


def _feeds(manifest: Manifest, signature: str, past: int, tokens: int = 1) -> dict:
    """Random feeds keyed by TensorSpec.key for one call at position `past` with T = `tokens`, windows as the
    runtime passes them (sliding: the last W-1 entries; drafter: the store layers' entries up to and including pos)."""
    rng = np.random.default_rng(0)
    sig = manifest.backend("onnx").signatures[signature]
    spec = manifest.kv_cache
    windows = {"past_sliding": min(past, spec.sliding_past), "past_full": past, "T": tokens,
               "sliding_len": min(past + 1, spec.drafter_sliding_visible), "full_len": past + 1}
    feeds = {}
    for t in sig.inputs:
        shape = [windows.get(d, 1) if isinstance(d, str) else d for d in t.shape]
        if t.role == "input_ids":
            feeds[t.key] = rng.integers(0, manifest.model.vocab_size, shape).astype(t.dtype)
        elif t.role == "input_pos":
            feeds[t.key] = np.full(shape, past, dtype=t.dtype)
        else:
            feeds[t.key] = rng.standard_normal(shape).astype(t.dtype)
    return feeds


def _weights_floor(manifest: Manifest):
    """A graph of the target's MatMuls whose B is a weight (an initializer, or the Transpose of one: the tied
    lm_head), each fed one activation row; None when it has none (quantized graphs use MatMulNBits)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(manifest.path(manifest.backend("onnx").graphs["target"].file)))
    weights = {t.name: t for t in model.graph.initializer if len(t.dims) == 2 and t.data_type == TensorProto.FLOAT}
    for n in model.graph.node:  # W^T as a weight of its own: its MatMul streams the same bytes
        if n.op_type == "Transpose" and n.input[0] in weights:
            transposed = numpy_helper.to_array(weights[n.input[0]]).T.copy()
            weights[n.output[0]] = numpy_helper.from_array(transposed, n.output[0])
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    if not matmuls:
        return None
    nodes = [helper.make_node("MatMul", [f"x{weights[n.input[1]].dims[0]}", n.input[1]], [f"y{i}"])
             for i, n in enumerate(matmuls)]
    nodes.append(helper.make_node("Concat", [n.output[0] for n in nodes], ["all"], axis=-1))  # nothing pruned
    rows = sorted({weights[n.input[1]].dims[0] for n in matmuls})
    graph = helper.make_graph(nodes, "floor", [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [1, 1, k])
                                               for k in rows],
                              [helper.make_tensor_value_info("all", TensorProto.FLOAT, None)],
                              [weights[name] for name in {n.input[1] for n in matmuls}])
    session = _scratch_session(graph, model.opset_import)
    feeds = {f"x{k}": np.ones((1, 1, k), np.float32) for k in rows}
    return lambda: session.run(None, feeds)


def _scratch_session(graph, opset_import):
    """A one-thread CPU session (no spinning, errors only in the log) of a graph built here."""
    import onnxruntime as ort
    from onnx import helper

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    return ort.InferenceSession(helper.make_model(graph, opset_imports=opset_import).SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def _fixed_cost(manifest: Manifest, feeds: dict):
    """A run with the target decode's inputs (same names, dtypes, values) and as many outputs, each an Identity of
    an input: the session run's own cost (feeds in, outputs out, executor), with no kernel work to speak of."""
    import onnx
    from onnx import helper

    model = onnx.load(str(manifest.path(manifest.backend("onnx").graphs["target"].file)), load_external_data=False)
    inputs = [i for i in model.graph.input if i.name in feeds]
    count = len(model.graph.output)
    nodes = [helper.make_node("Identity", [inputs[i % len(inputs)].name], [f"out{i}"]) for i in range(count)]
    outputs = [helper.make_tensor_value_info(f"out{i}", inputs[i % len(inputs)].type.tensor_type.elem_type, None)
               for i in range(count)]
    graph = helper.make_graph(nodes, "fixed", inputs, outputs)
    session = _scratch_session(graph, model.opset_import)
    names = [o.name for o in outputs]
    run = session.run  # as OrtSession.run calls it
    return lambda: run(names, feeds, None)


def time_calls(folders: list[Path], past: int = 100, rounds: int = 15, calls: int = 100,
               threads: list[int] | None = None) -> dict[str, dict]:
    """Median seconds per call, folder -> {"decode", "draft", "floor", "fixed"}: every round times `calls` calls of
    each kind for every folder in turn; the result is the median over rounds of each round's median. `threads`:
    the intra-op threads of each folder's sessions (default 1 each; floor and fixed always run on 1)."""
    from mtpkit.runtime.backends.onnx import OrtSession

    runs = {}
    for i, folder in enumerate(folders):
        manifest = load_manifest(folder)
        session = OrtSession.open(manifest, manifest.backend("onnx"), threads[i] if threads else 1)
        feeds = {signature: _feeds(manifest, signature, past) for signature in ("decode", "draft")}
        for signature, f in feeds.items():
            runs[(str(folder), signature)] = lambda s=session, sig=signature, f=f: s.run(sig, f)
        floor = _weights_floor(manifest)
        if floor is not None:
            runs[(str(folder), "floor")] = floor
        decode = manifest.backend("onnx").signatures["decode"]
        runs[(str(folder), "fixed")] = _fixed_cost(manifest, {t.name: feeds["decode"][t.key] for t in decode.inputs})
    result: dict[str, dict] = collections.defaultdict(dict)
    for (folder, kind), seconds in time_interleaved(runs, rounds, calls).items():
        result[folder][kind] = seconds
    return dict(result)


def time_interleaved(runs: dict, rounds: int = 15, calls: int = 100) -> dict:
    """Median seconds per call of each zero-argument callable in `runs` (key -> call): every round times `calls`
    calls of each in turn, so all see the same machine load; the result is the median of the rounds' medians."""
    samples = collections.defaultdict(list)
    for _ in range(rounds):
        for key, call in runs.items():
            for _ in range(max(3, calls // 10)):  # warm this session's caches again after the others ran
                call()
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
            samples[key].append(statistics.median(times))
    return {key: statistics.median(values) for key, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mtpkit.export.backends.onnx.bench",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("baseline", type=Path, help="export folder to compare against")
    p.add_argument("new", type=Path, nargs="+", help="export folders to measure")
    p.add_argument("--past", type=int, default=100, help="context length before the call (default 100)")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    p.add_argument("--calls", type=int, default=100, help="calls per kind and round (default 100)")
    p.add_argument("--baseline-threads", type=int, default=1, metavar="N",
                   help="intra-op threads of the baseline's decode and draft sessions (default 1, as every other "
                        "session here); e.g. all cores, the runtime's older default, to compare default "
                        "against default")
    args = p.parse_args(argv)
    if args.baseline_threads < 1:
        p.error(f"--baseline-threads must be >= 1 (got {args.baseline_threads})")
    counts = {f: node_counts(f) for f in (args.baseline, *args.new)}
    threads = [args.baseline_threads] + [1] * len(args.new)
    times = time_calls([args.baseline, *args.new], args.past, args.rounds, args.calls, threads)
    for folder in args.new:
        at = f" (baseline sessions at {args.baseline_threads} threads)" if args.baseline_threads != 1 else ""
        print(f"{args.baseline} -> {folder}{at}")
        _print_comparison(counts[args.baseline], counts[folder], times[str(args.baseline)], times[str(folder)])
    return 0


def _print_comparison(old_counts: dict, new_counts: dict, old: dict, new: dict) -> None:
    for graph in old_counts:
        before, after = old_counts[graph], new_counts[graph]
        print(f"  {graph:8s} nodes {before['nodes']:5d} -> {after['nodes']:5d}   per layer {before['per_layer']:6.1f} "
              f"-> {after['per_layer']:6.1f} ({after['per_layer'] / before['per_layer']:.1%}, {after['layers']} layers)")
        print(f"           most frequent ops now: {dict(list(after['ops'].items())[:8])}")
    for kind in ("decode", "draft", "floor", "fixed"):
        if kind in old and kind in new:
            print(f"  {kind:8s} {old[kind] * 1e3:.3f} ms -> {new[kind] * 1e3:.3f} ms   x{old[kind] / new[kind]:.2f}")
    if all(kind in times for times in (old, new) for kind in ("decode", "floor", "fixed")):
        rest = [t["decode"] - t["floor"] - t["fixed"] for t in (old, new)]
        print(f"  rest     {rest[0] * 1e3:.3f} ms -> {rest[1] * 1e3:.3f} ms   (decode - floor - fixed: what fusion can "
              f"still shrink)")


if __name__ == "__main__":
    raise SystemExit(main())
