"""Runtime backends, one module per graph format, mirroring export/backends/ (see runtime/roles.py BACKENDS).

Each module `runtime/backends/<kind>.py` provides `load(manifest, backend, threads) -> (Target, Drafter)`;
the draft-verify loop is typed against the Protocols below and never sees a backend class.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Protocol

import numpy as np

from mtpkit.errors import UsageError
from mtpkit.extras import require

from ..handoff import LastCall
from ..manifest import Manifest, ManifestError
from ..roles import BACKENDS


class KVStore(Protocol):
    capacity: int  # positions the export's cache holds
    last: LastCall  # where the last target call wrote (for the hf hand-off)

    def drafter_view(self, pos: int, mode: str):
        """What the drafter may read when drafting for the newest token at `pos` (backend-specific handle)."""


class Target(Protocol):
    kv: KVStore
    calls: int  # graph calls so far (logical: a chunked prefill counts once)
    max_draft: int | None  # drafts one verify call can take (None: any)

    def positions_needed(self, prompt_len: int, max_new_tokens: int) -> int: ...

    def forward(self, ids: list[int], pos: int) -> tuple[np.ndarray, np.ndarray]:
        """Run ids at positions pos..; write their K/V; return logits [T, V] and activations [T, H]."""


class Drafter(Protocol):
    calls: int

    def step(self, token: int, activations: np.ndarray, pos: int, view) -> tuple[np.ndarray, np.ndarray]:
        """One draft step at a constant pos; returns logits [V] and the activations for the next step [H]."""


def open_backend(manifest: Manifest, kind: str | None = None, threads: int | None = None) -> tuple[Target, Drafter]:
    """Target and drafter of one backend of the export (default: onnx when present)."""
    name = kind or manifest.backend().kind
    info = BACKENDS.get(name)
    if info is None:
        close = difflib.get_close_matches(str(name), BACKENDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UsageError(f"unknown backend {name!r}{hint}; this mtpkit runs {', '.join(BACKENDS)}")
    if info.extra:  # before looking into the export: say what to install first
        require(info.extra, f"the {name} runtime backend (--backend {name})", info.runtime_modules)
    backend = manifest.backend(name)
    module = importlib.import_module(f"{__name__}.{name}")
    try:
        return module.load(manifest, backend, threads)
    except _load_errors(name) as e:  # sha256 matched, yet the graph runtime cannot read the file
        raise ManifestError(f"the {name} graphs in {manifest.root} cannot be loaded "
                            f"({' '.join(str(e).split())[:300]}); re-export the model") from e


def _load_errors(kind: str) -> tuple[type[BaseException], ...]:
    """Exceptions that mean "this graph file is unreadable" for a backend's runtime (not a bug in mtpkit)."""
    if kind == "onnx":
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

        return ort_errors.InvalidProtobuf, ort_errors.InvalidGraph, ort_errors.NoSuchFile, ort_errors.Fail
    return ()
