"""Measure a target + drafter pair the way transformers runs it: assisted greedy generate vs plain greedy.

Drafts are recorded with the export reference's record_drafts (what HF's loop actually proposes, stale K/V
hand-over included) and target calls by wrapping target.forward.
"""

from __future__ import annotations

import re
from contextlib import contextmanager

import torch

from mtpkit.export.reference import record_drafts
from mtpkit.export.scoped import patched
from mtpkit.runtime.stats import tokens_per_target_call

# A prompt ends where the model must continue code, or inside a docstring/comment (prose-like text).
CATEGORIES = {
    "code": re.compile(r"^ {4,}(?:(?:if|for|return|while|def|with|elif)\b|try:)[^\n#\"']*\n", re.M),
    "docstring/comment": re.compile(r"(?:^\s*\"\"\"[A-Z][a-z]+ [a-z]+ |^\s*# [A-Z][a-z]+ [a-z]+ )", re.M),
}
CONTEXT_CHARS = 400


def eval_prompts(texts: list[str], per_category: int) -> list[tuple[str, str]]:
    """(category, prompt) pairs from held-out files, taken round-robin over files so no single file dominates."""
    prompts = []
    for name, pattern in CATEGORIES.items():
        per_file = [[m.end() for m in pattern.finditer(t) if m.end() > CONTEXT_CHARS] for t in texts]
        picked, rank = [], 0
        while len(picked) < per_category and any(rank < len(ends) for ends in per_file):
            for text, ends in zip(texts, per_file):
                if rank < len(ends) and len(picked) < per_category:
                    start = text.rfind("\n", 0, ends[rank] - CONTEXT_CHARS) + 1  # begin on a whole line
                    picked.append((name, text[start:ends[rank]]))
            rank += 3  # skip neighbours: consecutive matches share most of their context
        prompts.extend(picked)
    return prompts


@contextmanager
def count_forwards(target):
    """Yield a one-item list that counts target forwards (undone on exit)."""
    calls, forward = [0], target.forward

    def counted(*args, **kwargs):
        calls[0] += 1
        return forward(*args, **kwargs)

    with patched(target, "forward", counted):
        yield calls


def run_prompt(target, drafter, ids: torch.Tensor, new_tokens: int) -> dict:
    """One prompt: plain greedy, assisted greedy, and per-round acceptance against the greedy reference."""
    with torch.no_grad():
        greedy = target.generate(ids, do_sample=False, max_new_tokens=new_tokens)[0].tolist()
        with record_drafts() as rounds, count_forwards(target) as calls:
            assisted = target.generate(ids, assistant_model=drafter, do_sample=False, max_new_tokens=new_tokens)
    assisted = assisted[0].tolist()
    first_hits, first_total, accepted = 0, 0, []
    for length, drafts in rounds:
        truth = greedy[length:length + len(drafts)]
        if not truth:
            continue
        first_total += 1
        first_hits += drafts[0] == truth[0]
        n = 0
        while n < min(len(drafts), len(truth)) and drafts[n] == truth[n]:
            n += 1
        accepted.append(n)
    new = len(assisted) - ids.shape[1]
    return {"lossless": assisted == greedy, "new_tokens": new, "target_calls": calls[0], "rounds": len(rounds),
            "first_hits": first_hits, "first_total": first_total, "accepted": accepted}


def summarise(results: list[dict]) -> dict:
    first_total = sum(r["first_total"] for r in results)
    accepted = [a for r in results for a in r["accepted"]]
    new, calls = sum(r["new_tokens"] for r in results), sum(r["target_calls"] for r in results)
    return {
        "prompts": len(results), "lossless": all(r["lossless"] for r in results),
        "lossless_prompts": sum(r["lossless"] for r in results),
        "acceptance_pos1": round(sum(r["first_hits"] for r in results) / max(1, first_total), 4),
        "mean_accepted_per_round": round(sum(accepted) / max(1, len(accepted)), 4),
        "tokens_per_target_call": round(tokens_per_target_call(new, calls) or 0.0, 4),
        "new_tokens": new, "target_calls": calls, "draft_rounds": len(accepted),
    }


def measure_pair(target, drafter, tokenizer, prompts: list[tuple[str, str]], new_tokens: int) -> dict:
    """Per-category and overall figures; tokens per target call counts the prefill call too."""
    from ..make import BOS_ID

    per_cat: dict[str, list] = {}
    for category, text in prompts:
        ids = torch.tensor([[BOS_ID] + tokenizer.encode(text, add_special_tokens=False).ids])
        per_cat.setdefault(category, []).append(run_prompt(target, drafter, ids, new_tokens))
    figures = {cat: summarise(res) for cat, res in per_cat.items()}
    figures["all"] = summarise([r for res in per_cat.values() for r in res])
    figures["max_new_tokens"] = new_tokens
    figures["num_assistant_tokens"] = int(drafter.generation_config.num_assistant_tokens)
    return figures
