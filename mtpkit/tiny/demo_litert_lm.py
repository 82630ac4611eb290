"""`mtpkit demo --backend onnx,litert`, last step: LiteRT-LM, the runtime the Android app ships, on the export's
model.litertlm with speculative decoding off and on, on the demo's held-out prompts.

mtpkit's own LiteRT backend is the desktop reference (parity, the cost model); what a phone runs is LiteRT-LM,
whose speculative decoding reads the bundle's MTP drafter section. Its rows come from `mtpkit bench --peers`
(mtpkit/bench/litert_lm.py, mtpkit/bench/peer_timing.py): every repeat runs every prompt with speculation off, then
on, so both see the same machine load; ms/token is the whole call's wall time over its new tokens (prefill included).
Reported, never asserted.
"""

from __future__ import annotations

import contextlib
import statistics
from pathlib import Path


def litert_lm_check(out: Path, texts: list[str], max_new_tokens: int, repeats: int = 3,
                    threads: int | None = None) -> dict:
    """Speculative vs plain on LiteRT-LM: medians over repeats per prompt, then over prompts; `same_text`: prompts
    whose speculative text agrees with the plain one (greedy speculation must not change it). threads: all cores
    unless given, as mtpkit's LiteRT backend."""
    from importlib.metadata import version

    from mtpkit.bench import peer_timing as lib
    from mtpkit.bench.litert_lm import litert_lm_peers
    from mtpkit.runtime.manifest import load_manifest
    from mtpkit.runtime.quiet import output_captured

    prompts = [lib.PeerPrompt(str(i), text, ()) for i, text in enumerate(texts)]
    with contextlib.ExitStack() as stack:
        plain, spec = litert_lm_peers(load_manifest(out), threads, max_new_tokens, stack)
        with output_captured("LiteRT-LM's first calls"):
            lib.warm_up([plain, spec], prompts[0])
        runs = lib.measure([plain, spec], prompts, repeats)
    plain_row, spec_row = lib.summarize([plain, spec], prompts, runs, decode=None)  # no mtpkit reference row
    speedups = [p["ms_per_token"] / s["ms_per_token"] for p, s in zip(plain_row["per_prompt"], spec_row["per_prompt"])]
    same = sum(_agree(runs[plain.name][q.name][0][1].text, runs[spec.name][q.name][0][1].text) for q in prompts)
    return {"runtime": f"litert-lm {version('litert-lm-api')}", "threads": plain.threads, "prompts": len(prompts),
            "repeats": repeats, "plain_ms_per_token": plain_row["ms_per_token"],
            "speculative_ms_per_token": spec_row["ms_per_token"],
            "median_speedup": statistics.median(speedups), "min_speedup": min(speedups), "same_text": same}


def _agree(plain: str | None, spec: str | None) -> bool:
    """Both have text and it agrees (mtpkit/bench/peer_timing.py texts_agree: a last draft round may run past the
    other)."""
    from mtpkit.bench.peer_timing import texts_agree

    return bool(plain and spec) and texts_agree(plain, spec)


def print_litert_lm(report: dict) -> None:
    print(f"{report['runtime']} (the runtime the Android app ships) on model.litertlm, "
          f"{report['prompts']} held-out prompts: speculative vs plain median {report['median_speedup']:.2f}x "
          f"(min {report['min_speedup']:.2f}x), {report['plain_ms_per_token']:.2f} -> "
          f"{report['speculative_ms_per_token']:.2f} ms/token, same text {report['same_text']}/{report['prompts']}")
