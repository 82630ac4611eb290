"""Memory preflight: the export's peak resident memory, estimated from the checkpoints' headers before any weight
is loaded, and a one-line refusal when it exceeds the memory available (MemAvailable, or --memory-budget).

The model (bytes; W = the fp32 weights the exporter holds, target text weights + drafter, 4 bytes per parameter):

    peak(phase) = BASE[backends] + W * (1 + GROWTH[phase])   (+ the stored copy of non-fp32 weights while loading)
                                                               (+ the quantized weights while quantizing)
    peak = max over the phases this export runs

BASE and GROWTH were measured with export/phases.py (the larger of VmHWM and a 20 ms VmRSS sampler, per phase) on
the tiny fixtures: `mtpkit make-tiny --shape e2b` (weights ~3.5 MB: BASE) and `--shape e2b-wide` (0.15 B
parameters, W = 0.57 GiB: GROWTH = (measured peak - BASE) / W - 1), on a 2-core Linux machine (torch 2.13,
onnxruntime, litert-torch 0.10). Figures and commands: docs/export-memory.md. Extrapolation to E2B (4.7 B text and
drafter parameters, W = 17.5 GiB) is UNMEASURED: each phase's copies are assumed to scale with W, its fixed costs
not to grow, and ONNX graphs over 2 GB (external data) to cost what small ones do.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path

from mtpkit.errors import CheckpointError, MemoryBudgetError

from .checkpoint import Source, tensor_headers
from .models import target_adapter
from .phases import MB, human_bytes

log = logging.getLogger("mtpkit")

GB = 1 << 30  # --memory-budget is in GiB, like every size mtpkit prints
# The process without weights: the interpreter, torch, transformers, onnx, onnxruntime (the tiny e2b export's
# largest phase: 581 MB); litert adds litert-torch, TensorFlow Lite and ai-edge-quantizer (953 MB).
BASE = {"onnx": 600 * MB, "litert": 1000 * MB}
# Extra copies of W at each phase's peak beyond the model itself; e2b-wide's measured peak in MiB (W = 580.5):
GROWTH = {
    "load": 0.0,  # the model takes the read tensors over (assign=True); + the stored copy of non-fp32 files
    #               (bf16: 1263 = base + W + the bf16 copy; fp32 files stay mmapped and are read lazily: 398)
    "onnx graphs": 2.9,  # torch.export's constants, the ONNX IR and its serialization, share_embedding (2839)
    "litert graphs": 4.3,  # export_hf loads the checkpoint again and converts it to flatbuffers (4078, 4084)
    "reference": 0.1,  # transformers generate() on the loaded model (1137)
    "check": 1.25,  # ONNX Runtime sessions of the fp32 graphs beside the PyTorch model (1881)
    "acceptance": 1.25,  # the runtime on the final graphs; runs with --no-check too (1871)
    # the float graphs loaded again and quantized beside them, then measured (int4: onnx 2321; onnx + litert 3994)
    "onnx quantize": 1.8,
    "litert quantize": 3.0,
}
# What stays resident after the LiteRT phase, in W: the phases after it measured ~1 W above the ONNX-only export's
# (reference 2189 vs 1137, check 2844 vs 1881, beyond the larger BASE); freed memory the allocator keeps, or a copy.
LITERT_KEPT = 1.0
ELEMENT_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
                 "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass(frozen=True)
class Weights:
    """What the exporter will load, from the safetensors headers: element counts and the bytes read."""

    target: int  # elements of the target's text weights (vision / audio towers are never loaded)
    drafter: int
    ple: int  # of the target's: the per-layer-embedding table (kept at --ple-quant under int8 / int4)
    converted: int  # stored bytes of tensors not already fp32: alive beside their fp32 copies while loading

    @property
    def fp32(self) -> int:
        return 4 * (self.target + self.drafter)


def read_weights(target: Source, drafter: Source) -> Weights:
    """Count from the headers only: the same prefixes the model adapters load (export/models/)."""
    prefix = target_adapter(target).weight_prefix(target)
    t = {k: _size(k, v, target.folder) for k, v in tensor_headers(target.folder).items() if k.startswith(prefix)}
    d = {k: _size(k, v, drafter.folder) for k, v in tensor_headers(drafter.folder).items()}
    elements = lambda sizes, suffix="": sum(n for k, (n, _) in sizes.items() if k.endswith(suffix))  # noqa: E731
    return Weights(target=elements(t), drafter=elements(d), ple=elements(t, "embed_tokens_per_layer.weight"),
                   converted=sum(n * b for n, b in (*t.values(), *d.values()) if b != 4))


def _size(name: str, entry, folder: Path) -> tuple[int, int]:
    """(elements, bytes per element) of one header entry."""
    try:
        shape, dtype = entry["shape"], entry["dtype"]
        if not all(isinstance(n, int) and n >= 0 for n in shape):
            raise TypeError
        return math.prod(shape), ELEMENT_BYTES[dtype]
    except (KeyError, TypeError):
        raise CheckpointError(f"{folder} has a safetensors header entry {name!r} without a readable shape and dtype "
                              "(or a dtype mtpkit cannot load); re-download the checkpoint") from None


def phases(cfg, w: Weights) -> dict[str, int]:
    """Estimated peak bytes of each phase this export (cfg: ExportConfig) runs, in order."""
    base = BASE["onnx"]  # litert-torch and TensorFlow Lite are imported by the LiteRT phase, and stay
    out = {"load": int(base + w.fp32 + w.converted)}
    for kind in cfg.backend:
        out[f"{kind} graphs"] = int(max(base, BASE[kind]) + w.fp32 * (1 + GROWTH[f"{kind} graphs"]))
        if kind == "litert":
            base = BASE["litert"] + LITERT_KEPT * w.fp32
    later = [("reference", 0), ("check", 0) if cfg.check else None,
             ("quantize", quantized_bytes(cfg, w)) if {cfg.quant, cfg.drafter_quant} != {"fp32"} else None,
             ("acceptance", 0)]
    growth = {**GROWTH, "quantize": max(GROWTH[f"{kind} quantize"] for kind in cfg.backend)}
    out.update({name: int(base + w.fp32 * (1 + growth[name]) + extra) for name, extra in filter(None, later)})
    return out


def quantized_bytes(cfg, w: Weights) -> int:
    """Bytes of the weights under the recipe: blockwise int8 / int4 carry one fp32 scale per block."""
    per = lambda recipe: {"fp32": 4, "fp16": 2, "int8": 1, "int4": 0.5}[recipe] + (  # noqa: E731
        4 / cfg.block_size if recipe.startswith("int") else 0)
    ple = cfg.ple_quant if cfg.quant.startswith("int") else cfg.quant
    return int((w.target - w.ple) * per(cfg.quant) + w.ple * per(ple) + w.drafter * per(cfg.drafter_quant))


@dataclass(frozen=True)
class Estimate:
    """The preflight's verdict, recorded in manifest.json's export.preflight."""

    phases: dict[str, int]  # phase -> estimated peak bytes
    budget: int | None  # bytes, None when unknown (no /proc/meminfo and no --memory-budget)
    budget_source: str  # --memory-budget | MemAvailable | unknown

    @property
    def peak_bytes(self) -> int:
        return max(self.phases.values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get)

    def as_dict(self) -> dict:
        return {"estimated_peak_mb": round(self.peak_bytes / MB, 1), "estimated_peak_phase": self.peak_phase,
                "estimated_phases_mb": {k: round(v / MB, 1) for k, v in self.phases.items()},
                "budget_mb": None if self.budget is None else round(self.budget / MB, 1),
                "budget_source": self.budget_source}


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo: what can be allocated without swapping; None off Linux."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check(cfg, target: Source, drafter: Source) -> Estimate:
    """Estimate the export's peak and refuse it, in one line, when it exceeds the budget; logs the estimate."""
    w = read_weights(target, drafter)
    budget = None if cfg.memory_budget is None else int(cfg.memory_budget * GB)
    source = "--memory-budget" if budget is not None else "MemAvailable"
    budget = budget if budget is not None else available_bytes()
    estimate = Estimate(phases(cfg, w), budget, source if budget is not None else "unknown")
    where = f"{human_bytes(budget)} available ({estimate.budget_source})" if budget is not None else "budget unknown"
    log.info("memory preflight: estimated peak %s (%s), %s", human_bytes(estimate.peak_bytes), estimate.peak_phase,
             where)
    if budget is not None and estimate.peak_bytes > budget:
        raise MemoryBudgetError(_refusal(cfg, w, estimate))
    return estimate


