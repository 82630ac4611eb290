"""Is speculative output exactly plain output on an export? Greedy plain decoding against speculative decoding at
every fixed draft length and auto, on the trained tiny pair's held-out prompts (those `mtpkit demo` times) or a
JSONL file, token for token; and, over the same prompts, how many verified logit rows differ in any bit from the
same tokens decoded one at a time at the same positions. Not run in CI (tests/test_litert_quant.py asserts the row
check on the structural variants).

    .venv/bin/python tools/lossless_check.py EXPORT [--backend litert] [--prompts FILE] [--max-new-tokens 64]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def prompts_of(path: Path | None) -> list[tuple[str, str]]:
    if path is None:
        from mtpkit.tiny.demo import heldout_prompts

        return heldout_prompts()
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(r.get("category", "custom"), r["prompt"]) for r in rows]


def rows_differing(target, ids: list[int], k: int) -> tuple[int, int]:
    """(rows differing, rows compared): a verify of the next k + 1 prompt tokens against decoding them one by one."""
    if len(ids) < k + 2:
        return 0, 0
    split = len(ids) - (k + 1)
    target.forward(ids[:split], 0)
    verified = target.forward(ids[split:], split)[0][-(k + 1):]
    decoded = [target.forward([t], split + j)[0][-1] for j, t in enumerate(ids[split:])]  # rewind: a position
    return sum(not np.array_equal(v, d) for v, d in zip(verified, decoded)), k + 1


def check(folder: Path, backend: str | None, prompts: list[tuple[str, str]], max_new: int) -> dict:
    from mtpkit.runtime.engine import Engine, GenConfig

    engine = Engine(folder, backend=backend)
    max_draft = engine.target.max_draft or 4
    modes = {f"k={k}": k for k in range(1, max_draft + 1)} | {"auto": None}
    runs, equal, differing, compared = 0, 0, 0, 0
    first_differences = []
    for category, text in prompts:
        ids = engine.codec.encode(text)
        plain = [t for t, _ in engine.generate(ids, GenConfig(max_new_tokens=max_new, mtp=False))]
        for name, k in modes.items():
            spec = [t for t, _ in engine.generate(ids, GenConfig(max_new_tokens=max_new, num_assistant_tokens=k))]
            runs, equal = runs + 1, equal + (spec == plain)
            if spec != plain:
                first_differences.append({"prompt": category, "mode": name,
                                          "at": next(i for i, (a, b) in enumerate(zip(spec + [-1], plain)) if a != b)})
        d, n = rows_differing(engine.target, ids + plain, max_draft)
        differing, compared = differing + d, compared + n
    return {"export": str(folder), "backend": engine.backend.kind, "recipe": engine.manifest.backend(
        engine.backend.kind).graphs["target"].recipe, "prompts": len(prompts), "max_new_tokens": max_new,
        "modes": list(modes), "runs": runs, "equal": equal, "first_differences": first_differences,
        "verified_rows_differing": differing, "verified_rows_compared": compared}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("export", type=Path)
    p.add_argument("--backend", default=None, help="backend to check (default: the export's first)")
    p.add_argument("--prompts", type=Path, help="JSONL of {category, prompt} (default: the trained pair's held-out)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    r = check(args.export, args.backend, prompts_of(args.prompts), args.max_new_tokens)
    r["command"] = " ".join(["python tools/lossless_check.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"{r['backend']} {r['recipe']}: speculative == plain in {r['equal']}/{r['runs']} runs ({r['prompts']} prompts "
          f"x {', '.join(r['modes'])}, {r['max_new_tokens']} new tokens); verified rows differing from one-by-one "
          f"decoding: {r['verified_rows_differing']}/{r['verified_rows_compared']}")
    for d in r["first_differences"]:
        print(f"  differs: {d['prompt']} {d['mode']} from token {d['at']}")
    if args.json:
        args.json.write_text(json.dumps(r, indent=1) + "\n")
    return 0 if r["equal"] == r["runs"] and r["verified_rows_differing"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
