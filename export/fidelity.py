"""Fidelity of quantized graphs against the float model, measured at export, with a gate per recipe.

Teacher-forced, per backend: the reference prompts followed by transformers' float greedy continuation go
through the quantized target graphs in the mtpkit runtime; each continuation position's logits are compared with
PyTorch's float logits (top-1 agreement, mean KL(float || quantized), max |logit difference|). Free-running: the mtpkit runtime
on the quantized export decodes greedily (greedy prefix match with transformers) and speculatively (drafter
acceptance), beside the same runtime figures of the float export measured before quantization. An export whose KV
capacity is smaller than a reference prompt and its continuation measures them cut to fit (fitted).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch

from mtpkit.errors import MtpkitError
from mtpkit.runtime.backends import LoadOptions
from mtpkit.runtime.manifest import Manifest
from mtpkit.runtime.speculative import DEFAULT_NUM_ASSISTANT_TOKENS

from . import lattice
from .mapped import CHECKPOINT, page_out
from .recipes import recipe

log = logging.getLogger("mtpkit")

FIDELITY_FILE = "quant_fidelity.json"
MIN_NEW = 8  # continuation ids kept beside a prompt cut to the KV capacity


class QualityGateError(MtpkitError, ValueError):
    """A quantized export missed its recipe's gate; the message names the recipe and the figure."""


def teacher_forced(export: Path | Manifest, target, reference: dict, backend: str | None = None) -> dict:
    """A backend's quantized target graphs vs float PyTorch: each reference prompt is prefilled through the mtpkit
    runtime, then float greedy's continuation is fed one decode call per token (the same graphs users run,
    static LiteRT prefill lengths included); every continuation position's logits are compared."""
    with lattice.released(target):  # the graphs run first, without the PyTorch weights beside them
        prompts, cut, graph_rows = _runtime_rows(export, reference, backend)
    agree, kls, max_abs, positions = [], [], 0.0, 0
    for p, got in zip(prompts, graph_rows):
        prompt, cont = p["prompt_ids"], p["greedy_ids"][:-1]
        got = got.astype(np.float64)
        with torch.no_grad():
            want = target(torch.tensor([prompt + cont])).logits[0, len(prompt) - 1:].double().numpy()
        page_out(*CHECKPOINT)  # the model and the graphs are not resident together (export/mapped.py)
        agree.append(got.argmax(-1) == want.argmax(-1))
        kls.append(_kl(want, got))
        max_abs, positions = max(max_abs, float(np.abs(got - want).max())), positions + len(got)
    return {"top1_agreement": float(np.concatenate(agree).mean()), "top1_stderr": _stderr([a.mean() for a in agree]),
            "mean_kl": float(np.concatenate(kls).mean()), "max_abs_logit": max_abs, "positions": positions,
            "prompts_cut": cut}


def _runtime_rows(export: Path | Manifest, reference: dict, backend: str | None) -> tuple[list[dict], int, list]:
    """(the prompts fitted, how many were cut, per prompt the target graphs' float32 logits at its last prompt
    position and at each continuation id fed one decode call at a time); the engine is gone on return."""
    from mtpkit.runtime.engine import Engine

    engine = Engine(export, threads=1, backend=backend, options=LoadOptions(weight_cache=False))  # as runtime_figures
    prompts, cut = fitted(reference, engine)
    out = []
    for p in prompts:
        prompt, cont = p["prompt_ids"], p["greedy_ids"][:-1]
        rows = [engine.target.forward(prompt, 0)[0][-1]]
        rows += [engine.target.forward([t], len(prompt) + i)[0][-1] for i, t in enumerate(cont)]
        out.append(np.stack(rows).astype(np.float32))
    return prompts, cut, out


