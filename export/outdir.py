"""The export folder's life cycle: one writer at a time, leftovers of killed runs cleaned, a full disk named.

An export is written into `.OUT.partial-XXXXXXXX` next to OUT and renamed into place at the end (pipeline.py), so
a run killed at any point leaves either no OUT or the previous complete one. While it runs it holds an exclusive
lock on `.OUT.lock` (fcntl.flock, released by the kernel when the process dies, even by SIGKILL), which is what
makes the leftovers safe to delete: whoever holds the lock is the only one writing them.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import socket
import time
from pathlib import Path

from mtpkit.errors import DiskFullError, OutputBusyError, UsageError

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; exports into one folder must not overlap
    fcntl = None

log = logging.getLogger("mtpkit")


class OutputLock:
    """Exclusive ownership of an export folder while it is written; release() (or process death) frees it."""

    def __init__(self, out: Path):
        self.out, self.path = out, out.with_name(f".{out.name}.lock")
        self.fd: int | None = None

    def acquire(self) -> "OutputLock":
        while fcntl is not None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd)
                os.close(fd)
                raise OutputBusyError(f"{self.out} is being written by another mtpkit "
                                      f"export ({holder}); wait for it to finish or choose another --out") from None
            except OSError as e:  # a file system without locks (some network mounts): go on, as on Windows
                os.close(fd)
                log.warning("cannot lock %s (%s); make sure no other export writes %s", self.path, e.strerror,
                            self.out)
                return self
            if _same_file(fd, self.path):  # not unlinked by a finishing holder between our open and flock
                os.ftruncate(fd, 0)
                holder = f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%H:%M:%S')}"
                os.write(fd, holder.encode())
                self.fd = fd
                return self
            os.close(fd)
        return self

    def release(self) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)  # while still held, so no one locks a file that is going away
            os.close(self.fd)
            self.fd = None


def claim(out: Path, force: bool) -> OutputLock:
    """Lock OUT for writing, then deal with what a killed run left (only the lock holder writes these):
    a previous OUT caught mid-replacement is put back, stale partial folders are removed."""
    lock = OutputLock(out).acquire()
    try:
        if lock.fd is not None:  # without the lock (no fcntl, or no locks on this file system) they may be live
            _clean_leftovers(out)
        if out.exists() and not force:  # created by another export since the config was checked
            raise UsageError(f"output folder {out} already exists; pass --force to replace it or choose another --out")
    except BaseException:
        lock.release()
        raise
    return lock


def _clean_leftovers(out: Path) -> None:
    olds = sorted(_leftovers(out, "old"))
    if olds and not out.exists():
        olds.pop().rename(out)  # killed between the two renames of a replacement: restore the complete one
        log.info("restored %s, which an interrupted export was replacing", out)
    for stale in [*olds, *_leftovers(out, "partial")]:
        shutil.rmtree(stale, ignore_errors=True)
        log.info("removed %s, left by an interrupted export", stale.name)


def disk_full(e: BaseException, out: Path) -> DiskFullError | None:
    """A DiskFullError naming OUT when `e` means the disk (or quota) is full, else None."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        free = shutil.disk_usage(out.parent).free
        return DiskFullError(f"no space left on device while writing {out} ({free / 2**20:.0f} MiB free now); the "
                             "partial export was removed: free some space or choose another --out")
    return None


def _leftovers(out: Path, kind: str) -> list[Path]:
    # exactly the names pipeline.py makes: mkdtemp's 8-character suffix, _replace's timestamp
    pattern = re.compile(re.escape(f".{out.name}.{kind}-") + (r"[a-z0-9_]{8}" if kind == "partial" else r"\d+") + "$")
    if not out.parent.is_dir():
        return []
    return [p for p in out.parent.iterdir() if pattern.match(p.name) and p.is_dir() and not p.is_symlink()]


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 200, 0).decode(errors="replace").strip() or "pid unknown"
    except OSError:
        return "pid unknown"


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    return os.fstat(fd).st_ino == st.st_ino and os.fstat(fd).st_dev == st.st_dev
