"""ONNX Runtime backend: window KV I/O (past window in, the T new entries out) into host buffers.

The host keeps each KV-owning target layer's cache (window_kv.py: full-attention layers at every position,
sliding-window layers in a ring of their window). A target call at `pos` writes its new entries at
pos..pos+T-1 (a position-indexed write). Rollback after a rejected draft is only a rewind of the caller's `pos`:
masks come from absolute positions, so entries beyond it are never read until they are overwritten.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import TYPE_CHECKING, Callable, TypeAlias, cast

import numpy as np

from ..embedding_table import QuantizedTable
from ..manifest import Backend, Manifest, ManifestError, OnnxOptions
from . import Drafter as DrafterProtocol
from . import Feeds, GraphTensors, LoadOptions, check_signatures
from . import Target as TargetProtocol
from .window_kv import WindowKV

if TYPE_CHECKING:
    import onnxruntime as ort

StoreView: TypeAlias = dict[str, tuple[np.ndarray, np.ndarray]]  # the drafter's view: store-layer K, V per layer type


def onnx_options(backend: Backend) -> OnnxOptions:
    """The entry's options, read as ONNX's record (its kind's record: runtime/roles.py BACKENDS)."""
    options = backend.options
    assert isinstance(options, OnnxOptions), type(options)
    return options


def load_errors() -> tuple[type[BaseException], ...]:
    """What ONNX Runtime raises for a graph file it cannot read."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

    return ort_errors.InvalidProtobuf, ort_errors.InvalidGraph, ort_errors.NoSuchFile, ort_errors.Fail


SIGNATURES = ("prefill", "decode", "verify", "draft")  # what Target and Drafter run


class OrtSession:
    """ONNX Runtime on CPU, one InferenceSession per graph file; run(signature, feeds by role) -> outputs by role.

    Options, chosen by measurement (docs/performance.md):
    - intra-op threads per graph: `threads` when given, else the faster of 1 and all cores, timed on the graph's
      own decode / draft call when the export is opened (pick_threads). Small graphs lose more to waking pool
      threads for every op than they gain; large ones gain.
    - spinning off: with spinning on, the idle session's pool keeps spinning while the other session runs and
      the two fight for cores (docs/performance.md, section 1).
    - inter-op 1, sequential execution: the graphs are one chain of ops; target and drafter never overlap.
    - no IOBinding: the graphs return only the new K/V entries (T rows), which the host writes into its
      preallocated buffers; past windows are passed as numpy views, so there is no large copy to save.
    """

    def __init__(self, backend: Backend, sessions: dict[str, ort.InferenceSession], threads: dict[str, int]):
        self.backend, self._sessions, self.threads = backend, sessions, threads
        for graph, session in sessions.items():  # here, whoever opened the sessions: before their first call
            tensors = _graph_tensors(session)
            check_signatures(backend, graph, lambda sig: tensors)
        self._run = {name: s.run for name, s in sessions.items()}  # the public API only
        # per signature: graph, (input name, feed key) pairs, output names and keys, resolved once
        self._io = {name: (sig.graph, [(t.name, t.key) for t in sig.inputs], [t.name for t in sig.outputs],
                           [t.key for t in sig.outputs]) for name, sig in backend.signatures.items()}

    @classmethod
    def open(cls, manifest: Manifest, backend: Backend, threads: int,
             options: LoadOptions = LoadOptions()) -> "OrtSession":
        sessions = {name: cls.open_graph(manifest, backend, name, threads, options) for name in backend.graphs}
        return cls(backend, sessions, {name: threads for name in sessions})

    @staticmethod
    def open_graph(manifest: Manifest, backend: Backend, graph: str, threads: int,
                   options: LoadOptions = LoadOptions()) -> ort.InferenceSession:
        """One InferenceSession of a graph at `threads` intra-op threads, with the options above."""
        import onnxruntime as ort

        _check_version(ort.__version__, onnx_options(backend).min_onnxruntime)
        missing = [name for name in SIGNATURES if name not in backend.signatures]
        if missing:
            raise ManifestError(f"manifest.json: backends.onnx.signatures.{missing[0]} is missing; re-export the model")
        opts = session_options(options)
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(str(manifest.path(backend.graphs[graph].file)), opts,
                                    providers=["CPUExecutionProvider"])

    def wrap_graph_calls(self, wrap: Callable[[Callable], Callable]) -> None:
        """Replace each graph's own ONNX Runtime call by wrap(call) (tools/host_overhead.py times them)."""
        self._run = {name: wrap(run) for name, run in self._run.items()}

    def run(self, signature: str, feeds: Feeds) -> Feeds:
        """feeds and outputs are keyed by TensorSpec.key: (role, layer or layer type)."""
        graph, inputs, output_names, output_keys = self._io[signature]
        values = self._run[graph](output_names, {name: feeds[key] for name, key in inputs}, None)
        return dict(zip(output_keys, values))


def _graph_tensors(session: ort.InferenceSession) -> GraphTensors:
    """The session's inputs and outputs with their ranks; ONNX Runtime gives an unknown rank as [], like a scalar's,
    so [] is not compared (the exporters declare no scalars)."""
    def ranks(args: list) -> dict[str, int | None]:
        return {a.name: len(a.shape) or None for a in args}
    return ranks(session.get_inputs()), ranks(session.get_outputs())


def session_options(options: LoadOptions = LoadOptions()) -> ort.SessionOptions:
    """A plain SessionOptions (the export's own graph check opens sessions with it), warnings off (an fp32 E2B's
    tied table logs a constant-folding notice per session). Without weight packing, sessions keep their MatMul
    weights where the model file maps them instead of packing a private copy: for fp32 graphs that copy is as large
    as the weights (E4B: ~18.6 GB beside the mapped file); decode is as fast without it, a 5-token verify ~2.8x
    slower (docs/export-memory.md), so the runtime's own sessions pack."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if not options.pack_weights:
        opts.add_session_config_entry("session.disable_prepacking", "1")
    return opts


def release(version: str) -> tuple[int, ...]:
    """(major, minor) of an ONNX Runtime version such as "1.27.0+cpu", for comparing with min_onnxruntime."""
    return tuple(int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit())


def _check_version(installed: str, needed: str | None) -> None:
    """Graphs on an older ONNX Runtime fail deep in session creation (fused ops, quantized tables); say so in one
    line instead."""
    if needed and release(installed) < release(needed):
        raise ManifestError(f"this export's ONNX graphs need onnxruntime >= {needed} (installed {installed}): "
                            "upgrade onnxruntime, or for fused float graphs re-export with --no-fuse")


class Embeddings:
    """The target's scaled token embedding, looked up on the host in the table the target graph also uses."""

    def __init__(self, manifest: Manifest, backend: Backend):
        e = onnx_options(backend).embedding
        path = manifest.path(e["file"])  # refuses a file outside the export folder
        self.scale = np.float32(e["scale"])
        if e["dtype"] in ("int4", "int8"):  # blockwise codes + scales, as the graph's GatherBlockQuantized reads them
            self.table: QuantizedTable | np.memmap = QuantizedTable(e, path.parent)
            self._row: Callable[[int], np.ndarray] = self.table.row
        else:
            self.table = table = np.memmap(path, dtype=np.dtype(e["dtype"]), mode="r", offset=int(e.get("offset", 0)),
                                           shape=tuple(e["shape"]))
            self._row = table.view(np.ndarray).__getitem__  # memmap rows pay subclass overhead on every step

    def __call__(self, token: int) -> np.ndarray:
        return (np.asarray(self._row(token), np.float32) * self.scale).reshape(1, 1, -1)


_IDS, _POS = ("input_ids", None), ("input_pos", None)


class Target:
    max_draft = None  # dynamic T: any draft length fits in one verify call

    def __init__(self, session: OrtSession, kv: WindowKV):
        self.session, self.kv = session, kv
        self.calls = 0

    @property
    def threads(self) -> dict[str, int]:
        return self.session.threads

    def positions_needed(self, prompt_len: int, max_new_tokens: int) -> int:
        return prompt_len + max_new_tokens

    def forward(self, ids: list[int], pos: int) -> tuple[np.ndarray, np.ndarray]:
        n = len(ids)
        self.kv.check_room(pos, n)
        feeds = self.kv.windows(pos)
        feeds[_IDS], feeds[_POS] = np.array([ids], np.int64), np.array([pos], np.int64)
        out = self.session.run("decode" if n == 1 else "verify" if pos else "prefill", feeds)
        self.kv.commit(pos, n, out)
        self.kv.last.start, self.kv.last.end = pos, pos + n
        self.calls += 1
        return out[("logits", None)][0], out[("activations", None)][0]


class Drafter:
    def __init__(self, session: OrtSession, embeddings: Embeddings):
        self.session, self.embed = session, embeddings
        sig = session.backend.signatures["draft"]
        # (feed key, layer type, 0 for K / 1 for V) of each store-layer input, resolved once: this runs k times a round
        # (every store-layer input carries its layer type: the exporter writes it)
        self.store_inputs = [(t.key, cast(str, t.layer_type), int(t.role == "store_value")) for t in sig.inputs
                             if t.role in ("store_key", "store_value")]
        self.calls = 0

    def step(self, token: int, activations: np.ndarray, pos: int, view: StoreView) -> tuple[np.ndarray, np.ndarray]:
        feeds: Feeds = {("inputs_embeds", None): self.embed(token),
                        ("activations", None): activations.reshape(1, 1, -1),
                        ("input_pos", None): np.array([pos], np.int64)}
        for key, layer_type, kv in self.store_inputs:
            feeds[key] = view[layer_type][kv]
        out = self.session.run("draft", feeds)
        self.calls += 1
        return out[("logits", None)][0, -1], out[("projected_activations", None)][0, -1]


def load(manifest: Manifest, backend: Backend, threads: int | None = None,
         options: LoadOptions = LoadOptions()) -> tuple[TargetProtocol[StoreView], DrafterProtocol[StoreView]]:
    """The runtime backend contract (runtime/backends/__init__.py), which mypy checks these classes against."""
    kv, embed = WindowKV(manifest), Embeddings(manifest, backend)
    cores = os.cpu_count() or 1
    if threads or cores == 1:
        session = OrtSession.open(manifest, backend, threads or 1, options)
    else:
        session = pick_threads(manifest, backend, kv, embed, (1, cores), options)
    return Target(session, kv), Drafter(session, embed)


def pick_threads(manifest: Manifest, backend: Backend, kv: WindowKV, embed: Embeddings, candidates: tuple[int, ...],
                 options: LoadOptions = LoadOptions(), repeats: int = 12) -> OrtSession:
    """Per graph, the thread count whose decode (target) or draft step (drafter) is faster; within 10% the fewer
    threads win: they leave cores to the host and to other processes, whose load can come and go after the pick
    (on a shared 2-core machine a 2-thread target waits for the busy core).

    The candidates are timed one at a time, most threads first, so the process never holds two sessions of a
    graph (a full-size export would start with twice the memory it runs with); the last candidate's sessions are
    kept where they win and only the other graphs are opened again."""
    order = sorted(candidates, reverse=True)
    times: dict[int, dict[str, list[float]]] = {}
    session: OrtSession | None = None
    for n in order:
        session = None  # the previous candidate's sessions are released before the next opens
        session = OrtSession.open(manifest, backend, n, options)
        times[n] = _time_calls(session, kv, embed, repeats)
    chosen, drafter_graph = {}, backend.signatures["draft"].graph
    for graph in backend.graphs:
        role = "drafter" if graph == drafter_graph else "target"
        best = min(order, key=lambda n: statistics.median(times[n][role]))
        keep = statistics.median(times[order[-1]][role]) <= 1.10 * statistics.median(times[best][role])
        chosen[graph] = order[-1] if keep else best
    assert session is not None
    sessions, session = dict(session._sessions), None  # the last candidate's sessions, and nothing else, hold them
    for graph, n in chosen.items():
        if n != order[-1]:
            del sessions[graph]  # released before its winner opens
            sessions[graph] = OrtSession.open_graph(manifest, backend, graph, n, options)
    return OrtSession(backend, sessions, chosen)


def _time_calls(session: OrtSession, kv: WindowKV, embed: Embeddings, repeats: int) -> dict[str, list[float]]:
    """Seconds of a decode call and a draft step, repeats times after two warm-up passes."""
    target, drafter = Target(session, kv), Drafter(session, embed)
    pos, times = min(64, kv.capacity - 1), {"target": [], "drafter": []}  # type: int, dict[str, list[float]]
    for rep in range(repeats + 2):
        t0 = time.perf_counter()
        _, hidden = target.forward([0], pos)
        t1 = time.perf_counter()
        drafter.step(0, hidden[-1], pos, kv.drafter_view(pos, "clean"))
        if rep >= 2:
            times["target"].append(t1 - t0)
            times["drafter"].append(time.perf_counter() - t1)
    return times
