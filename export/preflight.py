"""Memory preflight: the export's peak resident and anonymous memory, estimated from the checkpoints' headers before
any weight is loaded, and a one-line refusal when the anonymous peak (what cannot be paged out) exceeds the memory
available (MemAvailable, or --memory-budget); a resident peak above it only logs that mapped pages will be handed
back.

The model (bytes; W = the target's text weights + the drafter's at 4 bytes per parameter, H = the same weights as
the exporter holds them: the target in --dtype, the drafter in fp32):

    peak(phase) = base + H + W * growth(phase)   (+ the stored copy of converted weights while loading)
                                                  (+ the quantized weights while quantizing)
    peak = max over the phases this export runs

base and the growth of a backend's own phases (its graphs, its quantization) are that backend's MEMORY
(export/backends/<kind>/ ExportMemory); the other phases' growth is GROWTH below. In the phases that open ONNX
Runtime sessions W leaves out the per-layer-embedding table (mapped, not copied); a quantized export's acceptance
phase grows by its final weights x GROWTH or QUANTIZED_RESIDUE x W, the larger.

`--dtype auto` holds the target in fp32 when that fits the budget (PyTorch's phases run fastest), else in the
checkpoint's own dtype (bf16 on the hub: half the bytes, the same graphs).

Bases and growths are measured with export/phases.py (the larger of VmHWM and a 20 ms VmRSS sampler, per phase) on
the tiny fixtures: `mtpkit make-tiny --shape e2b` (base) and `--shape e2b-wide` (W = 0.57 GiB: growth = (measured
peak - base) / W - 1). At full size (E2B: W = 17.5 GiB) each phase's copies are assumed to scale with W and its
fixed costs not to grow; a backend's anonymous figures (ExportMemory.anonymous) are fitted through full-size
exports too. Figures and commands: docs/export-memory.md.
"""

from __future__ import annotations

import importlib
import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path

from mtpkit.errors import CheckpointError, MemoryBudgetError

from . import backends
from .backends import ExportMemory
from .checkpoint import Source, tensor_headers
from .models import target_adapter
from .phases import MB, human_bytes
from .recipes import RECIPES, Recipe, recipe

log = logging.getLogger("mtpkit")

GB = 1 << 30  # --memory-budget is in GiB, like every size mtpkit prints
# Extra copies of W at each phase's peak beyond the model itself; e2b-wide's measured peak in MiB (W = 580.5;
# docs/export-memory.md, "The estimate"). Each backend's own phases (graphs, quantize) and its base are its MEMORY
# (export/backends/<kind>/).
GROWTH = {
    "load": 0.0,  # the model takes the read tensors over (assign=True); + the stored copy of converted files
    #               (bf16 file held fp32: 1263 = base + W + the bf16 copy; held as stored: mmapped, read lazily: 397)
    "reference": 0.2,  # transformers generate(); bf16 held: each weight upcast as used (fp32 1119, bf16 993)
    # ONNX Runtime sessions of the fp32 graphs beside the PyTorch model, their weights mapped, not prepacked
    # (without prepacking: 1750; 1881 prepacked)
    "check": 1.0,
    # the runtime on the final graphs; runs with --no-check too (fp32: 1871). For quantized graphs: their
    # weights x this, or QUANTIZED_RESIDUE x W if larger (int4: 1352)
    "acceptance": 1.25,
}
# What the quantize phase leaves resident (the allocator keeps freed pages) under the acceptance phase's quantized
# graphs, in W (e2b-wide int4 acceptance: 1352 MiB = base + model + 0.3 W, docs/export-memory.md)
QUANTIZED_RESIDUE = 0.3
# The export's resident set is held under this share of the budget by handing back mapped checkpoint and graph pages
# (clean, re-read when needed) as it passes it: what it leaves is the page cache's and the rest of the machine's.
# Uncapped, E4B's float graph check holds the 16 GB float decoder beside the checkpoint's last pages (22.3 GiB,
# docs/scale-bench.md).
RESIDENT_SHARE = 0.85
INTEGER_DTYPES = ("U8", "I8", "I32")  # what the pre-quantized formats pack their codes in (export/lattice)
ELEMENT_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
                 "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


