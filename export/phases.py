"""Wall time and peak resident memory per export phase, logged and recorded in manifest.json's `export` entry.

The peak is the larger of two Linux figures, since each misses what the other sees: the kernel's high-water mark
(VmHWM in /proc/self/status, reset per phase by writing "5" to /proc/self/clear_refs), which the kernel updates
only when memory is unmapped, and a thread sampling VmRSS every 20 ms, which misses short spikes. Without /proc
(macOS) it is ru_maxrss, the process's peak so far: an upper bound. A child's peak (RUSAGE_CHILDREN) is added
when it grew during the phase; no exporter spawns one (litert-torch's export_hf converts in-process).
The reset also lowers what getrusage and time(1) report for the process: read its peak from PhaseLog instead.

The sampler also records the peak of RssAnon: memory the kernel cannot reclaim (the OOM killer's measure). The
rest of RSS at full size is mostly clean file pages (a held bf16 checkpoint, ONNX Runtime's mapped .data), which
the kernel drops and re-reads under pressure instead of killing the process (docs/export-memory.md).
"""

from __future__ import annotations

import contextlib
import logging
import re
import resource
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("mtpkit")

STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")
MB = 1 << 20


def _status() -> dict[str, int]:
    """/proc/self/status's kB fields read at once (empty without /proc)."""
    try:
        text = STATUS.read_text()
    except OSError:
        return {}
    return {k: int(v) for k, v in re.findall(r"^(\w+):\s+(\d+) kB", text, re.MULTILINE)}


def _status_kb(key: str) -> int | None:
    return _status().get(key)


def _reset_high_water_mark() -> bool:
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def _maxrss_bytes(who: int) -> int:
    # ru_maxrss is in KiB on Linux and in bytes on macOS
    return resource.getrusage(who).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


class _Sampler(threading.Thread):
    """The largest VmRSS and RssAnon seen while it runs, sampled every 20 ms. With a cap (bytes), the mapped pages
    of the checkpoint and the graphs are handed back (export/mapped.py) whenever VmRSS passes it: they are clean
    file pages, re-read from disk when needed, and the export's resident set stays near the cap."""

    def __init__(self, cap: int | None = None):
        super().__init__(daemon=True, name="mtpkit-rss-sampler")
        self.peak_kb, self.anon_kb, self.done, self.cap_kb, self.paged = 0, 0, threading.Event(), None, 0
        if cap:
            self.cap_kb = cap // 1024
        self.sample()

    def sample(self):
        status = _status()
        rss = status.get("VmRSS", 0)
        if self.cap_kb and rss > self.cap_kb:
            from .mapped import CHECKPOINT, GRAPHS, page_out

            page_out(*CHECKPOINT, *GRAPHS)
            self.paged += 1
            status = _status()
        self.peak_kb = max(self.peak_kb, rss)
        self.anon_kb = max(self.anon_kb, status.get("RssAnon", 0))

    def run(self):
        while not self.done.wait(0.02):
            self.sample()


@contextlib.contextmanager
def peak_rss(cap: int | None = None):
    """Yields a dict that holds, once the block ends, `bytes`: the peak resident memory during the block, and
    `anon` (Linux): the sampled peak of its anonymous part; `paged`: how often mapped pages were handed back to
    hold VmRSS near `cap` (bytes; None: no cap)."""
    result, children = {"bytes": 0}, _maxrss_bytes(resource.RUSAGE_CHILDREN)
    exact = _status_kb("VmHWM") is not None and _reset_high_water_mark()
    sampler = _Sampler(cap) if _status_kb("VmRSS") is not None else None
    if sampler:
        sampler.start()
    try:
        yield result
    finally:
        if sampler:
            sampler.done.set()
            sampler.join()
            sampler.sample()
            result["sampled"], result["anon"] = sampler.peak_kb * 1024, sampler.anon_kb * 1024
            result["paged"] = sampler.paged
        if exact:
            result["hwm"] = (_status_kb("VmHWM") or 0) * 1024
        own = max(result.get("sampled", 0), result.get("hwm", 0)) or _maxrss_bytes(resource.RUSAGE_SELF)
        child = _maxrss_bytes(resource.RUSAGE_CHILDREN)
        result["bytes"] = own + (child if child > children else 0)


@dataclass
class PhaseLog:
    """The export's phases in order: name, wall seconds, peak RSS (MB); numbered [i/total] by one counter."""

    total: int = 0  # phases the export will run
    phases: list[dict] = field(default_factory=list)
    resident_cap: int | None = None  # bytes: mapped pages are handed back above it (peak_rss)

    @contextlib.contextmanager
    def phase(self, name: str, doing: str):
        """Measure the next phase: logs `[i/total] doing` as it starts and `  [i/total] name: 12.3 s, peak RSS
        1.4 GB` when it ends (nothing when it fails)."""
        step = f"[{len(self.phases) + 1}/{self.total}]"
        log.info("%s %s", step, doing)
        started = time.perf_counter()
        with peak_rss(self.resident_cap) as peak:
            yield
        seconds = time.perf_counter() - started
        trim_heap()
        entry = {"phase": name, "seconds": round(seconds, 2), "peak_rss_mb": round(peak["bytes"] / MB, 1)}
        if "anon" in peak:
            entry["peak_anon_mb"] = round(peak["anon"] / MB, 1)
        if peak.get("paged"):
            entry["paged_out"] = peak["paged"]  # times mapped pages were handed back at the resident cap
        self.phases.append(entry)
        anon = f" ({human_bytes(peak['anon'])} anonymous)" if "anon" in peak else ""
        log.info("  %s %s: %.1f s, peak RSS %s%s", step, name, seconds, human_bytes(peak["bytes"]), anon)
        log.debug("  %s peak RSS: high-water mark %s, sampled %s", name, peak.get("hwm"), peak.get("sampled"))

    def as_dict(self) -> dict:
        """The manifest's `export.phases` entry plus the whole export's peak and time."""
        out = {"phases": list(self.phases),
               "peak_rss_mb": max((p["peak_rss_mb"] for p in self.phases), default=0.0),
               "seconds": round(sum(p["seconds"] for p in self.phases), 2)}
        anon = [p["peak_anon_mb"] for p in self.phases if "peak_anon_mb" in p]
        if anon:
            out["peak_anon_mb"] = max(anon)
        return out


def trim_heap() -> None:
    """Give the heap's free pages back to the system (glibc's malloc_trim) when a phase ends: glibc keeps what a
    phase freed, and the next phase's peak would stand on it (anonymous memory the kernel cannot reclaim)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):  # not glibc
        pass


def human_bytes(n: float) -> str:
    return f"{n / (1 << 30):.1f} GB" if n >= 1 << 30 else f"{n / MB:.0f} MB"
