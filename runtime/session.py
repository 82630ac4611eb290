"""Backend-neutral graph sessions: run(signature, feeds by role) -> outputs by role.

ONNX Runtime is the first backend; a LiteRT backend implements the same two methods. Everything is read from
the manifest: which graph serves a signature and the name of every tensor.
"""

from __future__ import annotations

import os
from typing import Protocol

import numpy as np

from .manifest import Manifest, ManifestError, Signature


class GraphSession(Protocol):
    manifest: Manifest

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

    def __init__(self, manifest: Manifest, threads: int | None = None):
        import onnxruntime as ort

        self.manifest = manifest
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads or os.cpu_count() or 1
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 3
        self._sessions = {}
        for name, graph in manifest.graphs.items():
            if graph.backend != "onnx":
                raise ManifestError(f"graph {name} is a {graph.backend} graph; open it with the {graph.backend} backend")
            self._sessions[name] = ort.InferenceSession(str(manifest.path(graph.file)), opts,
                                                        providers=["CPUExecutionProvider"])

    def run(self, signature: str, feeds: dict) -> dict:
        sig = self.manifest.signatures[signature]
        named = {t.name: feeds[(t.role, t.layer)] for t in sig.inputs}
        names = [t.name for t in sig.outputs]
        values = self._sessions[sig.graph].run(names, named)
        return {(t.role, t.layer): v for t, v in zip(sig.outputs, values)}


BACKENDS = {"onnx": OrtSession}


def open_session(manifest: Manifest, threads: int | None = None) -> GraphSession:
    backends = {g.backend for g in manifest.graphs.values()}
    if len(backends) != 1 or next(iter(backends)) not in BACKENDS:
        raise ManifestError(f"no runtime backend for graphs of type {sorted(backends)}; supported: {sorted(BACKENDS)}")
    return BACKENDS[backends.pop()](manifest, threads)


def signature_layers(sig: Signature, role: str) -> list[int]:
    return [t.layer for t in sig.inputs if t.role == role]