# Anonymous memory (RssAnon: what the kernel cannot drop and re-read, so what gets a process OOM-killed) is
# estimated where a backend measured it (ExportMemory.anonymous); elsewhere, and for an fp32 export's acceptance
# (prepacked sessions), anonymous = resident.

# Phases that open ONNX Runtime sessions, which map a Gather-only table (the PLE table) instead of copying it
SESSION_PHASES = ("check", "acceptance", "quantize")

HELD_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
STORED = {"F32": "fp32", "BF16": "bf16", "F16": "fp16"}


@dataclass(frozen=True)
class Weights:
    """What the exporter will load, from the safetensors headers: element counts and the bytes read."""

    target: int  # elements of the target's text weights (vision / audio towers are never loaded)
    drafter: int
    ple: int  # of the target's: the per-layer-embedding table (kept at --ple-quant under int8 / int4)
    converted: int  # stored bytes of tensors not already fp32: alive beside their fp32 copies while loading
    stored: str = "fp32"  # the target's weights' dtype in the files (fp32 | bf16 | fp16), "mixed" otherwise
    moments: int = 0  # int4 calibration's float32 mean x x^T of each weight the adapter compensates (INT4_COMPENSATE)
    packed: int = 0  # a pre-quantized target's packed codes: held beside its dequantized (anonymous) weights throughout

    @property
    def fp32(self) -> int:
        return 4 * (self.target + self.drafter)

    def held(self, dtype: str) -> int:
        """Bytes the loaded models take with the target held in dtype (the drafter stays fp32)."""
        return HELD_BYTES[dtype] * self.target + 4 * self.drafter

    def load_extra(self, dtype: str) -> int:
        """Stored bytes alive beside their converted copies while loading: none when held as stored, or when a
        pre-quantized target's codes dequantize into the held dtype (a few rows at a time)."""
        return 0 if dtype == self.stored or self.packed else self.converted

    def anonymous_held(self, dtype: str) -> int:
        """The held weights' anonymous bytes: a converted copy, or a pre-quantized target's dequantized weights and
        its codes; none for weights held as stored (they stay mapped)."""
        return self.held(dtype) + self.packed if dtype != self.stored or self.packed else 0


def read_weights(target: Source, drafter: Source) -> Weights:
    """Count from the headers only: the same prefixes the model adapters load (export/models/)."""
    adapter = target_adapter(target)
    stored_headers = tensor_headers(target.folder)
    prefix, headers = adapter.weight_prefix(target), _as_loaded(target.config, stored_headers)
    packed = 0 if headers is stored_headers else sum(  # the codes: a packed checkpoint's integer tensors
        math.prod(v["shape"]) * ELEMENT_BYTES[v["dtype"]] for k, v in stored_headers.items()
        if k.startswith(prefix) and v.get("dtype") in INTEGER_DTYPES)
    t = {k: _size(k, v, target.folder) for k, v in headers.items() if k.startswith(prefix)}
    compensated = [v["shape"][-1] for k, v in headers.items() if k.startswith(prefix) and len(v["shape"]) == 2
                   and any(c in k for c in adapter.INT4_COMPENSATE)]
    d = {k: _size(k, v, drafter.folder) for k, v in tensor_headers(drafter.folder).items()}
    elements = lambda sizes, suffix="": sum(n for k, (n, _) in sizes.items() if k.endswith(suffix))  # noqa: E731
    dtypes = {STORED.get(v["dtype"], "mixed") for k, v in headers.items() if k.startswith(prefix)}
    return Weights(target=elements(t), drafter=elements(d), ple=elements(t, "embed_tokens_per_layer.weight"),
                   converted=sum(n * b for n, b in (*t.values(), *d.values()) if b != 4),
                   stored=dtypes.pop() if len(dtypes) == 1 else "mixed", moments=sum(4 * k * k for k in compensated),
                   packed=packed)


