"""Where a LiteRT graph's XNNPACK weight cache lives, so that a second start maps the packed weights instead of
packing them again (at E2B int4 16-32 s and a private copy of every weight; docs/performance.md "Start-up").

ai-edge-litert 2.3.0 takes the cache as a file path (CpuOptions.xnnpack_weight_cache_path; its docstring says
"directory", its CPU accelerator hands the string to XNNPACK's `weight_cache_file_path`): XNNPACK maps the file if
it holds a valid cache, else packs the weights into it while the CompiledModel is created. Only CompiledModel
takes the option; the Interpreter's default delegate always packs into memory.

- **Name.** `<graph file>.<sha256[:16]>-<runtime tag>.xnnpack_cache`: the manifest's sha256 (checked at load)
  keys the cache to the graph's bytes, since XNNPACK finds packed weights by buffer index; the tag covers what
  else changes the packing: ai-edge-litert's version and the CPU (XNNPACK picks its kernels, and their packing,
  by the instructions it finds).
- **Place.** Beside the graph, as LiteRT-LM puts its cache beside its bundle, if that folder is writable; else
  the user cache folder (runtime/verified.py cache_dir(), `xnnpack/`); else none (packed in memory, as before).
- **Never half-written.** XNNPACK writes the cache where it is told, in place; it is told a temporary name in
  the same folder, renamed to the final name once the model is created (all packing happens then).
- **Never loaded unless written here.** A cache is native data XNNPACK trusts (offsets it does not check), so
  an export folder copied from elsewhere must not bring its own: a cache is used only if the user cache folder
  records its (device, inode, size, mtime, ctime) from when this user's mtpkit wrote it (stamps as in
  runtime/verified.py). Anything else is rebuilt over.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ..verified import cache_dir

SUFFIX = ".xnnpack_cache"
RECORD = "written.json"
MAX_RECORDS = 256
STALE_SECONDS = 3600.0


@cache
def runtime_tag() -> str:
    """What a packed cache depends on besides the graph: the LiteRT build and the CPU's instruction sets."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        litert = version("ai-edge-litert")
    except PackageNotFoundError:
        litert = "unknown"
    flags = ""
    try:  # Linux: the instruction sets XNNPACK picks kernels by
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    text = "\n".join([litert, platform.machine(), platform.processor(), " ".join(sorted(flags.split()))])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cache_name(graph_file: str, sha256: str) -> str:
    return f"{Path(graph_file).name}.{sha256[:16]}-{runtime_tag()}{SUFFIX}"


def user_folder() -> Path:
    return cache_dir() / "xnnpack"


@dataclass
class WeightCache:
    """One graph's cache: `path` is what XNNPACK is given (the final file, or the temporary it packs into);
    commit() after the model was created, discard() if it was not."""

    final: Path
    path: Path
    building: bool

    def commit(self) -> None:
        """Give the packed cache its final name (the model keeps its mapping) and record it as written here."""
        if self.building:
            try:
                os.replace(self.path, self.final)
                _remember(self.final)
            except OSError:  # the folder changed under us: the next start packs again
                self.path.unlink(missing_ok=True)
            self.building = False

    def discard(self) -> None:
        if self.building:
            self.path.unlink(missing_ok=True)
            self.building = False


def weight_cache(graph_path: Path, sha256: str, graph_bytes: int) -> WeightCache | None:
    """The graph's cache: a trusted one to map, else a temporary to pack into, beside the graph or in the user
    cache folder (whichever is writable first and has room); None when neither is."""
    if not _writable(user_folder()):  # where caches written here are recorded: without it none is trusted
        return None
    name = cache_name(graph_path.name, sha256)
    for folder in (graph_path.parent, user_folder()):
        final = folder / name
        if _trusted(final):
            return WeightCache(final, final, building=False)
    for folder in (graph_path.parent, user_folder()):
        temporary = _temporary(folder, name, graph_bytes)
        if temporary is not None:
            return WeightCache(folder / name, temporary, building=True)
    return None


def _temporary(folder: Path, name: str, graph_bytes: int) -> Path | None:
    """A fresh temporary file beside the final name, if the folder takes one and has room for the packed weights
    (XNNPACK aborts the process when a write to its cache fails)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _sweep(folder, name)
        if shutil.disk_usage(folder).free < 2 * graph_bytes + (64 << 20):
            return None
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=f".partial{SUFFIX}")
        os.close(fd)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep the cache from other users of a shared export
        return Path(tmp)
    except OSError:
        return None


def _sweep(folder: Path, name: str) -> None:
    """Temporaries a killed process left (an hour old: another process may be packing into its own now)."""
    for p in folder.glob(f".{name}.*.partial{SUFFIX}"):
        try:
            if time.time() - p.stat().st_mtime > STALE_SECONDS:
                p.unlink()
        except OSError:
            pass


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK)


def _stamp(path: Path) -> list[int]:
    st = os.stat(path)
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _records() -> dict:
    try:
        records = json.loads((user_folder() / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return records if isinstance(records, dict) else {}


def _trusted(path: Path) -> bool:
    try:
        return _records().get(str(path.resolve())) == _stamp(path)
    except OSError:
        return False


def _remember(path: Path) -> None:
    """Record the cache as written here (atomically; a lost record only costs packing again)."""
    records = _records()
    records[str(path.resolve())] = _stamp(path)
    kept = dict(list(records.items())[-MAX_RECORDS:])
    tmp = None
    try:
        user_folder().mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=user_folder(), prefix=".written-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(kept, f)
        os.replace(tmp, user_folder() / RECORD)
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
