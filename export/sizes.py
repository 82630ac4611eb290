"""The size plan behind `mtpkit export --dry-run`: the bytes of every file an export writes and the memory a runtime
needs to decode with it, from the checkpoints' configs and safetensors headers alone (names, shapes, dtypes; no
weight is read, nothing is written).

Each checkpoint tensor's copies come from its model adapter (`stored_in`: which graph of a backend holds it and which
op reads it there); each backend's `plan_files` (export/backends/<kind>/sizes.py) encodes them with the function its
quantizer decides by (LiteRT: quantization.encoding_for, ONNX: encodings.encoding_for), so a recipe is planned as it
is exported, and adds the graph structure (ops, protobuf, alignment, bundle metadata), modelled by constants measured
on the tiny exports. The int4 plan's 8-bit choices depend on names alone (calibration.kept_8bit), not on the
calibration, so they are predicted exactly.

Memory, per backend (one runtime): the weights every call of a graph reads (resident), the tables read a row per
token (memory-mapped: only the rows used are paged in), the graph structure, and the KV cache the runtime
preallocates, float32: a full-attention layer at the full capacity; a sliding-window layer at the capacity on
LiteRT (its graphs write at the position), and on ONNX as the host's ring (runtime/backends/window_kv.py: its window
and one verify call to start with, growing with the answer).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtpkit.errors import UsageError

from . import calibration, int4
from .backends import backend_module
from .checkpoint import tensor_headers
from .phases import human_bytes

log = logging.getLogger("mtpkit")

FLOATS = ("F64", "F32", "F16", "BF16")  # safetensors dtypes the graphs hold as float weights
INDEX_BYTES = 8  # integer tensors (the centroid head's token ordering) are indices: the graphs hold them as int64
ROW_USES = frozenset({"lookup", "gather"})  # a table read a row per token: memory-mapped, not resident
KV_BYTES = 4  # the KV cache is float32 (manifest.json's quantization.kv_cache)


@dataclass(frozen=True)
class Weight:
    """A checkpoint tensor, from its safetensors header, and its copies in one backend's graphs."""

    side: str  # target | drafter
    name: str  # its checkpoint key (the target's after the adapter's weight_prefix)
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype
    stored: dict[str, frozenset[str]]  # graph -> the uses reading it there (the adapter's stored_in)

    @property
    def index_bytes(self) -> int | None:
        """Bytes of an integer tensor as the graphs hold it; None for a float weight (its encoding decides)."""
        return None if self.dtype in FLOATS else INDEX_BYTES * math.prod(self.shape)


@dataclass(frozen=True)
class SizeJob:
    """What a backend's plan_files reads."""

    cfg: Any  # ExportConfig, its shape defaults fitted to the model
    weights: tuple[Weight, ...]
    plans: dict  # side -> export/int4.Int4Plan (int4 recipes): the names-only plan, no calibration
    target_config: Any  # the HF text config
    drafter_config: Any
    target_folder: Path  # its tokenizer files travel into the LiteRT bundle
    kv_layers: tuple  # the target's KV-owning layers (manifest KVLayer)
    roundings: int = 0  # the target's static int8 activation roundings (export/lattice/planned.roundings)

    def side(self, graph_side: str) -> tuple[Weight, ...]:
        return tuple(w for w in self.weights if w.side == graph_side)


@dataclass(frozen=True)
class PlannedFile:
    name: str
    bytes: int  # predicted size on disk
    side: str | None  # the runtime call that reads it: target | drafter; None: a package of the other files
    read: int = 0  # weight bytes every call of its graph reads (resident)
    rows: int = 0  # bytes of tables read a row per token (memory-mapped)
    encodings: dict[str, int] = field(default_factory=dict)  # encoding -> how many weights it stores so
    note: str = ""


