"""`mtpkit` command line: each subcommand parses flags into a frozen config and calls one library function.

Subcommand modules are imported lazily so that runtime commands never import torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from . import __version__

# name -> (module, one-line help); each module has add_arguments(parser) and run(args) -> int
COMMANDS = {
    "demo": ("mtpkit.export.demo", "export the trained tiny pair shipped with mtpkit, prove parity, time it"),
    "make-tiny": ("mtpkit.export.commands", "write a tiny random Gemma 4 target + drafter (HF layout) for tests"),
    "export": ("mtpkit.export.commands", "convert a Gemma 4 target + its MTP drafter into graphs + manifest.json"),
    "run": ("mtpkit.runtime.commands", "generate text from an export with speculative (or plain) decoding"),
    "parity": ("mtpkit.runtime.commands", "replay the export-time transformers reference and compare token for token"),
    "bench": ("mtpkit.runtime.commands", "time speculative vs plain decoding on the same graphs (interleaved runs)"),
}
EXTRA_COMMANDS = {
    "train-tiny": ("mtpkit.export.train_tiny", "train the small Gemma 4 target + drafter pair shipped with mtpkit"),
}

EPILOG = """examples:
  mtpkit demo out/demo
  mtpkit make-tiny out/tiny
  mtpkit export out/tiny/target --drafter out/tiny/drafter --out out/tiny-onnx
  mtpkit run out/tiny-onnx --prompt "def fib(n):" --max-new-tokens 32
  mtpkit parity out/tiny-onnx --json out/parity.json
  mtpkit bench out/tiny-onnx --repeats 3
"""


class CommandError(Exception):
    """Raised by subcommands for a one-line user-facing failure."""


def _available() -> dict:
    found = dict(COMMANDS)
    for name, (module, help_) in EXTRA_COMMANDS.items():
        if importlib.util.find_spec(module) is not None:
            found[name] = (module, help_)
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mtpkit", description=__doc__.splitlines()[0] if __doc__ else None,
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"mtpkit {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="only print errors and results")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in _available().items():
        p = sub.add_parser(name, help=help_, description=help_, formatter_class=argparse.RawDescriptionHelpFormatter)
        getattr(importlib.import_module(module), "add_arguments")(p, name)
    return parser


def _configure_logging(quiet: bool) -> None:
    """Progress lines from mtpkit only; other libraries stay at their defaults."""
    log = logging.getLogger("mtpkit")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("mtpkit: %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.WARNING if quiet else logging.INFO)
    log.propagate = False


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    _configure_logging(args.quiet)
    module = importlib.import_module(_available()[args.command][0])
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print("mtpkit: interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, CommandError) as e:  # user errors: one line, no traceback
        print(f"mtpkit {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
