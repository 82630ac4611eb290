"""Which LiteRT (XNNPACK) weight layout verifies several tokens cheaply and stays batch-invariant, at E2B's MLP
widths: the LiteRT counterpart of tools/verify_kernels.py.

Builds one float graph of `--layers` MLP pairs (hidden -> ffn -> hidden, distinct random weights, so they stream
from memory as a real decoder's do) per row count, quantizes it with each ai-edge-quantizer recipe below (the
layouts mtpkit's LiteRT recipes write: int4 blocks of 32 with fp16 scales, int8 per channel), and times a decode
call (1 row) against verify calls of `--rows` rows each, interleaved over `--rounds`, on `--threads` threads. It
also checks that every row of the longest call equals, bit for bit, the same row run alone. Not run in CI.

XNNPACK multiplies a call's rows in tiles of its kernel's row count (`mr` in XNNPACK's src/configs/gemm-config.c:
4 for int8 on AVX2 and on every ARM64 path, 8 on AVX-512), streaming the weights once per tile: the cost steps up
just past a multiple of it, which `--rows 2,3,4,5,8` shows.

    .venv/bin/python tools/litert_kernels.py [--layers 4] [--threads 1] [--rounds 30] [--rows 5] [--work DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

HIDDEN, FFN = 1536, 6144  # E2B's MLP
RECIPES = {"int4 b32 (mtpkit int4)": "dynamic_wi4b32_afp32", "int4 b64": "dynamic_wi4b64_afp32",
           "int4 per channel": "dynamic_wi4c_afp32", "int8 per channel (mtpkit int8)": "dynamic_wi8_afp32"}


def build(work: Path, layers: int, rows: list[int]) -> dict[str, dict[int, Path]]:
    """{recipe: {rows: .tflite}} from one set of random weights."""
    import litert_torch
    import torch
    from ai_edge_quantizer import quantizer, recipe

    from mtpkit.runtime.quiet import output_captured

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
    for n in (1, *rows):
        float_file = work / f"float_{n}.tflite"
        with output_captured("litert-torch conversion"):  # its progress prints would interleave with the table
            litert_torch.convert(model, (torch.randn(1, n, HIDDEN),)).export(str(float_file))
            for name, fn in RECIPES.items():
                files[name][n] = work / f"{fn}_{n}.tflite"
                quantizer.Quantizer(str(float_file), getattr(recipe, fn)()).quantize().export_model(
                    str(files[name][n]))
        float_file.unlink()
    return files


def runner(path: Path, threads: int):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path), num_threads=threads)
    run = interpreter.get_signature_runner()
    (name,) = run.get_input_details()
    return lambda x: next(iter(run(**{name: x}).values()))


def timed(files: dict[str, dict[int, Path]], threads: int, rounds: int, longest: int) -> dict:
    """{(recipe, rows): seconds per call} over interleaved rounds, and {(recipe, 'equal'): rows bit-equal alone}."""
    x = np.random.default_rng(0).standard_normal((1, longest, HIDDEN)).astype(np.float32)
    calls = {(name, n): runner(path, threads) for name, by in files.items() for n, path in by.items()}
    samples: dict = {key: [] for key in calls}
    for r in range(rounds + 1):  # round 0 warms up
        for (name, n), call in calls.items():
            t0 = time.perf_counter()
            call(x[:, :n])
            if r:
                samples[(name, n)].append(time.perf_counter() - t0)
    for name in files:
        together = calls[(name, longest)](x)[0]
        samples[(name, "equal")] = all(np.array_equal(together[i], calls[(name, 1)](x[:, i:i + 1])[0, 0])
                                       for i in range(longest))
    return samples


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--rows", default="5", help="comma-separated verify lengths to time against a decode (default 5)")
    p.add_argument("--work", type=Path, default=None, help="folder for the graphs (default: a temporary one)")
    args = p.parse_args(argv)
    rows = sorted({int(n) for n in args.rows.split(",")} - {1})
    if not rows or rows[0] < 1:
        p.error("--rows takes verify lengths >= 2, e.g. 2,3,4,5,8")
    with tempfile.TemporaryDirectory() as tmp:
        files = build(args.work or Path(tmp), args.layers, rows)
        samples = timed(files, args.threads, args.rounds, rows[-1])
    print(f"| weights | decode ms | {' | '.join(f'verify({n}) / decode' for n in rows)} | rows bit-equal alone |\n"
          f"|---|---:|{'---:|' * len(rows)}---|")
    for name in files:
        one = statistics.median(samples[(name, 1)])
        ratios = " | ".join(f"{statistics.median(samples[(name, n)]) / one:.2f}" for n in rows)
        print(f"| {name} | {1e3 * one:.2f} | {ratios} | {'yes' if samples[(name, 'equal')] else 'no'} |")
    print(f"\n{args.layers} MLP pairs {HIDDEN} -> {FFN} -> {HIDDEN}, {args.threads} thread(s), median of {args.rounds} "
          "interleaved rounds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