def tally(name: str, side: str | None, parts: list[tuple[frozenset, str, int]], structure: int,
          note: str = "") -> PlannedFile:
    """A graph file from its weights' (uses, encoding, bytes) and the bytes of everything else in it."""
    encodings: dict[str, int] = {}
    for _, label, _ in parts:
        encodings[label] = encodings.get(label, 0) + 1
    rows = sum(n for uses, _, n in parts if uses <= ROW_USES)
    read = sum(n for _, _, n in parts) - rows
    return PlannedFile(name, read + rows + structure, side, read, rows, dict(sorted(encodings.items())), note)


@dataclass(frozen=True)
class Memory:
    """What one runtime holds to decode with a backend's files."""

    target_read: int  # weight bytes a target call reads (one per token decoding plainly, one per verify round)
    drafter_read: int  # weight bytes a drafter step reads
    mapped: int  # tables read a row per token: memory-mapped, only the rows used are paged in
    structure: int  # graph files' bytes that are not weights (ops, protobuf, alignment): resident
    kv: int  # the KV cache, as the runtime preallocates it
    kv_window: int  # the KV cache if sliding layers held only their window
    sliding_held: int | None = None  # positions a sliding layer starts with (a ring), None: the capacity

    @property
    def resident(self) -> int:
        return self.target_read + self.drafter_read + self.structure + self.kv


@dataclass(frozen=True)
class BackendPlan:
    kind: str
    files: tuple[PlannedFile, ...]
    memory: Memory

    @property
    def total(self) -> int:
        return sum(f.bytes for f in self.files)


@dataclass(frozen=True)
class SizePlan:
    cfg: Any  # ExportConfig, fitted
    backends: dict[str, BackendPlan]
    kv_layers: tuple  # the target's KV-owning layers (manifest KVLayer)
    sliding_window: int
    low_bit: tuple[str, ...] = ()  # what --max-size lowered to the target recipe's low_bits (fit_size)

    def render(self) -> str:
        """What `mtpkit export --dry-run` prints: each backend's files, then the memory to decode with them."""
        cfg, layers = self.cfg, self.kv_layers
        lines = ["dry run: sizes from the checkpoints' configs and safetensors headers (no weight read, nothing "
                 "written); graph structure from constants measured on the tiny exports",
                 f"  target {cfg.target}, drafter {cfg.drafter}",
                 f"  --quant {cfg.quant}, --drafter-quant {cfg.drafter_quant}, --ple-quant {cfg.ple_quant}, "
                 f"--block-size {cfg.block_size}, --max-cache-len {cfg.max_cache_len} ({len(layers)} KV layers)"]
        if cfg.max_size is not None:
            lines.append(_fit_line(cfg, self.low_bit, self.backends))
        if any(r.int4 for r in cfg.recipes.values()):
            lines.append("  int4: the weights kept at 8 bits are chosen by name, not by the calibration (which picks "
                         "scales): the plan holds for any calibration")
        for backend in self.backends.values():
            lines += ["", *_files_lines(backend), *_memory_lines(backend.memory, cfg.max_cache_len, len(layers),
                                                                  self.sliding_window)]
        return "\n".join(lines)


def _size(n: int) -> str:
    return f"{n:>15,} B {human_bytes(n):>8}"


def _files_lines(backend: BackendPlan) -> list[str]:
    lines = [f"{backend.kind}"]
    for f in backend.files:
        stored = ", ".join(f"{label} x{n}" for label, n in f.encodings.items())
        lines.append(f"  {f.name:<28}{_size(f.bytes)}  {stored}{'; ' if stored and f.note else ''}{f.note}")
    lines.append(f"  {'all files':<28}{_size(backend.total)}")
    return lines


