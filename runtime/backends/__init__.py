"""Runtime backends, one module per graph format, mirroring export/backends/ (see runtime/roles.py BACKENDS).

Each module `runtime/backends/<kind>.py` provides
- `load(manifest, backend, threads, options: LoadOptions) -> (Target, Drafter)`; the draft-verify loop is typed
  against the Protocols below and never sees a backend class;
- optionally `load_errors() -> tuple of exception types` that mean "this graph file is unreadable" to its graph
  runtime (reported as a damaged export, not as a bug in mtpkit);
`load` passes every graph it opens through `check_signatures` (below) before the graph's first call.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Protocol, TypeVar

import numpy as np

from mtpkit.errors import UsageError
from mtpkit.extras import require

from ..handoff import LastCall
from ..manifest import Backend, Manifest, ManifestError, Signature, TensorSpec
from ..roles import BACKENDS


# What a backend's drafter reads of the target's KV cache (ONNX: the K/V slices, LiteRT: mask ranges): each backend
# has its own, so a target and a drafter pair up only when their views agree (checked by mypy, see pyproject.toml).
View = TypeVar("View")
View_co = TypeVar("View_co", covariant=True)
View_contra = TypeVar("View_contra", contravariant=True)
Feeds = dict[tuple[str, int | str | None], np.ndarray]  # a graph call's inputs or outputs, keyed by TensorSpec.key
# a graph's own inputs and outputs of one signature, as the graph runtime reports them: name -> rank, None where
# the graph does not say
GraphTensors = tuple[dict[str, int | None], dict[str, int | None]]


class KVStore(Protocol[View_co]):
    capacity: int  # positions the export's cache holds
    last: LastCall  # where the last target call wrote (for the hf hand-off)

    def drafter_view(self, pos: int, mode: str) -> View_co:
        """What the drafter may read when drafting for the newest token at `pos`."""

    def resumable(self, pos: int) -> bool:
        """Whether a call may start at `pos` on what the cache holds (a sliding-window ring forgets old positions);
        where not, the caller prefills from the start."""

    def keep_from(self, pos: int) -> None:
        """Keep positions from `pos` on readable (a generate's answer), and the window before it; a store that
        keeps every position does nothing."""

    def write(self, layer: int, key: np.ndarray, value: np.ndarray) -> None:
        """Overwrite positions 0..S-1 of layer's cache with K and V given as [1, h, S, d] (the export's graph check
        feeds the drafter PyTorch's own K/V this way)."""


class Target(Protocol[View_co]):
    # properties: read-only, so a backend may hold them as plain attributes of a narrower type (ONNX: max_draft
    # is always None); a settable Protocol attribute would have to match its type exactly
    @property
    def kv(self) -> KVStore[View_co]: ...

    @property
    def calls(self) -> int:
        """Graph calls so far (logical: a chunked prefill counts once)."""

    @property
    def max_draft(self) -> int | None:
        """Drafts one verify call can take (None: any)."""

    @property
    def threads(self) -> dict[str, int]:
        """Intra-op threads of each graph (by manifest graph name), as the backend opened it."""

    def positions_needed(self, prompt_len: int, max_new_tokens: int) -> int: ...

    def forward(self, ids: list[int], pos: int) -> tuple[np.ndarray, np.ndarray]:
        """Run ids at positions pos..; write their K/V; return logits [T, V] and activations [T, H]."""


class Drafter(Protocol[View_contra]):
    @property
    def calls(self) -> int: ...

    def step(self, token: int, activations: np.ndarray, pos: int, view: View_contra) -> tuple[np.ndarray, np.ndarray]:
        """One draft step at a constant pos; returns logits [V] and the activations for the next step [H]."""


@dataclass(frozen=True)
class LoadOptions:
    """How a backend opens its graphs, given by whoever opens them (the Engine's caller).

    pack_weights: let the graph runtime pack a private copy of the weights for its fast kernels (ONNX Runtime's
    prepacking, LiteRT's XNNPACK). Off, the weights stay where the file maps them: for the exporter's one-off float
    runs, where that copy (a float E2B decoder: about 9 GB) is more than the export can afford
    (docs/export-memory.md).
    weight_cache: keep the packed weights in a file (LiteRT: XNNPACK's weight cache, runtime/backends/litert_cache.py)
    that the next start maps instead of packing again. Off for the exporter's runs, which must leave nothing in the
    export folder but what the manifest names."""
    pack_weights: bool = True
    weight_cache: bool = True


def open_backend(manifest: Manifest, kind: str | None = None, threads: int | None = None,
                 options: LoadOptions = LoadOptions()) -> tuple[Target[Any], Drafter[Any]]:
    """Target and drafter of one backend of the export (default: Manifest.backend's, the first in role-table
    order)."""
    name = kind or manifest.backend().kind
    info = BACKENDS.get(name)
    if info is None:
        close = difflib.get_close_matches(str(name), BACKENDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UsageError(f"unknown backend {name!r}{hint}; this mtpkit runs {', '.join(BACKENDS)}")
    if info.extra:  # before looking into the export: say what to install first
        require(info.extra, f"the {name} runtime backend (--backend {name})", info.runtime_modules)
    backend = manifest.backend(name)
    module = backend_module(name)
    try:
        return module.load(manifest, backend, threads, options)
    except getattr(module, "load_errors", tuple)() as e:  # sha256 matched, yet its graph runtime cannot read it
        raise ManifestError(f"the {name} graphs in {manifest.root} cannot be loaded "
                            f"({' '.join(str(e).split())[:300]}); re-export the model") from e


def backend_module(kind: str) -> ModuleType:
    """runtime/backends/<kind>.py (a kind from the role table)."""
    return importlib.import_module(f"{__name__}.{kind}")


def check_signatures(backend: Backend, graph: str, tensors: Callable[[Signature], GraphTensors | None]) -> None:
    """Every signature the manifest declares on `graph` against the graph's own tensors (`tensors(signature)`, None
    when the graph has no such signature), before any call: a manifest whose tensor names or ranks were edited
    would otherwise fail inside the graph runtime, in an error that names neither the graph nor the tensor.
    Metadata only: nothing runs. Both lists must match the graph's, name for name: the runtime feeds only the
    inputs declared, and reads every output it runs by role from the declared ones."""
    for name, sig in backend.signatures.items():
        if sig.graph != graph:
            continue
        where = f"manifest.json: backends.{backend.kind}.signatures.{name}"
        of_graph = f"graph {graph} ({backend.graphs[graph].file})"
        found = tensors(sig)
        if found is None:
            raise ManifestError(f"{where} names signature {sig.backend_name!r}, which {of_graph} does not have; "
                                "re-export the model")
        for kind, declared, actual in (("input", sig.inputs, found[0]), ("output", sig.outputs, found[1])):
            _check_declared(f"{where} declares {kind}", of_graph, declared, actual)
            undeclared = set(actual) - {t.name for t in declared}
            if undeclared:
                raise ManifestError(f"{where} does not declare {kind} {min(undeclared)!r} of {of_graph}; "
                                    "re-export the model")


def _check_declared(declares: str, of_graph: str, declared: list[TensorSpec], actual: dict[str, int | None]) -> None:
    for t in declared:
        if t.name not in actual:
            raise ManifestError(f"{declares} {t.name!r}, which {of_graph} does not have; re-export the model")
        rank = actual[t.name]
        if rank is not None and rank != len(t.shape):
            raise ManifestError(f"{declares} {t.name!r} with rank {len(t.shape)}, but {of_graph} has it with rank "
                                f"{rank}; re-export the model")
