"""`mtpkit export`: flags -> frozen config -> one library call. torch loads lazily."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from mtpkit.runtime.roles import BACKENDS

from .config import BLOCK_SIZES, DTYPES, PLE_RECIPES, QUANT_RECIPES  # torch-free, so --help works in the runtime-only install

log = logging.getLogger("mtpkit")

EXPORT_EPILOG = """TARGET and --drafter are local HF checkpoint folders or hub ids (safetensors only; no remote code).
Both hub layouts load: gemma4 (Gemma4ForConditionalGeneration; the text path is exported) and gemma4_text.

DIR receives manifest.json (the contract read by the runtimes), target.onnx + embeddings.bin, drafter.onnx,
the tokenizer, reference.json/.npz (transformers outputs for `mtpkit parity`) and graph_parity.json.
The export is written to a temporary folder and renamed into place only after every graph matched PyTorch.

The same checkpoints, flags and package versions give byte-identical files on every backend. manifest.json
records the flags and versions (`export`) apart from what was measured (`measured`: times, memory); --verify DIR
re-runs that record into a temporary folder beside DIR and prints MATCH, or the first file that differs (exit 1).

examples:
  mtpkit export google/gemma-4-E2B-it --drafter google/gemma-4-E2B-it-assistant --out e2b-onnx
  mtpkit export --verify e2b-onnx
