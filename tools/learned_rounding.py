"""How far training can take `--quant mobile`'s widths where post-training encoders stop: the trained tiny pair's
target at 4 bits, one scale per channel / row (every weight and table, the per-layer projections at 8 bits), with
its rounding learned by distillation from the float model, then compared teacher-forced with the float model on
held-out text, as tools/size_sensitivity.py does. Not run in CI; the evidence in
docs/quant-report-tiny-pair/size-sensitivity.md ("Beyond the encoder").

    .venv/bin/python tools/learned_rounding.py --mode rounding|qat [--steps 400] [--windows 16]

- rounding: each weight's codes are round(w / s + v), the offsets v in [-0.5, 0.5] moved by signed gradient steps
  and each channel's scale s by Adam (AutoRound / SignRound); the weights stay as trained, so this is an encoder.
- qat: the float weights themselves are trained through the rounding (straight-through), with the scales:
  quantization-aware fine-tuning, which changes the model.
Both start from the scales tools/size_sensitivity.py searches, and learn on the pair's training text (never its
held-out files), 8 windows of 256 tokens a step; the loss is the KL divergence from the float model's predictions.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import size_sensitivity as ss  # noqa: E402
from int4_sensitivity import agreement  # noqa: E402


def training_windows(tokens: int) -> list[list[int]]:
    """The pair's training text (not its held-out files) in windows of 256 tokens, bos first."""
    from tokenizers import Tokenizer

    from mtpkit.tiny.training.corpus import load_corpus

    tok = Tokenizer.from_file(str(ss.PAIR / "tokenizer.json"))
    ids = tok.encode("\n".join(load_corpus(max_train_files=12).train), add_special_tokens=False).ids[:tokens]
    return [[2, *ids[s:s + 255]] for s in range(0, len(ids) - 255, 255)]


def learnable(float_sd: dict, importance: dict, shared: set[int], train_weights: bool) -> tuple[dict, dict]:
    """({name: [w, scale, offsets, log scale factor]} for the 4-bit weights, {name: fixed 8-bit value})."""
    from mtpkit.export.int4 import _normalised, best_scales, weight_key

    grid, out, fixed = ss.scale_grid(4), {}, {}
    for name, value in float_sd.items():
        kind = ss.kind_of(name, shared) if value.ndim == 2 else None
        if kind is None:
            if value.ndim == 2 and "per_layer" in name and "norm" not in name:
                fixed[name] = torch.from_numpy(ss.fake_quant(value.double().numpy(), 8, 0, None, False)).float()
            continue
        w = value.float().numpy()
        imp = importance.get("lm_head" if kind == "head" else weight_key(name) or "")
        diagonal = np.diagonal(imp) if imp is not None and np.ndim(imp) == 2 else imp
        weight = None if diagonal is None else _normalised(diagonal).reshape(1, 1, -1)
        scale = best_scales(w.reshape(len(w), 1, -1), weight, grid, -8, 7)
        out[name] = [torch.from_numpy(w).requires_grad_(train_weights), torch.from_numpy(scale),
                     torch.zeros(w.shape, requires_grad=not train_weights), torch.zeros(len(w), 1, requires_grad=True)]
    return out, fixed


def quantized(params: dict, fixed: dict) -> dict:
    """The 4-bit values, rounding passed straight through for the gradients."""
    out = dict(fixed)
    for name, (w, scale, offsets, log_factor) in params.items():
        s = scale * torch.exp(log_factor)
        x = w / s + offsets
        out[name] = torch.clamp(x + (torch.round(x) - x).detach(), -8, 7) * s
    return out


def step(model, base: dict, params: dict, fixed: dict, batch, teacher, adam, offset_lr: float) -> float:
    from torch.func import functional_call

    adam.zero_grad()
    for p in params.values():
        p[2].grad = None
    weights, total = quantized(params, fixed), 0.0
    for ids, want in zip(batch, teacher):
        got = functional_call(model, {**base, **weights}, (torch.tensor([ids]),)).logits[0].log_softmax(-1)
        loss = torch.sum(want.exp() * (want - got), -1).mean() / len(batch)
        loss.backward(retain_graph=True)
        total += float(loss.detach())
    with torch.no_grad():
        for _, _, offsets, log_factor in params.values():
            if offsets.grad is not None:  # signed gradient steps, AutoRound's update
                offsets.sub_(offset_lr * torch.sign(offsets.grad)).clamp_(-0.5, 0.5)
    adam.step()
    with torch.no_grad():
        for p in params.values():
            p[3].clamp_(np.log(0.6), np.log(1.2))
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("rounding", "qat"), required=True)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--windows", type=int, default=16, help="held-out windows of 160 tokens (default 16)")
    p.add_argument("--tokens", type=int, default=65536, help="training-text tokens to learn on (default 65536)")
    p.add_argument("--every", type=int, default=100, help="measure every this many steps (default 100)")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    model, float_sd, importance, windows, want = ss._setup(args.windows)
    text_cfg = model.config.get_text_config()
    shared = set(range(text_cfg.num_hidden_layers - text_cfg.num_kv_shared_layers, text_cfg.num_hidden_layers))
    params, fixed = learnable(float_sd, importance, shared, args.mode == "qat")
    train = training_windows(args.tokens)
    with torch.no_grad():
        teacher = [model(torch.tensor([ids])).logits[0].log_softmax(-1) for ids in train]
    scales = [p[3] for p in params.values()]
    groups = [{"params": scales, "lr": 5e-3}] + ([{"params": [p[0] for p in params.values()], "lr": 2e-4}]
                                                 if args.mode == "qat" else [])
    adam, start = torch.optim.Adam(groups), time.time()
    measure = lambda: agreement(model, float_sd, {k: v.detach() for k, v in quantized(params, fixed).items()},  # noqa: E731
                                windows, want)
    scores = measure()
    print(f"| step | training KL | held-out top-1 | held-out mean KL | s |\n|---:|---:|---:|---:|---:|\n"
          f"| 0 | | {scores['top1']:.4f} | {scores['kl']:.2e} | 0 |", flush=True)
    for n in range(1, args.steps + 1):
        pick = rng.permutation(len(train))[:8]
        loss = step(model, float_sd, params, fixed, [train[i] for i in pick], [teacher[i] for i in pick], adam,
                    0.025 * (1 - (n - 1) / args.steps))
        if n % args.every == 0 or n == args.steps:
            scores = measure()
            print(f"| {n} | {loss:.4f} | {scores['top1']:.4f} | {scores['kl']:.2e} | {time.time() - start:.0f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
