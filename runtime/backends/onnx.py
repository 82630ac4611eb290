"""ONNX Runtime backend: window KV I/O (past window in, the T new entries out) into host buffers.

Host-side KV state is one preallocated [1, kv_heads, capacity, head_dim] buffer per KV-owning target layer.
A target call at `pos` writes its new entries at pos..pos+T-1 (a position-indexed write). Rollback after a
rejected draft is only a rewind of the caller's `pos`: masks come from absolute positions, so slots beyond it
are never read until they are overwritten.
"""

from __future__ import annotations

import os

import numpy as np

from ..embedding_table import QuantizedTable
from ..handoff import CacheFullError, LastCall, drafter_ranges
from ..manifest import Backend, Manifest


class OrtSession:
    """ONNX Runtime on CPU, one InferenceSession per graph file; run(signature, feeds by role) -> outputs by role.

    Options, chosen deliberately:
    - intra-op threads = `threads` (default: all cores), inter-op 1, sequential execution: the graphs are one
      chain of ops and target and drafter never run concurrently.
    - spinning off: with spinning on, the idle session's threads keep spinning while the other session runs
      and the two fight for cores on small machines.
    - no IOBinding: the graphs return only the new K/V entries (T rows), which the host writes into its
      preallocated buffers; past windows are passed as numpy views, so there is no large copy to save.
    """

    def __init__(self, manifest: Manifest, backend: Backend, threads: int | None = None):
        import onnxruntime as ort

        self.backend = backend
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads or os.cpu_count() or 1
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 3
        self._sessions = {name: ort.InferenceSession(str(manifest.path(graph.file)), opts,
                                                     providers=["CPUExecutionProvider"])
                          for name, graph in backend.graphs.items()}

    def run(self, signature: str, feeds: dict) -> dict:
        """feeds and outputs are keyed by TensorSpec.key: (role, layer or layer type)."""
        sig = self.backend.signatures[signature]
        named = {t.name: feeds[t.key] for t in sig.inputs}
        values = self._sessions[sig.graph].run([t.name for t in sig.outputs], named)
        return {t.key: v for t, v in zip(sig.outputs, values)}