"""


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.epilog = EXPORT_EPILOG
    p.add_argument("target", nargs="?", help="target checkpoint: local folder or hub id")
    p.add_argument("--drafter", help="drafter (-assistant) checkpoint: local folder or hub id (required)")
    p.add_argument("--out", type=Path, help="export folder to create (required)")
    p.add_argument("--verify", type=Path, metavar="DIR",
                   help="instead of exporting: re-run the export DIR/manifest.json records (same checkpoints, flags "
                        "and, required, package versions) into a temporary folder beside DIR, compare every file "
                        "(manifest.json outside `measured`) and print MATCH, or the first file that differs and "
                        "exit 1; takes no other argument")
    p.add_argument("--backend", default="onnx",
                   help=f"comma-separated: {', '.join(BACKENDS)} (each backend's graphs are checked against "
                        "PyTorch; default onnx)")
    p.add_argument("--max-cache-len", type=int, default=None,
                   help="KV capacity in tokens: prompt + generated (default 4096, or the target's "
                        "max_position_embeddings when that is smaller)")
    p.add_argument("--quant", default="fp32", choices=QUANT_RECIPES,
                   help="target weights: fp32 (default), fp16, int8 or int4 (weight-only, blockwise; int4 picks "
                        "its scales on calibration text and keeps the sensitive tensors at 8 bits, int4-rtn is "
                        "plain round-to-nearest), or int8-dynamic (per-channel int8 weights, int8 activations "
                        "at run time); quantized graphs are measured against the float model and gated (see "
                        "quant_fidelity.json)")
    p.add_argument("--calibration", type=Path, default=None, metavar="FILE.jsonl",
                   help='int4 calibration prompts, one {"text": ...} or {"ids": [...]} per line (default: a small '
                        "built-in set; it must not contain the export's reference prompts, which fidelity is "
                        "measured on)")
    p.add_argument("--drafter-quant", default=None, choices=QUANT_RECIPES, help="drafter weights (default: --quant)")
    p.add_argument("--ple-quant", default="int8", choices=PLE_RECIPES,
                   help="per-layer-embedding table under --quant int8/int4/int8-dynamic: int8 (default) or int4 "
                        "(half the bytes of the largest table; quant_fidelity.json shows what it costs)")
    p.add_argument("--block-size", type=int, default=32, choices=BLOCK_SIZES, help="int8/int4 block (default 32)")
    p.add_argument("--accuracy-level", type=int, default=4, choices=range(5), metavar="0-4",
                   help="ONNX MatMulNBits accuracy level: 4 = int8 activations, fastest on CPU (default 4)")
    p.add_argument("--no-fuse", dest="fuse", action="store_false",
                   help="ONNX graphs of standard ops only, for runtimes older than ONNX Runtime 1.20 (slower per decode "
                        "call: docs/performance.md, section 0)")
    p.add_argument("--no-quality-gate", dest="quality_gate", action="store_false",
                   help="warn instead of failing when a quantized graph misses its recipe's fidelity gate")
    p.add_argument("--target-revision", help="hub revision of the target")
    p.add_argument("--drafter-revision", help="hub revision of the drafter")
    p.add_argument("--reference-tokens", type=int, default=32, help="new tokens per reference prompt (default 32)")
    p.add_argument("--prefill-len", type=int, default=None,
                   help="LiteRT static prefill chunk length (default 128, or the KV capacity when that is smaller)")
    p.add_argument("--max-draft", type=int, default=None,
                   help="LiteRT drafts per verify call, verify length = this + 1 (default: the drafter's "
                        "num_assistant_tokens, at most 3: XNNPACK multiplies 4 rows per pass on ARM64 and AVX2, so a "
                        "5th token costs a second pass over the weights; on AVX-512, 8 rows per pass, 8 tokens still cost 1.65x "
                        "4 at e2b-wide widths)")
    p.add_argument("--no-check", dest="check", action="store_false", help="skip the graph-vs-PyTorch check")
    p.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="what the exporter holds the target's weights in while it works: auto (default: fp32 when "
                        "the memory preflight says it fits, since PyTorch's phases run fastest on it, else the "
                        "checkpoint's own dtype, bf16 for the hub's Gemma 4), fp32, bf16 or fp16. The graphs are the "
                        "same either way (weights are upcast exactly as they are written); bf16 halves the memory "
                        "an fp32 copy would take")
    p.add_argument("--memory-budget", type=float, default=None, metavar="GB",
                   help="memory (GiB) the export may use at its peak; an export estimated to need more anonymous "
                        "memory (mapped checkpoint and graph pages can be paged out, so they do not count) is refused "
                        "before loading weights (default: MemAvailable)")
    p.add_argument("--force", action="store_true", help="replace DIR if it exists")


def run(args: argparse.Namespace) -> int:
    from mtpkit.errors import UsageError

    from .config import ExportConfig

    if args.verify is not None:
        return verify(args)
    missing = [name for name, value in (("TARGET", args.target), ("--drafter", args.drafter), ("--out", args.out))
               if value is None]
    if missing:
        raise UsageError(f"the following arguments are required: {', '.join(missing)} (or --verify DIR to re-run "
                         "an export)")
    cfg = ExportConfig(target=args.target, drafter=args.drafter, out=args.out, backend=args.backend,
                       force=args.force, max_cache_len=args.max_cache_len, quant=args.quant,
                       drafter_quant=args.drafter_quant, ple_quant=args.ple_quant, block_size=args.block_size,
                       accuracy_level=args.accuracy_level, fuse=args.fuse, quality_gate=args.quality_gate,
                       target_revision=args.target_revision, drafter_revision=args.drafter_revision,
                       reference_tokens=args.reference_tokens, check=args.check, prefill_len=args.prefill_len,
                       max_draft=args.max_draft, memory_budget=args.memory_budget, dtype=args.dtype,
                       calibration=args.calibration)
    from .pipeline import export_model

    out = export_model(cfg)  # GraphParityError and QualityGateError are MtpkitErrors: one line, exit 2
    print(out)
    return 0


def verify(args: argparse.Namespace) -> int:
    """`--verify DIR`: MATCH (exit 0), or the first differing file (exit 1)."""
    from mtpkit.errors import UsageError

    from .reproduce import verify as reexport_and_compare

    given = _flags_beside_verify(args)
    if given:
        raise UsageError(f"--verify DIR re-runs the export with the flags DIR/manifest.json records; drop "
                         f"{', '.join(given)}")
    difference = reexport_and_compare(args.verify)
    if difference is None:
        print(f"MATCH {args.verify}: every file is byte-identical to a re-export from its manifest "
              "(manifest.json outside `measured`)")
        return 0
    print(f"MISMATCH {args.verify}: {difference}")
    return 1


def _flags_beside_verify(args: argparse.Namespace) -> list[str]:
    """The export arguments given with --verify (those not at their default), as they are spelt."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser, "export")
    defaults = vars(parser.parse_args(["--verify", "DIR"]))
    return [("TARGET" if dest == "target" else ("--no-" if default is True else "--") + dest.replace("_", "-"))
            for dest, default in defaults.items() if dest != "verify" and getattr(args, dest) != default]
