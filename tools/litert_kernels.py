"""Which LiteRT (XNNPACK) weight layout verifies several tokens cheaply and stays batch-invariant, at E2B's MLP
widths: the LiteRT counterpart of tools/verify_kernels.py.

Builds one float graph of `--layers` MLP pairs (hidden -> ffn -> hidden, distinct random weights, so they stream
from memory as a real decoder's do) per row count, quantizes it with each ai-edge-quantizer recipe below (the
layouts mtpkit's LiteRT recipes write: int4 blocks of 32 with fp16 scales, int8 per channel), and times a decode
call (1 row) against a verify call (5 rows), interleaved over `--rounds`, on `--threads` threads. It also checks
that every row of the 5-row call equals, bit for bit, the same row run alone. Not run in CI.

    .venv/bin/python tools/litert_kernels.py [--layers 4] [--threads 1] [--rounds 30] [--work DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

HIDDEN, FFN, ROWS = 1536, 6144, 5  # E2B's MLP; a verify of 4 drafts
RECIPES = {"int4 b32 (mtpkit int4)": "dynamic_wi4b32_afp32", "int4 b64": "dynamic_wi4b64_afp32",
           "int4 per channel": "dynamic_wi4c_afp32", "int8 per channel (mtpkit int8)": "dynamic_wi8_afp32"}


def build(work: Path, layers: int) -> dict[str, dict[int, Path]]:
    """{recipe: {rows: .tflite}} from one set of random weights."""
    import litert_torch
    import torch
    from ai_edge_quantizer import quantizer, recipe

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, FFN, bias=False) for _ in range(layers))
            self.down = torch.nn.ModuleList(torch.nn.Linear(FFN, HIDDEN, bias=False) for _ in range(layers))

        def forward(self, x):
            for up, down in zip(self.up, self.down):
                x = down(torch.nn.functional.gelu(up(x)))
            return x

    torch.manual_seed(0)
    model, files = MLP().eval(), {name: {} for name in RECIPES}
    for rows in (1, ROWS):
        float_file = work / f"float_{rows}.tflite"
        litert_torch.convert(model, (torch.randn(1, rows, HIDDEN),)).export(str(float_file))
        for name, fn in RECIPES.items():
            files[name][rows] = work / f"{fn}_{rows}.tflite"
            quantizer.Quantizer(str(float_file), getattr(recipe, fn)()).quantize().export_model(str(files[name][rows]))
        float_file.unlink()
    return files


def runner(path: Path, threads: int):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path), num_threads=threads)
    run = interpreter.get_signature_runner()
    (name,) = run.get_input_details()
    return lambda x: next(iter(run(**{name: x}).values()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--work", type=Path, default=None, help="folder for the graphs (default: a temporary one)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        files = build(args.work or Path(tmp), args.layers)
        x = np.random.default_rng(0).standard_normal((1, ROWS, HIDDEN)).astype(np.float32)
        calls = {(name, rows): runner(path, args.threads) for name, by in files.items() for rows, path in by.items()}
        feeds = {1: x[:, :1], ROWS: x}
        samples: dict = {key: [] for key in calls}
        for r in range(args.rounds + 1):  # round 0 warms up
            for (name, rows), call in calls.items():
                t0 = time.perf_counter()
                call(feeds[rows])
                if r:
                    samples[(name, rows)].append(time.perf_counter() - t0)
        print(f"| weights | decode ms | verify({ROWS}) ms | verify / decode | rows bit-equal alone |\n|---|---|---|---|---|")
        for name in files:
            one, five = (1e3 * statistics.median(samples[(name, n)]) for n in (1, ROWS))
            together = calls[(name, ROWS)](x)[0]
            alone = [calls[(name, 1)](x[:, i:i + 1])[0, 0] for i in range(ROWS)]
            equal = all(np.array_equal(together[i], alone[i]) for i in range(ROWS))
            print(f"| {name} | {one:.2f} | {five:.2f} | {five / one:.2f} | {'yes' if equal else 'no'} |")
    print(f"\n{args.layers} MLP pairs {HIDDEN} -> {FFN} -> {HIDDEN}, {args.threads} thread(s), median of {args.rounds} "
          "interleaved rounds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
