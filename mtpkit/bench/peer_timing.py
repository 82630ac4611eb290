"""`mtpkit bench --peers`: mtpkit beside the runtimes a user would otherwise run, on the same prompts (torch-free).

A peer is a name and a callable prompt -> PeerOutput; peers.py picks them and builds the transformers ones,
litert_lm.py and llama_cpp.py build LiteRT-LM's and llama.cpp's.
Every repeat runs every prompt on every peer back to back, so all see the same machine load. ms/token is the
wall time of the whole call, prefill included, over its new tokens: median over repeats per prompt, then over
prompts. Each peer is compared with one mtpkit row, its baseline: ratio = peer ms/token / baseline ms/token per
prompt, median over prompts (> 1: mtpkit is faster). Tokens are compared with the reference, the first mtpkit row
(plain greedy on the export's first backend); reported, never asserted. Speed is never asserted either.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from mtpkit.runtime.engine import Engine, GenConfig

TIMING = "wall time of the whole generate call / new tokens (prefill included)"


@dataclass(frozen=True)
class PeerPrompt:
    name: str
    text: str
    ids: tuple[int, ...]  # mtpkit's tokenization (BOS included): what the token-level peers are given


@dataclass(frozen=True)
class PeerOutput:
    new_tokens: int
    tokens: tuple[int, ...] | None = None  # None: the peer returns text only (LiteRT-LM); compared as text
    text: str | None = None


@dataclass(frozen=True)
class Peer:
    name: str
    run: Callable[[PeerPrompt], PeerOutput]
    threads: object  # what it ran with, as recorded in the report (an int, or mtpkit's per-graph dict)
    baseline: str | None = None  # the mtpkit row it is compared with; None for mtpkit's own rows
    note: str = ""


def mtpkit_peers(engine: Engine, plain_cfg: GenConfig, spec_cfg: GenConfig, threads: object) -> list[Peer]:
    """mtpkit's plain and speculative rows on one open Engine (its backend names them)."""
    kind = engine.backend.kind

    def runner(cfg: GenConfig) -> Callable[[PeerPrompt], PeerOutput]:
        def run(prompt: PeerPrompt) -> PeerOutput:
            tokens = tuple(t for t, _ in engine.generate(list(prompt.ids), cfg))
            return PeerOutput(len(tokens), tokens)
        return run

    spec = spec_cfg.num_assistant_tokens or spec_cfg.schedule or "auto"
    return [Peer(f"mtpkit {kind} plain", runner(plain_cfg), threads),
            Peer(f"mtpkit {kind} spec", runner(spec_cfg), threads, note=f"draft length {spec}")]


def warm_up(peers: list[Peer], prompt: PeerPrompt) -> None:
    """One untimed call per peer: first calls pay allocation, lazy initialisation and kernel selection."""
    for peer in peers:
        peer.run(prompt)


def measure(peers: list[Peer], prompts: list[PeerPrompt], repeats: int,
            progress: Callable[[str], None] | None = None, clock: Callable[[], float] = time.perf_counter) -> dict:
    """{peer name: {prompt name: [(seconds, PeerOutput) per repeat]}}; every repeat runs every prompt on every
    peer, in the order given."""
    runs: dict[str, dict[str, list[tuple[float, PeerOutput]]]] = {p.name: {q.name: [] for q in prompts} for p in peers}
    for rep in range(repeats):
        for prompt in prompts:
            for peer in peers:
                if progress:
                    progress(f"peers {rep + 1}/{repeats} {prompt.name}: {peer.name}")
                start = clock()
                out = peer.run(prompt)
                runs[peer.name][prompt.name].append((clock() - start, out))
    return runs


