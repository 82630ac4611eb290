"""`mtpkit quant-report`: every recipe pair derived from one float export, measured against the float model.

The matrix is backend x target recipe x drafter recipe. For each row: file size, teacher-forced fidelity of the
target (top-1 agreement, mean KL, max logit error), greedy prefix match and drafter acceptance in the runtime,
tokens per target call, and decode ms/token plain and speculative. Speeds come from one run, interleaved across
recipes, so their ratios compare; absolute times are this machine's.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import shutil
import statistics
from pathlib import Path

from mtpkit.errors import UsageError
from mtpkit.runtime.speculative import DEFAULT_NUM_ASSISTANT_TOKENS

from . import recipes as recipe_table
from .recipes import FP32, recipe

EPILOG = """Writes OUT/report.json, OUT/report.md, OUT/size_vs_top1.png and OUT/acceptance.png; with --keep-exports also
the exports under OUT/exports/ (one float export; every other recipe is derived from it).

example:
  mtpkit quant-report mtpkit/tiny/assets/tiny_pair/target --drafter mtpkit/tiny/assets/tiny_pair/drafter \\
      --out docs/quant-report
"""


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.epilog = EPILOG
    p.add_argument("target", help="target checkpoint: local folder or hub id")
    p.add_argument("--drafter", required=True, help="drafter checkpoint: local folder or hub id")
    p.add_argument("--out", required=True, type=Path, help="report folder to create")
    p.add_argument("--backend", default="onnx", help="onnx, litert or onnx,litert: the backend axis (default onnx)")
    p.add_argument("--recipes", default=",".join(recipe_table.names()), help="target recipes (default: all)")
    p.add_argument("--drafter-recipes", default="fp32,int8,int4", help="drafter recipes (default fp32,int8,int4)")
    p.add_argument("--block-size", type=int, default=32, choices=(32, 64, 128))
    p.add_argument("--max-cache-len", type=int, default=512)
    p.add_argument("--max-new-tokens", type=int, default=32, help="decoded tokens per prompt and run")
    p.add_argument("--repeats", type=int, default=3, help="interleaved timing rounds (median reported)")
    p.add_argument("--heldout", type=Path, metavar="FILE.jsonl",
                   help='held-out text, one {"text": ...} per line: each row is also measured on it (teacher-forced '
                        "over the text after its first 32 tokens, greedy prefix match from those 32); it must not "
                        "be the int4 calibration text (tools/heldout_text.py writes the tiny pair's)")
    p.add_argument("--keep-exports", action="store_true", help="keep OUT/exports (every derived export; large)")
    p.add_argument("--force", action="store_true", help="replace OUT")


def run(args: argparse.Namespace) -> int:
    recipes = [_recipes(args.recipes, "--recipes"), _recipes(args.drafter_recipes, "--drafter-recipes")]
    if args.out.exists() and not args.force:
        raise UsageError(f"{args.out} already exists; pass --force to replace it")
    backends = tuple(b.strip() for b in args.backend.split(",") if b.strip())  # checked by the float export
    report = quant_report(args.target, args.drafter, args.out, *recipes, backends=backends, block_size=args.block_size,
                          max_cache_len=args.max_cache_len, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                          keep_exports=args.keep_exports, heldout=args.heldout)
    print((args.out / "report.md").read_text())
    return 0 if report["rows"] else 1


def _recipes(text: str, flag: str) -> list[str]:
    names = [r.strip() for r in text.split(",") if r.strip()]
    bad = [r for r in names if r not in recipe_table.RECIPES]
    if bad or not names:
        raise UsageError(f"{flag}: unknown recipe {bad[0] if bad else text!r}; choose from "
                         f"{', '.join(recipe_table.names())}")
    return names


def quant_report(target: str, drafter: str, out: Path, recipes: list[str], drafter_recipes: list[str], *,
                 backends: tuple[str, ...] = ("onnx",), block_size: int = 32, max_cache_len: int = 512,
                 max_new_tokens: int = 32, repeats: int = 3, keep_exports: bool = False,
                 heldout: Path | None = None) -> dict:
    from tqdm import tqdm

    from mtpkit.export.config import ExportConfig
    from mtpkit.export.pipeline import export_model

    recipes, drafter_recipes = _lattice_where_held(recipes, target), _lattice_where_held(drafter_recipes, drafter)
    if out.exists():
        shutil.rmtree(out)
    exports = out / "exports"
    float_dir = export_model(ExportConfig(target=target, drafter=drafter, out=exports / "fp32-fp32",
                                          backend=",".join(backends), max_cache_len=max_cache_len,
                                          quant="fp32", drafter_quant="fp32"))  # the baseline, even of a QAT pair
    # the float pair is always measured: it is the baseline every ratio is taken against
    baseline = (FP32.name, FP32.name)
    pairs = [baseline] + [p for p in itertools.product(recipes, drafter_recipes) if p != baseline]
    folders = {pair: derive_quantized(float_dir, exports, pair, block_size, checkpoints=(target, drafter))
               for pair in tqdm(pairs, desc="quantizing", unit="pair")}
    rows = _measure(folders, float_dir, target, max_new_tokens, repeats, heldout)
    report = {"target": target, "drafter": drafter, "backends": list(backends), "block_size": block_size,
              "max_new_tokens": max_new_tokens, "repeats": repeats, "heldout": str(heldout) if heldout else None,
              "calibration": _calibration(folders), "rows": rows}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(markdown(report))
    _plots(rows, out)
    if not keep_exports:
        shutil.rmtree(exports)
    return report


def derive_quantized(float_dir: Path, exports: Path, pair: tuple[str, str], block_size: int,
                     ple_bits: int | None = None, checkpoints: tuple[str, str] | None = None,
                     low_bit: tuple[str, ...] = ()) -> Path:
    """A copy of the float export with the pair's recipes applied to every backend in it (the float export
    itself for fp32-fp32); ple_bits: the per-layer-embedding table's bits (`--ple-quant`; None: the target
    recipe's own, 4 under mobile, else 8).
    checkpoints (target, drafter; default: the folders the float export was read from) give the int4 recipes
    their model adapters and int4 its calibration of the target on the built-in set, as `mtpkit export` does.
    low_bit: the target weights lowered to the recipe's low_bits (what --max-size chooses, export/sizes.fit_size)."""
    from mtpkit.runtime.manifest import load_manifest

    from .backends import backend_module

    recipes = {"target": recipe(pair[0]), "drafter": recipe(pair[1])}
    if not any(r.quantized for r in recipes.values()):
        return float_dir
    ple_bits = recipes["target"].ple_bits if ple_bits is None else ple_bits
    folder = exports / ("-".join(pair) + (f"-ple{ple_bits}" if ple_bits != recipes["target"].ple_bits else "")
                        + (f"-low{len(low_bit)}" if low_bit else ""))
    shutil.copytree(float_dir, folder)
    manifest = load_manifest(folder)
    plans = _plans(recipes, folder, manifest, checkpoints, ple_bits, low_bit)
    backends = {kind: backend_module(kind).quantize(folder, backend, recipes, block_size, ple_bits=ple_bits,
                                                     plans=plans)
                for kind, backend in manifest.backends.items()}
    dataclasses.replace(manifest, backends=backends).save(folder)
    return folder


