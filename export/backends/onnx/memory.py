"""What an ONNX export costs in memory, for the memory preflight (export/preflight.py)."""

from __future__ import annotations

from ...phases import MB
from ...recipes import Recipe
from .. import ExportMemory


def streamed(recipe: Recipe) -> bool:
    """Quantized tensor by tensor from the float graph's mapped data, or left float; fp16 and the dynamic recipe
    load the whole graph."""
    return recipe.onnx in ("float", "streamed")


def _quantize_growth(recipes: set[Recipe]) -> float:
    """The quantize phase's growth in W for `recipes` (e2b-wide peaks in MiB, docs/export-memory.md): 1.0 when every
    recipe is packed tensor by tensor from the float graph's mapped data (stream.py) beside the unpacked float
    sessions (int4: 1787); 1.8 when one loads the float graph whole and quantizes beside it (int4 so: 2321); 1.1 W
    more for int8-dynamic, whose quantize_dynamic reads its own shape-inferred copy of the float graph (3010)."""
    growth = 1.0 if all(map(streamed, recipes)) else 1.8
    return max(growth, 1.8 + 1.1) if any(r.onnx == "dynamic" for r in recipes) else growth


# The memory preflight's figures (export/preflight.py; docs/export-memory.md). Anonymous memory per phase: fixed
# MiB + growth x W (session phases: W less the mapped PLE table), beyond a held copy converted from the stored dtype
# and, while quantizing, the quantized weights; fitted through e2b-wide (W = 580 MiB) and the full-size E2B
# (W = 17954 MiB), both int4 and held as stored, plus 20% (docs/export-memory.md, "Resident and anonymous").
MEMORY = ExportMemory(
    base=600 * MB,  # the interpreter, torch, transformers, onnx, onnxruntime (tiny e2b's largest phase: 581 MB)
    graphs=0.15,  # streamed (stream.py): the IR, one tensor in flight (e2b-wide fp32 held 1159, bf16 held 971)
    quantize=_quantize_growth,
    anonymous={"load": (330, 0.021), "onnx graphs": (600, 0.028), "reference": (420, 0.173), "check": (235, 0.52),
               "quantize": (450, 0.28), "acceptance": (410, 0.51)},
    measured=streamed)

