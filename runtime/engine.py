"""Engine: an export folder opened once (manifest, sessions, KV buffers, tokenizer); generate() per request."""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Generator

from mtpkit.errors import UsageError, check_int

from . import timings
from .auto import AutoPolicy, CostMeter, TimedDrafter, TimedTarget, calibrate
from .backends import LoadOptions, open_backend
from .handoff import HANDOFF_MODES
from .manifest import Manifest, load_manifest
from .sampling import Sampler, SamplingConfig
from .speculative import SCHEDULES, DraftSchedule, fit_draft, plain_generate, speculative_generate
from .stats import Stats, timed
from .tokenizer import TextCodec

log = logging.getLogger("mtpkit")


@dataclass(frozen=True)
class GenConfig:
    max_new_tokens: int = 64
    mtp: bool = True  # False: plain decoding on the same target graph
    # k per round, or "auto": chosen each round by the cost model. None: auto when schedule is None too (unless
    # sampling is seeded, see auto), else the drafter's generation_config value from the manifest
    num_assistant_tokens: int | str | None = None
    schedule: str | None = None  # constant | heuristic | auto; None: auto unless a k is given, then the manifest's
    max_draft: int = 16  # the most drafts a round may take (heuristic and auto); never above the export's
    kv_handoff: str = "clean"  # clean | hf (transformers' exact hand-off, for draft-by-draft comparison)
    sampling: SamplingConfig = SamplingConfig()

    def __post_init__(self) -> None:
        check_int("--max-new-tokens", self.max_new_tokens, 1)
        if not isinstance(self.mtp, bool) or not isinstance(self.sampling, SamplingConfig):
            raise UsageError(f"mtp must be a bool and sampling a SamplingConfig (got {self.mtp!r}, {self.sampling!r})")
        k = self.num_assistant_tokens
        if k is not None and k != "auto" and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
            raise UsageError(f"--num-assistant-tokens must be >= 1 or 'auto' (got {k!r}); "
                             "use --no-mtp to disable drafting")
        if self.schedule is not None and self.schedule not in SCHEDULES:
            raise UsageError(f"unknown schedule {self.schedule!r}; use one of {', '.join(SCHEDULES)}")
        if (k == "auto" and self.schedule not in (None, "auto")) or (isinstance(k, int) and self.schedule == "auto"):
            raise UsageError(f"--num-assistant-tokens {k} and --schedule {self.schedule} contradict each other: the "
                             "auto schedule picks k itself; give one of them")
        check_int("--max-draft", self.max_draft, 1)
        if self.kv_handoff not in HANDOFF_MODES:
            raise UsageError(f"unknown --kv-handoff {self.kv_handoff!r}; use one of {', '.join(HANDOFF_MODES)}")

    @classmethod
    def from_options(cls, **options: Any) -> GenConfig:
        """The one way from what a user gives (CLI flags, API keywords) to a GenConfig: its own fields, with
        SamplingConfig's (temperature, top_k, top_p, seed) beside them; an unknown name is a TypeError, as in any
        call."""
        sampling = {f.name for f in fields(SamplingConfig)}
        known = {f.name for f in fields(cls)} - {"sampling"} | sampling
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown generation option {unknown[0]!r}; the options are {', '.join(sorted(known))}")
        return cls(**{k: v for k, v in options.items() if k not in sampling},
                   sampling=SamplingConfig(**{k: v for k, v in options.items() if k in sampling}))

    @property
    def auto(self) -> bool:
        """Draft lengths chosen by the cost model: asked for, or neither a k nor a schedule was given. Not by
        default for seeded sampling: where rounds split depends on call timings, so would the samples drawn."""
        if not self.mtp or "auto" in (self.num_assistant_tokens, self.schedule):
            return self.mtp
        seeded = self.sampling.seed is not None and not self.sampling.greedy
        return self.num_assistant_tokens is None and self.schedule is None and not seeded


