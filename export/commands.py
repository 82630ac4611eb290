"""`mtpkit export`: flags -> frozen config -> one library call. torch loads lazily."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from mtpkit.runtime.roles import BACKENDS

log = logging.getLogger("mtpkit")

EXPORT_EPILOG = """TARGET and --drafter are local HF checkpoint folders or hub ids (safetensors only; no remote code).
Both hub layouts load: gemma4 (Gemma4ForConditionalGeneration; the text path is exported) and gemma4_text.

DIR receives manifest.json (the contract read by the runtimes), target.onnx + embeddings.bin, drafter.onnx,
the tokenizer, reference.json/.npz (transformers outputs for `mtpkit parity`) and graph_parity.json.
The export is written to a temporary folder and renamed into place only after every graph matched PyTorch.

example:
  mtpkit export google/gemma-4-E2B-it --drafter google/gemma-4-E2B-it-assistant --out e2b-onnx
"""


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.epilog = EXPORT_EPILOG
    p.add_argument("target", help="target checkpoint: local folder or hub id")
    p.add_argument("--drafter", required=True, help="drafter (-assistant) checkpoint: local folder or hub id")
    p.add_argument("--out", required=True, type=Path, help="export folder to create")
    p.add_argument("--backend", default="onnx",
                   help=f"comma-separated: {', '.join(BACKENDS)} (every backend also writes the ONNX graphs it is "
                        "checked against; default onnx)")
    p.add_argument("--max-cache-len", type=int, default=4096, help="KV capacity in tokens (default 4096)")
    p.add_argument("--quant", default="none", help="quantization recipe (default none)")
    p.add_argument("--target-revision", help="hub revision of the target")
    p.add_argument("--drafter-revision", help="hub revision of the drafter")
    p.add_argument("--reference-tokens", type=int, default=32, help="new tokens per reference prompt (default 32)")
    p.add_argument("--prefill-len", type=int, default=128, help="LiteRT static prefill chunk length (default 128)")
    p.add_argument("--num-draft", type=int, default=None,
                   help="LiteRT drafts per verify call, verify length = this + 1 (default: drafter's num_assistant_tokens)")
    p.add_argument("--no-check", dest="check", action="store_false", help="skip the graph-vs-PyTorch check")
    p.add_argument("--force", action="store_true", help="replace DIR if it exists")


def run(args: argparse.Namespace) -> int:
    from .config import ExportConfig

    cfg = ExportConfig(target=args.target, drafter=args.drafter, out=args.out, backend=args.backend,
                       force=args.force, max_cache_len=args.max_cache_len, quant=args.quant,
                       target_revision=args.target_revision, drafter_revision=args.drafter_revision,
                       reference_tokens=args.reference_tokens, check=args.check, prefill_len=args.prefill_len,
                       num_draft=args.num_draft)
    from mtpkit.cli import CommandError

    from .pipeline import export_model
    from .verify import GraphParityError

    try:
        out = export_model(cfg)
    except GraphParityError as e:
        raise CommandError(str(e)) from e
    print(out)
    return 0