def _refusal(cfg, w: Weights, estimate: Estimate) -> str:
    fits = []  # the smallest changes that fit: none that only adds a flag to one already listed
    for flags, peak in alternatives(cfg, w):
        if peak <= estimate.budget and not any(set(f) <= set(flags) for f, _ in fits):
            fits.append((flags, peak))
    listed = ", ".join(f"{' '.join(flags)} ({human_bytes(peak)})" for flags, peak in fits[:3])
    hint = (f"options that fit: {listed}" if fits else
            "no --backend / --quant choice fits; free memory or use a larger machine")
    return (f"this export needs an estimated {human_bytes(estimate.peak_bytes)} at its peak ({estimate.peak_phase}), "
            f"more than the {human_bytes(estimate.budget)} available ({estimate.budget_source}); {hint} (the estimate "
            "is extrapolated from small models; --memory-budget GB overrides the budget)")


def alternatives(cfg, w: Weights) -> list[tuple[tuple[str, ...], int]]:
    """(flags, estimated peak) of the exports one or two flags away from cfg (--backend onnx, another --quant),
    fewest changes first, then smallest. --no-check is no option: the acceptance phase loads the graphs anyway."""
    options = []
    for backend in ([None, ("onnx",)] if cfg.backend != ("onnx",) else [None]):
        for recipe in [None, *(r for r in ("fp32", "fp16", "int8", "int4") if r != cfg.quant)]:
            changes = {k: v for k, v in (("backend", backend), ("quant", recipe)) if v}
            if changes:
                flags = tuple(f"--backend {','.join(v)}" if k == "backend" else f"--quant {v}"
                              for k, v in changes.items())
                options.append((flags, max(phases(replace(cfg, **changes), w).values())))
    return sorted(options, key=lambda o: (len(o[0]), o[1]))
