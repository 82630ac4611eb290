"""ExportConfig: validated once, loudly, then frozen. Each field maps 1:1 to an `mtpkit export` flag."""

from __future__ import annotations

import difflib
import logging
from dataclasses import MISSING, dataclass, field, replace
from pathlib import Path
from typing import Any

from mtpkit.errors import UsageError, check_number
from mtpkit.extras import require

from mtpkit.runtime.roles import BACKENDS

from . import recipes
from .recipes import PLE_RECIPES, Recipe

log = logging.getLogger("mtpkit")
AUTO = "auto"  # --quant's default: checkpoint for a pre-quantized target, else fp32 (resolved in _check_quant)

BLOCK_SIZES = (32, 64, 128)
DTYPES = ("auto", "fp32", "bf16", "fp16")  # what the exporter holds the target's weights in (models/gemma4_text.py)
MIN_CACHE_LEN = 16
DEFAULT_MAX_CACHE_LEN = 4096  # adapts down to the target's max_position_embeddings when that is smaller
DEFAULT_PREFILL_LEN = 128  # adapts down to the KV capacity when that is smaller
# LiteRT verifies max_draft + 1 tokens in one static call. XNNPACK multiplies int8 / int4 rows in tiles of 4 on
# ARM64 and AVX2 (gemm-config.c `mr`) and streams the weights once per tile, so a 5th token costs a second pass
# (docs/scale-bench.md, "Verify length and XNNPACK's row tile").
DEFAULT_MAX_DRAFT = 3


def flag(default=MISSING, help: str = "", **argparse: Any):
    """An ExportConfig field and its `mtpkit export` flag in one place: the help text, argparse's type / choices /
    metavar, and the default (written into the help by export/commands.py, so the two cannot disagree)."""
    return field(default=default, metadata={"help": help, **argparse})