def fitted(reference: dict, engine) -> tuple[list[dict], int]:
    """The reference prompts as the engine's KV capacity holds them, and how many were cut. A continuation longer
    than the room its prompt leaves is cut to that room: still a prefix of transformers' greedy output. A prompt
    that leaves less than MIN_NEW is cut to its first ids and the ids after them become its continuation, marked
    "text": teacher-forced like any other, but not transformers' greedy output, so not greedily matched."""
    room = engine.kv.capacity - engine.target.positions_needed(0, 0)  # ids one run may hold
    new = max(1, min(MIN_NEW, room // 2))
    prompts, cut = [], 0
    for p in reference["prompts"]:
        prompt, greedy = p["prompt_ids"], p["greedy_ids"]
        if len(prompt) + len(greedy) <= room:
            prompts.append(p)
        elif len(prompt) + min(new, len(greedy)) <= room:
            prompts.append({**p, "greedy_ids": greedy[:room - len(prompt)]})
        else:
            ids = (prompt + greedy)[:room]
            prompts.append({**p, "prompt_ids": ids[:-new], "greedy_ids": ids[-new:], "text": True})
        cut += prompts[-1] is not p
    return prompts, cut


def _stderr(per_prompt: list[float]) -> float:
    """Standard error of the mean over prompts: how far another draw of as many prompts may move top-1."""
    return float(np.std(per_prompt, ddof=1) / np.sqrt(len(per_prompt))) if len(per_prompt) > 1 else 0.0


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    log_p = p_logits - np.logaddexp.reduce(p_logits, axis=-1, keepdims=True)
    log_q = q_logits - np.logaddexp.reduce(q_logits, axis=-1, keepdims=True)
    return (np.exp(log_p) * (log_p - log_q)).sum(-1)


def runtime_figures(export: Path | Manifest, reference: dict,
                    num_assistant_tokens: int = DEFAULT_NUM_ASSISTANT_TOKENS, backend: str | None = None,
                    options: LoadOptions = LoadOptions(weight_cache=False)) -> dict:
    """The mtpkit runtime on an export: greedy prefix match with transformers' float greedy, drafter acceptance
    and tokens per target call (speculative greedy, constant k = num_assistant_tokens capped by a static verify length,
    clean hand-off; recorded as `schedule` and `num_assistant_tokens`, whatever schedule the drafter's config names).
    No weight cache by default: the export folder must get nothing the manifest does not name."""
    from mtpkit.runtime.engine import Engine, GenConfig

    engine = Engine(export, threads=1, backend=backend, options=options)
    asked = GenConfig(num_assistant_tokens=num_assistant_tokens, schedule="constant")
    num_assistant_tokens = int(engine.resolve(asked, adapt=True).num_assistant_tokens or 0)  # an int: constant
    prefix, diverged, drafted, accepted, new, calls = [], {}, 0, 0, 0, 0
    prompts, cut = fitted(reference, engine)
    for p in prompts:
        n = len(p["greedy_ids"])
        if not p.get("text"):  # a cut prompt's continuation is its text: no greedy output to match
            first = _greedy_match(engine, p)
            prefix.append(first / n)
            if first < n:
                diverged[p["name"]] = first
        stats = engine.run(p["prompt_ids"], GenConfig(max_new_tokens=n, num_assistant_tokens=num_assistant_tokens,
                                                      schedule="constant"))
        drafted, accepted, new, calls = (drafted + stats.drafted, accepted + stats.accepted,
                                         new + stats.new_tokens, calls + stats.target_calls)
    return {"greedy_prefix_match": float(np.mean(prefix)) if prefix else None,
            "greedy_exact_prompts": sum(x == 1.0 for x in prefix), "prompts": len(prefix), "prompts_cut": cut,
            "first_divergence": diverged, "acceptance": accepted / drafted if drafted else None,
            "tokens_per_target_call": new / calls if calls else None, "schedule": "constant", "num_assistant_tokens": num_assistant_tokens}


def _greedy_match(engine, p: dict) -> int:
    """How many leading tokens of the runtime's plain greedy output equal transformers' greedy_ids."""
    from mtpkit.runtime.engine import GenConfig

    want = p["greedy_ids"]
    plain = [t for t, _ in engine.generate(p["prompt_ids"], GenConfig(max_new_tokens=len(want), mtp=False))]
    return next((i for i, (a, b) in enumerate(zip(plain, want)) if a != b), min(len(plain), len(want)))


def check(manifest, target, float_figures: dict, gate: bool) -> dict:
    """Measure every backend of the quantized export, write FIDELITY_FILE ({backend kind: its figures}), and
    enforce (or, without gate, warn about) each backend's gate on its target recipe. float_figures: backend kind
    -> runtime_figures of the float export, measured before quantizing.
    """
    reference = json.loads(manifest.path(manifest.reference["file"]).read_text())
    report, failures = {}, []
    for kind in manifest.backends:
        graphs = manifest.backend(kind).graphs
        figures = {"target_recipe": graphs["target"].recipe, "drafter_recipe": graphs["drafter"].recipe,
                   "teacher_forced": teacher_forced(manifest, target, reference, kind),
                   "runtime": _released_runtime_figures(manifest, target, reference, kind),
                   "float_runtime": float_figures[kind],
                   "gate": {"top1_agreement_min": recipe(graphs["target"].recipe).gate, "enforced": gate},
                   # int4: the text its scales were calibrated on, which the reference prompts above are not
                   "calibration": ((manifest.backend(kind).options.quantization or {}).get("target")
                                   or {}).get("calibration")}
        figures["float_margin_at_divergence"] = _margins(target, reference, figures["runtime"]["first_divergence"])
        cut = figures["runtime"].get("prompts_cut")
        if cut:
            log.info("  %s: %d of %d reference prompts cut to the KV capacity of %d (--max-cache-len)", kind, cut,
                     len(reference["prompts"]), manifest.kv_cache.capacity)
        _log(kind, figures)
        failures += _gate_failure(kind, figures)
        report[kind] = figures
    manifest.path(FIDELITY_FILE).write_text(json.dumps(report, indent=2) + "\n")
    if failures and gate:
        raise QualityGateError(failures[0])
    for message in failures:
        log.warning("warning: %s", message)
    return report


def _released_runtime_figures(manifest, target, reference: dict, kind: str) -> dict:
    with lattice.released(target):  # a full-size QAT target's floats and the graphs are not held together
        return runtime_figures(manifest, reference, backend=kind)


def _gate_failure(kind: str, figures: dict) -> list[str]:
    target, tf = recipe(figures["target_recipe"]), figures["teacher_forced"]
    if target.gate is None or tf["top1_agreement"] >= target.gate:
        return []
    return [f"{kind} {target.name} target: teacher-forced top-1 agreement with the float model is "
            f"{tf['top1_agreement']:.3f}, below the {target.name} gate {target.gate} ({tf['positions']} positions); "
            f"use a wider recipe (--quant {target.wider}) or pass --no-quality-gate to export anyway"]


def _log(kind: str, figures: dict) -> None:
    tf, rt = figures["teacher_forced"], figures["runtime"]
    prefix = rt["greedy_prefix_match"]  # None: every prompt was cut to its text, none matched greedily
    log.info("  %s: %s target / %s drafter: top-1 agreement %.3f, mean KL %.2e, max|dlogit| %.3f, greedy prefix "
             "%s, acceptance %s (float %s)", kind, figures["target_recipe"], figures["drafter_recipe"],
             tf["top1_agreement"], tf["mean_kl"], tf["max_abs_logit"], "-" if prefix is None else f"{prefix:.2f}",
             _pct(rt["acceptance"]), _pct(figures["float_runtime"]["acceptance"]))


def _margins(target, reference: dict, diverged: dict) -> dict:
    """Where greedy output diverges, the float model's top-1 minus top-2 logit there: a small margin means a
    near-tie that any rounding can flip, not a broken graph."""
    out = {}
    for p in reference["prompts"]:
        if p["name"] in diverged:
            i = diverged[p["name"]]
            with torch.no_grad():
                logits = target(torch.tensor([p["prompt_ids"] + p["greedy_ids"][:i]])).logits[0, -1]
            top2 = torch.topk(logits, 2).values
            out[p["name"]] = {"position": i, "margin": float(top2[0] - top2[1])}
    return out


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"
