"""Quantization-aware training of a tiny float target at Google's mobile widths, so that the QAT checkpoints the
quant report measures are trained on their lattice, as Google's are, and not only rounded onto it.

Each weight that mtpkit/tiny/qat.py quantizes is snapped per output channel at its width (qat.snap), and each
decoder linear's input and output are rounded to a static int8 scale: absmax / 127 over training text, fixed
before training. Both use straight-through gradients. The loss mixes next-token cross-entropy with the KL to the
float target's logits.

    train(SOURCE, OUT, QATConfig()) -> OUT

OUT is a float checkpoint (the weights before snapping) with `activation_scales.json` beside it;
qat.write(OUT, ...) snaps it into any QAT format with those scales.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from . import qat

log = logging.getLogger("mtpkit")
SCALES = qat.TRAINED_SCALES


@dataclass(frozen=True)
class QATConfig:
    steps: int = 1200
    lr: float = 5e-4
    distill: float = 0.8  # weight of the KL to the float target; the rest is next-token cross-entropy
    batch: int = 16
    seq_len: int = 128
    calibration_batches: int = 4
    seed: int = 0


class _Snapped(nn.Module):
    """weight -> its lattice value (qat.snap), the gradient passed straight through."""

    def __init__(self, bits: int):
        super().__init__()
        self.bits = bits

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        codes, scale = qat.snap(w.detach(), self.bits)
        return w + (codes.float() * scale - w).detach()


def _rounded(x: torch.Tensor, s: float) -> torch.Tensor:
    """x rounded to int8 at scale s (export/lattice/srq.rounded), the gradient passed straight through."""
    y = torch.clamp(torch.round(x / s), -128, 127) * s
    return x + (y - x).detach()


def _quantize_in_training(model: nn.Module, widths: dict, scales: dict) -> None:
    """Snap every weight qat.write quantizes (2-D, not the tied embedding table) and round each calibrated linear's
    input and output, in place."""
    for name, module in model.named_modules():
        w = getattr(module, "weight", None)
        if isinstance(w, nn.Parameter) and w.dim() == 2 and not name.endswith(("embed_tokens", "lm_head")):
            parametrize.register_parametrization(module, "weight", _Snapped(qat._bits(widths, name + ".weight")))
    for name, module in qat.linears(model).items():
        s_in, s_out = scales[name]
        module.register_forward_pre_hook(lambda m, a, s=s_in: (_rounded(a[0], s),))
        module.register_forward_hook(lambda m, a, out, s=s_out: _rounded(out, s))


def train(source: Path, out: Path, cfg: QATConfig = QATConfig()) -> Path:
    """Fine-tune the float target at `source` on its lattice (see the module docstring); write it to `out`."""
    from transformers import AutoModelForCausalLM

    from .training.loops import lr_at, sample_chunks

    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    ids = _training_ids(source)
    teacher = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32).eval()
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    scales = qat.calibrate(model, [sample_chunks(ids, cfg.batch, cfg.seq_len, gen) for _ in range(cfg.calibration_batches)])
    _quantize_in_training(model, qat.mobile_bits(json.loads((source / "config.json").read_text())), scales)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    started = time.time()
    for step in range(cfg.steps):
        chunk = sample_chunks(ids, cfg.batch, cfg.seq_len + 1, gen)
        loss = _loss(model, teacher, chunk, cfg.distill)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg.steps, cfg.lr, warmup=20)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 100 == 0 or step == cfg.steps - 1:
            log.info("QAT step %d/%d loss %.3f (%.0f s)", step, cfg.steps, loss.item(), time.time() - started)
    _save(model, source, out, scales, cfg)
    return out


def _loss(model, teacher, chunk: torch.Tensor, distill: float) -> torch.Tensor:
    logits = model(input_ids=chunk[:, :-1], use_cache=False).logits
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1))
    if not distill:
        return ce
    with torch.no_grad():
        target = F.log_softmax(teacher(input_ids=chunk[:, :-1], use_cache=False).logits, -1)
    kl = F.kl_div(F.log_softmax(logits, -1), target, log_target=True, reduction="batchmean") / logits.shape[1]
    return (1 - distill) * ce + distill * kl


def _training_ids(source: Path) -> torch.Tensor:
    """The training corpus (mtpkit/tiny/training/corpus.py) as one id stream, in the target's own tokenizer."""
    from tokenizers import Tokenizer

    from .training.corpus import load_corpus

    tok = Tokenizer.from_file(str(source / "tokenizer.json"))
    return torch.tensor([i for text in load_corpus().train for i in tok.encode(text, add_special_tokens=False).ids])


def _save(model: nn.Module, source: Path, out: Path, scales: dict, cfg: QATConfig) -> None:
    """The trained weights (before snapping) under the source checkpoint's names, its other files as they are."""
    from safetensors.torch import load_file, save_file

    for module in model.modules():
        if parametrize.is_parametrized(module, "weight"):
            parametrize.remove_parametrizations(module, "weight", leave_parametrized=False)
    trained = model.state_dict()
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(source, out)
    state = {k: trained[k].to(v.dtype).contiguous() for k, v in load_file(str(source / "model.safetensors")).items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / SCALES).write_text(json.dumps({"config": asdict(cfg), "scales": scales}, indent=1) + "\n")
