"""`mtpkit demo`: the main job on the trained tiny pair shipped with mtpkit: export -> parity -> speed summary."""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from pathlib import Path

from mtpkit.export.recipes import RECIPES as EXPORT_RECIPES  # torch-free: --help lists them in any install

log = logging.getLogger("mtpkit")

EPILOG = """Uses the trained tiny Gemma 4 target + drafter in mtpkit/tiny/assets/tiny_pair (see its pair.json).
By default (--pair e2b-shaped) the target is first grown wide (mtpkit/tiny/grow.py: MLPs x64, 96 M
parameters, same drafter) so that on the timed recipe a drafter step costs about what the real E2B pair's does
relative to a target call (the demo prints both); it is grown once (about 15 s, 383 MB) into
~/.cache/mtpkit/demo-pairs (or $MTPKIT_CACHE_DIR) and kept there, since the export's manifest points at it. --pair small uses the shipped pair as is (fast, but its
drafter costs 1/3 of a target call, so speculation barely pays).

Steps: export the float pair to DIR and replay the transformers reference through the runtime on each
backend (token-for-token parity; float graphs, since quantized weights cannot equal transformers); derive
the recipe that is timed, DIR/RECIPE (LiteRT int8 by default, the recipe docs/quantization.md recommends for
speculative decoding: exact, and cheap to verify up to 4 tokens, the default); time speculative against plain
decoding on it, checking that both give the same tokens on every prompt; with the litert backend also LiteRT-LM
(the runtime the Android app ships) on DIR/RECIPE/model.litertlm, speculative decoding off and on.
`mtpkit bench DIR/RECIPE --peers` compares it with transformers and the other runtimes. Nothing is downloaded.
"""
PAIRS = ("e2b-shaped", "small")
RECIPES = tuple(r.name for r in EXPORT_RECIPES.values() if r.offered)  # fp32, fp16, int8, int4
# the recipe each backend's speculative decoding is timed on unless --quant says otherwise: LiteRT int8 verifies
# k + 1 tokens for about a decode and is bit-exact; ONNX int8 / int4 are exact only up to near-ties
# (docs/quantization.md "How to choose")
RECOMMENDED = {"litert": "int8", "onnx": "fp32"}


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.epilog = EPILOG
    p.add_argument("out", type=Path, metavar="DIR",
                   help="export folder to create (the float export; the timed recipe in DIR/RECIPE)")
    p.add_argument("--pair", choices=PAIRS, default=PAIRS[0], help="which demo pair (default e2b-shaped)")
    p.add_argument("--backend", default="litert", help="litert, onnx or onnx,litert (default litert)")
    p.add_argument("--quant", choices=RECIPES, default=None,
                   help="the recipe timed, derived from the float export (default: int8 on litert, fp32 on onnx)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved bench runs per prompt (default 3)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--force", action="store_true", help="replace DIR if it exists")


def run(args: argparse.Namespace) -> int:
    from mtpkit.errors import CommandError
    from mtpkit.export.config import ExportConfig
    from mtpkit.export.pipeline import export_model
    from mtpkit.runtime.parity import run_parity

    target, drafter, record = demo_pair(args.pair)
    cfg = ExportConfig(target=str(target), drafter=str(drafter), out=args.out, backend=args.backend,
                       force=args.force, max_cache_len=1024, prefill_len=32)
    asked = {b.strip() for b in args.backend.split(",")}
    backends = [b for b in cfg.backend if b in asked]  # litert's export adds the onnx graphs it is checked against
    out = export_model(cfg)
    recipes = {b: args.quant or RECOMMENDED[b] for b in backends}
    folders = {r: derived(out, r, cfg.block_size) for r in set(recipes.values())}  # each recipe derived once
    timed = {b: folders[r] for b, r in recipes.items()}
    (out / "demo_pair.json").write_text(json.dumps(record, indent=1) + "\n")
    failures = []
    for backend in backends:
        parity = run_parity(out, args.threads, backend)
        print(f"parity ({backend}, fp32 vs transformers): {'PASS' if parity['ok'] else 'FAIL'}, "
              f"{parity['checks'] - parity['failed']}/{parity['checks']} checks, k in {parity['draft_lengths']}")
        failures += [] if parity["ok"] else [f"parity ({backend}) failed; see `mtpkit parity {out}` for the mismatches"]
    for backend in backends:
        recipe = recipes[backend]
        report = heldout_check(timed[backend], backend, args.threads, args.max_new_tokens, args.repeats)
        report["recipe"], report["export"], report["cpu"] = recipe, str(timed[backend]), cpu_kind()
        report["e2b_cost_ratio"] = E2B_COST_RATIO.get((backend, recipe), {}).get(report["cpu"])
        print_heldout(report)
        if report["same_tokens"] < report["runs"]:
            failures.append(f"speculative output differed from plain output on {backend} {recipe} in "
                            f"{report['runs'] - report['same_tokens']}/{report['runs']} runs")
        if backend == "litert":
            from .demo_litert_lm import litert_lm_check, print_litert_lm

            texts = [t for _, t in heldout_prompts()]
            report["litert_lm"] = litert_lm_check(timed[backend], texts, args.max_new_tokens, args.repeats,
                                                  args.threads)
            print_litert_lm(report["litert_lm"])
        (out / f"demo_{backend}.json").write_text(json.dumps(report, indent=2) + "\n")
    if failures:
        raise CommandError("; ".join(failures))
    return 0


