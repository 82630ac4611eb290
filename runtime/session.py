"""Backend-neutral graph sessions: run(signature, feeds by role) -> outputs by role.

ONNX Runtime is the first backend; a LiteRT backend implements the same two methods. Everything is read from
the manifest: which graph serves a signature and the name of every tensor.
"""

from __future__ import annotations

import os
from typing import Protocol

import numpy as np

from mtpkit.extras import require

from .manifest import Backend, Manifest, ManifestError


class GraphSession(Protocol):
    manifest: Manifest
    backend: Backend

    def run(self, signature: str, feeds: dict[tuple[str, int | None], np.ndarray]) -> dict[tuple[str, int | None], np.ndarray]:
        """feeds and outputs are keyed by (role, layer); layer is None for non-KV tensors."""
        ...


class OrtSession:
    """ONNX Runtime on CPU, one InferenceSession per graph file.

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

        self.manifest, self.backend = manifest, backend
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads or os.cpu_count() or 1
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 3
        self._sessions = {}
        for name, graph in backend.graphs.items():
            self._sessions[name] = ort.InferenceSession(str(manifest.path(graph.file)), opts,
                                                        providers=["CPUExecutionProvider"])

    def run(self, signature: str, feeds: dict) -> dict:
        sig = self.backend.signatures[signature]
        named = {t.name: feeds[t.key] for t in sig.inputs}
        values = self._sessions[sig.graph].run([t.name for t in sig.outputs], named)
        return {t.key: v for t, v in zip(sig.outputs, values)}


def open_session(manifest: Manifest, kind: str | None = None, threads: int | None = None) -> GraphSession:
    """A session for one backend of the export (default: onnx when present)."""
    if kind == "litert" or (kind is None and manifest.backend().kind == "litert"):
        require("litert", "the LiteRT runtime backend (--backend litert)", modules=("ai_edge_litert",))
    backend = manifest.backend(kind)
    if backend.kind == "onnx":
        return OrtSession(manifest, backend, threads)
    if backend.kind == "litert":
        from .litert import LiteRtSession  # imported lazily: ai-edge-litert is an optional dependency

        return LiteRtSession(manifest, backend, threads)
    raise ManifestError(f"no runtime backend for {backend.kind!r} graphs; this mtpkit runs onnx and litert")
