"""LiteRT target calls through the LiteRT backend as it was at a git commit and as it is now, interleaved in one
process on one export. Not run in CI.

    .venv/bin/python tools/litert_backend_ab.py EXPORT --before COMMIT [--threads 1] [--past 256] [--rounds 15]

The backend module (runtime/backends/litert.py) at COMMIT is loaded beside the current one; each opens the export
(its own graphs and caches), prefills the same context and times decode and verify at position --past, round by
round. Prints medians in ms and before / now.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE = "runtime/backends/litert.py"


def backend_at(commit: str):
    """The backend module as of commit, loaded as a sibling of the current one (its relative imports resolve)."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{MODULE}"], check=True, capture_output=True,
                            text=True).stdout
    name = "mtpkit.runtime.backends._litert_before"
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "mtpkit.runtime.backends"
    sys.modules[name] = module
    exec(compile(source, f"{commit}:{MODULE}", "exec"), module.__dict__)
    return module


def main(argv: list[str] | None = None) -> int:
    from mtpkit.runtime.backends import litert as now
    from mtpkit.runtime.manifest import load_manifest

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("export", type=Path)
    ap.add_argument("--before", required=True, help="git commit of the backend to compare with")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--past", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    manifest = load_manifest(args.export)
    modules = {"before": backend_at(args.before), "now": now}
    targets = {name: m.load(manifest, manifest.backend("litert"), args.threads)[0] for name, m in modules.items()}
    verify = targets["now"].max_draft + 1
    runs = {}
    for name, target in targets.items():
        target.forward(list(range(2, args.past + 2)), 0)
        runs[(name, "decode")] = lambda t=target: t.forward([0], args.past)
        runs[(name, "verify")] = lambda t=target: t.forward([0] * verify, args.past)
    samples: dict[tuple, list[float]] = {k: [] for k in runs}
    for r in range(args.rounds + 1):
        for key, call in runs.items():
            t0 = time.perf_counter()
            call()
            if r:  # round 0 warms up
                samples[key].append(1e3 * (time.perf_counter() - t0))
    ms = {k: statistics.median(v) for k, v in samples.items()}
    print(f"{args.export}: threads {args.threads}, position {args.past}, {args.rounds} rounds, verify of {verify}, "
          f"before = {args.before}")
    for kind in ("decode", "verify"):
        a, b = ms[("before", kind)], ms[("now", kind)]
        print(f"{kind}: before {a:.1f} ms, now {b:.1f} ms, before / now {a / b:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
