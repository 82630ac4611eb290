"""`mtpkit demo`: the main job on the trained tiny pair shipped with mtpkit: export -> parity -> speed summary."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

log = logging.getLogger("mtpkit")

EPILOG = """Uses the trained tiny Gemma 4 target + drafter in mtpkit/export/assets/tiny_pair (see its pair.json).
Writes the export to DIR, replays the transformers reference through the runtime (token-for-token parity) and
times speculative against plain decoding on the same graphs. Nothing is downloaded.
"""


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.epilog = EPILOG
    p.add_argument("out", type=Path, help="export folder to create")
    p.add_argument("--backend", default="onnx", help="onnx or onnx,litert (default onnx)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved bench runs per prompt (default 3)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")


def run(args: argparse.Namespace) -> int:
    from mtpkit.cli import CommandError
    from mtpkit.runtime.bench import BenchConfig, run_bench
    from mtpkit.runtime.commands import print_bench
    from mtpkit.runtime.parity import run_parity

    from .config import ExportConfig
    from .pipeline import export_model
    from .train_tiny import ASSETS

    cfg = ExportConfig(target=str(ASSETS / "target"), drafter=str(ASSETS / "drafter"), out=args.out,
                       backend=args.backend, force=args.force, max_cache_len=1024, prefill_len=32)
    out = export_model(cfg)
    ok = True
    for backend in cfg.backend:
        report = run_parity(out, args.threads, backend)
        ok &= report["ok"]
        print(f"parity ({backend}): {'PASS' if report['ok'] else 'FAIL'}, {report['checks'] - report['failed']}/"
              f"{report['checks']} checks, k in {report['draft_lengths']}")
        print_bench(run_bench(out, BenchConfig(repeats=args.repeats, max_new_tokens=args.max_new_tokens),
                              threads=args.threads, backend=backend), args.repeats)
    if not ok:
        raise CommandError("parity failed; see `mtpkit parity DIR` for the mismatches")
    return 0