def _plans(recipes: dict, folder: Path, manifest, checkpoints: tuple[str, str] | None, ple_bits: int,
           low_bit: tuple[str, ...] = ()) -> dict:
    from . import calibration, lattice
    from .checkpoint import resolve
    from .models import drafter_adapter, target_adapter
    from .pipeline import _encoder

    if not any(r.int4 or r.lattice for r in recipes.values()):
        return {}
    if checkpoints is None:  # the folders the float export read its weights from
        checkpoints = (manifest.source["target"]["folder"], manifest.source["drafter"]["folder"])
    sources = {"target": resolve(checkpoints[0], "target"), "drafter": resolve(checkpoints[1], "drafter")}
    adapters = {"target": target_adapter(sources["target"]), "drafter": drafter_adapter(sources["drafter"])}
    target = adapters["target"].load(sources["target"]) if recipes["target"].calibrated else None
    plans = calibration.plans(recipes, target, adapters, _encoder(folder), manifest.tokens.bos, ple_bits=ple_bits,
                              low_bit=low_bit)
    if any(r.lattice for r in recipes.values()):  # --quant checkpoint: the checkpoints' own lattices
        models = {side: adapters[side].load(sources[side]) for side, r in recipes.items() if r.lattice}
        plans.update(lattice.plans({s: r for s, r in recipes.items() if r.lattice}, models))
    return plans