def _as_loaded(config: dict, headers: dict) -> dict:
    """A pre-quantized checkpoint's headers as the loaded model holds them: each packed weight at its float shape,
    in the dtype of the checkpoint's float tensors (what --dtype auto holds it in), scales left out."""
    from .lattice import planned

    loaded, lattice = planned.headers(config, headers)
    if lattice is None:
        return headers
    stored = {k: headers[k]["dtype"] for k in loaded if k in headers and headers[k]["dtype"] in STORED}
    floats = set(stored.values())
    dtype = floats.pop() if len(floats) == 1 else "F32"
    return {k: h if k in stored else {**h, "dtype": dtype} for k, h in loaded.items()}


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


def memory(kind: str) -> ExportMemory:
    """A backend's memory figures: MEMORY of export/backends/<kind>/."""
    return importlib.import_module(f"{backends.__name__}.{kind}").MEMORY


def phases(cfg, w: Weights, dtype: str = "fp32") -> dict[str, int]:
    """Estimated peak bytes of each phase this export (cfg: ExportConfig) runs, in order, with the target's
    weights held in dtype (fp32 | bf16 | fp16)."""
    mems = {kind: memory(kind) for kind in cfg.backend}
    # before the graphs phases, the lightest backend's modules: each imports its own in its phase (litert-torch)
    base, held = min(m.base for m in mems.values()), w.held(dtype) + w.packed
    out = {"load": int(base + held + w.load_extra(dtype))}
    for kind, m in mems.items():
        out[f"{kind} graphs"] = int(max(base, m.base) + held + w.fp32 * m.graphs)
        base = max(base, m.base + m.kept * w.fp32)
    quantized = cfg.quantized
    later = [("reference", 0), ("check", 0) if cfg.check else None,
             ("quantize", quantized_bytes(cfg, w) + calibration_bytes(cfg, w)) if quantized else None,
             ("acceptance", 0)]
    growth = {**GROWTH, "quantize": max(m.quantize(set(cfg.recipes.values())) for m in mems.values())}
    # ONNX Runtime maps a Gather-only table (the PLE table) instead of copying it: only the rest grows these phases
    # (full-size E2B acceptance: 14.4 GB, not the 40 GiB of W x (1 + 1.25); docs/export-memory.md)
    grows = {name: w.fp32 - (4 * w.ple if name in SESSION_PHASES else 0) for name in growth}
    out.update({name: int(base + held + grows[name] * growth[name] + extra) for name, extra in filter(None, later)})
    if quantized:  # the acceptance phase runs the quantized graphs: their weights, or what quantizing left, grow it
        kept = max(final_bytes(cfg, w) * GROWTH["acceptance"], QUANTIZED_RESIDUE * grows["acceptance"])
        out["acceptance"] = int(base + held + kept)
    return out


def anonymous(cfg, w: Weights, dtype: str = "fp32") -> dict[str, int]:
    """Estimated peak anonymous bytes of each phase: the part of phases() that cannot be paged out, where the
    export's one backend measured it for these recipes (ExportMemory.anonymous); else all of phases()."""
    rss = phases(cfg, w, dtype)
    fit = memory(cfg.backend[0]) if len(cfg.backend) == 1 else None
    if fit is None or fit.anonymous is None or not all(map(fit.measured, cfg.recipes.values())):
        return rss
    held = w.anonymous_held(dtype)
    out = {}
    for name in rss:
        fixed, growth = fit.anonymous[name]
        grows = w.fp32 - (4 * w.ple if name in SESSION_PHASES else 0)
        out[name] = int(fixed * MB + held + growth * grows)
    out["load"] += w.load_extra(dtype)
    if "quantize" in out:
        out["quantize"] += quantized_bytes(cfg, w) + calibration_bytes(cfg, w)
    else:  # fp32 graphs: the runtime's sessions prepack their weights
        out["acceptance"] = rss["acceptance"]
    return {name: min(rss[name], anon) for name, anon in out.items()}


