"""The auto schedule's calibration, kept between starts: the call costs `auto.calibrate` measured are written to
the user cache folder (runtime/verified.py cache_dir(), `timings/`), keyed by everything they depend on: the graphs'
bytes (the manifest's sha256), the backend and its runtime's version, the threads per graph, the longest draft, the
CPU. A later start with the same key seeds the cost meter from the file instead of timing a few calls before its
first token (at E2B about 1.4 s; docs/scale-bench.md); the run's own calls refine the seeds as before.

Data only, never trusted beyond its shape: a file that does not parse as costs is ignored and written over.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from functools import cache
from pathlib import Path

from .manifest import Backend
from .verified import cache_dir

Costs = tuple[float, dict[int, float]]  # (a drafter step, {target call length t: seconds})
RUNTIMES = ("mtpkit", "onnxruntime", "ai-edge-litert")


@cache
def machine_tag() -> str:
    """The installed runtimes' versions and the CPU (model, cores, instruction sets)."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "-"

    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = [line for line in f if line.startswith(("model name", "flags", "Features"))]
        flags = "".join(sorted(set(lines)))
    except OSError:
        pass
    parts = [*map(installed, RUNTIMES), platform.machine(), platform.processor(), str(os.cpu_count()), flags]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def key(backend: Backend, threads: dict[str, int], max_draft: int) -> str:
    """What the calibration of `backend` (a manifest Backend) at these threads and longest draft depends on."""
    graphs = sorted((name, g.sha256) for name, g in backend.graphs.items())
    text = json.dumps([backend.kind, graphs, sorted(threads.items()), max_draft, machine_tag()])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _path(key: str) -> Path:
    return cache_dir() / "timings" / f"{key}.json"


def load(key: str) -> Costs | None:
    """The costs recorded under key, or None (none recorded, or not costs)."""
    try:
        data = json.loads(_path(key).read_text(encoding="utf-8"))
        draft, target = float(data["draft"]), {int(t): float(s) for t, s in data["target"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not target or min(draft, *target.values()) <= 0:
        return None
    return draft, target


def save(key: str, costs: Costs) -> None:
    """Record costs under key, whole or not at all; a cache folder that cannot be written keeps none."""
    path = _path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"draft": costs[0], "target": {str(t): s for t, s in costs[1].items()}}, f)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
