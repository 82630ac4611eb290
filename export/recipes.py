"""Quantization recipes as data: one frozen Recipe per `--quant` name, and every table the exporter reads about a
recipe is a field here. Adding a recipe is one entry in RECIPES (plus an encoder, where it needs a new one);
nothing else compares a recipe's name (tests/test_recipes.py checks that).

Torch-free: `mtpkit export --help` lists the names in the runtime-only install.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    name: str
    bits: int | None = None  # weight bits of the MatMul / FULLY_CONNECTED weights; None: a float recipe
    float_bits: int = 32  # float recipes: the weights' float width (fp32 / fp16)
    search_scales: bool = False  # int4: each block's scale searched on a grid (export/int4.py), else round-to-nearest
    calibrated: bool = False  # the target's scales searched on calibration activations, with error compensation
    table_bits: int | None = None  # the tied embedding / lm_head table (ONNX: quantized once; int4's plan may raise it)
    # the drafter's centroid-head table (read by a lookup, no MatMul): 4 under every int recipe, the target verifies
    # what it proposes, and at 8 bits it alone would be 67 MB at E2B / E4B; None: float32 (fp16: float16)
    draft_table_bits: int | None = None
    gate: float | None = None  # least teacher-forced top-1 agreement with the float model (export/fidelity.py)
    wider: str | None = None  # the next more faithful recipe, named when the gate fails
    bytes_per_weight: float = 4.0  # stored bytes per weight (the memory preflight); blockwise adds a scale per block
    blockwise: bool = False  # one float scale per --block-size weights along the input dimension
    onnx: str = "float"  # how ONNX quantizes it: float (no rewrite), streamed (tensor by tensor from the mapped
    #                      float data, export/backends/onnx/stream.py), fp16 (ORT's converter), dynamic (ORT's
    #                      quantize_dynamic: int8 activations at run time)
    litert: str | None = None  # LiteRT's encoding of the weights: fp16, int8 or int4; None: the float graphs
    litert_as: str | None = None  # LiteRT stores it as this recipe (the same bytes), recorded under that name
    # size-first: --ple-quant's default under the int recipes (the per-layer-embedding table is half of E2B)
    ple_bits: int = 8
    # --drafter-quant's default under this recipe (None: the recipe itself). The 8-bit recipes take int4: the target
    # verifies what the drafter proposes, 4-bit drafters keep its acceptance (docs/quant-report-tiny-pair), and an
    # 8-bit drafter is 52.6 MB at E2B (exported; 54.6 planned at E4B), over the 50 MB every recipe below fp16 keeps to
    drafter: str | None = None
    keeps_sensitive: bool = True  # a searched int4 plan keeps the adapter's INT4_KEEP_8BIT weights at 8 bits
    # one scale per output channel / table row instead of per block (LiteRT; ONNX Runtime's kernels need
    # power-of-two blocks, so ONNX takes its largest, CHANNELWISE_ONNX_BLOCK)
    channelwise: bool = False
    offered: bool = False  # named by the memory preflight's "options that fit" when an export does not fit
    gguf: tuple[str, ...] = ()  # llama.cpp's types of the same width (`bench --peers` compares at equal bytes)
    # the width --max-size lowers weights to, in the order the target's adapter names (low_bit_order), until the
    # export fits; None: the recipe has no lower width (a budget it misses is refused)
    low_bits: int | None = None
    # writes a pre-quantized checkpoint's own codes and scales (export/lattice); weights it keeps float stay float
    lattice: bool = False

    @property
    def quantized(self) -> bool:
        """The float graphs are rewritten (any recipe but fp32)."""
        return self.bits is not None or self.float_bits != 32

    @property
    def int4(self) -> bool:
        """Blockwise 4-bit weights, with export/int4.py's plan (which weights keep 8 bits)."""
        return self.bits == 4 and not self.lattice


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("fp32", offered=True, gguf=("F32",)),
    Recipe("fp16", float_bits=16, gate=0.99, wider="fp32", bytes_per_weight=2, onnx="fp16", litert="fp16",
           offered=True, gguf=("F16",)),
    Recipe("int8", bits=8, table_bits=8, draft_table_bits=4, drafter="int4", gate=0.95, wider="fp16", bytes_per_weight=1,
           blockwise=True, onnx="streamed", litert="int8", offered=True, gguf=("Q8_0",)),
    Recipe("int4", bits=4, search_scales=True, calibrated=True, table_bits=4, draft_table_bits=4, gate=0.85,
           wider="int8", bytes_per_weight=0.5, blockwise=True, onnx="streamed", litert="int4", offered=True,
           gguf=("Q4_0", "Q4_K_M")),
    Recipe("int4-rtn", bits=4, table_bits=4, draft_table_bits=4, gate=0.85, wider="int4", bytes_per_weight=0.5,
           blockwise=True, onnx="streamed", litert="int4", gguf=("Q4_0", "Q4_K_M")),
    # size-first (docs/quantization.md, "mobile"): every weight and table at 4 bits with one scale per channel, the
    # E2B bundle within Google's 2.59 GB; scales searched on calibration, gate / up error-compensated. Gate 0.75: the
    # trained pair's exported graphs read 0.797 (ONNX) / 0.820 (LiteRT) (docs/quant-report-tiny-pair/mobile.md)
    # --max-size lowers the KV-shared layers' MLPs to 2 bits per channel (Google's E2B bundle: all of them)
    Recipe("mobile", bits=4, search_scales=True, calibrated=True, table_bits=4, draft_table_bits=4, ple_bits=4,
           keeps_sensitive=False, channelwise=True, gate=0.75, wider="int4", bytes_per_weight=0.5, onnx="streamed",
           litert="int4", offered=True, gguf=("Q4_0",), low_bits=2),
    # LiteRT's int8 (dynamic_wi8_afp32) already quantizes activations at run time: the same bytes as int8 there.
    # Wider: int8, whose 32-wide blocks are finer than one activation scale per call (trained tiny pair: top-1
    # 1.000 against 0.984, docs/scale-bench.md)
    Recipe("int8-dynamic", bits=8, table_bits=8, draft_table_bits=4, drafter="int4", gate=0.95, wider="int8", bytes_per_weight=1,
           onnx="dynamic", litert="int8", litert_as="int8", gguf=("Q8_0",)),
    # a quantization-aware-trained checkpoint's own lattice, written as it is (docs/quantization.md, "checkpoint"):
    # the default for a pre-quantized checkpoint. A float drafter beside it takes mobile's encoding. Gate 0.8: the
    # trained pair snapped with static activation scales reads 0.979 (ONNX, its own float noise: PyTorch against
    # itself batched otherwise moves a logit by 0.32) and 0.854 (LiteRT, whose int8 kernels re-round activations)
    Recipe("checkpoint", bits=4, channelwise=True, gate=0.8, wider="fp32", bytes_per_weight=0.5, onnx="streamed",
           litert="int4", drafter="mobile", lattice=True, gguf=("Q4_0",)),
)}
FP32 = RECIPES["fp32"]
KEPT_8BIT = RECIPES["int8"]  # what a graph whose weights all kept 8 bits under a 4-bit recipe is recorded as
ALIASES = {"none": "fp32"}  # accepted for --quant and --drafter-quant
# --ple-quant: the per-layer-embedding table's bits under the int recipes (a 4-bit PLE broke other toolchains, so 8
# unless asked)
PLE_RECIPES = ("int8", "int4")
CHANNELWISE_ONNX_BLOCK = 128  # the nearest ONNX Runtime has to one scale per channel (block_size: a power of two)


def names() -> tuple[str, ...]:
    """The recipe names, in the order --help lists them."""
    return tuple(RECIPES)


def recipe(name: str) -> Recipe:
    """The Recipe of a name (or alias); KeyError for an unknown one (ExportConfig refuses those in one line)."""
    return RECIPES[ALIASES.get(name, name)]


def ple_default(target: Recipe) -> str:
    """--ple-quant's default: the target recipe's own choice (int4 under the size-first recipe, else int8)."""
    return f"int{target.ple_bits}"


def drafter_default(target: Recipe) -> str:
    """--drafter-quant's default: the target recipe's own choice (int4 under the 8-bit recipes, else the same)."""
    return target.drafter or target.name


def ple_bits(name: str) -> int:
    """Bits of the per-layer-embedding table for a --ple-quant name."""
    bits = recipe(name).bits
    assert bits is not None and name in PLE_RECIPES, name
    return bits
