"""int4 weights chosen to keep the model: one encoder and one plan shared by the ONNX and LiteRT backends, so
`--quant int4` writes the same codes and scales on both.

Recipes (`--quant`):
- `int4`: blockwise 4-bit codes (-8..7) with one positive float16 scale per block of `block` input channels, the
  scale picked per block from SCALE_GRID to minimise the block's squared error weighted by each input channel's
  mean square activation on calibration text (`export/calibration.py`): a diagonal estimate of the layer's output
  error, the idea of AWQ / HQQ without their iterations. For the weights the adapter names in `INT4_COMPENSATE`
  (Gemma 4: the MLP's gate and up projections) calibration gives the whole mean x x^T, and each column's rounding
  error is compensated on the columns not yet encoded (GPTQ). Mixed precision: the tensors the adapter names in
  `INT4_KEEP_8BIT` (measured by `tools/int4_sensitivity.py`: for Gemma 4 the tied embedding / lm_head table and
  attention q, k, v and o) keep 8 bits, and so does the per-layer-embedding path unless `--ple-quant int4`.
- `int4-rtn`: round-to-nearest, each backend's plain encoding, kept for comparison: on LiteRT this encoder with
  the absmax / 7 scale alone, the per-layer-embedding path at 8 bits; on ONNX, ONNX Runtime's own packing (scale:
  the block's signed extreme / -8) of every MatMul, per-layer projections included, the PLE table at 8 bits.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import numpy as np

from .recipes import Recipe

# candidates for (block absmax / scale): 7 is round-to-nearest of the absmax; above 7 the largest values clip to
# +7 / -8 for a finer step on the rest (the negative extreme is exact at 8)
SCALE_GRID = np.linspace(6.5, 8.5, 17, dtype=np.float32)
RTN_GRID = np.array([7.0], np.float32)  # int4-rtn: the absmax / 7 alone
# 2 bits (codes -2..1): far coarser steps, so a wider search; most blocks clip their largest values
TWO_BIT_GRID = np.linspace(1.0, 2.6, 17, dtype=np.float32)
# GPTQ's lazy batch: errors reach the columns beyond a run of this many in one matrix product (the GPTQ paper's
# 128), so a whole-row block (one scale per channel) costs matrix products, not k rank-one updates
LAZY = 128
_ELEMENTS = 1 << 22  # weights searched at a time (16 MiB of float32): the search's temporaries stay ~100 MiB


def encode(rows: np.ndarray, block: int, importance: np.ndarray | None = None,
           grid: np.ndarray | None = None, bits: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """(codes int8 [n, k] in -2^(bits-1)..2^(bits-1)-1 (4 bits: -8..7; 2 bits: -2..1), scales float16
    [n, k // block], all positive) of rows [n, k], blockwise along
    k, each block's scale the `grid` candidate with the least squared error, weighted by `importance`: [k], the
    mean square input activation per channel (None: unweighted), or [k, k], the mean x x^T, which also compensates
    each column's rounding error on the columns after it (GPTQ). RTN_GRID gives int4-rtn. Rows are independent,
    so any slicing of the rows gives the same result. grid: SCALE_GRID at 4 bits, TWO_BIT_GRID at 2 (None)."""
    n, k = rows.shape
    grid = grid if grid is not None else TWO_BIT_GRID if bits == 2 else SCALE_GRID
    levels = code_range(bits)
    if k % block:
        raise ValueError(f"width {k} is not a multiple of the int4 block {block}")
    codes, scales = np.empty((n, k), np.int8), np.empty((n, k // block), np.float16)
    full = importance is not None and np.ndim(importance) == 2
    diagonal = np.diagonal(importance) if full else importance
    weight = None if diagonal is None else _normalised(diagonal).reshape(1, k // block, block)
    factor = _inverse_factor(np.asarray(importance, np.float64)) if full else None
    step = max(1, _ELEMENTS // k)
    for start in range(0, n, step):
        stop = min(n, start + step)
        part = rows[start:stop]
        codes[start:stop], scales[start:stop] = _compensated(part, block, weight, grid, factor, levels) if full \
            else _search(part.reshape(stop - start, k // block, block), weight, grid, levels)
    return codes, scales


def code_range(bits: int) -> tuple[int, int]:
    """(lowest, highest) signed code of a symmetric `bits`-wide encoding: -8..7 at 4 bits, -2..1 at 2."""
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def _inverse_factor(hessian: np.ndarray, damp: float = 0.01) -> np.ndarray:
    """The upper Cholesky factor of (H + damp * mean diag * I)^-1, float32: GPTQ's error propagation weights. A
    channel calibration never excited gets the damping alone, so it neither sends nor receives corrections."""
    h = hessian.copy()
    dead = np.diagonal(h) <= 0
    h[dead, dead] = 1.0
    h[np.diag_indices_from(h)] += damp * np.mean(np.diagonal(h))
    return np.linalg.cholesky(np.linalg.inv(h)).T.astype(np.float32)


def _compensated(rows: np.ndarray, block: int, weight: np.ndarray, grid: np.ndarray,
                 factor: np.ndarray, levels: tuple[int, int] = (-8, 7)) -> tuple[np.ndarray, np.ndarray]:
    """GPTQ over one slice of rows: blocks in order, each block's scale searched on the weights as corrected so
    far, each column rounded with it and its error spread over the later columns (within a run of LAZY columns one
    column at a time, beyond it once per run as one matrix product). Columns are held as rows (w transposed) so
    each step reads contiguous memory."""
    n, k = rows.shape
    wt = np.array(rows.T, np.float32, order="C")
    codes, scales = np.empty((k, n), np.int8), np.empty((n, k // block), np.float16)
    run = min(block, LAZY)
    for b, g in enumerate(range(0, k, block)):
        _, s = _search(wt[g:g + block].T.reshape(n, 1, block), weight[:, b:b + 1], grid, levels)
        scale = s[:, 0].astype(np.float32)
        scales[:, b] = s[:, 0]
        for h in range(g, g + block, run):
            e = min(h + run, g + block)
            errors = np.empty((e - h, n), np.float32)
            for j in range(h, e):
                q = np.clip(np.rint(wt[j] / scale), *levels)
                codes[j] = q
                errors[j - h] = (wt[j] - q * scale) / factor[j, j]
                wt[j + 1:e] -= np.outer(factor[j, j + 1:e], errors[j - h])
            wt[e:] -= factor[h:e, e:].T @ errors
    return codes.T, scales


def _search(blocks: np.ndarray, weight: np.ndarray | None, grid: np.ndarray,
            levels: tuple[int, int] = (-8, 7)) -> tuple[np.ndarray, np.ndarray]:
    blocks = blocks.astype(np.float32, copy=False)
    scale = best_scales(blocks, weight, grid, *levels)
    return _codes(blocks, scale, *levels).reshape(blocks.shape[0], -1), scale.astype(np.float16)


def best_scales(blocks: np.ndarray, weight: np.ndarray | None, grid: np.ndarray, lo: int = -8,
                hi: int = 7) -> np.ndarray:
    """Per block of float32 `blocks` [n, blocks, block]: of the scales amax / d for d in grid (as float16 stores
    them), the one whose codes in [lo, hi] give the least squared error, weighted by `weight` where given."""
    amax = np.abs(blocks).max(axis=2)
    best_scale, best_err = None, None
    for d in grid:
        scale = _stored(amax / d)
        err = np.square(_codes(blocks, scale, lo, hi) * scale[..., None] - blocks)
        err = (err if weight is None else err * weight).sum(axis=2)
        if best_scale is None:
            best_scale, best_err = scale, err
        else:
            better = err < best_err
            best_scale, best_err = np.where(better, scale, best_scale), np.where(better, err, best_err)
    assert best_scale is not None  # grid is never empty
    return best_scale


def _stored(scale: np.ndarray) -> np.ndarray:
    """The scale as float16 stores it, never zero (XNNPACK refuses a zero int4 scale; an all-zero block stays 0)."""
    s = scale.astype(np.float16)
    s[s == 0] = np.finfo(np.float16).tiny
    return s.astype(np.float32)


def _codes(blocks: np.ndarray, scale: np.ndarray, lo: int = -8, hi: int = 7) -> np.ndarray:
    return np.clip(np.rint(blocks / scale[..., None]), lo, hi).astype(np.int8)


def _normalised(importance: np.ndarray) -> np.ndarray:
    """Mean 1, and a floor so a channel calibration never excited still counts a little."""
    x = np.asarray(importance, np.float64)
    x = x / x.mean() if x.mean() > 0 else np.ones_like(x)
    return (x + 1e-2).astype(np.float32)


def decode(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float32 [n, k] of encode's output."""
    n, k = codes.shape
    block = k // scales.shape[1]
    return (codes.reshape(n, -1, block).astype(np.float32) * scales.astype(np.float32)[..., None]).reshape(n, k)


_LAYER = re.compile(r"(layers\.\d+\..+?)(?:\.weight)?(?:\.T)?$")


def weight_key(name: str) -> str | None:
    """The checkpoint-independent key of a graph weight inside a decoder layer ("layers.3.mlp.up_proj"), the same
    for ONNX initializers ("model.model.layers.3.mlp.up_proj.weight.T"), LiteRT tensors
    ("w:model.model.language_model.layers.3.mlp.up_proj.weight") and PyTorch module names; None outside layers."""
    found = _LAYER.search(name)
    return found.group(1) if found else None


@dataclasses.dataclass(frozen=True)
class Int4Plan:
    """What each weight of one side (target or drafter) becomes under an int4 recipe. keep_8bit: substrings of
    weight names kept at 8 bits (the model adapter's INT4_KEEP_8BIT; empty for int4-rtn). importance: weight_key
    -> mean square input activation per channel from calibration, or the full mean x x^T for a weight whose
    rounding errors are compensated (empty: unweighted scales). low_bit: weight_key prefixes ("layers.20.mlp") at
    the recipe's low_bits, what a size budget lowered (export/sizes.fit_size)."""

    recipe: Recipe
    keep_8bit: tuple[str, ...] = ()
    low_bit: tuple[str, ...] = ()
    importance: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    calibration: Mapping = dataclasses.field(default_factory=dict, compare=False)  # what importance came from
    # --quant checkpoint: the checkpoint's own codes and scales (export/lattice.Lattice); weights it lacks stay float
    lattice: object = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def searched(self) -> bool:
        """Scales searched per block (int4), or the absmax rule (int4-rtn)."""
        return self.recipe.search_scales

    def bits(self, name: str) -> int:
        if self.lattice is not None:
            found = self.lattice.weight(name)
            return found.bits if found is not None else 32
        if any(k in name for k in self.keep_8bit):
            return 8
        key = weight_key(name) or ""
        lowered = self.recipe.low_bits and any(key.startswith(prefix + ".") for prefix in self.low_bit)
        return self.recipe.low_bits if lowered else 4

    def importance_of(self, name: str) -> np.ndarray | None:
        """[k] mean square input per channel, [k, k] mean x x^T (error compensated), or None."""
        key = weight_key(name)
        return self.importance.get(key) if key else None


def label(bits: int, block: int, importance: np.ndarray | None = None) -> str:
    """How a weight is stored, as manifest.json records it: "int8/b32", "int4/b32", "int4/b32/gptq" (compensated),
    "int2/b1536/gptq"."""
    return f"int{bits}/b{block}" + ("/gptq" if bits < 8 and np.ndim(importance) == 2 else "")


def require_plan(recipe: Recipe, plan: Int4Plan | None, side: str) -> None:
    """A searched recipe's scales and 8-bit choices come from a plan (export/calibration.plans); a backend refuses
    to guess."""
    if recipe.search_scales and plan is None:
        raise ValueError(f"--quant {recipe.name} needs a plan for the {side} (export/calibration.plans)")


def plan(recipe: Recipe, keep_8bit: tuple[str, ...], importance: Mapping[str, np.ndarray] | None = None,
         calibration: Mapping | None = None, low_bit: tuple[str, ...] = ()) -> Int4Plan:
    """The recipe's plan; round-to-nearest (no scale search) keeps no weight at 8 bits and uses no activations.
    low_bit: the weight_key prefixes a size budget lowered to the recipe's low_bits (a recipe without them: none)."""
    if not recipe.int4:
        raise ValueError(f"{recipe.name!r} is not an int4 recipe")
    if low_bit and not recipe.low_bits:
        raise ValueError(f"{recipe.name!r} has no lower width for {low_bit[0]}")
    if not recipe.search_scales:
        return Int4Plan(recipe, low_bit=tuple(low_bit))
    return Int4Plan(recipe, tuple(keep_8bit), tuple(low_bit), dict(importance or {}), dict(calibration or {}))