def derived(out: Path, recipe: str, block_size: int) -> Path:
    """OUT itself for fp32, else OUT/RECIPE: the float export with RECIPE applied to target and drafter on every
    backend (as `mtpkit quant-report` derives it), built beside OUT and moved in whole."""
    from mtpkit.export.quant_report import derive_quantized

    if not EXPORT_RECIPES[recipe].quantized:
        return out
    staging = out.with_name(f".{out.name}.{recipe}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    log.info("deriving the %s recipe from the float export into %s", recipe, out / recipe)
    folder = derive_quantized(out, staging, (recipe, recipe), block_size)
    folder.rename(out / recipe)
    shutil.rmtree(staging)
    return out / recipe


def demo_pair(name: str) -> tuple[Path, Path, dict]:
    """(target, drafter, how they were made) for --pair NAME; the e2b-shaped pair is grown once into mtpkit's
    cache folder and kept there, where the export's manifest says it is."""
    from mtpkit.runtime.verified import cache_dir

    from .grow import cached_pair
    from .train import ASSETS

    if name == "small":
        return ASSETS / "target", ASSETS / "drafter", {"pair": name, "method": "the shipped trained pair"}
    target, drafter = cached_pair(ASSETS, cache_dir() / "demo-pairs")
    return target, drafter, {"pair": name, **json.loads((target.parent / "pair.json").read_text())}


def heldout_check(out: Path, backend: str, threads: int | None, max_new_tokens: int, repeats: int = 3) -> dict:
    """The runtime on the held-out prompts transformers was measured on (pair.json): acceptance and tokens per
    target call (prefill call included, as in pair.json) at transformers' k (pair.json), capped by a static
    verify length, then default decoding (auto draft length) against plain decoding, interleaved, with the cost
    model's prediction from the same run's measured costs.
    same_tokens / runs: speculative runs (auto, and that k with both hand-offs) whose tokens equal plain decoding's."""
    import statistics

    from mtpkit.bench.sweep import metered
    from mtpkit.runtime.auto import CostMeter
    from mtpkit.runtime.engine import Engine, GenConfig
    from mtpkit.runtime.stats import tokens_per_target_call

    from .train import ASSETS

    pair = json.loads((ASSETS / "pair.json").read_text())
    engine = Engine(out, threads, backend)
    asked = GenConfig(num_assistant_tokens=pair["figures"]["num_assistant_tokens"], schedule="constant")
    k = engine.resolve(asked, adapt=True).num_assistant_tokens
    with metered(engine, CostMeter(alpha=None)) as meter:
        rows = [_prompt_row(engine, category, text, max_new_tokens, repeats, k) for category, text in heldout_prompts()]
    costs = meter.costs(2)
    summary = {mode: tokens_per_target_call(sum(r[mode]["new_tokens"] for r in rows),
                                            sum(r[mode]["target_calls"] for r in rows)) for mode in ("hf", "clean")}
    measured = [r["bench"]["speedup"] for r in rows]
    predicted = [r["bench"]["predicted_speedup"] for r in rows]
    return {"backend": backend, "prompts": len(rows), "k": k, "transformers_k": pair["figures"]["num_assistant_tokens"],
            "same_tokens": sum(r["same_tokens"] for r in rows),
            "runs": sum(r["runs"] for r in rows), "rows": rows, "tokens_per_target_call": summary,
            "transformers_tokens_per_target_call": pair["figures"]["all"]["tokens_per_target_call"],
            "call_ms": {"target_decode": 1e3 * costs.target[0], "drafter_step": 1e3 * costs.draft},
            "median_speedup": statistics.median(measured), "min_speedup": min(measured),
            "median_predicted_speedup": statistics.median(predicted),
            "measured_over_predicted": statistics.median(m / p for m, p in zip(measured, predicted))}


def _prompt_row(engine, category: str, text: str, max_new_tokens: int, repeats: int, k: int) -> dict:
    from mtpkit.bench.sweep import BenchConfig, bench_prompt
    from mtpkit.runtime.engine import GenConfig
    from mtpkit.runtime.stats import Stats

    ids = engine.codec.encode(text)  # <bos> + text, as transformers was measured (pair.json)
    plain = _tokens(engine, ids, GenConfig(max_new_tokens=max_new_tokens, mtp=False), Stats())
    row: dict = {"category": category, "runs": 3,
                 "same_tokens": int(_tokens(engine, ids, GenConfig(max_new_tokens=max_new_tokens), Stats()) == plain)}
    for mode in ("hf", "clean"):
        stats = Stats()
        spec = _tokens(engine, ids, GenConfig(max_new_tokens=max_new_tokens, num_assistant_tokens=k, kv_handoff=mode),
                       stats)
        first = stats.accepted_at[0] / stats.drafted_at[0] if stats.drafted_at else 0.0
        row[mode] = {"new_tokens": stats.new_tokens, "target_calls": stats.target_calls, "pos1": first}
        row["same_tokens"] += int(spec == plain)
    row["bench"] = bench_prompt(engine, category, ids, BenchConfig(repeats=repeats, max_new_tokens=max_new_tokens))
    return row


def _tokens(engine, ids: list[int], cfg, stats) -> list[int]:
    return [t for t, _ in engine.generate(ids, cfg, stats)]


# E2B's target decode / drafter step on the recipe the demo times by default, measured at the full E2B shape
# (random weights, 1 thread, position 256; tools/call_costs.py, docs/scale-bench.md): AVX2 176.2 / 2.73 ms
# (the 3-step round's mean, --max-draft 3), AVX-512 VNNI 122.1 / 4.3 ms
E2B_COST_RATIO = {("litert", "int8"): {"AVX2": 65, "AVX-512 VNNI": 28}}


def cpu_kind() -> str:
    """The x86 vector extension that decides the int8 kernels' speed ("AVX-512 VNNI", "AVX-512", "AVX2"), else the
    machine name (ARM64 phones are not measured)."""
    import platform

    try:
        flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), [])
    except OSError:
        flags = []
    for flag, kind in (("avx512_vnni", "AVX-512 VNNI"), ("avx512f", "AVX-512"), ("avx2", "AVX2")):
        if flag in flags:
            return kind
    return platform.machine()


