"""Engine: an export folder opened once (manifest, sessions, KV buffers, tokenizer); generate() per request."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .backends import open_backend
from .handoff import HANDOFF_MODES
from .manifest import load_manifest
from .sampling import Sampler, SamplingConfig
from .speculative import SCHEDULES, DraftSchedule, plain_generate, speculative_generate
from .stats import Stats, timed
from .tokenizer import TextCodec


@dataclass(frozen=True)
class GenConfig:
    max_new_tokens: int = 64
    mtp: bool = True  # False: plain decoding on the same target graph
    num_assistant_tokens: int | None = None  # None: the drafter's generation_config value from the manifest
    schedule: str | None = None  # constant | heuristic; None: from the manifest
    draft_cap: int = 16  # upper bound for the heuristic schedule
    kv_handoff: str = "clean"  # clean | hf (transformers' exact hand-off, for draft-by-draft comparison)
    sampling: SamplingConfig = SamplingConfig()

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1 (got {self.max_new_tokens})")
        if self.num_assistant_tokens is not None and self.num_assistant_tokens < 1:
            raise ValueError(f"--num-assistant-tokens must be >= 1 (got {self.num_assistant_tokens}); "
                             "use --no-mtp to disable drafting")
        if self.schedule is not None and self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; use one of {', '.join(SCHEDULES)}")
        if self.kv_handoff not in HANDOFF_MODES:
            raise ValueError(f"unknown --kv-handoff {self.kv_handoff!r}; use one of {', '.join(HANDOFF_MODES)}")


class Engine:
    def __init__(self, export_dir: str | Path, threads: int | None = None, backend: str | None = None):
        self.manifest = load_manifest(export_dir)
        self.target, self.drafter = open_backend(self.manifest, backend, threads)
        self.backend = self.manifest.backend(backend)
        self.kv = self.target.kv
        self.max_draft = self.target.max_draft
        self.codec = TextCodec(self.manifest)

    def schedule(self, cfg: GenConfig) -> DraftSchedule:
        gen = self.manifest.generation
        k = cfg.num_assistant_tokens or int(gen["num_assistant_tokens"])
        kind = cfg.schedule or gen.get("num_assistant_tokens_schedule", "constant")
        cap = max(cfg.draft_cap, k)
        if self.max_draft is not None:  # static verify length (LiteRT): k + 1 tokens must fit in it
            if k > self.max_draft:
                raise ValueError(f"this {self.backend.kind} export verifies at most {self.max_draft} drafts per "
                                 f"round; use --num-assistant-tokens <= {self.max_draft} or re-export with a longer verify")
            cap = min(cap, self.max_draft)
        return DraftSchedule(kind, k, cap)

    def generate(self, prompt_ids: list[int], cfg: GenConfig, stats: Stats | None = None) -> Iterator[tuple[int, bool]]:
        """Yields (token, from_draft); fills stats (timings, acceptance, calls) as it goes."""
        if not prompt_ids:
            raise ValueError("the prompt is empty; pass some text")
        needed = self.target.positions_needed(len(prompt_ids), cfg.max_new_tokens)
        if needed > self.kv.capacity:
            raise ValueError(f"prompt ({len(prompt_ids)} tokens) + --max-new-tokens ({cfg.max_new_tokens}) exceeds the "
                             f"export's KV capacity of {self.kv.capacity} tokens; shorten them or re-export with a "
                             "larger --max-cache-len")
        stats = stats if stats is not None else Stats()
        sampler = Sampler(cfg.sampling)
        eos = set(self.manifest.eos_ids)
        t0, d0 = self.target.calls, self.drafter.calls
        if cfg.mtp:
            tokens = speculative_generate(self.target, self.drafter, prompt_ids, sampler, self.schedule(cfg),
                                          cfg.max_new_tokens, eos, cfg.kv_handoff, stats)
        else:
            tokens = ((t, False) for t in plain_generate(self.target, prompt_ids, sampler, cfg.max_new_tokens, eos))
        try:
            yield from timed(tokens, stats)
        finally:  # once per run, also when the caller stops early; not per token
            stats.target_calls, stats.drafter_calls = self.target.calls - t0, self.drafter.calls - d0
