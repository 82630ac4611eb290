"""sha256 of export files, remembered per user so that an unchanged file is not hashed at every start.

Hashing an E2B export (4.4 GB) costs 3-8 s per `mtpkit run`, up to half the start-up (docs/performance.md). A
record is keyed by the file's real path and stamped with (device, inode, size, mtime_ns, ctime_ns): any write to
the file, a rename over it or a `touch -d` that restores mtime changes ctime, which only the kernel sets, so a
stamp that matches means the bytes hashed then are the bytes there now. As in git's "racy" check, a file modified
in the last RACY_SECONDS is hashed but not recorded (timestamps tick at a few milliseconds). Stored in
$MTPKIT_CACHE_DIR, else $XDG_CACHE_HOME/mtpkit, else ~/.cache/mtpkit (verified.json); a missing, unreadable or
corrupt record file means hashing everything, and a read-only one is left alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

RACY_SECONDS = 2.0
MAX_RECORDS = 256  # the most recently used are kept
FILE_NAME = "verified.json"


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def cache_dir() -> Path:
    if os.environ.get("MTPKIT_CACHE_DIR"):
        return Path(os.environ["MTPKIT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mtpkit"


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


class VerifiedFiles:
    """digest(path) -> the file's sha256, hashed only when no record with its current stamp exists."""

    def __init__(self, folder: Path | None = None):
        self.path = (folder or cache_dir()) / FILE_NAME
        self.records, self.dirty = self._read(), False

    def _read(self) -> dict:
        try:
            records = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return records if isinstance(records, dict) else {}

    def digest(self, path: Path) -> str:
        st = os.stat(path)
        key, stamp = str(Path(path).resolve()), _stamp(st)
        record = self.records.get(key)
        if isinstance(record, dict) and record.get("stamp") == stamp and isinstance(record.get("sha256"), str):
            record["used"], self.dirty = time.time(), True
            return record["sha256"]
        digest = sha256_file(path)
        if time.time() - max(st.st_mtime, st.st_ctime) > RACY_SECONDS:
            self.records[key], self.dirty = {"stamp": stamp, "sha256": digest, "used": time.time()}, True
        return digest

    def save(self) -> None:
        """Write the records atomically; any failure leaves the old file (or none) and costs only re-hashing."""
        if not self.dirty:
            return
        used = lambda item: item[1].get("used", 0) if isinstance(item[1], dict) else 0  # noqa: E731
        kept = dict(sorted(self.records.items(), key=used, reverse=True)[:MAX_RECORDS])
        tmp = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".verified-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(kept, f)
            os.replace(tmp, self.path)
        except OSError:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
        self.dirty = False
