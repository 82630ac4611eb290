"""Hand back the resident pages of the files the export process maps (the checkpoint's safetensors, the graphs)
between steps that read them in full.

Once read, a mapped file's pages count in the process's resident set and leave it only under memory pressure. A
full-size graph check reads the whole PyTorch model and then the whole float graph: at E4B 15 GB of bf16
checkpoint plus 16 GB of float decoder. madvise(MADV_PAGEOUT) (Linux 5.4+) reclaims a mapping's pages at once;
the next read faults them back in from the file. It never discards data: dirty file pages are written back,
private copies are kept (no swap here), so any mapping may be given.
"""

from __future__ import annotations

import ctypes
import sys

MADV_PAGEOUT = 21


def page_out(*suffixes: str) -> int:
    """Reclaim the pages of every mapping of a file whose path ends with one of suffixes; returns the bytes of
    the mappings advised (0 where the platform or kernel has no MADV_PAGEOUT)."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    advised = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or not fields[5].rstrip("\n").endswith(suffixes):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if libc.madvise(start, end - start, MADV_PAGEOUT) == 0:
                advised += end - start
    return advised


CHECKPOINT = (".safetensors",)
GRAPHS = (".tflite", ".onnx", ".onnx.data", ".bin")