def heldout_prompts() -> list[tuple[str, str]]:
    """(category, text) of the held-out prompts transformers was measured on (the shipped pair's pair.json)."""
    from .train import ASSETS
    from .training.corpus import load_corpus
    from .training.measure import eval_prompts

    pair = json.loads((ASSETS / "pair.json").read_text())
    return list(eval_prompts(load_corpus().heldout, pair["config"]["eval_prompts"]))


def print_heldout(report: dict) -> None:
    t, c = report["tokens_per_target_call"], report["call_ms"]
    print(f"held-out prompts ({report['prompts']}, {report['backend']} {report['recipe']}): tokens per target call "
          f"at k={report['k']} {t['hf']:.2f} with transformers' hand-off (transformers measured "
          f"{report['transformers_tokens_per_target_call']:.2f} at k={report['transformers_k']}), {t['clean']:.2f} "
          "with the clean hand-off")
    e2b = report.get("e2b_cost_ratio")
    print(f"cost shape: target decode {c['target_decode']:.2f} ms, drafter step {c['drafter_step']:.2f} ms "
          f"(1/{c['target_decode'] / c['drafter_step']:.0f} of a target call; "
          + (f"E2B on {report['backend']} {report['recipe']}, {report['cpu']}: 1/{e2b}, docs/scale-bench.md)" if e2b
             else f"E2B not measured on {report['backend']} {report['recipe']}, {report['cpu']})"))
    for r in report["rows"]:
        b = r["bench"]
        print(f"  {r['category']:<18} speculative (auto, k={b['predicted_k']}) vs plain: {b['speedup']:.2f}x "
              f"measured, {b['predicted_speedup']:.2f}x predicted")
    print(f"median speedup {report['median_speedup']:.2f}x (min {report['min_speedup']:.2f}x), cost model predicted "
          f"{report['median_predicted_speedup']:.2f}x; measured/predicted {report['measured_over_predicted']:.2f} "
          f"(default flags: automatic draft length, {report['backend']} {report['recipe']}, same graphs, interleaved)")
    print(f"speculative tokens == plain tokens: {report['same_tokens']}/{report['runs']} runs (auto, and "
          f"k={report['k']} with both KV hand-offs)")
