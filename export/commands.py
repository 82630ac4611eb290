"""`mtpkit export`: flags -> frozen config -> one library call. torch loads lazily."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

from .config import ExportConfig  # torch-free, so --help works in the runtime-only install

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
    """One flag per ExportConfig field, its help, type and default read from the field (config.py `flag`)."""
    p.epilog = EXPORT_EPILOG
    p.add_argument("--verify", type=Path, metavar="DIR",
                   help="instead of exporting: re-run the export DIR/manifest.json records (same checkpoints, flags "
                        "and, required, package versions) into a temporary folder beside DIR, compare every file "
                        "(manifest.json outside `measured`) and print MATCH, or the first file that differs and "
                        "exit 1; takes no other argument")
    for f in dataclasses.fields(ExportConfig):
        add_flag(p, f)


def add_flag(p: argparse.ArgumentParser, f: dataclasses.Field) -> None:
    """The field's flag: --name for a value (None while not given, so a default that adapts can tell), --no-name
    for a boolean that defaults to on, --name for one that defaults to off; a positional for `positional`."""
    meta = dict(f.metadata)
    help_text, positional = meta.pop("help"), meta.pop("positional", False)
    if callable(meta.get("choices")):  # read when the parser is built: a recipe registered since is listed
        meta["choices"] = meta["choices"]()
    default = None if f.default is dataclasses.MISSING else f.default
    if positional:
        p.add_argument(f.name, nargs="?", help=help_text, **meta)
    elif isinstance(default, bool):
        spelt = f"--{'no-' if default else ''}{f.name.replace('_', '-')}"
        p.add_argument(spelt, dest=f.name, action="store_false" if default else "store_true", help=help_text)
    else:
        shown = ",".join(default) if isinstance(default, tuple) else default
        if shown is not None:
            help_text = f"{help_text} (default {shown})"
        p.add_argument(f"--{f.name.replace('_', '-')}", default=shown, help=help_text, **meta)


def run(args: argparse.Namespace) -> int:
    from mtpkit.errors import UsageError

    if args.verify is not None:
        return verify(args)
    missing = [name for name, value in (("TARGET", args.target), ("--drafter", args.drafter), ("--out", args.out))
               if value is None]
    if missing:
        raise UsageError(f"the following arguments are required: {', '.join(missing)} (or --verify DIR to re-run "
                         "an export)")
    cfg = ExportConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ExportConfig)})
    if cfg.dry_run:
        from .pipeline import plan_export

        print(plan_export(cfg).render())
        return 0
    from .pipeline import export_model

    out = export_model(cfg)  # GraphParityError and QualityGateError are MtpkitErrors: one line, exit 2
    print(out)
    return 0


def verify(args: argparse.Namespace) -> int:
    """`--verify DIR`: MATCH (exit 0), or the first differing file (exit 1)."""
    from mtpkit.errors import UsageError

    from .pipeline import export_model
    from .reproduce import verify as reexport_and_compare

    given = _flags_beside_verify(args)
    if given:
        raise UsageError(f"--verify DIR re-runs the export with the flags DIR/manifest.json records; drop "
                         f"{', '.join(given)}")
    difference = reexport_and_compare(args.verify, export_model)
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
