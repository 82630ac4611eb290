"""The QAT row of the quant report: the trained tiny pair's target trained on Google's mobile widths
(mtpkit/tiny/qat_train.py: weights snapped, static int8 activation scales, straight-through gradients) and written
in the `gemma` layout (its drafter on a Q4_0 lattice), with and without its static activation scales, exported with
`--quant checkpoint` and measured by `mtpkit quant-report` against transformers on the same QAT checkpoint over the
held-out windows; and the QAT model itself against the float pair (PyTorch, teacher-forced on the same windows).
Not in CI.

    .venv/bin/python tools/qat_report.py OUT [--windows 64] [--backend onnx,litert] [--self-check N]
                                              [--qat-steps 1200 | --trained DIR]

--qat-steps 0 snaps the float target without training. Writes OUT/trained (the QAT-trained float checkpoint and
its scales), OUT/<variant>/report/ (quant-report's report.md and report.json) and OUT/summary.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "mtpkit" / "tiny" / "assets" / "tiny_pair"
VARIANTS = {"weights": False, "static-activations": True}  # name -> static activation scales written


def vs_float(qat_target: Path, texts: list[str], prompt_len: int = 32, text_len: int = 128) -> dict:
    """Teacher-forced top-1 agreement of the QAT target with the float target over each window's text after its
    first prompt_len tokens (both as the exporter loads them: the QAT one computes what transformers does on it)."""
    from tokenizers import Tokenizer

    from mtpkit.export.checkpoint import resolve
    from mtpkit.export.models import gemma4_text

    tok = Tokenizer.from_file(str(SHIPPED / "target" / "tokenizer.json"))
    qat = gemma4_text.load(resolve(str(qat_target), "target"))
    ref = gemma4_text.load(resolve(str(SHIPPED / "target"), "target"))
    bos = json.loads((SHIPPED / "target" / "config.json").read_text()).get("bos_token_id", 2)
    agree = total = 0
    with torch.no_grad():
        for text in texts:
            ids = [bos, *tok.encode(text, add_special_tokens=False).ids[:prompt_len + text_len]]
            x = torch.tensor([ids])
            a, b = qat(x).logits[0, prompt_len:].argmax(-1), ref(x).logits[0, prompt_len:].argmax(-1)
            agree, total = agree + int((a == b).sum()), total + len(a)
    return {"top1_vs_float_pair": agree / total, "positions": total}


def self_consistency(qat_target: Path, texts: list[str], prompt_len: int = 32, text_len: int = 128) -> dict:
    """transformers against itself on the QAT checkpoint: teacher-forced top-1 of one full-sequence forward against
    token-by-token decoding with its KV cache (from_pretrained: GemmaQuantizer, apply_srq). How far the checkpoint's
    own computation moves with the order of float operations: the floor any graph can be held to."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(qat_target), dtype=torch.float32).eval()
    tok = Tokenizer.from_file(str(qat_target / "tokenizer.json"))
    agree = total = 0
    with torch.no_grad():
        for text in texts:
            ids = [2, *tok.encode(text, add_special_tokens=False).ids[:prompt_len + text_len]]
            full = model(torch.tensor([ids])).logits[0, prompt_len:].argmax(-1)
            out = model(torch.tensor([ids[:prompt_len + 1]]), use_cache=True)
            steps = [out.logits[0, -1]]
            for t in ids[prompt_len + 1:]:
                out = model(torch.tensor([[t]]), cache=out.cache, use_cache=True)
                steps.append(out.logits[0, -1])
            agree, total = agree + int((full == torch.stack(steps).argmax(-1)).sum()), total + len(full)
    return {"transformers_full_vs_cached_top1": agree / total, "positions": total,
            "lm_head_dynamic_int8_top1": dynamic_head(model, tok, texts, prompt_len, text_len)}


def dynamic_head(model, tok, texts: list[str], prompt_len: int, text_len: int) -> float:
    """Teacher-forced top-1 of the QAT model with its lm_head's input quantized per row to asymmetric int8, as
    XNNPACK's dynamic-range kernel does on LiteRT to a layer without static scales, against the model as it is."""
    def per_row_int8(module, args):
        x = args[0]
        lo, hi = x.amin(-1, keepdim=True).clamp(max=0), x.amax(-1, keepdim=True).clamp(min=0)
        scale = (hi - lo) / 255
        zero = torch.round(-128 - lo / scale)
        return ((torch.clamp(torch.round(x / scale) + zero, -128, 127) - zero) * scale,)

    agree = total = 0
    with torch.no_grad():
        for text in texts:
            x = torch.tensor([[2, *tok.encode(text, add_special_tokens=False).ids[:prompt_len + text_len]]])
            ref = model(x).logits[0, prompt_len:].argmax(-1)
            hook = model.lm_head.register_forward_pre_hook(per_row_int8)
            rounded = model(x).logits[0, prompt_len:].argmax(-1)
            hook.remove()
            agree, total = agree + int((ref == rounded).sum()), total + len(ref)
    return agree / total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--windows", type=int, default=64)
    p.add_argument("--backend", default="onnx,litert")
    p.add_argument("--self-check", type=int, metavar="N",
                   help="only transformers' full-sequence against token-by-token top-1 on the first N windows")
    p.add_argument("--qat-steps", type=int, default=1200,
                   help="quantization-aware training steps of the target (0: snap the float target untrained)")
    p.add_argument("--trained", type=Path, help="a target trained by mtpkit/tiny/qat_train.py already: no training")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "tools"))
    from heldout_text import windows

    from mtpkit.export.quant_report import quant_report
    from mtpkit.tiny.qat import TRAINED_SCALES, write_pair

    args.out.mkdir(parents=True, exist_ok=True)
    texts = windows(args.windows)
    heldout = args.out / "heldout.jsonl"
    heldout.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    source = _trained(args)
    summary = {"target": str(source), "qat_steps": 0 if source == SHIPPED / "target" else
               json.loads((source / TRAINED_SCALES).read_text())["config"]["steps"]}
    for name, srq in VARIANTS.items():
        target, drafter = write_pair(source, SHIPPED / "drafter", args.out / name / "pair", "gemma",
                                     drafter_fmt="q4_0", srq=srq)
        if args.self_check:
            summary[name] = self_consistency(target, texts[:args.self_check])
            continue
        report = quant_report(str(target), str(drafter), args.out / name / "report", ["checkpoint"], ["checkpoint"],
                              backends=tuple(args.backend.split(",")), max_cache_len=256, repeats=1, heldout=heldout)
        keys = ("backend", "target_recipe", "drafter_recipe", "teacher_forced", "heldout")
        rows = [{k: r[k] for k in keys if k in r} for r in report["rows"]]
        summary[name] = {"rows": rows, **vs_float(target, texts)}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


def _trained(args) -> Path:
    """The float target the QAT checkpoints are written from: --trained, the shipped one (--qat-steps 0), or the
    shipped one trained on its lattice into OUT/trained."""
    if args.trained:
        return args.trained
    if not args.qat_steps:
        return SHIPPED / "target"
    from mtpkit.tiny import qat_train

    return qat_train.train(SHIPPED / "target", args.out / "trained", qat_train.QATConfig(steps=args.qat_steps))


if __name__ == "__main__":
    raise SystemExit(main())
