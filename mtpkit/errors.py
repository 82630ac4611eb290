"""The MtpkitError family: failures the user can fix (bad input, broken or foreign files, a busy or full disk).

The CLI prints any of these as one line and exits 2. Any other exception is a bug in mtpkit: the CLI keeps its
traceback and asks for a report. Most classes also derive from the builtin a caller would catch for them
(ValueError, ImportError, ...), so `except ValueError` catches them too. Standard library only: the runtime-only
install imports this module.
"""

from __future__ import annotations

import math
import numbers


class MtpkitError(Exception):
    """A user-facing failure; the message says what is wrong and how to fix it."""


class UsageError(MtpkitError, ValueError):
    """A bad argument: a flag, a config field, a prompt the export cannot take."""


class CheckpointError(MtpkitError, ValueError):
    """A Hugging Face checkpoint that cannot be exported (missing, foreign, damaged, mismatched)."""


class ManifestError(MtpkitError, ValueError):
    """An export folder or manifest.json that cannot be used (missing, malformed, modified, from another version)."""


class ModelOutputError(MtpkitError, ValueError):
    """Logits a runtime cannot pick from (NaN): a damaged or over-quantized graph, not a bug in the loop."""


class OutputBusyError(MtpkitError):
    """Another process is writing the same export folder."""


class DiskFullError(MtpkitError, OSError):
    """The disk filled up while writing; the partial output was removed."""


class CommandError(MtpkitError):
    """A subcommand's own one-line failure (e.g. `mtpkit demo` when parity fails)."""


class MemoryBudgetError(MtpkitError):
    """An export whose estimated peak memory exceeds what is available; refused before any weight is loaded."""


def check_int(name: str, value: object, low: int | None = None, high: int | None = None, hint: str = "") -> int:
    """value as an int if it is an integer within [low, high], else UsageError naming `name` (bools and floats
    are refused)."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise UsageError(f"{name} must be an integer {_bounds(low, high)} (got {value!r}){hint}")
    n = int(value)  # exact for any Integral, numpy's included
    if (low is not None and n < low) or (high is not None and n > high):
        raise UsageError(f"{name} must be {_bounds(low, high)} (got {value!r}){hint}")
    return n


def check_number(name: str, value: object, low: float, high: float = math.inf, low_open: bool = False,
                 hint: str = "") -> float:
    """value as a float if it is a finite real number within [low, high] ((low, high] with low_open), else
    UsageError naming `name`; NaN and infinities are refused."""
    bounds = f"in ({low:g}, {high:g}]" if low_open else _bounds(low, None if high == math.inf else high)
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise UsageError(f"{name} must be a number {bounds} (got {value!r}){hint}")
    x = float(value)
    if not (math.isfinite(x) and (low < x if low_open else low <= x) and x <= high):
        raise UsageError(f"{name} must be {bounds}{' and finite' if high == math.inf else ''} (got {value!r}){hint}")
    return x


def _bounds(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"in [{low:g}, {high:g}]"
    return f">= {low:g}" if low is not None else f"<= {high:g}" if high is not None else ""
