"""How long int4's calibration takes on a full-size checkpoint (the forward passes whose activations weight the scale
search and feed GPTQ), this tree's export/calibration.py against the same file at another commit, interleaved in one
run, with the moments compared. The target is held in bf16 and computed in fp32, as `mtpkit export` does at full
size. Not run in CI.

    .venv/bin/python tools/calibration_time.py CHECKPOINT/target [--windows 16] [--rounds 1] [--batch 8]
        [--against COMMIT]

CHECKPOINT: e.g. `tools/random_checkpoint.py /tmp/E2B --model e2b`. Windows: the first N of the built-in set's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from encode_time import module_at  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("target", help="a full-size target checkpoint folder")
    p.add_argument("--windows", type=int, default=0, help="the first N calibration windows (default: all)")
    p.add_argument("--rounds", type=int, default=1, help="timed runs per commit (default 1)")
    p.add_argument("--batch", type=int, default=0, help="windows per pass for this tree (default: its own BATCH)")
    p.add_argument("--against", default="f188192", help="the commit to compare with (default f188192)")
    args = p.parse_args(argv)
    from tokenizers import Tokenizer

    from mtpkit.export import calibration
    from mtpkit.export.checkpoint import resolve
    from mtpkit.export.models import target_adapter

    source = resolve(args.target, "target")
    adapter = target_adapter(source)
    model = adapter.load(source, "bf16")
    tok = Tokenizer.from_file(str(source.folder / "tokenizer.json"))
    prompts, _ = calibration.load(None, lambda t: tok.encode(t, add_special_tokens=False).ids, 2)
    prompts = prompts[:args.windows or None]
    print(f"{len(prompts)} windows, {sum(map(len, prompts))} tokens", flush=True)
    versions = {args.against: module_at(args.against, "calibration"), "this tree": calibration}
    seconds, moments = {name: [] for name in versions}, {}
    with adapter.fp32_compute(model):
        for _ in range(args.rounds):
            for name, module in versions.items():
                start = time.perf_counter()
                batch = {"batch": args.batch} if args.batch and module is calibration else {}
                moments[name] = module.importance(model, prompts, adapter.INT4_COMPENSATE, **batch)
                seconds[name].append(time.perf_counter() - start)
                print(f"  {name}: {seconds[name][-1]:.1f} s", flush=True)
    before, after = (min(s) for s in seconds.values())
    old, new = moments[args.against], moments["this tree"]
    worst = max(float(np.abs(new[k] - old[k]).max() / max(np.abs(old[k]).max(), 1e-30)) for k in old)
    print(f"{args.against} {before:.1f} s, this tree {after:.1f} s: {before / after:.2f}x; same keys: "
          f"{set(old) == set(new)}, largest moment difference {worst:.1e} of its largest entry", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
