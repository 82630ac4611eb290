"""How exactly each computation of a QAT checkpoint with static activation scales computes its model: the trained
tiny pair's target (tools/qat_report.py's OUT/trained) written in the `gemma` layout with its static scales,
exported with default flags (`--quant checkpoint`) to both backends, and teacher-forced over the held-out windows.

Each position's top-1 is compared between every two of five computations of the same checkpoint:
- float64: the PyTorch model the exporter loads, in float64. Every int8 layer's products of codes and scales are
  exact in float64 and their sums nearly so, so its roundings are the QAT model's own: the reference here.
- float32: the same model in float32, one full-sequence forward (the reference of the quant report, qat.md).
- float32 cached: token by token with its KV cache, as transformers generates.
- onnx, litert: the exported graphs through mtpkit's runtime (prefill, then one decode call per token).

A value that float32 summation moves across a rounding boundary moves by a whole int8 step, so float32 PyTorch is
itself off the QAT model at some positions; this measures where each computation lands. Not in CI.

    .venv/bin/python tools/qat_exactness.py OUT --trained DIR [--windows 64] [--backend onnx,litert]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "mtpkit" / "tiny" / "assets" / "tiny_pair"


def positions(model, prompts: list[dict], cached: bool = False) -> list[np.ndarray]:
    """Per prompt, the model's argmax at its last prompt position and at each teacher-forced continuation id."""
    out = []
    with torch.no_grad():
        for p in prompts:
            ids, n = p["prompt_ids"] + p["greedy_ids"][:-1], len(p["prompt_ids"])
            if not cached:
                out.append(model(torch.tensor([ids])).logits[0, n - 1:].argmax(-1).numpy())
                continue
            step = model(torch.tensor([ids[:n]]), use_cache=True)
            rows = [step.logits[0, -1]]
            for t in ids[n:]:
                step = model(torch.tensor([[t]]), cache=step.cache, use_cache=True)
                rows.append(step.logits[0, -1])
            out.append(torch.stack(rows).argmax(-1).numpy())
    return out


def agreement(a: list[np.ndarray], b: list[np.ndarray]) -> dict:
    per = [float((x == y).mean()) for x, y in zip(a, b)]
    return {"top1": float(np.mean(np.concatenate([x == y for x, y in zip(a, b)]))),
            "stderr": float(np.std(per, ddof=1) / np.sqrt(len(per)))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--trained", type=Path, required=True, help="the QAT-trained target (qat_report.py OUT/trained)")
    p.add_argument("--windows", type=int, default=64)
    p.add_argument("--backend", default="onnx,litert")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "tools"))
    from heldout_text import windows

    import mtpkit
    from mtpkit.export.checkpoint import resolve
    from mtpkit.export.fidelity import _runtime_rows
    from mtpkit.export.models import target_adapter
    from mtpkit.tiny.qat import write_pair

    target, drafter = write_pair(args.trained, SHIPPED / "drafter", args.out / "pair", "gemma", drafter_fmt="q4_0",
                                 srq=True)
    folder = args.out / "export"
    if not (folder / "manifest.json").exists():
        mtpkit.export_pair(target, drafter, folder, backend=args.backend, max_cache_len=256, reference_tokens=4)
    source = resolve(str(target), "target")
    model = target_adapter(source).load(source).eval()
    prompts = _text_prompts(model, folder, windows(args.windows))
    found = {}
    for kind in args.backend.split(","):
        used, _, rows = _runtime_rows(folder, {"prompts": prompts}, kind)
        assert len(used) == len(prompts) and all(u is q for u, q in zip(used, prompts)), "a window was cut"
        found[kind] = [r.argmax(-1) for r in rows]
    found["float32"] = positions(model, prompts)
    found["float32 cached"] = positions(model, prompts, cached=True)
    found["float64"] = positions(model.double(), prompts)
    names = list(found)
    summary = {"windows": len(prompts), "positions": int(sum(len(x) for x in found["float64"])),
               "agreement": {a: {b: agreement(found[a], found[b]) for b in names if b != a} for a in names}}
    (args.out / "exactness.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


def _text_prompts(model, folder: Path, texts: list[str]) -> list[dict]:
    """The held-out windows as the quant report teacher-forces them (32 prompt tokens, the next 128 as text)."""
    from mtpkit.export.quant_report import heldout_references

    held_text, _ = heldout_references(model, folder, texts, new_tokens=1)
    return held_text["prompts"]


if __name__ == "__main__":
    raise SystemExit(main())
