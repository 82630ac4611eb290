"""Runtime backends, one module per graph format, mirroring export/backends/ (see runtime/roles.py BACKENDS).

Each module `runtime/backends/<kind>.py` provides `load(manifest, backend, threads) -> (Target, Drafter)`;
the draft-verify loop is typed against the Protocols below and never sees a backend class.
"""

from __future__ import annotations

import importlib
from typing import Protocol

import numpy as np

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
        raise ManifestError(f"unknown backend {name!r}; this mtpkit runs {', '.join(BACKENDS)}")
    if info.extra:  # before looking into the export: say what to install first
        require(info.extra, f"the {name} runtime backend (--backend {name})", info.runtime_modules)
    backend = manifest.backend(name)
    return importlib.import_module(f"{__name__}.{name}").load(manifest, backend, threads)
