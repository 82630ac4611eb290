"""Export backends, one module per graph format (see runtime/roles.py BACKENDS), mirrored by runtime/backends/.

Each module `export/backends/<kind>.py` provides
- `export(job: ExportJob) -> manifest.Backend`: it writes its graph files into job.folder and returns its manifest
  entry (graph files with sha256, signatures whose tensors carry roles from the role table, backend options);
- `check(manifest, job, ids) -> list[verify.GraphCheck]`: its float graphs against PyTorch (export/verify.py);
- `quantize(folder, backend, recipes, block_size, accuracy_level, ple_bits) -> manifest.Backend`.
The pipeline only orchestrates.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpkit.runtime.manifest import KVLayer


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

    @property
    def hidden(self) -> int:
        return self.target.config.hidden_size

    @property
    def vocab(self) -> int:
        return self.target.config.vocab_size

    def kv_layer(self, layer: int) -> KVLayer:
        return next(d for d in self.kv_layers if d.layer == layer)
