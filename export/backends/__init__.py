"""Export backends, one package per graph format (see runtime/roles.py BACKENDS), mirrored by runtime/backends/.

Each package `export/backends/<kind>/` provides, from its __init__.py,
- `export(job: ExportJob) -> manifest.Backend`: it writes its graph files into job.folder and returns its manifest
  entry (graph files with sha256, signatures whose tensors carry roles from the role table, backend options);
- `check(manifest, job, ids) -> list[verify.GraphCheck]`: its float graphs against PyTorch (export/verify.py);
- `quantize(folder, backend, recipes, block_size, accuracy_level, ple_bits) -> manifest.Backend`: its float
  graphs rewritten under the recipes (only called for a quantized export);
- `MEMORY: ExportMemory`: what its phases cost, for the memory preflight (export/preflight.py).
- `plan_files(job: sizes.SizeJob) -> list[sizes.PlannedFile]`: the bytes of every file its export writes, from the
  checkpoints' headers alone (`mtpkit export --dry-run`, export/sizes.py).
- `PACKAGES` (optional): the pip distributions that write its files, whose versions manifest.json records
  (export/reproduce.py).
The pipeline only orchestrates.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from mtpkit.runtime.manifest import KVLayer

from ..recipes import Recipe


@dataclass(frozen=True)
class ExportJob:
    """What every backend export reads; built once by the pipeline after the checkpoints are loaded."""

    cfg: Any  # ExportConfig
    folder: Path  # the temporary export folder, renamed into place at the end
    target: Any  # the loaded Gemma4ForCausalLM (eval), weights held in --dtype: run it under fp32_compute
    drafter: Any  # the loaded Gemma4AssistantForCausalLM
    target_adapter: Any  # export/models module of the target family
    drafter_adapter: Any
    target_folder: Path  # the target's HF checkpoint folder
    kv_layers: tuple[KVLayer, ...]  # the target's KV-owning layers
    store: dict[str, int]  # layer type -> the store layer the drafter reads
    max_draft: int  # drafts per verify call for static-shape backends
    low_bit: tuple[str, ...] = ()  # target weights --max-size lowered to the recipe's low_bits (sizes.fit_size)

    @property
    def hidden(self) -> int:
        return self.target.config.hidden_size

    @property
    def vocab(self) -> int:
        return self.target.config.vocab_size

    def kv_layer(self, layer: int) -> KVLayer:
        return next(d for d in self.kv_layers if d.layer == layer)


@dataclass(frozen=True)
class ExportMemory:
    """A backend's share of the export's peak memory (export/preflight.py), in bytes and in W: the target's and
    the drafter's weights at 4 bytes per parameter. Measured, per backend, as docs/export-memory.md describes."""

    base: int  # bytes: the process with this backend's export modules imported, before any weight is loaded
    graphs: float  # growth in W of its graphs phase, beyond the loaded model
    quantize: Callable[[set[Recipe]], float]  # growth in W of its quantize phase for the set of recipes used
    kept: float = 0.0  # W that stays resident after its graphs phase (what the allocator keeps, or a copy)
    # anonymous memory of an export of this backend alone, per phase: (fixed MiB, growth in W), fitted for the
    # recipes `measured` accepts; None: not measured, anonymous = resident
    anonymous: dict[str, tuple[float, float]] | None = None
    measured: Callable[[Recipe], bool] = lambda recipe: False


def backend_module(kind: str) -> ModuleType:
    """export/backends/<kind>/ (a kind from the role table)."""
    return importlib.import_module(f"{__name__}.{kind}")