@dataclass(frozen=True)
class ExportConfig:
    target: str = flag(help="target checkpoint: local folder or hub id (gemma4 or gemma4_text)", positional=True)
    drafter: str = flag(help="drafter (-assistant) checkpoint: local folder or hub id (required)")
    out: Path = flag(help="export folder to create, written atomically (required)", type=Path)
    backend: tuple[str, ...] = flag(("onnx",), f"comma-separated: {', '.join(BACKENDS)} (each backend's graphs are "
                                               "checked against PyTorch)")
    force: bool = flag(False, "replace DIR if it exists")
    dry_run: bool = flag(False, "export nothing: print the bytes of every file the export would write (per backend, "
                                "with each weight's encoding under --quant) and the memory a runtime needs to decode "
                                "at --max-cache-len (weights read per call, memory-mapped tables, KV cache), from "
                                "the checkpoints' configs and safetensors headers alone, in seconds")
    max_cache_len: int | None = flag(None, "KV capacity in tokens: prompt + generated (default "
                                           f"{DEFAULT_MAX_CACHE_LEN}, or the target's max_position_embeddings when "
                                           "that is smaller)", type=int)
    quant: str = flag(AUTO, "target weights: fp32, fp16, int8 or int4 (weight-only, blockwise; int4 picks its "
                            "scales on calibration text and keeps the sensitive tensors at 8 bits, int4-rtn is "
                            "plain round-to-nearest), int8-dynamic (per-channel int8 weights, int8 activations "
                            "at run time), mobile (size-first: every weight and table 4-bit, one scale per "
                            "channel: the smallest bundle), or checkpoint (a quantization-aware-trained "
                            "checkpoint's own codes and scales, exactly); quantized graphs are measured against "
                            "the float model and gated (see quant_fidelity.json). auto: checkpoint for a "
                            "pre-quantized checkpoint, else fp32", choices=lambda: (AUTO, *recipes.names()))
    drafter_quant: str | None = flag(None, "drafter weights (default: --quant, but int4 under int8 and "
                                       "int8-dynamic: the target verifies what it proposes)", choices=recipes.names)
    ple_quant: str | None = flag(None, "per-layer-embedding table under the int recipes: int8, or int4 (half the "
                                       "bytes of the largest table; quant_fidelity.json shows what it costs) "
                                       "(default: int4 under --quant mobile, else int8)", choices=PLE_RECIPES)
    max_size: float | None = flag(None, "the most bytes (GB, 1e9) a device downloads: LiteRT's model.litertlm, or "
                                        "the ONNX files when no LiteRT bundle is written. --quant mobile lowers the "
                                        "target's KV-shared layers' MLPs to 2 bits, the first of them first, until the "
                                        "size plan fits; a plan that cannot fit is refused before any weight loads",
                                  type=float, metavar="GB")
    block_size: int = flag(32, "int8/int4 block along the input dimension", type=int, choices=BLOCK_SIZES)
    fuse: bool = flag(True, "ONNX graphs of standard ops only, for runtimes older than ONNX Runtime 1.20 (slower per "
                            "decode call: docs/performance.md, section 0)")
    accuracy_level: int = flag(4, "ONNX MatMulNBits accuracy level: 4 = int8 activations, fastest on CPU; 0 = unset",
                               type=int, choices=range(5), metavar="0-4")
    quality_gate: bool = flag(True, "warn instead of failing when a quantized graph misses its recipe's fidelity gate")
    target_revision: str | None = flag(None, "hub revision of the target")
    drafter_revision: str | None = flag(None, "hub revision of the drafter")
    reference_tokens: int = flag(32, "new tokens per reference prompt recorded from transformers", type=int)
    check: bool = flag(True, "skip the graph-vs-PyTorch check")
    prefill_len: int | None = flag(None, "LiteRT static prefill chunk length (default "
                                         f"{DEFAULT_PREFILL_LEN}, or the KV capacity when that is smaller)", type=int)
    max_draft: int | None = flag(None, "LiteRT drafts per verify call, verify length = this + 1 (default: the "
                                       f"drafter's num_assistant_tokens, at most {DEFAULT_MAX_DRAFT}: XNNPACK "
                                       "multiplies 4 rows per pass on ARM64 and AVX2, so a 5th token costs a second "
                                       "pass over the weights; on AVX-512, 8 rows per pass, 8 tokens still cost 1.65x "
                                       "4 at e2b-wide widths)",
                                 type=int)
    memory_budget: float | None = flag(None, "memory (GiB) the export may use at its peak; an export estimated to "
                                             "need more anonymous memory (mapped checkpoint and graph pages can be "
                                             "paged out, so they do not count) is refused before loading weights "
                                             "(default: MemAvailable)", type=float, metavar="GB")
    dtype: str = flag("auto", "what the exporter holds the target's weights in while it works: auto (fp32 when the "
                              "memory preflight says it fits, since PyTorch's phases run fastest on it, else the "
                              "checkpoint's own dtype, bf16 for the hub's Gemma 4), fp32, bf16 or fp16. The graphs "
                              "are the same either way (weights are upcast exactly as they are written); bf16 halves "
                              "the memory an fp32 copy would take", choices=DTYPES)
    calibration: Path | None = flag(None, 'int4 calibration prompts, one {"text": ...} or {"ids": [...]} per line '
                                          "(default: a built-in set; it must not contain the export's reference "
                                          "prompts, which fidelity is measured on)", type=Path,
                                    metavar="FILE.jsonl")

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
        if self.max_size is not None:
            object.__setattr__(self, "max_size", check_number("--max-size", self.max_size, 0, low_open=True,
                                                              hint="; give it in GB, e.g. 3.66"))
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
        return recipes.ple_bits(self.ple_quant)

    @property
    def recipes(self) -> dict[str, Recipe]:
        """The Recipe of each side: "target" (--quant) and "drafter" (--drafter-quant)."""
        return {"target": recipes.recipe(self.quant), "drafter": recipes.recipe(self.drafter_quant or self.quant)}

    @property
    def quantized(self) -> bool:
        """Some graphs are rewritten by a recipe (not every side fp32)."""
        return any(r.quantized for r in self.recipes.values())

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
        if self.quant == AUTO:
            object.__setattr__(self, "quant", self._auto_quant())
        object.__setattr__(self, "quant", recipes.ALIASES.get(self.quant, self.quant))
        object.__setattr__(self, "drafter_quant", recipes.ALIASES.get(self.drafter_quant, self.drafter_quant))
        for flag, recipe in (("--quant", self.quant), ("--drafter-quant", self.drafter_quant)):
            if recipe is not None and recipe not in recipes.RECIPES:
                raise UsageError(f"unknown {flag} recipe {recipe!r}{_did_you_mean(recipe, recipes.names())}; "
                                 f"choose from {', '.join(recipes.names())}")
        if self.drafter_quant is None and recipes.recipe(self.quant).lattice and self._drafter_prequantized():
            object.__setattr__(self, "drafter_quant", self.quant)  # a QAT drafter beside a QAT target keeps its own
        if self.drafter_quant is None:
            object.__setattr__(self, "drafter_quant", recipes.drafter_default(recipes.recipe(self.quant)))
        if self.ple_quant is None:
            object.__setattr__(self, "ple_quant", recipes.ple_default(recipes.recipe(self.quant)))
        if self.ple_quant not in PLE_RECIPES:
            raise UsageError(f"unknown --ple-quant recipe {self.ple_quant!r}{_did_you_mean(self.ple_quant, PLE_RECIPES)}"
                             f"; choose from {', '.join(PLE_RECIPES)}")
        if self.block_size not in BLOCK_SIZES:
            raise UsageError(f"--block-size must be one of {', '.join(map(str, BLOCK_SIZES))}, got {self.block_size}")
        if self.accuracy_level not in range(5):
            raise UsageError(f"--accuracy-level must be 0-4, got {self.accuracy_level}")
        if self.calibration is not None:
            object.__setattr__(self, "calibration", Path(self.calibration))
            calibrated = [r.name for r in recipes.RECIPES.values() if r.calibrated]
            if not self.recipes["target"].calibrated:  # only the target is calibrated, never the drafter
                raise UsageError(f"--calibration is read by --quant {' / '.join(calibrated)} only (it calibrates the "
                                 f"target; the other recipes use no activations); drop it or pass --quant "
                                 f"{calibrated[0]}")
            if not self.calibration.is_file():
                raise UsageError(f"--calibration {self.calibration}: no such file; give a .jsonl of "
                                 '{"text": ...} or {"ids": [...]} lines')


    def _drafter_prequantized(self) -> bool:
        from .lattice import detect_folder

        return bool(self.drafter) and detect_folder(self.drafter, weights=True) is not None

    def _auto_quant(self) -> str:
        """--quant's default: a pre-quantized target (its config says so) keeps its lattice (checkpoint); anything
        else is exported float (fp32). A Q4_0 lattice lies in the weights alone: --quant checkpoint asks for it."""
        from .lattice import detect_folder

        found = detect_folder(self.target) if self.target else None
        if found is None:
            return "fp32"
        log.info("  --quant checkpoint: the target is a pre-quantized (%s) checkpoint; its codes and scales are "
                 "written as they are", found)
        return "checkpoint"


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
