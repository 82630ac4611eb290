"""`mtpkit` command line: each subcommand parses flags into a frozen config and calls one library function.

Subcommand modules are imported lazily so that runtime commands never import torch.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import signal
import sys
import threading
import traceback

from .version import __version__
from .errors import CommandError, MtpkitError  # noqa: F401  (CommandError: subcommands' one-line failures)
from .extras import require

# name -> (module, one-line help, extra it needs or None); each module has add_arguments(parser, name) and
# run(args) -> int. Modules import only the standard library at the top, so every --help works in the
# runtime-only install; the extra is checked before run().
COMMANDS = {
    "demo": ("mtpkit.tiny.demo", "export the trained tiny pair shipped with mtpkit, prove parity, time it", "export"),
    "make-tiny": ("mtpkit.tiny.make", "write a tiny random Gemma 4 target + drafter (HF layout) for tests",
                  "export"),
    "export": ("mtpkit.export.commands", "convert a Gemma 4 target + its MTP drafter into graphs + manifest.json",
               "export"),
    "quant-report": ("mtpkit.export.quant_report",
                     "measure every quantization recipe pair against the float model (size, fidelity, speed)",
                     "export"),
    "run": ("mtpkit.runtime.commands", "generate text from an export with speculative (or plain) decoding", None),
    "chat": ("mtpkit.runtime.chat", "talk to an export in the terminal: multi-turn, streamed, with stats per answer",
             None),
    "parity": ("mtpkit.runtime.commands", "replay the export-time transformers reference and compare token for token",
               None),
    "bench": ("mtpkit.bench", "time speculative vs plain decoding on the same graphs (interleaved runs)", None),
    "train-tiny": ("mtpkit.tiny.train", "train the small Gemma 4 target + drafter pair shipped with mtpkit",
                   "export"),
}

DESCRIPTION = ("Ship Gemma 4 with its MTP drafter: export target + drafter to ONNX / LiteRT graphs with a manifest, "
               "then run, verify and time the lossless draft-verify loop (torch-free).")
EPILOG = """examples:
  mtpkit demo out/demo
  mtpkit make-tiny out/tiny
  mtpkit export out/tiny/target --drafter out/tiny/drafter --out out/tiny-onnx
  mtpkit run out/tiny-onnx --prompt "def fib(n):" --max-new-tokens 32
  mtpkit chat out/tiny-onnx --max-new-tokens 128
  mtpkit parity out/tiny-onnx --json out/parity.json
  mtpkit bench out/tiny-onnx --repeats 3
"""


# Exit codes: 0 ok, 1 a check failed (parity), 2 a user error (one line on stderr), 70 a bug in mtpkit (traceback).
BUG_EXIT = 70  # EX_SOFTWARE in sysexits.h
BUG_LINE = ("this is a bug in mtpkit {version}, not in your input; please report it with the traceback above "
            "and the command you ran")


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block) and did-you-mean for misspelt choices."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def _check_value(self, action, value):
        if action.choices is not None and value not in action.choices:
            choices = [str(c) for c in action.choices]
            close = difflib.get_close_matches(str(value), choices, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}{hint}; choose from {', '.join(choices)}")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="mtpkit", description=DESCRIPTION,
                    epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"mtpkit {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="only print errors and results")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_, extra) in COMMANDS.items():
        if extra:
            help_ += f" [needs the {extra} extra]"
        p = sub.add_parser(name, help=help_, description=help_, formatter_class=argparse.RawDescriptionHelpFormatter)
        getattr(importlib.import_module(module), "add_arguments")(p, name)
    return parser


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at emit time (not the stream of the first call), so main() can run
    repeatedly in one process, e.g. under pytest's capture, without writing to a closed stream."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _):
        pass


def _configure_logging(quiet: bool) -> None:
    """Progress lines from mtpkit only; other libraries stay at their defaults."""
    log = logging.getLogger("mtpkit")
    if not log.handlers:
        handler = _StderrHandler()
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
    module_name, _, extra = COMMANDS[args.command]
    previous = _terminate_like_interrupt()
    try:
        if extra:
            require(extra, "this command")
        return int(importlib.import_module(module_name).run(args) or 0)
    except KeyboardInterrupt as e:
        terminated = isinstance(e, Terminated)
        print(f"mtpkit: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 128 + signal.SIGTERM if terminated else 130
    except (MtpkitError, OSError) as e:  # the user's input or environment (files, permissions, disk): one line
        print(f"mtpkit {args.command}: error: {one_line(e)}", file=sys.stderr)
        return 2
    except Exception:  # anything else is mtpkit's fault: keep the traceback and say so
        traceback.print_exc()
        print(f"mtpkit {args.command}: internal error: " + BUG_LINE.format(version=__version__), file=sys.stderr)
        return BUG_EXIT
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class Terminated(KeyboardInterrupt):
    """SIGTERM raised where the command is, as Ctrl-C is: cleanup runs (an export removes its partial folder and
    lock) instead of the process dying with tens of GB of temporaries left until the next export."""


def _raise_terminated(signum, frame):
    raise Terminated()


def _terminate_like_interrupt():
    """Install the SIGTERM handler; returns the previous one (None off the main thread, where Python cannot)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_terminated)


def one_line(e: BaseException) -> str:
    """The message of e on one line (some libraries' messages span several)."""
    text = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return text or type(e).__name__


if __name__ == "__main__":
    sys.exit(main())
