"""`mtpkit bench`: plain, auto and every draft length k on the same graphs, interleaved; predicted vs measured.

Per prompt, each repeat runs plain decoding, the default schedule (auto) and constant k = 1..max_draft back to back,
so their ratios come from one stretch of machine time. The prediction is the cost model (runtime/cost_model.py)
fed with this prompt's measured per-call costs and host overhead and its conditional acceptance by position.
Speed is reported, never asserted: on a shared machine absolute numbers are noise, interleaved ratios less so.
"""

from __future__ import annotations

import json
import statistics
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

from mtpkit.errors import UsageError
from mtpkit.runtime.auto import CostMeter, TimedDrafter, TimedTarget
from mtpkit.runtime.cost_model import best_k, predict
from mtpkit.runtime.engine import Engine, GenConfig
from mtpkit.runtime.stats import Stats, conditional_acceptance

from .peer_timing import PeerPrompt

CATEGORIES = ("code", "structured", "rewrite", "prose")
DEFAULT_MAX_DRAFT = 8  # constant draft lengths a bench measures when the export allows them


@dataclass(frozen=True)
class BenchPrompt:
    category: str  # code | structured | rewrite | prose, or any name a --prompts file gives
    name: str
    text: str = ""
    ids: tuple[int, ...] | None = None  # token ids instead of text (the export's reference prompts)


# The tiny pair learnt Python source, so every category is written as code or its comments and docstrings.
PROMPTS = (
    BenchPrompt("code", "fib", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    BenchPrompt("code", "class", "class LRUCache:\n    def __init__(self, capacity):\n"),
    BenchPrompt("structured", "json", '{"name": "mtpkit", "version": "0.1.0", "dependencies": ['),
    BenchPrompt("structured", "dict", 'DEFAULTS = {\n    "host": "localhost",\n    "port": 8080,\n'),
    BenchPrompt("rewrite", "comprehension", "# Rewrite as a list comprehension:\nresult = []\nfor x in items:\n"
                "    if x > 0:\n        result.append(x * 2)\n"),
    BenchPrompt("rewrite", "summary", '"""Summarize what the function below does in one sentence.\n\n'),
    BenchPrompt("prose", "module", '"""This module provides'),
    BenchPrompt("prose", "story", "Once upon a time, "),
)


@dataclass(frozen=True)
class BenchConfig:
    repeats: int = 3  # interleaved runs of every mode per prompt; the median is reported
    max_new_tokens: int = 64
    max_draft: int | None = None  # constant k = 1..max_draft measured and predicted; None: 8, capped by a static verify
    num_assistant_tokens: int | str | None = None  # the "speculative" column: auto unless a k or schedule is given
    schedule: str | None = None

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise UsageError(f"--repeats must be >= 1 (got {self.repeats})")
        if self.max_draft is not None and self.max_draft < 1:
            raise UsageError(f"--max-draft must be >= 1 (got {self.max_draft})")
        self.spec_config()  # GenConfig's own checks: k, schedule, max_new_tokens
        if self.max_new_tokens < 3:  # the cost model needs a decode call after the prefill's token to be timed
            raise UsageError(f"mtpkit bench needs --max-new-tokens >= 3 to time a decode call (got {self.max_new_tokens})")

    def fitted(self, engine: Engine) -> "BenchConfig":
        """max_draft for this export: the default 8, or as many drafts as a static verify graph takes (LiteRT's 4
        by default); an explicit --max-draft beyond that is refused in one line instead of failing at its first
        run."""
        fits = engine.resolve(GenConfig(max_draft=self.max_draft or DEFAULT_MAX_DRAFT)).max_draft
        if self.max_draft is not None and fits < self.max_draft:
            raise UsageError(f"--max-draft {self.max_draft}: this {engine.backend.kind} export verifies at most {fits} "
                             f"drafts per round; use --max-draft <= {fits} (or leave it out)")
        return replace(self, max_draft=fits)

    def spec_config(self) -> GenConfig:
        return GenConfig(max_new_tokens=self.max_new_tokens, num_assistant_tokens=self.num_assistant_tokens,
                         schedule=self.schedule)

    def modes(self) -> dict[str | int, GenConfig]:
        """Every mode a repeat runs: plain, the speculative column, then constant k = 1..max_draft."""
        if self.max_draft is None:
            raise ValueError("BenchConfig.modes() needs max_draft: fit the config to the export first (fitted)")
        modes: dict[str | int, GenConfig] = {"plain": GenConfig(max_new_tokens=self.max_new_tokens, mtp=False),
                                             "spec": self.spec_config()}
        modes.update({k: GenConfig(max_new_tokens=self.max_new_tokens, num_assistant_tokens=k, schedule="constant")
                      for k in range(1, self.max_draft + 1)})
        return modes


def load_prompts(path: str | Path) -> list[BenchPrompt]:
    """A JSONL file, one {"category": ..., "prompt": ..., "name": optional} object per line (blank lines skipped).

    Raises:
        UsageError: naming the file and line of the first bad entry.
    """
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--prompts {path}: no such file")
    prompts = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"{path}:{n}: not valid JSON ({e.msg}); each line is one JSON object") from None
        if not isinstance(entry, dict) or not all(isinstance(entry.get(f), str) and entry[f] for f in ("category",
                                                                                                        "prompt")):
            raise UsageError(f'{path}:{n}: needs non-empty string fields "category" and "prompt", e.g. '
                             '{"category": "code", "prompt": "def f(x):"}')
        prompts.append(BenchPrompt(entry["category"], str(entry.get("name") or f"line{n}"), entry["prompt"]))
    if not prompts:
        raise UsageError(f"{path}: no prompts in the file")
    return prompts