def held_dtype(cfg, w: Weights, budget: int | None) -> str:
    """--dtype, resolved: auto holds the target in fp32 when that export's resident peak fits the budget (or the
    budget is unknown), since PyTorch runs fastest on fp32 (e2b-wide's reference: 48 s vs 139 s held bf16,
    docs/export-memory.md); else in its stored dtype (fp32 when that is mixed)."""
    if cfg.dtype != "auto":
        return cfg.dtype
    stored = w.stored if w.stored in HELD_BYTES else "fp32"
    if budget is None or max(phases(cfg, w, "fp32").values()) <= budget:
        return "fp32"
    return stored


def quantized_bytes(cfg, w: Weights) -> int:
    """Bytes of the weights under the recipe, the PLE table at --ple-quant under the int recipes."""
    target = cfg.recipes["target"]
    ple = recipe(cfg.ple_quant) if target.bits is not None else target
    return final_bytes(cfg, w) + int(w.ple * _per_weight(cfg, ple))


def calibration_bytes(cfg, w: Weights) -> int:
    """int4's calibration moments, alive through the quantize phase (the full-size E2B: 0.6 GiB for gate / up)."""
    return w.moments if cfg.recipes["target"].calibrated else 0


def _per_weight(cfg, chosen: Recipe) -> float:
    """Stored bytes per weight: the blockwise recipes carry one fp32 scale per block."""
    return chosen.bytes_per_weight + (4 / cfg.block_size if chosen.blockwise else 0)


def final_bytes(cfg, w: Weights) -> int:
    """Bytes of the final graphs' weights an ONNX Runtime session holds: all but the PLE table, which it maps."""
    sides = cfg.recipes
    return int((w.target - w.ple) * _per_weight(cfg, sides["target"]) + w.drafter * _per_weight(cfg, sides["drafter"]))


@dataclass(frozen=True)
class Estimate:
    """The preflight's verdict, recorded in manifest.json's export.preflight."""

    phases: dict[str, int]  # phase -> estimated peak resident bytes
    budget: int | None  # bytes, None when unknown (no /proc/meminfo and no --memory-budget)
    budget_source: str  # --memory-budget | MemAvailable | unknown
    dtype: str = "fp32"  # what the target's weights are held in (--dtype, auto resolved)
    anonymous: dict[str, int] | None = None  # phase -> estimated peak anonymous bytes; None: all of phases

    @property
    def peak_bytes(self) -> int:
        return max(self.phases.values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get)

    @property
    def anon_phases(self) -> dict[str, int]:
        return self.anonymous or self.phases

    @property
    def anon_bytes(self) -> int:
        """What the budget is held against: the peak that cannot be paged out."""
        return max(self.anon_phases.values())

    @property
    def anon_phase(self) -> str:
        return max(self.anon_phases, key=self.anon_phases.get)

    @property
    def resident_cap(self) -> int | None:
        """VmRSS above which the export hands mapped pages back (export/phases.py): RESIDENT_SHARE of the budget."""
        return None if self.budget is None else int(RESIDENT_SHARE * self.budget)

    def as_dict(self) -> dict:
        return {"estimated_peak_mb": round(self.peak_bytes / MB, 1), "estimated_peak_phase": self.peak_phase,
                "estimated_phases_mb": {k: round(v / MB, 1) for k, v in self.phases.items()},
                "budget_mb": None if self.budget is None else round(self.budget / MB, 1),
                "budget_source": self.budget_source, "dtype": self.dtype,
                "resident_cap_mb": None if self.resident_cap is None else round(self.resident_cap / MB, 1),
                "estimated_anon_peak_mb": round(self.anon_bytes / MB, 1),
                "estimated_anon_phases_mb": {k: round(v / MB, 1) for k, v in self.anon_phases.items()}}


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
    """Estimate the export's peaks and refuse it, in one line, when the anonymous peak exceeds the budget; logs the
    estimate, and a resident peak above the budget as mapped pages to be handed back."""
    w = read_weights(target, drafter)
    budget = None if cfg.memory_budget is None else int(cfg.memory_budget * GB)
    source = "--memory-budget" if budget is not None else "MemAvailable"
    budget = budget if budget is not None else available_bytes()
    dtype = held_dtype(cfg, w, budget)
    estimate = Estimate(phases(cfg, w, dtype), budget, source if budget is not None else "unknown", dtype,
                        anonymous(cfg, w, dtype))
    where = f"{human_bytes(budget)} available ({estimate.budget_source})" if budget is not None else "budget unknown"
    log.info("memory preflight: estimated peak %s resident, %s of it anonymous (%s, target held in %s), %s",
             human_bytes(estimate.peak_bytes), human_bytes(estimate.anon_bytes), estimate.anon_phase, dtype, where)
    if budget is not None and estimate.anon_bytes > budget:
        raise MemoryBudgetError(_refusal(cfg, w, estimate))
    if budget is not None and estimate.peak_bytes > budget:
        log.info("memory preflight: the resident peak exceeds the budget by memory-mapped file pages (checkpoint, "
                 "graph data); they are handed back above %s resident and re-read when needed: slower, not killed",
                 human_bytes(estimate.resident_cap))
    return estimate


