"""Held-out text of the trained tiny pair as JSONL for `mtpkit quant-report --heldout`: windows of the held-out
corpus files the pair was never trained on (mtpkit/tiny/training/corpus.py), each starting on a whole line.
Not the int4 calibration set (export/calibration.py BUILT_IN); tests/test_int4.py checks they share nothing.

    .venv/bin/python tools/heldout_text.py OUT.jsonl [--windows 64] [--chars 900]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def windows(count: int = 64, chars: int = 900) -> list[str]:
    from mtpkit.tiny.training.corpus import load_corpus

    text = "".join(load_corpus(max_train_files=1).heldout)
    stride = (len(text) - chars) // count
    out = []
    for i in range(count):
        start = text.find("\n", i * stride) + 1  # a whole line first
        out.append(text[start:start + chars])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--windows", type=int, default=64,
                   help="windows (64: held-out top-1 steady to about 0.005, its standard error in the report)")
    p.add_argument("--chars", type=int, default=900, help="characters per window (about 200 tokens of code)")
    args = p.parse_args(argv)
    args.out.write_text("".join(json.dumps({"text": t}) + "\n" for t in windows(args.windows, args.chars)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
