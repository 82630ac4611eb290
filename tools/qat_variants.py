"""QAT checkpoints on every tiny structural variant: each variant of the test suite (tests/conftest.py VARIANTS:
both target layouts, both drafter heads, e2b / e4b, k_eq_v) snapped to its mobile widths with static int8
activation scales in the `gemma` layout (mtpkit/tiny/qat.py, its drafter on a Q4_0 lattice), exported with default
flags to ONNX and LiteRT, and compared with transformers' greedy tokens (plain and speculative, `mtpkit parity`)
and teacher-forced logits (the export's fidelity figures). --weights-only writes no activation scales. CI runs one
case per format on the trained pair (tests/test_qat.py); this is the matrix. Not in CI.

    .venv/bin/python tools/qat_variants.py OUT [--variants a,b] [--format gemma] [--weights-only]

Writes OUT/<variant>/ (pair, export) and OUT/summary.json; prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_variant(name: str, spec: dict, out: Path, fmt: str, srq: bool = True) -> dict:
    import mtpkit
    from mtpkit.runtime.parity import run_parity
    from mtpkit.tiny.make import TinySpec, make_tiny
    from mtpkit.tiny.qat import write_pair

    float_target, float_drafter = make_tiny(out / "float", TinySpec(**spec))
    target, drafter = write_pair(float_target, float_drafter, out / "pair", fmt, drafter_fmt="q4_0", srq=srq)
    start = time.perf_counter()
    # no quality gate: on random weights a weights-only lattice on LiteRT's dynamic-range kernels may miss it,
    # and the figures are what this reports
    export = mtpkit.export_pair(target, drafter, out / "export", backend="onnx,litert", reference_tokens=12,
                                max_cache_len=128, quality_gate=False)
    row: dict = {"variant": name, "format": fmt, "static_scales": srq,
                 "export_s": round(time.perf_counter() - start, 1), **_self_check(target)}
    manifest = json.loads((export / "manifest.json").read_text())
    row["static_int8"] = manifest["backends"]["litert"]["options"]["quantization"]["target"].get("static_int8", 0)
    figures = json.loads((export / "quant_fidelity.json").read_text())
    for backend in ("onnx", "litert"):
        results = run_parity(export, backend=backend)["results"]
        tokens = [r for r in results if r["name"].endswith("== transformers greedy")]
        row[backend] = {"token_checks": len(tokens), "token_checks_equal": sum(r["ok"] for r in tokens),
                        "top1": figures[backend]["teacher_forced"]["top1_agreement"],
                        "max_abs_logit": figures[backend]["teacher_forced"]["max_abs_logit"]}
    return row


def _self_check(target: Path) -> dict:
    """transformers against itself on the checkpoint (tools/qat_report.py): how far float order alone moves it."""
    from heldout_text import windows
    from qat_report import self_consistency

    r = self_consistency(target, windows(8), prompt_len=16, text_len=32)
    return {"transformers_full_vs_cached_top1": r["transformers_full_vs_cached_top1"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--variants", help="comma-separated names (default: every variant)")
    p.add_argument("--format", default="gemma", choices=("gemma", "compressed-tensors"))
    p.add_argument("--weights-only", action="store_true", help="no static activation scales (weights on the lattice)")
    args = p.parse_args(argv)
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tools")]
    from conftest import VARIANTS

    names = args.variants.split(",") if args.variants else list(VARIANTS)
    rows = [run_variant(n, VARIANTS[n], args.out / n, args.format, not args.weights_only) for n in names]
    (args.out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("| variant | transformers full vs cached top-1 | LiteRT int8 ops | backend | greedy checks equal to "
          "transformers | teacher-forced top-1 | max dlogit |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        for b in ("onnx", "litert"):
            print(f"| {r['variant']} | {r['transformers_full_vs_cached_top1']:.3f} | {r['static_int8']} | {b} | "
                  f"{r[b]['token_checks_equal']} / {r[b]['token_checks']} | {r[b]['top1']:.3f} | "
                  f"{r[b]['max_abs_logit']:.2g} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