def ms_per_token(stats: Stats) -> float:
    """Decode phase only: the prefill is the same graph call in every mode."""
    return 1e3 * (stats.total_s - stats.ttft_s) / max(1, stats.new_tokens - 1)


@contextmanager
def metered(engine: Engine, meter: CostMeter) -> Iterator[CostMeter]:
    """Time the engine's calls into `meter` too (a median-mode meter: the whole bench of one prompt)."""
    saved = engine.target, engine.drafter
    engine.target, engine.drafter = TimedTarget(saved[0], meter), TimedDrafter(saved[1], meter)
    try:
        yield meter
    finally:
        engine.target, engine.drafter = saved


def measure(engine: Engine, ids: list[int], modes: dict[str | int, GenConfig], repeats: int,
            progress: Callable[[str], None] | None = None) -> tuple[dict[str | int, list[Stats]], CostMeter]:
    """Runs of every mode, interleaved per repeat: {mode: [Stats per repeat]} and the meter of all their calls."""
    runs: dict[str | int, list[Stats]] = {mode: [] for mode in modes}
    with metered(engine, CostMeter(alpha=None)) as meter:
        for rep in range(repeats):
            for mode, cfg in modes.items():
                if progress:
                    progress(f"{'k=' if isinstance(mode, int) else ''}{mode} ({rep + 1}/{repeats})")
                runs[mode].append(engine.run(ids, cfg))
    return runs, meter


