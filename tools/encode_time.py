"""How long the int4 / 2-bit encoder takes on one weight of a published width, this tree's export/int4.py against the
same file at another commit, interleaved in one run (the ratio is what to read; the machine's load moves both).

A weight [rows, width] of normal values and a calibration moment from correlated inputs (what GPTQ compensates on);
for each block size, each commit's `encode` is timed `--rounds` times and the codes compared. Not run in CI.

    .venv/bin/python tools/encode_time.py [--rows 10240] [--width 2560] [--blocks 2560,32] [--against COMMIT]

Defaults: E4B's gate / up projection (10240 x 2560), one scale per channel (`mobile`) and blocks of 32 (`int4`).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def module_at(commit: str, name: str = "int4"):
    """export/<name>.py as it was at `commit`, imported on its own (its package imports made absolute)."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:export/{name}.py"], check=True,
                          capture_output=True, text=True).stdout
    text = re.sub(r"^(\s*)from \.(\w*) import", lambda m: f"{m[1]}from mtpkit.export{'.' * bool(m[2])}{m[2]} import",
                  text, flags=re.M)
    text = text.replace("Path(__file__)", f"Path({str(ROOT / 'export' / name)!r}).with_suffix('.py')")  # its data files
    path = Path(tempfile.mkdtemp()) / f"{name}_{commit}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10240, help="output channels (default 10240: E4B's gate / up)")
    p.add_argument("--width", type=int, default=2560, help="input channels (default 2560: E4B's hidden size)")
    p.add_argument("--blocks", default="2560,32", help="block sizes, comma-separated (the width: one per channel)")
    p.add_argument("--bits", type=int, default=4, choices=(2, 4))
    p.add_argument("--rounds", type=int, default=1, help="timed encodes per commit and block (default 1)")
    p.add_argument("--against", default="50cc9c0", help="the commit to compare with (default 50cc9c0)")
    args = p.parse_args(argv)
    from mtpkit.export import int4

    rng = np.random.default_rng(0)
    rows = rng.standard_normal((args.rows, args.width)).astype(np.float32)
    x = rng.standard_normal((2 * args.width, args.width)).astype(np.float32) @ \
        (np.eye(args.width, dtype=np.float32) + 0.1 * rng.standard_normal((args.width, args.width)).astype(np.float32))
    moment = (x.T @ x / len(x)).astype(np.float64)
    versions = {args.against: module_at(args.against), "this tree": int4}
    for block in (int(b) for b in args.blocks.split(",")):
        seconds, codes = {name: [] for name in versions}, {}
        for _ in range(args.rounds):
            for name, module in versions.items():
                start = time.perf_counter()
                codes[name] = module.encode(rows, block, moment, bits=args.bits)[0]
                seconds[name].append(time.perf_counter() - start)
        before, after = (min(s) for s in seconds.values())
        same = float(np.mean(codes[args.against] == codes["this tree"]))
        print(f"{args.rows} x {args.width}, block {block}, {args.bits} bits: {args.against} {before:.1f} s, "
              f"this tree {after:.1f} s: {before / after:.2f}x; codes equal {same:.5f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