def _refusal(cfg, w: Weights, estimate: Estimate) -> str:
    fits = []  # the smallest changes that fit: none that only adds a flag to one already listed
    for flags, peak in alternatives(cfg, w, estimate.dtype):
        if peak <= estimate.budget and not any(set(f) <= set(flags) for f, _ in fits):
            fits.append((flags, peak))
    listed = ", ".join(f"{' '.join(flags)} ({human_bytes(peak)})" for flags, peak in fits[:3])
    hint = (f"options that fit: {listed}" if fits else
            "no --backend / --quant / --dtype choice fits; free memory or use a larger machine")
    resident = (f", {human_bytes(estimate.peak_bytes)} resident with mapped files"
                if estimate.peak_bytes > estimate.anon_bytes else "")
    return (f"this export needs an estimated {human_bytes(estimate.anon_bytes)} at its peak ({estimate.anon_phase}"
            f"{resident}), more than the {human_bytes(estimate.budget)} available ({estimate.budget_source}); {hint} "
            "(the estimate is extrapolated from measured exports; --memory-budget GB overrides the budget)")


def alternatives(cfg, w: Weights, dtype: str = "fp32") -> list[tuple[tuple[str, ...], int]]:
    """(flags, estimated anonymous peak) of the exports one to three flags away from cfg (only the first backend,
    another --quant, the target held in its stored bf16/fp16 instead of fp32), fewest changes first, then smallest.
    --no-check is no option: the acceptance phase loads the graphs anyway."""
    options = []
    held = [None, w.stored] if dtype == "fp32" and w.stored in ("bf16", "fp16") else [None]
    for backend in ([None, cfg.backend[:1]] if len(cfg.backend) > 1 else [None]):
        for other in [None, *(r.name for r in RECIPES.values() if r.offered and r.name != cfg.quant)]:
            for stored in held:
                changes = {k: v for k, v in (("backend", backend), ("quant", other), ("dtype", stored)) if v}
                if changes:
                    flags = tuple(_flag(k, v) for k, v in changes.items())
                    peak = max(anonymous(replace(cfg, **changes), w, stored or dtype).values())
                    options.append((flags, peak))
    return sorted(options, key=lambda o: (len(o[0]), o[1]))


def _flag(name: str, value) -> str:
    return f"--backend {','.join(value)}" if name == "backend" else f"--{name} {value}"
