"""`mtpkit bench`: speculative vs plain decoding on the same graphs, interleaved, ratios from one run.

Speed is reported, never asserted: on a shared machine absolute numbers are noise, the ratio of interleaved
runs much less so.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass

from .engine import Engine, GenConfig
from .stats import Stats


@dataclass(frozen=True)
class BenchConfig:
    repeats: int = 3  # interleaved plain/speculative runs per prompt; the median is reported
    max_new_tokens: int = 64
    num_assistant_tokens: int | None = None
    schedule: str | None = None

    def __post_init__(self):
        if self.repeats < 1:
            raise ValueError(f"--repeats must be >= 1 (got {self.repeats})")


def run_once(engine: Engine, ids: list[int], cfg: GenConfig) -> Stats:
    """Generate to the end, discarding tokens; returns the run's stats."""
    stats = Stats()
    for _ in engine.generate(ids, cfg, stats):
        pass
    return stats


def bench_prompt(engine: Engine, name: str, ids: list[int], cfg: BenchConfig) -> dict:
    spec_cfg = GenConfig(max_new_tokens=cfg.max_new_tokens, num_assistant_tokens=cfg.num_assistant_tokens,
                         schedule=cfg.schedule)
    plain_cfg = GenConfig(max_new_tokens=cfg.max_new_tokens, mtp=False)
    run_once(engine, ids, spec_cfg)  # warm-up: first calls pay allocation and kernel selection
    plain, spec = [], []
    for _ in range(cfg.repeats):
        plain.append(run_once(engine, ids, plain_cfg))
        spec.append(run_once(engine, ids, spec_cfg))
    decode_s = lambda s: s.total_s - s.ttft_s  # noqa: E731 - decode phase only; prefill is the same graph call
    p_ms = statistics.median(1e3 * decode_s(s) / max(1, s.new_tokens - 1) for s in plain)
    s_ms = statistics.median(1e3 * decode_s(s) / max(1, s.new_tokens - 1) for s in spec)
    last = spec[-1].summary()
    return {"prompt": name, "prompt_tokens": len(ids), "new_tokens": spec[-1].new_tokens,
            "plain_ms_per_token": p_ms, "speculative_ms_per_token": s_ms, "speedup": p_ms / s_ms if s_ms else None,
            "acceptance_rate": last["acceptance_rate"], "acceptance_by_position": last["acceptance_by_position"],
            "tokens_per_target_call": last["tokens_per_target_call"], "drafter_calls": last["drafter_calls"],
            "target_calls": last["target_calls"]}


def run_bench(export_dir, cfg: BenchConfig, prompts: list[str] | None = None, threads: int | None = None,
              backend: str | None = None) -> dict:
    """Bench the given prompts, or the export's reference prompts when none are given."""
    engine = Engine(export_dir, threads, backend)
    if prompts:
        items = [(f"prompt{i}", engine.codec.encode(p)) for i, p in enumerate(prompts)]
    else:
        ref = json.loads(engine.manifest.path(engine.manifest.reference["file"]).read_text())
        items = [(p["name"], p["prompt_ids"]) for p in ref["prompts"]]
    rows = [bench_prompt(engine, name, ids, cfg) for name, ids in items]
    speedups = [r["speedup"] for r in rows if r["speedup"]]
    return {"config": cfg.__dict__, "backend": engine.backend.kind, "threads": threads, "rows": rows,
            "median_speedup": statistics.median(speedups) if speedups else None}