class Engine:
    def __init__(self, export: str | Path | Manifest, threads: int | None = None, backend: str | None = None,
                 options: LoadOptions = LoadOptions()):
        """export: an export folder, or a Manifest already read (the exporter's, before it writes manifest.json);
        options: how the backend opens its graphs (runtime/backends LoadOptions)."""
        if threads is not None:
            check_int("--threads", threads, 1)
        self.manifest = export if isinstance(export, Manifest) else load_manifest(export)
        # (target, drafter) as the backend opened them: calibration and tools call them without the meter
        self.untimed = open_backend(self.manifest, backend, threads, options)
        self.meter = CostMeter()  # every call is timed (~1 us each): the auto schedule and `mtpkit bench` read it
        self.target, self.drafter = TimedTarget(self.untimed[0], self.meter), TimedDrafter(self.untimed[1], self.meter)
        self.backend = self.manifest.backend(backend)
        self.kv = self.target.kv
        self.max_draft = self.target.max_draft
        self.codec = TextCodec(self.manifest)
        self.policy: AutoPolicy | None = None  # the auto schedule's state, kept across runs (see auto_policy)
        # the ids whose K/V the cache holds at positions 0.., and the target's call count when they were left
        # there: any target call since (calibration, a tool) voids them
        self.held: tuple[list[int], int] = ([], -1)

    @property
    def threads(self) -> dict[str, int]:
        """Intra-op threads per graph as the backend opened them (ONNX: its per-graph pick; LiteRT: --threads or
        all cores)."""
        return dict(self.untimed[0].threads)

    def resolve(self, cfg: GenConfig, adapt: bool = False) -> GenConfig:
        """cfg against this export, the one place a draft length meets the export's max_draft (a static verify
        length): max_draft capped at it, num_assistant_tokens an int (or "auto") capped at max_draft. The drafter's
        default adapts; a k the caller gave beyond the export is refused, unless adapt (a tool's "up to k")."""
        if cfg.auto:
            return replace(cfg, num_assistant_tokens="auto", max_draft=fit_draft(cfg.max_draft, self.max_draft))
        k = cfg.num_assistant_tokens or self.default_k
        assert isinstance(k, int)  # "auto" took the branch above
        if fit_draft(k, self.max_draft) < k and cfg.num_assistant_tokens is not None and not adapt:
            raise UsageError(f"this {self.backend.kind} export verifies at most {self.max_draft} drafts per round; use "
                             f"--num-assistant-tokens <= {self.max_draft} or re-export with a larger --max-draft")
        k = fit_draft(k, self.max_draft)
        return replace(cfg, num_assistant_tokens=k, max_draft=fit_draft(max(cfg.max_draft, k), self.max_draft))

    def schedule(self, cfg: GenConfig) -> DraftSchedule:
        cfg = self.resolve(cfg)
        k = cfg.num_assistant_tokens
        if k == "auto":
            policy = self.auto_policy(cfg.max_draft)
            return DraftSchedule("auto", policy.start(), cfg.max_draft, policy)
        assert isinstance(k, int)  # resolve gives an int or "auto"
        kind = cfg.schedule or self.manifest.generation.num_assistant_tokens_schedule
        return DraftSchedule(kind, k, cfg.max_draft)

    @cached_property
    def default_k(self) -> int:
        """The drafter's num_assistant_tokens (resolve caps it by a static verify length; logged once per engine,
        not per request: a default adapts)."""
        k = self.manifest.generation.num_assistant_tokens
        if self.max_draft is not None and k > self.max_draft:
            log.info("k = %d: the drafter's num_assistant_tokens (%d) capped by this %s export's verify length",
                     self.max_draft, k, self.backend.kind)
        return k

    def auto_policy(self, max_draft: int) -> AutoPolicy:
        """The engine's auto policy, created on first use and seeded with the calls' costs: timed (a few calls)
        unless an earlier start recorded them (runtime/timings.py)."""
        if self.policy is None:
            recorded = self.backend.options.acceptance_by_position or ()  # the exporter's figure, if any
            prior = [min(1.0, max(0.0, float(a))) for a in recorded]
            self.policy = AutoPolicy(max_draft, self.meter, prior=prior)
            key = timings.key(self.backend, self.threads, max_draft)
            costs = timings.load(key)  # this export's calls timed on this machine by an earlier start
            if costs is None:
                costs = calibrate(*self.untimed, max_draft)
                timings.save(key, costs)
            self.meter.seed(*costs)
        self.policy.max_draft = max_draft
        return self.policy

    def check_request(self, prompt_ids: list[int], cfg: GenConfig) -> None:
        """Raise UsageError for a request this export cannot run (empty prompt, beyond the KV capacity)."""
        if not prompt_ids:
            raise UsageError("the prompt is empty; pass some text")
        needed = self.target.positions_needed(len(prompt_ids), cfg.max_new_tokens)
        if needed > self.kv.capacity:
            raise UsageError(f"prompt ({len(prompt_ids)} tokens) + --max-new-tokens ({cfg.max_new_tokens}) exceeds the "
                             f"export's KV capacity of {self.kv.capacity} tokens; shorten them or re-export with a "
                             "larger --max-cache-len")

    def cached_prefix(self, prompt_ids: list[int]) -> int:
        """How many leading ids of prompt_ids the cache holds already: the longest common prefix with what the
        last generate left there (nothing if a target call ran since), less one: the last id is always run, its
        logits give the first token. Positions are a rewind: what lies past the prefix is overwritten. Nothing
        either where the cache no longer holds what a call at the prefix's end reads (KVStore.resumable)."""
        ids, calls = self.held
        if calls != self.untimed[0].calls:
            return 0
        n = 0
        for n, (a, b) in enumerate(zip(ids, prompt_ids), 1):
            if a != b:
                n -= 1
                break
        n = max(0, min(n, len(prompt_ids) - 1))
        return n if self.kv.resumable(n) else 0  # a sliding-window ring may no longer hold the window before n

    def run(self, prompt_ids: list[int], cfg: GenConfig) -> Stats:
        """Generate to the end for the stats alone (timings, acceptance, calls); the tokens are dropped."""
        stats = Stats()
        for _ in self.generate(prompt_ids, cfg, stats):
            pass
        return stats

    def generate(self, prompt_ids: list[int], cfg: GenConfig, stats: Stats | None = None,
                 reuse: bool = False) -> Generator[tuple[int, bool], None, None]:
        """Yields (token, from_draft); fills stats (timings, acceptance, calls) as it goes. reuse: prefill only
        what follows the prefix the cache holds from the previous generate (cached_prefix); the tokens are the
        same as without."""
        self.check_request(prompt_ids, cfg)
        stats = stats if stats is not None else Stats()
        sampler = Sampler(cfg.sampling)
        eos = set(self.manifest.eos_ids)
        schedule = self.schedule(cfg) if cfg.mtp else None  # before counting calls: auto may calibrate first
        start = self.cached_prefix(prompt_ids) if reuse else 0
        self.kv.keep_from(len(prompt_ids))  # a sliding-window ring keeps the answer, not the whole prompt
        stats.prompt_tokens, stats.cached_tokens = len(prompt_ids), start
        t0, d0 = self.target.calls, self.drafter.calls
        self.target.opening = True
        if schedule is not None:
            tokens = speculative_generate(self.target, self.drafter, prompt_ids, sampler, schedule, cfg.max_new_tokens,
                                          eos, cfg.kv_handoff, stats, start)
        else:
            tokens = ((t, False) for t in plain_generate(self.target, prompt_ids, sampler, cfg.max_new_tokens, eos,
                                                         start))
        produced: list[int] = []
        try:
            for item in timed(tokens, stats):
                produced.append(item[0])
                yield item
        finally:  # once per run, also when the caller stops early; not per token
            stats.target_calls, stats.drafter_calls = self.target.calls - t0, self.drafter.calls - d0
            # every produced token but the newest has its K/V cached; before the first, only what was there
            self.held = (list(prompt_ids) + produced[:-1] if produced else list(prompt_ids[:start]),
                         self.untimed[0].calls)