def summarize(peers: list[Peer], prompts: list[PeerPrompt], runs: dict, decode: Callable) -> list[dict]:
    """One JSON-ready row per peer: median ms/token, ratio to its baseline, tokens equal to the reference's."""
    ms = {p.name: {q.name: statistics.median(1e3 * s / max(1, o.new_tokens) for s, o in runs[p.name][q.name])
                   for q in prompts} for p in peers}
    reference = reference_name(peers)
    ref = runs.get(reference)
    rows = []
    for peer in peers:
        per = []
        for q in prompts:
            base = ms.get(peer.baseline, {}).get(q.name) if peer.baseline else None
            out = runs[peer.name][q.name][0][1]
            per.append({"prompt": q.name, "ms_per_token": ms[peer.name][q.name], "new_tokens": out.new_tokens,
                        "ratio": ms[peer.name][q.name] / base if base else None,
                        "same_tokens": _same(out, ref[q.name][0][1], decode) if ref and peer.name != reference
                        else None})
        ratios = [r["ratio"] for r in per if r["ratio"] is not None]
        same = [r["same_tokens"] for r in per if r["same_tokens"] is not None]
        rows.append({"name": peer.name, "baseline": peer.baseline, "threads": peer.threads, "note": peer.note,
                     "ms_per_token": statistics.median(ms[peer.name].values()),
                     "ratio": statistics.median(ratios) if ratios else None,
                     "same_tokens": sum(same) if same else None, "compared": len(same), "per_prompt": per})
    return rows


def reference_name(peers: list[Peer]) -> str | None:
    """The row every other one's tokens are compared with: the first of mtpkit's own (no baseline), if any."""
    return next((p.name for p in peers if p.baseline is None), None)


def _same(out: PeerOutput, ref: PeerOutput, decode: Callable) -> bool:
    if out.tokens is not None:
        return out.tokens == ref.tokens
    # text-only peers: the text must agree with mtpkit's where both have some and cover all but mtpkit's last token
    # (LiteRT-LM may leave the last token out of its text, or add a last draft round's tokens)
    assert ref.tokens is not None  # the reference is mtpkit's plain row, which always has tokens
    text, short = out.text or "", decode(list(ref.tokens[:-1]))
    return texts_agree(text, decode(list(ref.tokens))) and len(text) >= len(short)


def texts_agree(a: str, b: str) -> bool:
    """Equal over their common length: one of them may stop early or run a last draft round past the other."""
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def section(peers: list[Peer], prompts: list[PeerPrompt], runs: dict, decode: Callable, max_new_tokens: int,
            repeats: int, notes: list[str]) -> dict:
    """The report's `peers` section."""
    return {"timing": TIMING, "max_new_tokens": max_new_tokens, "repeats": repeats, "reference": reference_name(peers),
            "prompts": [q.name for q in prompts], "rows": summarize(peers, prompts, runs, decode), "notes": notes}


def verdict(row: dict) -> str:
    """'mtpkit onnx plain is 11.2x faster than transformers plain' (or slower), '' without a baseline."""
    r = row["ratio"]
    if not row["baseline"] or not r:
        return ""
    return (f"{row['baseline']} is {r:.1f}x faster than {row['name']}" if r >= 1
            else f"{row['baseline']} is {1 / r:.1f}x slower than {row['name']}")


def table_rows(sec: dict) -> list[list[str]]:
    rows = [["runtime", "threads", "ms/token", "vs mtpkit", "same tokens", "note"]]
    for r in sec["rows"]:
        same = "reference" if r["name"] == sec["reference"] else (
            f"{r['same_tokens']}/{r['compared']}" if r["compared"] else "-")
        rows.append([r["name"], format_threads(r["threads"]), f"{r['ms_per_token']:.3f}", verdict(r) or "-", same,
                     r["note"]])
    return rows


def format_threads(threads: object) -> str:
    if isinstance(threads, dict):
        return ",".join(f"{g} {n}" for g, n in threads.items())
    return str(threads)


def print_peers(sec: dict) -> None:
    rows = table_rows(sec)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(f"\npeers: ms/token = {sec['timing']}; median over {sec['repeats']} interleaved repeats, then over "
          f"{len(sec['prompts'])} prompts; max-new-tokens {sec['max_new_tokens']}; vs mtpkit: per-prompt ratio, "
          "median")
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    for note in sec["notes"]:
        print(f"  note: {note}")


def to_markdown(sec: dict) -> list[str]:
    """The `## Peers` lines of bench.md."""
    head, *body = table_rows(sec)
    lines = ["## Peers", "", f"ms/token = {sec['timing']}; median over {sec['repeats']} interleaved repeats, then "
             f"over {len(sec['prompts'])} prompts; max-new-tokens {sec['max_new_tokens']}. Same tokens: equal to "
             f"{sec['reference']}'s greedy output.", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return lines + [""] + [f"- {n}" for n in sec["notes"]] + [""]
