"""This machine's memory read bandwidth: the denominator of a decode call's bandwidth bound (tools/scale_bench.py).

A decode step with batch 1 reads every weight once and does ~2 flops per weight, so on CPU it is bound by how
fast the cores can stream memory, not by arithmetic. Two independent methods:

- `reduce` (the one reported): numpy's bitwise-OR reduction over uint64 words, split into one contiguous slice
  per thread. Integer OR is one vector instruction per 64 bytes, so the loop waits on memory, not on arithmetic;
  numpy releases the GIL inside the reduction, so Python threads stream in parallel.
- `gemv`: a float32 matrix-vector product in a child process started with OPENBLAS_NUM_THREADS (and OMP/MKL) set
  to the thread count, the same access pattern as a decode's weight MatMuls. A cross-check: BLAS threading can
  only be set before numpy loads, hence the child.

The buffer must be much larger than the last-level cache, or the figure is the cache's (a VM's lscpu may report a
host-wide L3: 480 MiB on docs/scale-bench.md's machine): the default is 2 GiB. It is filled with ones,
not zeros, since untouched zero pages all map one physical page and would read from cache. The best of
`repeats` passes is reported (other processes only ever slow a pass down); the median is kept beside it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable, Iterable

if TYPE_CHECKING:
    import numpy as np

GIB = 1 << 30


@dataclass(frozen=True)
class Bandwidth:
    gbps: float  # best pass, 1e9 bytes per second
    median_gbps: float
    threads: int
    bytes: int  # buffer size read per pass
    method: str  # "reduce" or "gemv"

    def as_dict(self) -> dict:
        return asdict(self)


def read_bandwidth(threads: int = 1, size: int = 2 * GIB, repeats: int = 5) -> Bandwidth:
    """Read bandwidth of `threads` threads each OR-reducing its own slice of one `size`-byte buffer."""
    import numpy as np

    words = np.ones(max(threads, size // 8), np.uint64)
    chunks = np.array_split(words, threads)
    seconds = [_timed_pass(chunks, np.bitwise_or.reduce) for _ in range(repeats + 1)][1:]  # pass 0 warms up
    return _result(seconds, threads, words.nbytes, "reduce")


def _timed_pass(chunks: list, reduce: Callable[[np.ndarray], object]) -> float:
    """Wall seconds from a common start until every thread has reduced its chunk."""
    if len(chunks) == 1:
        start = time.perf_counter()
        reduce(chunks[0])
        return time.perf_counter() - start
    barrier = threading.Barrier(len(chunks) + 1)

    def work(chunk: np.ndarray) -> None:
        barrier.wait()
        reduce(chunk)

    workers = [threading.Thread(target=work, args=(c,)) for c in chunks]
    for w in workers:
        w.start()
    barrier.wait()
    start = time.perf_counter()
    for w in workers:
        w.join()
    return time.perf_counter() - start


_GEMV = """
import json, sys, time
import numpy as np
size, repeats, cols = int(sys.argv[1]), int(sys.argv[2]), 4096
a = np.ones((max(1, size // (4 * cols)), cols), np.float32)
x = np.ones(cols, np.float32)
seconds = []
for _ in range(repeats + 1):
    start = time.perf_counter()
    a @ x
    seconds.append(time.perf_counter() - start)
print(json.dumps({"bytes": a.nbytes, "seconds": seconds[1:]}))
"""


def gemv_bandwidth(threads: int = 1, size: int = 2 * GIB, repeats: int = 5) -> Bandwidth:
    """Read bandwidth of a float32 GEMV over a `size`-byte matrix with `threads` BLAS threads (child process)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, "-c", _GEMV, str(size), str(repeats)], env=env, capture_output=True,
                         text=True, check=True)
    run = json.loads(out.stdout.strip().splitlines()[-1])
    return _result(run["seconds"], threads, run["bytes"], "gemv")


def _result(seconds: list[float], threads: int, nbytes: int, method: str) -> Bandwidth:
    return Bandwidth(gbps=nbytes / min(seconds) / 1e9, median_gbps=nbytes / statistics.median(seconds) / 1e9,
                     threads=threads, bytes=nbytes, method=method)


def measure(thread_counts: Iterable[int] = (1,), size: int = 2 * GIB, repeats: int = 5,
            cross_check: bool = True) -> dict:
    """{threads: {"reduce": Bandwidth, "gemv": Bandwidth}} for each thread count; gemv only with cross_check."""
    result: dict[int, dict[str, Bandwidth]] = {}
    for n in thread_counts:
        result[n] = {"reduce": read_bandwidth(n, size, repeats)}
        if cross_check:
            result[n]["gemv"] = gemv_bandwidth(n, size, repeats)
    return result