def _lattice_where_held(names: list[str], checkpoint: str) -> list[str]:
    """The recipes that apply to `checkpoint`: a lattice recipe (checkpoint) only where it is pre-quantized; a
    skipped one is logged."""
    from .lattice import detect_folder

    if not any(recipe(n).lattice for n in names) or detect_folder(checkpoint, weights=True):
        return names
    import logging

    logging.getLogger("mtpkit").info("  quant-report: %s is a float checkpoint; its rows skip %s", checkpoint,
                                     ", ".join(n for n in names if recipe(n).lattice))
    return [n for n in names if not recipe(n).lattice]


def _calibration(folders: dict) -> dict | None:
    """What int4's scales were calibrated on (the same built-in set or file for every derived export)."""
    from mtpkit.runtime.manifest import load_manifest

    for folder in folders.values():
        for backend in load_manifest(folder).backends.values():
            for graph in (backend.options.quantization or {}).values():
                if isinstance(graph, dict) and graph.get("calibration"):
                    return graph["calibration"]
    return None


def heldout_references(target, folder: Path, texts: list[str], prompt_len: int = 32, text_len: int = 128,
                       new_tokens: int = 32) -> tuple[dict, dict]:
    """Two reference dicts (export/reference.py's shape) from held-out texts: (each text's first prompt_len tokens
    followed by its own next text_len tokens, for teacher forcing; the same prompts followed by float greedy's
    new_tokens, for greedy prefix match and acceptance)."""
    import torch

    from mtpkit.runtime.manifest import load_manifest

    from .pipeline import _encoder
    from .reference import greedy_kwargs

    manifest, encode = load_manifest(folder), _encoder(folder)
    text, greedy = {"prompts": []}, {"prompts": []}
    for i, ids in enumerate(encode(t) for t in texts):
        prompt = [manifest.tokens.bos, *ids[:prompt_len]]
        text["prompts"].append({"name": f"heldout{i}", "prompt_ids": prompt,
                                "greedy_ids": ids[prompt_len:prompt_len + text_len]})
        with torch.no_grad():
            out = target.generate(torch.tensor([prompt]), **greedy_kwargs(new_tokens, manifest.eos_ids))
        greedy["prompts"].append({"name": f"heldout{i}", "prompt_ids": prompt, "greedy_ids": out[0, len(prompt):].tolist()})
    return text, greedy


def _measure(folders: dict, float_dir: Path, target_ref: str, max_new_tokens: int, repeats: int,
             heldout: Path | None = None) -> list[dict]:
    from tqdm import tqdm

    from mtpkit.runtime.manifest import load_manifest

    from . import fidelity
    from .checkpoint import resolve
    from .models import target_adapter

    source = resolve(target_ref, "target")
    target = target_adapter(source).load(source)
    reference = json.loads((float_dir / "reference.json").read_text())
    if heldout:
        texts = [json.loads(line)["text"] for line in heldout.read_text().splitlines() if line.strip()]
        held_text, held_greedy = heldout_references(target, float_dir, texts)
    teacher, rows = {}, []
    cases = [(kind, pair, folder) for pair, folder in folders.items() for kind in load_manifest(folder).backends]
    for kind, (t, d), folder in tqdm(cases, desc="measuring fidelity", unit="row"):
        graphs = load_manifest(folder).backend(kind).graphs
        if (kind, t) not in teacher:  # the target's fidelity does not depend on the drafter's recipe
            teacher[(kind, t)] = fidelity.teacher_forced(folder, target, reference, kind)
            if heldout:
                teacher[(kind, t, "heldout")] = {
                    "teacher_forced": fidelity.teacher_forced(folder, target, held_text, kind),
                    "runtime": fidelity.runtime_figures(folder, held_greedy, backend=kind)}
        rows.append({"backend": kind, "target_recipe": t, "drafter_recipe": d,
                     "bytes": {k: g.bytes for k, g in graphs.items() if k != "bundle"},  # the bundle repeats them
                     "teacher_forced": teacher[(kind, t)],
                     "runtime": fidelity.runtime_figures(folder, reference, backend=kind),
                     "heldout": teacher.get((kind, t, "heldout"))})
    speeds = _speeds({(kind, pair): folder for kind, pair, folder in cases}, reference, max_new_tokens, repeats)
    for row in rows:
        row.update(speeds[(row["backend"], (row["target_recipe"], row["drafter_recipe"]))])
    return rows


