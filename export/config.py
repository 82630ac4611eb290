"""ExportConfig: validated once, loudly, then frozen. Each field maps 1:1 to an `mtpkit export` flag."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from mtpkit.errors import UsageError, check_number
from mtpkit.extras import require

from mtpkit.runtime.roles import BACKENDS

# "none" is accepted as fp32 (the earlier name). int8-dynamic: per-channel int8 weights, activations quantized at
# run time (ONNX Runtime's quantize_dynamic; on LiteRT the same graphs as int8, which is dynamic-range already)
QUANT_RECIPES = ("fp32", "fp16", "int8", "int4", "int8-dynamic")
PLE_RECIPES = ("int8", "int4")  # the PLE table under int8 / int4 (a 4-bit PLE broke other toolchains)
BLOCK_SIZES = (32, 64, 128)
DTYPES = ("auto", "fp32", "bf16", "fp16")  # what the exporter holds the target's weights in (models/gemma4_text.py)


@dataclass(frozen=True)
class ExportConfig:
    target: str  # local HF checkpoint folder or hub id (gemma4 or gemma4_text)
    drafter: str  # local folder or hub id of the matching gemma4_assistant checkpoint
    out: Path  # export folder; written atomically
    backend: tuple[str, ...] = ("onnx",)  # graph formats to write
    force: bool = False  # replace an existing out folder
    max_cache_len: int = 4096  # KV capacity the runtime preallocates (prompt + generated tokens)
    quant: str = "fp32"  # target weights: fp32 | fp16 | int8 | int4 (weight-only, blockwise) | int8-dynamic
    drafter_quant: str | None = None  # drafter weights; None: the target's recipe
    ple_quant: str = "int8"  # the per-layer-embedding table under the int recipes: int8, or int4 only when asked
    block_size: int = 32  # int8 / int4 block along the input dimension
    fuse: bool = True  # ONNX: fused ORT kernels (RMSNorm, rotary, attention; ORT >= 1.20), or plain ONNX ops
    accuracy_level: int = 4  # ONNX MatMulNBits: 4 = int8 activations (fastest on CPU), 0 = unset
    quality_gate: bool = True  # fail a quantized export whose fidelity figures miss the recipe's gate
    target_revision: str | None = None  # hub revision, for hub ids
    drafter_revision: str | None = None
    reference_tokens: int = 32  # new tokens per reference prompt recorded from transformers
    check: bool = True  # verify every graph against PyTorch before declaring success
    prefill_len: int = 128  # LiteRT: static prefill chunk length (prompts are padded / chunked to it)
    num_draft: int | None = None  # LiteRT: drafts per static verify call; default: the drafter's num_assistant_tokens
    memory_budget: float | None = None  # GiB the export may use at its peak (preflight.py); None: MemAvailable
    dtype: str = "auto"  # the target's weights while exporting: the checkpoint's own dtype, or fp32 | bf16 | fp16

    def __post_init__(self):
        object.__setattr__(self, "out", Path(self.out))
        backends = tuple(b.strip() for b in self.backend) if not isinstance(self.backend, str) else tuple(
            b.strip() for b in self.backend.split(","))
        object.__setattr__(self, "backend", backends)
        for b in backends:
            if b not in BACKENDS:
                raise UsageError(f"unknown backend {b!r}{_did_you_mean(b, BACKENDS)}; choose from {', '.join(BACKENDS)}")
        self._check_quant(backends)
        for b in backends:
            if BACKENDS[b].export_modules:  # before any weights load, not minutes into the export
                require(BACKENDS[b].extra or "export", f"--backend {b}", BACKENDS[b].export_modules)
        if any(BACKENDS[b].export_needs_onnx for b in backends):
            backends = ("onnx", *backends)  # the ONNX graphs are the reference the export is checked against
        # role-table order (onnx first), each once
        object.__setattr__(self, "backend", tuple(b for b in BACKENDS if b in backends))
        if self.prefill_len < 1 or (self.num_draft is not None and self.num_draft < 1):
            raise UsageError("--prefill-len and --num-draft must be >= 1")
        if self.max_cache_len < 16:
            raise UsageError(f"--max-cache-len must be at least 16, got {self.max_cache_len}")
        if self.memory_budget is not None:
            object.__setattr__(self, "memory_budget", check_number("--memory-budget", self.memory_budget, 0,
                                                                   low_open=True, hint="; give it in GiB, e.g. 20"))
        if self.dtype not in DTYPES:
            raise UsageError(f"unknown --dtype {self.dtype!r}{_did_you_mean(self.dtype, DTYPES)}; "
                             f"choose from {', '.join(DTYPES)}")
        if self.reference_tokens < 1:
            raise UsageError(f"--reference-tokens must be at least 1, got {self.reference_tokens}")
        if self.out.exists() and not self.force:
            raise UsageError(f"output folder {self.out} already exists; pass --force to replace it or choose another --out")
        if self.out.exists() and not self.out.is_dir():
            raise UsageError(f"output path {self.out} exists and is not a folder; choose another --out")


    def _check_quant(self, backends) -> None:
        object.__setattr__(self, "quant", "fp32" if self.quant == "none" else self.quant)
        object.__setattr__(self, "drafter_quant", self.drafter_quant or self.quant)
        for flag, recipe in (("--quant", self.quant), ("--drafter-quant", self.drafter_quant)):
            if recipe not in QUANT_RECIPES:
                raise UsageError(f"unknown {flag} recipe {recipe!r}{_did_you_mean(recipe, QUANT_RECIPES)}; "
                                 f"choose from {', '.join(QUANT_RECIPES)}")
        if self.ple_quant not in PLE_RECIPES:
            raise UsageError(f"unknown --ple-quant recipe {self.ple_quant!r}{_did_you_mean(self.ple_quant, PLE_RECIPES)}"
                             f"; choose from {', '.join(PLE_RECIPES)}")
        if self.block_size not in BLOCK_SIZES:
            raise UsageError(f"--block-size must be one of {', '.join(map(str, BLOCK_SIZES))}, got {self.block_size}")
        if self.accuracy_level not in range(5):
            raise UsageError(f"--accuracy-level must be 0-4, got {self.accuracy_level}")


def _did_you_mean(value: str, choices) -> str:
    close = difflib.get_close_matches(value, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