def sweep_prompt(engine: Engine, prompt: BenchPrompt, cfg: BenchConfig,
                 progress: Callable[[str], None] | None = None) -> dict:
    """Predicted and measured speed-up over plain decoding for k = 1..max_draft and the speculative column (auto).

    Returns one JSON-ready row: ks[i] = {k, predicted_speedup, measured_speedup, ...}, chosen_k (the cost
    model's pick on this prompt's measured costs and acceptance; 0 = plain), spec (the auto run), costs.
    """
    ids = list(prompt.ids) if prompt.ids else engine.codec.encode(prompt.text)
    runs, meter = measure(engine, ids, cfg.modes(), cfg.repeats, progress)
    assert cfg.max_draft is not None  # modes() refuses a config not fitted to the export
    ks = list(range(1, cfg.max_draft + 1))
    acceptance = conditional_acceptance([s for k in ks for s in runs[k]], cfg.max_draft)
    acc = _filled(acceptance)
    costs = meter.costs(cfg.max_draft + 1)
    assert costs is not None  # the runs timed plain decode steps and drafter steps
    plain = statistics.median(ms_per_token(s) for s in runs["plain"])
    rows = []
    for pred in predict(costs, acc, ks):
        measured = statistics.median(ms_per_token(s) for s in runs[pred["k"]])
        last = runs[pred["k"]][-1]
        rows.append({"k": pred["k"], "predicted_speedup": pred["speedup"], "measured_speedup": plain / measured,
                     "predicted_ms_per_token": pred["ms_per_token"], "measured_ms_per_token": measured,
                     "predicted_tokens_per_round": pred["tokens_per_round"],
                     "measured_tokens_per_round": (last.new_tokens - 1) / max(1, last.target_calls - 1)})
    row = {"prompt": prompt.name, "category": prompt.category, "prompt_tokens": len(ids)}
    row.update(_spec_columns(runs["spec"], plain))
    row.update({"chosen_k": best_k(costs, acc, cfg.max_draft), "acceptance_by_position": acceptance, "ks": rows,
                "predicted_plain_ms_per_token": predict(costs, acc, [0])[0]["ms_per_token"],
                "costs_ms": {"draft": 1e3 * costs.draft, "target": [1e3 * t for t in costs.target],
                             "round_host": 1e3 * costs.round_host, "draft_host": 1e3 * costs.draft_host,
                             "plain_host": 1e3 * costs.plain_host}})
    return row


def _filled(acceptance: list) -> list[float]:
    """Positions no run reached borrow the one before (0 when none was reached)."""
    out, prev = [], 0.0
    for a in acceptance:
        prev = prev if a is None else a
        out.append(prev)
    return out


def _spec_columns(spec: list[Stats], plain_ms: float) -> dict:
    """The speculative column (auto by default): its ms/token, speed-up over plain, acceptance and calls, plus the
    mean k it used and its plain rounds."""
    s_ms = statistics.median(ms_per_token(s) for s in spec)
    last = spec[-1].summary()
    rounds = max(1, last["target_calls"] - 1)  # decode-phase target calls: one per round, plain rounds included
    return {"new_tokens": last["new_tokens"], "plain_ms_per_token": plain_ms, "speculative_ms_per_token": s_ms,
            "speedup": plain_ms / s_ms if s_ms else None, "acceptance_rate": last["acceptance_rate"],
            "tokens_per_target_call": last["tokens_per_target_call"], "drafter_calls": last["drafter_calls"],
            "target_calls": last["target_calls"], "spec_mean_k": last["drafted"] / rounds,
            "spec_plain_rounds": rounds - last["rounds"]}


def bench_prompt(engine: Engine, name: str, ids: list[int], cfg: BenchConfig) -> dict:
    """Plain vs the configured speculative mode only (no k sweep), with the cost model's prediction for it.

    Returns the row of sweep_prompt without `ks`; predicted_speedup is for the configured constant k, or for
    the cost model's best k under auto / heuristic.
    """
    modes: dict[str | int, GenConfig] = {"plain": GenConfig(max_new_tokens=cfg.max_new_tokens, mtp=False),
                                         "spec": cfg.spec_config()}
    engine.run(ids, modes["spec"])  # warm-up: first calls pay allocation and kernel selection
    runs, meter = measure(engine, ids, modes, cfg.repeats)
    max_draft = max(cfg.fitted(engine).max_draft or 1, *(d for s in runs["spec"] for d, _ in s.per_round), 1)  # set by fitted
    acc = _filled(conditional_acceptance(runs["spec"], max_draft))
    costs = meter.costs(max_draft + 1)
    assert costs is not None  # the runs timed plain decode steps and drafter steps
    k = cfg.num_assistant_tokens if isinstance(cfg.num_assistant_tokens, int) else best_k(costs, acc, max_draft)
    pred = predict(costs, acc, [k])[0]
    row = {"prompt": name, "prompt_tokens": len(ids), **_spec_columns(runs["spec"], _median_ms(runs["plain"]))}
    row.update({"predicted_k": k, "predicted_speedup": pred["speedup"], "acceptance_by_position":
                runs["spec"][-1].summary()["acceptance_by_position"]})
    return row