def _speeds(cases: dict, reference: dict, max_new_tokens: int, repeats: int) -> dict:
    """Decode ms/token, plain and speculative (k=4, or the backend's static cap), medians over rounds
    interleaved across every (backend, pair)."""
    from tqdm import tqdm

    from mtpkit.runtime.engine import Engine, GenConfig

    engines = {case: Engine(folder, backend=case[0]) for case, folder in cases.items()}
    prompts = [p["prompt_ids"] for p in reference["prompts"]]
    modes = lambda engine: {"plain": GenConfig(max_new_tokens=max_new_tokens, mtp=False),  # noqa: E731
                            "speculative": engine.resolve(GenConfig(max_new_tokens=max_new_tokens,
                                                                    num_assistant_tokens=DEFAULT_NUM_ASSISTANT_TOKENS),
                                                          adapt=True)}
    times = {(case, mode): [] for case in engines for mode in ("plain", "speculative")}
    for round_ in tqdm(range(repeats + 1), desc="timing", unit="round"):
        for case, engine in engines.items():
            for mode, cfg in modes(engine).items():
                stats = [engine.run(ids, cfg) for ids in prompts]
                if round_:  # round 0 warms up every session
                    decode = sum(s.total_s - s.ttft_s for s in stats) / sum(max(1, s.new_tokens - 1) for s in stats)
                    times[(case, mode)].append(1e3 * decode)
    return {case: {f"{mode}_ms_per_token": statistics.median(times[(case, mode)])
                   for mode in ("plain", "speculative")} for case in engines}


def markdown(report: dict) -> str:
    baseline = (FP32.name, FP32.name)
    base = {r["backend"]: r for r in report["rows"] if (r["target_recipe"], r["drafter_recipe"]) == baseline}
    held = any(r.get("heldout") for r in report["rows"])
    lines = ["| backend | target | drafter | MB | top-1 | mean KL | max dlogit | greedy prefix | acceptance | "
             "tok/call | plain ms/tok | vs fp32 | spec ms/tok |" + (" held-out top-1 | held-out KL | held-out greedy "
                                                                    "prefix |" if held else ""),
             "|" + "---|" * (16 if held else 13)]
    for r in report["rows"]:
        tf, rt, h = r["teacher_forced"], r["runtime"], r.get("heldout")
        lines.append(f"| {r['backend']} | {r['target_recipe']} | {r['drafter_recipe']} | "
                     f"{sum(r['bytes'].values()) / 1e6:.2f} | "
                     f"{tf['top1_agreement']:.3f} | {tf['mean_kl']:.1e} | {tf['max_abs_logit']:.3f} | "
                     f"{rt['greedy_prefix_match']:.2f} | {100 * (rt['acceptance'] or 0):.0f}% | "
                     f"{rt['tokens_per_target_call']:.2f} | {r['plain_ms_per_token']:.2f} | "
                     f"{base[r['backend']]['plain_ms_per_token'] / r['plain_ms_per_token']:.2f}x | "
                     f"{r['speculative_ms_per_token']:.2f} |" +
                     (f" {h['teacher_forced']['top1_agreement']:.3f} ± {h['teacher_forced']['top1_stderr']:.3f} | "
                      f"{h['teacher_forced']['mean_kl']:.1e} | "
                      f"{h['runtime']['greedy_prefix_match']:.2f} |" if h else (" - | - | - |" if held else "")))
    return "\n".join(lines) + "\n"


def _plots(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        if r["drafter_recipe"] == rows[0]["drafter_recipe"]:
            xy = (r["bytes"]["target"] / 1e6, r["teacher_forced"]["top1_agreement"])
            ax.scatter(*xy, marker="o" if r["backend"] == "onnx" else "s")
            ax.annotate(f"{r['backend']} {r['target_recipe']}", xy)
    ax.set(xlabel="target graph MB", ylabel="teacher-forced top-1 agreement", title="size vs fidelity")
    fig.tight_layout()
    fig.savefig(out / "size_vs_top1.png", dpi=120)
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [f"{r['backend']} {r['target_recipe']}/{r['drafter_recipe']}" for r in rows]
    ax.bar(labels, [100 * (r["runtime"]["acceptance"] or 0) for r in rows])
    ax.set(ylabel="drafter acceptance %", title="acceptance by target/drafter recipe")
    ax.tick_params(axis="x", rotation=60)
    fig.tight_layout()
    fig.savefig(out / "acceptance.png", dpi=120)
    plt.close("all")
