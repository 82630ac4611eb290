"""What a LiteRT export costs in memory, for the memory preflight (export/preflight.py)."""

from __future__ import annotations

from ...phases import MB
from .. import ExportMemory

# The memory preflight's figures (export/preflight.py; W = the fp32 weights; docs/export-memory.md). The graphs are
# converted without weights and written by streaming: converting the weightless graphs costs about 300 MB whatever
# the size, the weights add only what is in flight.
MEMORY = ExportMemory(
    base=1700 * MB,  # litert-torch and TensorFlow Lite (about 200 MB) and the weightless conversion
    graphs=0.05,
    quantize=lambda recipes: 0.05,  # re-grafted a block of rows at a time, read with pread
    # the float check opens the graphs without XNNPACK (LoadOptions pack_weights=False): no packed copy stays behind
    kept=0.0,
    # (fixed MiB, growth in W) per phase, fitted to two --backend litert --quant int4 exports: e2b-wide (W = 580
    # MiB, held fp32) and the full-size random E2B (W = 17954 MiB, held bf16 as stored); quantize, net of the
    # quantized weights the preflight adds, through e2b-wide and the full-size E4B under the calibrated int4 (W =
    # 28770 MiB, 12.6 GiB anonymous). docs/scale-bench.md, "LiteRT at full size"
    anonymous={"load": (275, 0.017), "litert graphs": (602, 0.057), "reference": (395, 0.217), "check": (249, 0.538),
               "quantize": (504, 0.336), "acceptance": (437, 0.445)},
    measured=lambda recipe: recipe.litert in ("int8", "int4"))