class WindowKV:
    """The host's KV buffers; hands each call its past window and each drafter step its visible entries."""

    def __init__(self, manifest: Manifest):
        spec = manifest.kv_cache
        self.capacity = int(spec["capacity"])
        self.types = {d.layer: d.type for d in manifest.kv_layers}
        self.buffers = {d.layer: (np.zeros((1, d.kv_heads, self.capacity, d.head_dim), np.float32),
                                  np.zeros((1, d.kv_heads, self.capacity, d.head_dim), np.float32))
                        for d in manifest.kv_layers}
        self.sliding_past = int(spec["sliding_past"])  # W-1: what a sliding layer needs of the past
        self.drafter_sliding = int(spec["drafter_sliding_visible"])  # W+1: what the drafter's sliding layers see
        self.drafter_layers = {t: int(i) for t, i in spec["drafter_layers"].items()}
        self.last = LastCall()

    def past(self, layer: int, pos: int) -> tuple[np.ndarray, np.ndarray]:
        """The past window a target call at `pos` reads for this layer (views when contiguous)."""
        start = 0 if self.types[layer] == "full_attention" else max(0, pos - self.sliding_past)
        k, v = self.buffers[layer]
        return _contiguous(k[:, :, start:pos]), _contiguous(v[:, :, start:pos])

    def write(self, layer: int, pos: int, k_new: np.ndarray, v_new: np.ndarray) -> None:
        k, v = self.buffers[layer]
        end = pos + k_new.shape[2]
        k[:, :, pos:end] = k_new
        v[:, :, pos:end] = v_new

    def check_room(self, pos: int, count: int) -> None:
        if pos + count > self.capacity:
            raise CacheFullError(
                f"KV cache full: {pos + count} positions needed, export capacity is {self.capacity}; "
                "shorten the prompt or --max-new-tokens, or re-export with a larger --max-cache-len")

    def drafter_view(self, pos: int, mode: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Store-layer K/V per layer type, as the drafter sees them when drafting for the token at `pos`."""
        view = {}
        for layer_type, (lo, hi) in drafter_ranges(pos, mode, self.last, self.sliding_past, self.drafter_sliding).items():
            k, v = self.buffers[self.drafter_layers[layer_type]]
            view[layer_type] = (_contiguous(k[:, :, lo:hi]), _contiguous(v[:, :, lo:hi]))
        return view


class Embeddings:
    """The target's scaled token embedding, looked up on the host in the table the target graph also uses."""

    def __init__(self, manifest: Manifest, backend: Backend):
        e = backend.options["embedding"]
        path = manifest.path(e["file"])  # refuses a file outside the export folder
        self.scale = np.float32(e["scale"])
        if e["dtype"] in ("int4", "int8"):  # blockwise codes + scales, as the graph's GatherBlockQuantized reads them
            self.table = QuantizedTable(e, path.parent)
            self._row = self.table.row
        else:
            self.table = np.memmap(path, dtype=np.dtype(e["dtype"]), mode="r", offset=int(e.get("offset", 0)),
                                   shape=tuple(e["shape"]))
            self._row = self.table.__getitem__

    def __call__(self, token: int) -> np.ndarray:
        return (np.asarray(self._row(token), np.float32) * self.scale).reshape(1, 1, -1)


class Target:
    max_draft = None  # dynamic T: any draft length fits in one verify call

    def __init__(self, session: OrtSession, kv: WindowKV):
        self.session, self.kv = session, kv
        self.layers = list(kv.buffers)
        self.calls = 0

    def positions_needed(self, prompt_len: int, max_new_tokens: int) -> int:
        return prompt_len + max_new_tokens

    def forward(self, ids: list[int], pos: int) -> tuple[np.ndarray, np.ndarray]:
        self.kv.check_room(pos, len(ids))
        signature = "decode" if len(ids) == 1 else "verify" if pos else "prefill"
        feeds = {("input_ids", None): np.asarray([ids], np.int64), ("input_pos", None): np.asarray([pos], np.int64)}
        for layer in self.layers:
            feeds[("past_key", layer)], feeds[("past_value", layer)] = self.kv.past(layer, pos)
        out = self.session.run(signature, feeds)
        for layer in self.layers:
            self.kv.write(layer, pos, out[("new_key", layer)], out[("new_value", layer)])
        self.kv.last.start, self.kv.last.end = pos, pos + len(ids)
        self.calls += 1
        return out[("logits", None)][0], out[("activations", None)][0]


class Drafter:
    def __init__(self, session: OrtSession, embeddings: Embeddings):
        self.session, self.embed = session, embeddings
        sig = session.backend.signatures["draft"]
        self.store_inputs = [t for t in sig.inputs if t.role in ("store_key", "store_value")]
        self.calls = 0

    def step(self, token: int, activations: np.ndarray, pos: int, view: dict) -> tuple[np.ndarray, np.ndarray]:
        feeds = {("inputs_embeds", None): self.embed(token), ("activations", None): activations.reshape(1, 1, -1),
                 ("input_pos", None): np.asarray([pos], np.int64)}
        for t in self.store_inputs:
            k, v = view[t.layer_type]
            feeds[t.key] = k if t.role == "store_key" else v
        out = self.session.run("draft", feeds)
        self.calls += 1
        return out[("logits", None)][0, -1], out[("projected_activations", None)][0, -1]


def load(manifest: Manifest, backend: Backend, threads: int | None = None) -> tuple[Target, Drafter]:
    session = OrtSession(manifest, backend, threads)
    return Target(session, WindowKV(manifest)), Drafter(session, Embeddings(manifest, backend))


def _contiguous(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)
