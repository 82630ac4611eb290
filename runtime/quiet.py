"""Keep third-party libraries' own printing out of mtpkit's output, without losing it.

Lives in the runtime (torch-free) because both sides need it: LiteRT's C++ runtime logs "INFO: Created TensorFlow
Lite XNNPACK delegate for CPU." on fd 2 at a process's first invoke (ai-edge-litert 2.3.0), and litert-torch /
TensorFlow print during export (export/scoped.py re-exports this).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator


@contextlib.contextmanager
def output_captured(what: str) -> Iterator[None]:
    """Send file descriptors 1 and 2 to a scratch file inside the block: litert-torch 0.10.0 prints progress trees
    and patch notices with print(), and TensorFlow / MLIR's C++ logging writes to fd 2 directly, so neither
    logging levels nor sys.stdout swaps can hide them. Replayed to stderr if the block raises (nothing is lost),
    logged at DEBUG otherwise."""
    import os
    import sys
    import tempfile

    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    with tempfile.TemporaryFile() as sink, open(os.dup(sink.fileno()), "w", buffering=1) as text_sink:
        saved = [os.dup(1), os.dup(2)]
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        failed = True
        try:  # sys.stdout / sys.stderr too: they need not be fds 1 / 2 (pytest, notebooks)
            with contextlib.redirect_stdout(text_sink), contextlib.redirect_stderr(text_sink):
                yield
            failed = False
        finally:
            text_sink.flush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
            sink.seek(0)
            text = sink.read().decode(errors="replace")
            if failed:
                sys.stderr.write(text)
            elif text:
                logging.getLogger("mtpkit").debug("%s output:\n%s", what, text)