def _median_ms(runs: list[Stats]) -> float:
    return statistics.median(ms_per_token(s) for s in runs)


def run_bench(export_dir: str | Path, cfg: BenchConfig, prompts: list | None = None, threads: int | None = None,
              backend: str | None = None, progress: Callable[[str], None] | None = None,
              peers: Callable[[Engine, list[PeerPrompt], Callable | None], dict] | None = None) -> dict:
    """Bench the given prompts (texts or BenchPrompts), or the built-in set (PROMPTS) when none are given.

    progress: optional callable(str) told what runs now (the CLI's stderr progress line). peers: optional
    callable(engine, [PeerPrompt], progress) -> the report's `peers` section (mtpkit/bench/peers.py run_peers),
    called after mtpkit's own bench on the same prompts.
    """
    engine = Engine(export_dir, threads, backend)
    cfg = cfg.fitted(engine)
    assert cfg.max_draft is not None  # fitted() sets it
    items = [p if isinstance(p, BenchPrompt) else BenchPrompt("custom", f"prompt{i}", p)
             for i, p in enumerate(prompts or PROMPTS)]
    first = list(items[0].ids) if items[0].ids else engine.codec.encode(items[0].text)
    for mode_cfg in cfg.modes().values():  # warm-up: first calls of each length pay allocation
        engine.run(first, mode_cfg)
    rows = []
    for i, prompt in enumerate(items):
        tell = (lambda what, i=i, p=prompt: progress(f"prompt {i + 1}/{len(items)} {p.category}/{p.name}: {what}")
                ) if progress else None
        rows.append(sweep_prompt(engine, prompt, cfg, tell))
    speedups = [r["speedup"] for r in rows if r["speedup"]]
    report = {"config": asdict(cfg), "backend": engine.backend.kind, "threads": engine.threads,
              "rows": rows, "categories": summarize(rows, cfg.max_draft),
              "median_speedup": statistics.median(speedups) if speedups else None}
    if peers is not None:
        report["peers"] = peers(engine, [_peer_prompt(engine, p) for p in items], progress)
    return report


def _peer_prompt(engine: Engine, prompt: BenchPrompt) -> PeerPrompt:
    ids = list(prompt.ids) if prompt.ids else engine.codec.encode(prompt.text)
    return PeerPrompt(f"{prompt.category}/{prompt.name}", prompt.text or engine.codec.decode(ids), tuple(ids))


def summarize(rows: list[dict], max_draft: int) -> dict:
    """Per category (and "all"): median predicted and measured speed-up per k, of auto, and the chosen k."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["category"], []).append(r)
    groups["all"] = rows
    out = {}
    for name, group in groups.items():
        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        out[name] = {"prompts": len(group), "speedup": med([r["speedup"] for r in group if r["speedup"]]),
                     "chosen_k": [r["chosen_k"] for r in group],
                     "predicted": [med([r["ks"][k]["predicted_speedup"] for r in group]) for k in range(max_draft)],
                     "measured": [med([r["ks"][k]["measured_speedup"] for r in group]) for k in range(max_draft)],
                     "acceptance": [med([r["acceptance_by_position"][k] for r in group
                                         if r["acceptance_by_position"][k] is not None]) for k in range(max_draft)]}
    return out
