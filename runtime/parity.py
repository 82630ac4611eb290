"""`mtpkit parity`: replay the export-time transformers reference through the runtime, token for token.

Checks per reference prompt: plain greedy == transformers greedy; speculative greedy == transformers greedy
for every recorded draft length, with both schedules and both KV hand-off modes; and in `hf` hand-off mode
the drafts of every round == the drafts transformers proposed. No torch needed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .engine import Engine, GenConfig
from .manifest import ManifestError
from .stats import Stats


@dataclass
class Check:
    prompt: str
    name: str
    ok: bool
    first_mismatch: int | None = None
    detail: dict = field(default_factory=dict)


def _first_mismatch(a: list, b: list) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _compare(prompt: str, name: str, got: list, want: list, **detail: int) -> Check:
    miss = _first_mismatch(got, want)
    return Check(prompt, name, miss is None, miss, detail)


def _run(engine: Engine, ids: list[int], cfg: GenConfig) -> tuple[list[int], Stats]:
    stats = Stats()
    tokens = [t for t, _ in engine.generate(ids, cfg, stats)]
    return tokens, stats


def check_prompt(engine: Engine, entry: dict, max_new: int, draft_lengths: list[int]) -> list[Check]:
    name, ids, want = entry["name"], entry["prompt_ids"], entry["greedy_ids"]
    plain, _ = _run(engine, ids, GenConfig(max_new_tokens=max_new, mtp=False))
    checks = [_compare(name, "plain greedy == transformers greedy", plain, want)]
    for k in draft_lengths:
        hf = entry["assisted"][str(k)]
        checks.append(_compare(name, f"transformers assisted k={k} == transformers greedy", hf["output_ids"], want))
        for schedule in ("constant", "heuristic"):
            out, stats = _run(engine, ids, GenConfig(max_new_tokens=max_new, num_assistant_tokens=k, schedule=schedule))
            checks.append(_compare(name, f"speculative k={k} {schedule} == transformers greedy", out, want,
                                   accepted=stats.accepted, drafted=stats.drafted))
        out, stats = _run(engine, ids, GenConfig(max_new_tokens=max_new, num_assistant_tokens=k,
                                                 schedule="constant", kv_handoff="hf"))
        checks.append(_compare(name, f"speculative k={k} hf-handoff == transformers greedy", out, want))
        checks.append(_compare(name, f"drafts k={k} hf-handoff == transformers drafts", stats.drafts, hf["drafts"],
                               rounds=len(hf["drafts"])))
    return checks


def run_parity(export_dir: str | Path, threads: int | None = None, backend: str | None = None) -> dict:
    """Returns the report; report['ok'] is False on any mismatch."""
    engine = Engine(export_dir, threads, backend)
    ref_entry = engine.manifest.reference
    if not ref_entry:
        raise ManifestError(f"{export_dir} has no transformers reference; re-export with 'mtpkit export' to record one")
    ref = json.loads(engine.manifest.path(ref_entry["file"]).read_text())
    # a static verify length (LiteRT) bounds k; longer recorded draft lengths are reported as not run
    lengths = [k for k in ref_entry["draft_lengths"] if engine.max_draft is None or k <= engine.max_draft]
    skipped = sorted(set(ref_entry["draft_lengths"]) - set(lengths))
    checks = []
    for entry in ref["prompts"]:
        checks += check_prompt(engine, entry, ref["max_new_tokens"], lengths)
    failed = [c for c in checks if not c.ok]
    return {"ok": not failed, "backend": engine.backend.kind, "checks": len(checks), "failed": len(failed),
            "prompts": [e["name"] for e in ref["prompts"]], "draft_lengths": lengths,
            "draft_lengths_not_supported": skipped, "results": [c.__dict__ for c in checks]}
