"""Which weights `--quant int4` should keep at 8 bits: each tensor kind (and, with --per-layer, each kind in each
layer) quantized to 4 bits alone while every other weight is at 8 bits, in PyTorch, then compared with the float
model teacher-forced on held-out text (top-1 agreement, mean KL). The kinds that cost the most per byte saved are
the model adapter's INT4_KEEP_8BIT (export/models/*.py). Not run in CI.

    .venv/bin/python tools/int4_sensitivity.py [TARGET] [--text FILE.jsonl] [--per-layer] [--out report.md]

- TARGET: a gemma4 / gemma4_text checkpoint (default: the trained tiny pair's target).
- 4 bits: export/int4.py's encoder (blockwise 32, searched scales weighted by the built-in calibration's
  activations, export/calibration.py); 8 bits: symmetric per output channel. The per-layer-embedding table stays
  float throughout (it is gathered, and --ple-quant measures it separately).
- held-out text: --text (one {"text": ...} per line), or for the tiny pair the held-out corpus files it was never
  trained on (mtpkit/tiny/training/corpus.py), 16 windows of 160 tokens.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "mtpkit/tiny/assets/tiny_pair/target"


def held_out_windows(target: Path, text_file: Path | None, windows: int = 16, length: int = 160) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(target / "tokenizer.json"))
    if text_file:
        texts = [json.loads(line)["text"] for line in text_file.read_text().splitlines() if line.strip()]
    else:
        from mtpkit.tiny.training.corpus import load_corpus

        texts = load_corpus(max_train_files=1).heldout
    ids = tok.encode("".join(texts), add_special_tokens=False).ids
    stride = max(length, len(ids) // windows)
    return [[2, *ids[s:s + length]] for s in range(0, len(ids) - length, stride)][:windows]


def _int8(w: np.ndarray) -> np.ndarray:
    scale = np.maximum(np.abs(w).max(axis=1, keepdims=True), 1e-9) / 127
    return np.clip(np.rint(w / scale), -127, 127) * scale


def _int4(w: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    from mtpkit.export import int4

    return int4.decode(*int4.encode(w, 32, importance))


def measure(model, float_sd: dict, weights: dict, four: set[str], importance: dict, windows, want) -> dict:
    """top-1 / mean KL against the float logits with the weights in `four` at 4 bits and the rest at 8."""
    from mtpkit.export.int4 import weight_key

    state = {}
    for names, w in weights.items():
        value = torch.from_numpy((_int4(w, importance.get(weight_key(names) or "")) if names in four
                                  else _int8(w)).astype(np.float32))
        state.update(dict.fromkeys(names.split(" = "), value))
    return agreement(model, float_sd, state, windows, want)


def agreement(model, float_sd: dict, state: dict, windows, want) -> dict:
    """top-1 / mean KL against the float logits `want` with `state` loaded over the float weights (restored after)."""
    model.load_state_dict({**float_sd, **state})
    agree, kl = [], []
    with torch.no_grad():
        for ids, ref in zip(windows, want):
            got = model(torch.tensor([ids])).logits[0].double()
            agree.append((got.argmax(-1) == ref.argmax(-1)).numpy())
            kl.append(torch.sum(ref.softmax(-1) * (ref.log_softmax(-1) - got.log_softmax(-1)), -1).numpy())
    model.load_state_dict(float_sd)
    return {"top1": float(np.concatenate(agree).mean()), "kl": float(np.concatenate(kl).mean())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("target", nargs="?", type=Path, default=PAIR, help="target checkpoint (default: the tiny pair)")
    p.add_argument("--text", type=Path, help="held-out text, one {\"text\": ...} per line")
    p.add_argument("--per-layer", action="store_true", help="each kind in each layer, not only each kind")
    p.add_argument("--out", type=Path, help="write the Markdown table here (default: stdout)")
    args = p.parse_args(argv)
    from mtpkit.export import calibration
    from mtpkit.export.checkpoint import resolve
    from mtpkit.export.int4 import weight_key
    from mtpkit.export.models import target_adapter

    torch.set_num_threads(1)
    source = resolve(str(args.target), "target")
    model = target_adapter(source).load(source)
    float_sd = {k: v.clone() for k, v in model.state_dict().items()}
    weights, seen = {}, {}
    for k, v in model.state_dict().items():  # a tied table is one weight under two names: measured once
        if v.ndim == 2 and v.shape[1] % 32 == 0 and "per_layer" not in k:
            seen.setdefault(v.data_ptr(), []).append(k)
    weights = {" = ".join(names): float_sd[names[0]].double().numpy() for names in seen.values()}
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(args.target / "tokenizer.json"))
    prompts, _ = calibration.load(None, lambda t: tok.encode(t, add_special_tokens=False).ids, 2)
    importance = calibration.importance(model, prompts)
    windows = held_out_windows(args.target, args.text)
    with torch.no_grad():
        want = [model(torch.tensor([ids])).logits[0].double() for ids in windows]
    kind = (lambda n: weight_key(n) or n) if args.per_layer else (lambda n: re.sub(r"layers\.\d+\.", "", weight_key(n) or n))
    groups: dict[str, set[str]] = {}
    for name in weights:
        groups.setdefault(kind(name), set()).add(name)
    base = measure(model, float_sd, weights, set(), importance, windows, want)
    rows = []
    for group, names in sorted(groups.items()):
        got = measure(model, float_sd, weights, names, importance, windows, want)
        params = sum(weights[n].size for n in names)
        rows.append((group, params, got, (got["kl"] - base["kl"]) / (params / 2 / 1e6)))
    lines = [f"All at 8 bits: top-1 {base['top1']:.4f}, mean KL {base['kl']:.2e} ({sum(len(w) for w in windows)} "
             f"positions of held-out text)", "",
             "| weights at 4 bits | parameters | top-1 | mean KL | KL added per MB saved |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {g} | {n:,} | {r['top1']:.4f} | {r['kl']:.2e} | {per:.2e} |"
              for g, n, r, per in sorted(rows, key=lambda r: -r[3])]
    text = "\n".join(lines) + "\n"
    (args.out.write_text(text) if args.out else sys.stdout.write(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
