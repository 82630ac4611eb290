"""Progress within a long export phase (tensors written, prompts done): a bar on a terminal, nothing elsewhere.

Phases log one line each (export/phases.py); a full-size export spends minutes inside some of them. The bar goes
to stderr only when stderr is a terminal, so logs, pipes and CI stay line-per-phase.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator


def on_terminal() -> bool:
    return sys.stderr.isatty()


@contextlib.contextmanager
def progress(total: int, what: str, unit: str) -> Iterator[Callable[[int], None]]:
    """Yields advance(n); shows `what` n/total unit on a terminal, leaving no line behind."""
    if not on_terminal() or total <= 1:
        yield lambda n=1: None
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=f"mtpkit:   {what}", unit=f" {unit}", leave=False, file=sys.stderr,
              dynamic_ncols=True) as bar:
        yield bar.update
