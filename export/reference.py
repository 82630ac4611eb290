"""Export-time reference from transformers, so that later parity checks need no torch.

For each fixed prompt it records: the prompt ids, the target's logits at the last prompt position, plain
greedy `generate()`, and `generate(assistant_model=drafter)` for several draft lengths together with the
drafts transformers proposed in every round.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from .progress import progress
from .scoped import patched

DRAFT_LENGTHS = (1, 2, 4, 8)


def draft_lengths(max_draft: int | None) -> tuple[int, ...]:
    """DRAFT_LENGTHS plus a static verify's longest round (LiteRT's default 3), so that parity covers it."""
    return tuple(sorted({*DRAFT_LENGTHS, max_draft})) if max_draft else DRAFT_LENGTHS


PROMPTS = [
    ("short", "Hi"),
    ("code", "def fibonacci(n):\n    if n < 2:\n        return n\n"),
    ("prose", "The quick brown fox jumps over the lazy dog. "),
]
LONG_TEXT = "Speculative decoding drafts several tokens and verifies them in one target pass. "


def reference_prompts(encode, bos_id: int, sliding_window: int, chat_ids: list[int] | None) -> list[tuple[str, list[int]]]:
    """Fixed prompts as token ids; one is longer than the sliding window so parity crosses it."""
    prompts = [(name, [bos_id, *encode(text)]) for name, text in PROMPTS]
    long_ids = [bos_id]
    while len(long_ids) <= sliding_window + 8:
        long_ids += encode(LONG_TEXT)
    prompts.append(("long", long_ids))
    if chat_ids:
        prompts.append(("chat", chat_ids))
    return prompts


@contextlib.contextmanager
def record_drafts():
    """Record the drafts transformers' Gemma 4 candidate generator proposes (undone on exit): one
    (context length, draft ids) pair per drafting round.

    Scoped to transformers 5.24's SinglePositionMultiTokenCandidateGenerator.get_candidates.
    """
    from transformers.generation.candidate_generator import SinglePositionMultiTokenCandidateGenerator as Gen

    rounds: list[tuple[int, list[int]]] = []
    original = Gen.get_candidates

    def wrapped(self, input_ids, *args, **kwargs):
        candidate_ids, logits = original(self, input_ids, *args, **kwargs)
        if logits is not None:
            rounds.append((input_ids.shape[1], candidate_ids[0, input_ids.shape[1]:].tolist()))
        return candidate_ids, logits

    with patched(Gen, "get_candidates", wrapped):
        yield rounds


def greedy_kwargs(max_new_tokens: int, eos_ids: list[int]) -> dict:
    """generate() arguments for greedy decoding that stops at the export's EOS ids (also `mtpkit bench --peers`)."""
    return dict(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos_ids, pad_token_id=eos_ids[0])


def load_pair(target_src, drafter_src) -> tuple:
    """Target and drafter as the exporter loads them (fp32, eval mode), with their generation_config.json as
    from_pretrained would read it (the drafter's k and schedule)."""
    from transformers import GenerationConfig

    from .models import drafter_adapter, target_adapter

    models = []
    for src, adapter in ((target_src, target_adapter), (drafter_src, drafter_adapter)):
        model = adapter(src).load(src)
        if (src.folder / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_pretrained(src.folder)
        models.append(model)
    return tuple(models)


def record(target, drafter, prompts, max_new_tokens: int, eos_ids: list[int],
           lengths: tuple[int, ...] = DRAFT_LENGTHS) -> tuple[dict, dict]:
    """Run transformers on every prompt.

    Returns:
        (json-able reference dict, arrays for reference.npz)
    """
    entries, arrays = [], {}
    gen = greedy_kwargs(max_new_tokens, eos_ids)
    with torch.no_grad(), patched(drafter.generation_config, "num_assistant_tokens",
                                  drafter.generation_config.num_assistant_tokens), \
            progress(len(prompts), "reference", "prompts") as advance:
        for name, ids in prompts:
            x = torch.tensor([ids])
            arrays[f"{name}.last_logits"] = target(x).logits[0, -1].numpy().astype(np.float32)
            plain = target.generate(x, **gen)[0, len(ids):].tolist()
            assisted = {}
            for k in lengths:
                drafter.generation_config.num_assistant_tokens = k
                with record_drafts() as rounds:
                    out = target.generate(x, assistant_model=drafter, **gen)[0, len(ids):].tolist()
                assisted[str(k)] = {"output_ids": out, "drafts": [drafts for _, drafts in rounds]}
            entries.append({"name": name, "prompt_ids": list(ids), "greedy_ids": plain, "assisted": assisted})
            advance(1)
    return {"max_new_tokens": max_new_tokens, "eos_ids": eos_ids, "prompts": entries}, arrays
