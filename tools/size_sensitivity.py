"""What each byte of a size-first recipe costs: the trained tiny pair's target with every weight kind at a chosen
width and layout (bits; block of 32 / 64 / 128 or one scale per channel), fake-quantized in PyTorch, teacher-forced
against the float model on held-out text (top-1 agreement, mean KL), beside the bytes the same choice gives the
full-size E2B target (the published E2B parameter counts, docs: shared gemma4-architecture.md). The evidence for
`--quant mobile` (docs/quantization.md, "mobile"). Not run in CI.

    .venv/bin/python tools/size_sensitivity.py [--windows 32] [--out report.md] [--cases TEXT]

Encoder: export/int4.py's scale search weighted by the built-in calibration's activations, the MLP's gate / up
error-compensated (GPTQ) as the recipes do, and in the rows that say so the attention projections and the lm_head too; 2 bits: the same search
over codes -2..1. Kinds: ple (the per-layer-embedding table), lookup (the embedder's copy of the tied table), head
(the target's lm_head copy), att (q, k, v, o), mlp (layers that own a KV cache), mlp_shared (the KV-shared layers,
double-wide at E2B). The per-layer projections stay 8 bits per channel throughout. The "rotated" rows turn each
weight's input side by a random-sign Hadamard before encoding (QuaRot / QuIP's incoherence), which no recipe does.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from int4_sensitivity import PAIR, agreement, held_out_windows  # noqa: E402

# E2B target parameters per kind and the width their scales run along (gemma4-architecture.md §6)
E2B = {"ple": (2348.8e6, 8960), "lookup": (402.7e6, 1536), "head": (402.7e6, 1536), "att": (278.4e6, 1536),
       "mlp": (424.7e6, 1536), "mlp_shared": (1132.5e6, 1536)}
E2B_REST = 41.3e6 * 1.0 + 45e6  # per-layer projections at 8 bits, and a 4-bit drafter (bytes)
ATT = ("q_proj", "k_proj", "v_proj", "o_proj")
C, B32, B128 = 0, 32, 128  # C: one scale per channel / row
# (name, {kind: (bits, block)}, GPTQ on attention and lm_head too: what the recipes do not do yet)
CASES_INT4 = dict(ple=(8, C), lookup=(8, C), head=(8, C), att=(8, C), mlp=(4, B32), mlp_shared=(4, B32))
CASES = [
    ("int4 (8-bit attention / tables / PLE, gate+up GPTQ)", CASES_INT4, False),
    ("all 4-bit, blocks of 32", dict.fromkeys(E2B, (4, B32)), True),
    ("all 4-bit b32, head 8-bit", {**dict.fromkeys(E2B, (4, B32)), "head": (8, C)}, True),
    ("all 4-bit b32, attention 8-bit", {**dict.fromkeys(E2B, (4, B32)), "att": (8, C)}, True),
    ("all 4-bit b32, PLE 8-bit", {**dict.fromkeys(E2B, (4, B32)), "ple": (8, C)}, True),
    ("all 4-bit b32, tables per row", {**dict.fromkeys(E2B, (4, B32)), "ple": (4, C), "lookup": (4, C),
                                       "head": (4, C)}, True),
    ("all 4-bit, blocks of 128, tables per row", {**dict.fromkeys(E2B, (4, B128)), "ple": (4, C), "lookup": (4, C),
                                                  "head": (4, C)}, True),
    ("mobile: all 4-bit, one scale per channel / row (as exported)", dict.fromkeys(E2B, (4, C)), False),
    ("mobile", dict.fromkeys(E2B, (4, C)), True),
    ("mobile, shared-layer MLPs 2-bit b32", {**dict.fromkeys(E2B, (4, C)), "mlp_shared": (2, B32)}, True),
    ("mobile, lookup table 2-bit per row", {**dict.fromkeys(E2B, (4, C)), "lookup": (2, C)}, True),
    ("mobile, PLE table 2-bit per row", {**dict.fromkeys(E2B, (4, C)), "ple": (2, C)}, True),
    # LiteRT's XNNPACK runs 2-bit weights one scale per channel only: the widths a LiteRT bundle could take
    ("mobile, shared-layer MLPs 2-bit per channel", {**dict.fromkeys(E2B, (4, C)), "mlp_shared": (2, C)}, True),
    ("mobile, lm_head 2-bit per channel", {**dict.fromkeys(E2B, (4, C)), "head": (2, C)}, True),
    ("mobile, shared-layer MLPs and lm_head 2-bit per channel (Google's mix)",
     {**dict.fromkeys(E2B, (4, C)), "mlp_shared": (2, C), "head": (2, C)}, True),
    ("mobile, shared-layer MLPs and lm_head 2-bit per channel, as exported",
     {**dict.fromkeys(E2B, (4, C)), "mlp_shared": (2, C), "head": (2, C)}, False),
    # E4B's bundle less Google's is 0.125 GB: 2-bit MLPs in 7 of its 18 KV-shared layers, the last 2 of the pair's 5
    ("mobile, the last 2 of 5 KV-shared layers' MLPs 2-bit per channel (E4B's 7 of 18)",
     {**dict.fromkeys(E2B, (4, C)), "mlp_shared": (2, C), "last_shared": 2}, True),
    # which end of the KV-shared layers to lower first (the order of the size-first budget, export/models)
    ("mobile, the first 2 of 5 KV-shared layers' MLPs 2-bit per channel",
     {**dict.fromkeys(E2B, (4, C)), "mlp_shared": (2, C), "first_shared": 2}, True),
    # incoherence (QuaRot / QuIP): every weight's input side turned by a random-sign Hadamard in blocks of 128
    # before it is encoded and turned back after (a graph would turn the activations instead): no byte changes
    ("mobile, weights and tables rotated (Hadamard blocks of 128)", {**dict.fromkeys(E2B, (4, C)), "rotate": 128},
     True),
    ("int4, rotated (Hadamard blocks of 128)", {**CASES_INT4, "rotate": 128}, False),
    # other 16-level encodings of a row at mobile's bytes: an asymmetric range (a zero point per row, 16 bits more)
    # and a row's own 16 levels (k-means weighted by calibration; 256 bits more per row, no LiteRT kernel reads it)
    ("mobile, asymmetric range per channel / row", {**dict.fromkeys(E2B, (4, C)), "encoder": "asymmetric"}, True),
    ("mobile, 16-level codebook per channel / row", {**dict.fromkeys(E2B, (4, C)), "encoder": "codebook"}, True),
]


def e2b_gb(choice: dict, shared_layers: int = 5) -> float:
    """E2B's bytes under the choice; a choice naming `last_shared` / `first_shared` gives only that part of the
    KV-shared layers (out of the pair's `shared_layers`) the mlp_shared choice, the rest the mlp one."""
    total = E2B_REST
    part = choice.get("last_shared", choice.get("first_shared", shared_layers)) / shared_layers
    for kind, (n, width) in E2B.items():
        for share, (bits, block) in ((part, choice[kind]), (1 - part, choice["mlp"])) if kind == "mlp_shared" \
                else ((1, choice[kind]),):
            extra = {"asymmetric": 16, "codebook": 16 * (1 << bits) - 16}.get(choice.get("encoder"), 0)
            total += share * n * (bits + ((16 + extra) / (block or width) if bits < 8 else 0)) / 8
    return total / 1e9


def scale_grid(bits: int) -> np.ndarray:
    """The candidates for block absmax / scale: at 4 bits a span around 7-8, at 2 bits export/int4.TWO_BIT_GRID."""
    from mtpkit.export.int4 import TWO_BIT_GRID, code_range

    hi = code_range(bits)[1]
    return np.linspace(hi * 0.93, (hi + 1) * 1.06, 17, dtype=np.float32) if bits > 2 else TWO_BIT_GRID


def moments(importance) -> tuple[bool, np.ndarray | None]:
    """(whether the full moment [k, k] is known, the per-channel mean squares or None)."""
    full = importance is not None and np.ndim(importance) == 2
    return full, np.diagonal(importance) if full else importance


def fake_quant(w: np.ndarray, bits: int, block: int, importance, compensated: bool) -> np.ndarray:
    """w at `bits` (8: symmetric per channel; 4 / 2: scales searched as export/int4.py does, over codes
    -2^(bits-1)..2^(bits-1)-1, GPTQ when compensated and the full moment is known)."""
    from mtpkit.export.int4 import _inverse_factor, _normalised, best_scales

    w = np.array(w, np.float32)
    if bits == 8:
        scale = np.maximum(np.abs(w).max(axis=1, keepdims=True), 1e-9) / 127
        return np.clip(np.rint(w / scale), -127, 127) * scale
    n, k = w.shape
    block = block or k
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    grid = scale_grid(bits)
    full, diagonal = moments(importance)
    weight = None if diagonal is None else _normalised(diagonal).reshape(1, k // block, block)
    if not (full and compensated):
        scale = best_scales(w.reshape(n, k // block, block), weight, grid, lo, hi)
        return (np.clip(np.rint(w.reshape(n, k // block, block) / scale[..., None]), lo, hi)
                * scale[..., None]).reshape(n, k)
    factor, out = _inverse_factor(np.asarray(importance, np.float64)), np.empty_like(w)
    for b, start in enumerate(range(0, k, block)):  # GPTQ, as export/int4._compensated
        end = start + block
        scale = best_scales(w[:, start:end].reshape(n, 1, block), weight[:, b:b + 1], grid, lo, hi)[:, 0]
        errors = np.empty((n, block), np.float32)
        for j in range(start, end):
            out[:, j] = np.clip(np.rint(w[:, j] / scale), lo, hi) * scale
            errors[:, j - start] = (w[:, j] - out[:, j]) / factor[j, j]
            w[:, j + 1:end] -= np.outer(errors[:, j - start], factor[j, j + 1:end])
        w[:, end:] -= errors @ factor[start:end, end:]
    return out


def row_levels(w: np.ndarray, bits: int, encoder: str, weight: np.ndarray) -> np.ndarray:
    """[n, 2^bits] sorted levels per row: an asymmetric range (both ends shrunk on a 9 x 9 grid, the least
    weighted squared error) or a weighted 1-D k-means (Lloyd, 25 rounds from the row's quantiles)."""
    m = 1 << bits
    lo, hi = w.min(axis=1, keepdims=True), w.max(axis=1, keepdims=True)
    if encoder == "asymmetric":
        best, best_err = None, None
        for a in np.linspace(0.6, 1.0, 9):
            for b in np.linspace(0.6, 1.0, 9):
                levels = lo * a + (hi * b - lo * a) * np.linspace(0, 1, m)
                err = (np.square(nearest(w, levels) - w) * weight).sum(axis=1)
                better = err < best_err if best is not None else np.ones(len(w), bool)
                best = levels if best is None else np.where(better[:, None], levels, best)
                best_err = err if best_err is None else np.where(better, err, best_err)
        return best
    levels = np.quantile(w, (np.arange(m) + 0.5) / m, axis=1).T
    for _ in range(25):
        idx = np.abs(w[:, :, None] - levels[:, None, :]).argmin(axis=2)
        onehot = (idx[:, :, None] == np.arange(m)) * weight[:, :, None]
        mass = onehot.sum(axis=1)
        levels = np.where(mass > 0, (onehot * w[:, :, None]).sum(axis=1) / np.maximum(mass, 1e-12), levels)
    return np.sort(levels, axis=1)


def nearest(w: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Each entry of w [n, k] (or [n]) rounded to the nearest of its row's levels [n, m]."""
    flat = w.ndim == 1
    w2 = w[:, None] if flat else w
    out = np.take_along_axis(levels, np.abs(w2[:, :, None] - levels[:, None, :]).argmin(axis=2), axis=1)
    return out[:, 0] if flat else out


def level_quant(w: np.ndarray, bits: int, encoder: str, importance, compensated: bool) -> np.ndarray:
    """w with each row at its own levels (row_levels), GPTQ column by column when compensated and the full
    moment is known: the levels are chosen once from the row, as mobile's per-channel scale is."""
    from mtpkit.export.int4 import _inverse_factor, _normalised

    w = np.array(w, np.float32)
    n, k = w.shape
    full, diagonal = moments(importance)
    weight = np.ones((1, k), np.float32) if diagonal is None else _normalised(diagonal)[None, :]
    levels = row_levels(w, bits, encoder, weight)
    if not (full and compensated):
        return nearest(w, levels)
    factor, out = _inverse_factor(np.asarray(importance, np.float64)), np.empty_like(w)
    for j in range(k):
        out[:, j] = nearest(w[:, j], levels)
        w[:, j + 1:] -= np.outer((w[:, j] - out[:, j]) / factor[j, j], factor[j, j + 1:])
    return out


def rotated(w: np.ndarray, importance, block: int, quantize) -> np.ndarray:
    """quantize(w R, importance seen through R) R^T, R a random-sign block-diagonal Hadamard (the largest power of
    two up to `block` that divides the width): the weight's outliers spread over their block before rounding."""
    k = w.shape[1]
    size = max(b for b in (1 << i for i in range(12)) if b <= block and k % b == 0)
    h = np.ones((1, 1))
    while len(h) < size:
        h = np.block([[h, h], [h, -h]])
    signs = np.random.default_rng(k).choice([-1.0, 1.0], size=k)
    r = signs[:, None] * np.kron(np.eye(k // size), h / np.sqrt(size))
    if importance is not None:
        importance = r.T @ importance @ r if np.ndim(importance) == 2 else np.einsum("ij,i,ij->j", r, importance, r)
    return quantize(w @ r, importance) @ r.T


def kind_of(name: str, shared: set[int]) -> str | None:
    if "embed_tokens_per_layer" in name:
        return "ple"
    if "per_layer" in name:
        return None  # the per-layer projections: 8 bits throughout
    if "embed_tokens" in name:
        return "lookup"
    if "lm_head" in name:
        return "head"
    layer = re.search(r"layers\.(\d+)\.", name)
    if any(a in name for a in ATT):
        return "att"
    if "mlp" in name and layer:
        return "mlp_shared" if int(layer.group(1)) in shared else "mlp"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--windows", type=int, default=32, help="held-out windows of 160 tokens (default 32)")
    p.add_argument("--out", type=Path, help="write the Markdown table here (default: stdout)")
    p.add_argument("--cases", default="", help="only the rows whose name contains this text (default: every row)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    model, float_sd, importance, windows, want = _setup(args.windows)
    text_cfg = model.config.get_text_config()
    shared = set(range(text_cfg.num_hidden_layers - text_cfg.num_kv_shared_layers, text_cfg.num_hidden_layers))
    lines = ["| recipe | attention / lm_head GPTQ | top-1 | mean KL | E2B target + drafter (GB) |",
             "|---|---|---:|---:|---:|"]
    for name, choice, compensate_more in [c for c in CASES if args.cases in c[0]]:
        last = set(sorted(shared)[-choice["last_shared"]:]) if "last_shared" in choice else \
            set(sorted(shared)[:choice["first_shared"]]) if "first_shared" in choice else shared
        top1, kl = _measure(model, float_sd, importance, windows, want, choice, compensate_more, last)
        gb = e2b_gb(choice, len(shared))
        lines.append(f"| {name} | {'yes' if compensate_more else 'no'} | {top1:.4f} | {kl:.2e} | {gb:.3f} |")
        print(lines[-1], file=sys.stderr, flush=True)
    text = f"Trained tiny pair, {sum(len(w) - 1 for w in windows)} held-out positions.\n\n" + "\n".join(lines) + "\n"
    (args.out.write_text(text) if args.out else sys.stdout.write(text))
    return 0


def _setup(n_windows: int):
    """The pair's target with its lm_head untied (the two copies differ on LiteRT), calibration moments of every
    projection and of the lm_head input, and the float logits on held-out windows."""
    from tokenizers import Tokenizer

    from mtpkit.export import calibration
    from mtpkit.export.checkpoint import resolve
    from mtpkit.export.models import target_adapter

    source = resolve(str(PAIR), "target")
    model = target_adapter(source).load(source)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    float_sd = {k: v.clone() for k, v in model.state_dict().items()}
    tok = Tokenizer.from_file(str(PAIR / "tokenizer.json"))
    prompts, _ = calibration.load(None, lambda t: tok.encode(t, add_special_tokens=False).ids, 2)
    importance = calibration.importance(model, prompts, ("mlp.gate_proj", "mlp.up_proj", *ATT))
    moment = {"sum": 0, "n": 0}

    def head_input(module, args, output):
        x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
        moment["sum"], moment["n"] = moment["sum"] + (x.T @ x).numpy(), moment["n"] + x.shape[0]

    handle = model.lm_head.register_forward_hook(head_input)
    with torch.no_grad():
        for ids in prompts:
            model(torch.tensor([ids]))
    handle.remove()
    importance["lm_head"] = moment["sum"] / moment["n"]
    windows = held_out_windows(PAIR, None, windows=n_windows)
    with torch.no_grad():
        want = [model(torch.tensor([ids])).logits[0].double() for ids in windows]
    return model, float_sd, importance, windows, want


def _measure(model, float_sd, importance, windows, want, choice, compensate_more: bool, shared) -> tuple:
    from mtpkit.export.int4 import weight_key

    state = {}
    for name, value in float_sd.items():
        kind = kind_of(name, shared) if value.ndim == 2 else None
        if value.ndim != 2 or (kind is None and "per_layer" not in name and "norm" in name):
            continue
        bits, block = choice[kind] if kind else (8, C)
        key = "lm_head" if kind == "head" else weight_key(name)
        compensated = "gate_proj" in name or "up_proj" in name or compensate_more and kind in ("att", "head")
        block = block if block and value.shape[1] % block == 0 else C
        encoder = choice.get("encoder") if bits < 8 else None
        quantize = (lambda w, imp: level_quant(w, bits, encoder, imp, compensated)) if encoder else \
            (lambda w, imp: fake_quant(w, bits, block, imp, compensated))  # noqa: E731
        w, imp = value.double().numpy(), importance.get(key or "")
        w = rotated(w, imp, choice["rotate"], quantize) if choice.get("rotate") and bits < 8 else quantize(w, imp)
        state[name] = torch.from_numpy(w.astype(np.float32))
    scores = agreement(model, float_sd, state, windows, want)
    return scores["top1"], scores["kl"]


if __name__ == "__main__":
    raise SystemExit(main())