def _memory_lines(m: Memory, capacity: int, layers: int, window: int) -> list[str]:
    rows = [("weights read per target call", m.target_read, "once per token, or per verify round"),
            ("weights read per drafter step", m.drafter_read, "its gathered table is counted as mapped"),
            ("tables, memory-mapped", m.mapped, "a row per token is read: resident only as used"),
            ("graph structure", m.structure, "ops, protobuf, alignment"),
            ("KV cache", m.kv, f"{layers} layers, float32: full-attention at {capacity} positions, sliding in a ring of "
                               f"{m.sliding_held} (window {window}, one verify), growing with the answer"
             if m.sliding_held else f"{layers} layers x {capacity} positions, float32 (sliding layers held at "
                                    f"their window of {window}: {human_bytes(m.kv_window)})"),
            ("resident", m.resident, "weights read, structure and KV cache; the mapped tables add the rows used")]
    return [f"  decoding at --max-cache-len {capacity}, one runtime:",
            *(f"    {name:<30}{_size(n)}  {why}" for name, n, why in rows)]


def backend_plans(cfg, sources: tuple, adapters: tuple, configs: tuple, low_bit: tuple[str, ...] = (),
                  weights: dict | None = None) -> dict[str, BackendPlan]:
    """Each backend's BackendPlan with `low_bit` lowered on the target; weights: kind -> read_weights (read here
    when not given)."""
    plans = int4_plans(cfg, adapters, low_bit, sources)
    layers = adapters[0].kv_layers(configs[0])
    from .lattice import planned

    rounded = planned.roundings(sources[0].folder, sources[0].config)
    backends = {}
    for kind in cfg.backend:
        held = weights[kind] if weights else read_weights(sources, adapters, configs, kind)
        job = SizeJob(cfg, held, plans, configs[0], configs[1], sources[0].folder, layers, rounded)
        files = tuple(backend_module(kind).plan_files(job))
        backends[kind] = BackendPlan(kind, files, memory(files, layers, cfg.max_cache_len, configs[0].sliding_window,
                                                         ring=kind == "onnx"))
    return backends


def downloads(backends: dict[str, BackendPlan]) -> dict[str, int]:
    """What --max-size bounds: each package (LiteRT's model.litertlm, what LiteRT-LM loads) where a backend writes
    one; when none does, each backend's files together."""
    packages = {f.name: f.bytes for b in backends.values() for f in b.files if f.side is None}
    return packages or {f"{kind} files": b.total for kind, b in backends.items()}


def fit_size(cfg, sources: tuple, adapters: tuple, configs: tuple) -> tuple[str, ...]:
    """The fewest of the target adapter's low_bit_order (first first) lowered to the target recipe's low_bits for
    every download to fit --max-size; () without --max-size. Refuses, in one line, a budget the recipe cannot
    meet (asked for explicitly). Plans only: no weight is read."""
    if cfg.max_size is None:
        return ()
    recipe = cfg.recipes["target"]
    order = adapters[0].low_bit_order(configs[0]) if recipe.low_bits else ()
    weights = {kind: read_weights(sources, adapters, configs, kind) for kind in cfg.backend}
    planned = {}

    def fits(n: int) -> bool:
        planned[n] = downloads(backend_plans(cfg, sources, adapters, configs, order[:n], weights))
        return max(planned[n].values()) <= cfg.max_size * 1e9

    if fits(0):
        return ()
    lo, hi = 1, len(order)
    if not hi or not fits(hi):
        least = min(planned, key=lambda n: max(planned[n].values()))  # at tiny widths 2 bits can add bytes
        name, size = max(planned[least].items(), key=lambda kv: kv[1])
        how = (f"with {least} of its {hi} weight groups at {recipe.low_bits} bits, the least it plans; raise "
               f"--max-size" if hi else "and has no lower width; pass --quant mobile (it lowers layers to fit) or "
               "raise --max-size")
        raise UsageError(f"--max-size {cfg.max_size:g} GB: {name} plans {size / 1e9:.4g} GB under --quant "
                         f"{recipe.name} {how}")
    while lo < hi:  # the size falls as more is lowered: the first n that fits
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    if lo:
        log.info("  --max-size %g GB: %d of the target's %d lowerable weight groups at %d bits (%s ... %s)",
                 cfg.max_size, lo, len(order), recipe.low_bits, order[0], order[lo - 1])
    return order[:lo]


