"""ExportConfig: validated once, loudly, then frozen. Each field maps 1:1 to an `mtpkit export` flag."""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from mtpkit.errors import UsageError, check_number
from mtpkit.extras import require

from mtpkit.runtime.roles import BACKENDS

log = logging.getLogger("mtpkit")

# "none" is accepted as an alias of fp32. int8-dynamic: per-channel int8 weights, activations quantized at
# run time (ONNX Runtime's quantize_dynamic; on LiteRT the same graphs as int8, which is dynamic-range already)
# int4: searched scales with calibration, sensitive tensors at 8 bits; int4-rtn: round-to-nearest (export/int4.py)
QUANT_RECIPES = ("fp32", "fp16", "int8", "int4", "int4-rtn", "int8-dynamic")
PLE_BITS = {"int8": 8, "int4": 4}  # the PLE table under int8 / int4 (a 4-bit PLE broke other toolchains)
PLE_RECIPES = tuple(PLE_BITS)
BLOCK_SIZES = (32, 64, 128)
DTYPES = ("auto", "fp32", "bf16", "fp16")  # what the exporter holds the target's weights in (models/gemma4_text.py)
MIN_CACHE_LEN = 16
DEFAULT_MAX_CACHE_LEN = 4096  # adapts down to the target's max_position_embeddings when that is smaller
DEFAULT_PREFILL_LEN = 128  # adapts down to the KV capacity when that is smaller
# LiteRT verifies max_draft + 1 tokens in one static call. XNNPACK multiplies int8 / int4 rows in tiles of 4 on
# ARM64 and AVX2 (gemm-config.c `mr`) and streams the weights once per tile, so a 5th token costs a second pass
# (docs/scale-bench.md, "Verify length and XNNPACK's row tile").
DEFAULT_MAX_DRAFT = 3


@dataclass(frozen=True)
class ExportConfig:
    target: str  # local HF checkpoint folder or hub id (gemma4 or gemma4_text)
    drafter: str  # local folder or hub id of the matching gemma4_assistant checkpoint
    out: Path  # export folder; written atomically
    backend: tuple[str, ...] = ("onnx",)  # graph formats to write
    force: bool = False  # replace an existing out folder
    max_cache_len: int | None = None  # KV capacity (prompt + generated tokens); None: 4096 or the model's limit
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
    prefill_len: int | None = None  # LiteRT: static prefill chunk (prompts padded / chunked); None: 128 or capacity
    max_draft: int | None = None  # LiteRT: drafts per static verify call; default: DEFAULT_MAX_DRAFT or the drafter's k
    memory_budget: float | None = None  # GiB the export may use at its peak (preflight.py); None: MemAvailable
    dtype: str = "auto"  # target weights while exporting: fp32 | bf16 | fp16; auto: fp32 if it fits, else as stored
    calibration: Path | None = None  # int4's calibration prompts (.jsonl); None: the built-in set (calibration.py)

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
        if any(v is not None and v < 1 for v in (self.prefill_len, self.max_draft)):
            raise UsageError("--prefill-len and --max-draft must be >= 1")
        if self.max_cache_len is not None and self.max_cache_len < MIN_CACHE_LEN:
            raise UsageError(f"--max-cache-len must be at least {MIN_CACHE_LEN}, got {self.max_cache_len}")
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


    @property
    def static_verify(self) -> bool:
        """Whether a backend exported verifies a fixed token count, --max-draft + 1 (LiteRT)."""
        return any(BACKENDS[b].static_verify for b in self.backend)

    @property
    def ple_bits(self) -> int:
        """Bits per value of the per-layer-embedding table under the int recipes."""
        return PLE_BITS[self.ple_quant]

    def fitted(self, max_positions: int, drafter_k: int) -> ExportConfig:
        """The config with every shape default resolved against the model: a default that does not fit adapts
        (and is logged); a value the user gave that does not fit is refused in one line.

        max_positions: the target's max_position_embeddings; drafter_k: the drafter's num_assistant_tokens.
        --max-draft defaults to the drafter's num_assistant_tokens, at most DEFAULT_MAX_DRAFT (logged for LiteRT).
        """
        cache = _fit("--max-cache-len", self.max_cache_len, DEFAULT_MAX_CACHE_LEN, max_positions,
                     f"the target's max_position_embeddings ({max_positions})")
        if cache < MIN_CACHE_LEN:
            raise UsageError(f"the target holds only {max_positions} positions (max_position_embeddings); mtpkit "
                             f"needs a KV capacity of at least {MIN_CACHE_LEN}")
        prefill = _fit("--prefill-len", self.prefill_len, DEFAULT_PREFILL_LEN, cache, f"the KV capacity ({cache})")
        if self.max_draft is None and drafter_k > DEFAULT_MAX_DRAFT and self.static_verify:
            log.info("  --max-draft %d (LiteRT verify calls of %d tokens, XNNPACK's row tile on ARM64 and AVX2; the "
                     "drafter's num_assistant_tokens is %d)", DEFAULT_MAX_DRAFT, DEFAULT_MAX_DRAFT + 1, drafter_k)
        max_draft = _fit("--max-draft", self.max_draft, min(drafter_k, DEFAULT_MAX_DRAFT), cache - 1,
                         f"the KV capacity ({cache}) less the verified token")
        return replace(self, max_cache_len=cache, prefill_len=prefill, max_draft=max_draft)

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
        if self.calibration is not None:
            object.__setattr__(self, "calibration", Path(self.calibration))
            if self.quant != "int4":  # only the target is calibrated: the drafter's int4 uses no activations
                raise UsageError("--calibration is read by --quant int4 only (it calibrates the target; the other "
                                 "recipes use no activations); drop it or pass --quant int4")
            if not self.calibration.is_file():
                raise UsageError(f"--calibration {self.calibration}: no such file; give a .jsonl of "
                                 '{"text": ...} or {"ids": [...]} lines')


def _fit(flag: str, given: int | None, default: int, limit: int, what: str) -> int:
    """given when it fits (refused otherwise); else the default, capped at limit (logged when it is)."""
    if given is not None:
        if given > limit:
            raise UsageError(f"{flag} {given} exceeds {what}; choose at most {limit}")
        return given
    if default > limit:
        log.info("  %s %d (the default %d exceeds %s)", flag, limit, default, what)
    return min(default, limit)


def _did_you_mean(value: str, choices) -> str:
    close = difflib.get_close_matches(value, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