def _fit_line(cfg, low_bit: tuple[str, ...], backends: dict[str, BackendPlan]) -> str:
    sizes = ", ".join(f"{name} {n / 1e9:.3f} GB" for name, n in downloads(backends).items())
    lowered = (f"{len(low_bit)} weight groups lowered to {cfg.recipes['target'].low_bits} bits ({low_bit[0]} ... "
               f"{low_bit[-1]})" if low_bit else "nothing lowered")
    return f"  --max-size {cfg.max_size:g} GB: {lowered}; {sizes}"


def read_weights(sources: tuple, adapters: tuple, configs: tuple, backend: str) -> tuple[Weight, ...]:
    """Every checkpoint tensor the export loads (the target's under its adapter's weight_prefix, as
    preflight.read_weights counts them) with its copies in `backend`'s graphs; tensors no graph holds are left out.
    A pre-quantized checkpoint's packed tensors count as the weights they hold (export/lattice/planned.py)."""
    from .lattice import planned

    out = []
    for side, src, adapter, config in zip(("target", "drafter"), sources, adapters, configs):
        prefix = adapter.weight_prefix(src) if side == "target" else ""
        for key, header in planned.headers(src.config, tensor_headers(src.folder))[0].items():
            if not key.startswith(prefix):
                continue
            name, shape = key[len(prefix):], tuple(header["shape"])
            stored = {graph: frozenset(uses) for graph, uses in
                      adapter.stored_in(config, name, shape, backend).items()}
            if stored:
                out.append(Weight(side, name, shape, header["dtype"], stored))
    return tuple(out)


def int4_plans(cfg, adapters: tuple, low_bit: tuple[str, ...] = (), sources: tuple = ()) -> dict:
    """Each int4 side's plan as far as names decide it: which weights keep 8 bits and which --max-size lowered
    (calibration only picks scales); a checkpoint side's lattice as far as its headers tell it."""
    from .lattice import planned

    plans = {side: int4.plan(recipe, calibration.kept_8bit(adapter, cfg.ple_bits, recipe),
                             low_bit=low_bit if side == "target" else ())
             for (side, recipe), adapter in zip(cfg.recipes.items(), adapters) if recipe.int4}
    for (side, recipe), src in zip(cfg.recipes.items(), sources):
        if recipe.lattice:  # a lattice the config does not name is a Q4_0 one (check_recipes saw it)
            headers = tensor_headers(src.folder)
            found = planned.headers(src.config, headers)[1]
            plans[side] = int4.Int4Plan(recipe, lattice=found or planned.q4_0(headers))
    return plans


def kv_bytes(layers, capacity: int, window: int | None = None) -> int:
    """K and V of every KV-owning layer at `capacity` positions, float32; sliding layers at `window` when given."""
    return sum(2 * KV_BYTES * d.kv_heads * d.head_dim * (min(capacity, window) if window and
                                                        d.type == "sliding_attention" else capacity) for d in layers)


def memory(files: tuple[PlannedFile, ...], layers, capacity: int, sliding_window: int, ring: bool = False) -> Memory:
    """A runtime's memory for these files: packages (the LiteRT bundle, for LiteRT-LM) are not loaded beside them.
    ring: its sliding layers start at their window and one verify call (the ONNX host's WindowKV)."""
    from mtpkit.runtime.backends.window_kv import first_ring

    held = first_ring(capacity, sliding_window + 1) if ring else None  # the drafter reads W + 1 (manifest kv_cache)
    loaded = [f for f in files if f.side is not None]
    read = {side: sum(f.read for f in loaded if f.side == side) for side in ("target", "drafter")}
    return Memory(target_read=read["target"], drafter_read=read["drafter"], mapped=sum(f.rows for f in loaded),
                  structure=sum(f.bytes - f.read - f.rows for f in loaded), kv=kv_bytes(layers, capacity, held),
                  kv_window=kv_bytes(layers, capacity, sliding_window),
                  sliding_held=held)
