"""`mtpkit bench`: plain, auto and every draft length on one export's graphs (sweep.py, report.py) and, with
--peers, the runtimes a user would otherwise run, timed beside it (peers.py).

This package is the room for measuring the runtime: the bench, its peers and this machine's read bandwidth
(bandwidth.py, for tools/). It may import mtpkit.runtime and mtpkit.export (the transformers peers load the
checkpoints the way the exporter does, with torch); neither imports it (tests/test_runtime_isolation.py). Only the
standard library is imported here at module level, and the exporter only with --peers, so `mtpkit bench` works in
the runtime-only install.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EPILOG = """Per prompt, each repeat runs plain decoding, auto (or the given -k/--schedule) and constant
k = 1..--max-draft back to back; prints the cost model's predicted speed-up beside the measured one for every k, per category.
Without --prompt/--prompts, benchmarks a built-in set (code, structured, rewrite, prose). A --prompts file has
one JSON object per line: {"category": "code", "prompt": "def f(x):", "name": "optional"}.

--chat times something else: a scripted 8-turn conversation (runtime/conversation.py keeps the KV cache between
turns, so each turn prefills only what is new) against a fresh prefill of the same history on a second engine,
turn by turn; it prints time to first token per turn (the median of --repeats conversations), checks every
turn's tokens are the fresh prefill's, and takes --turns, --max-new-tokens (per turn), --repeats, --threads,
--backend and --json.

examples:
  mtpkit bench DIR --out out/bench
  mtpkit bench DIR --chat --backend litert
  mtpkit bench DIR --prompts prompts.jsonl --max-draft 6 --repeats 5
  mtpkit bench DIR --peers --out out/bench

--peers adds a table: ms/token including prefill (wall time of each whole generate call / new tokens) for
mtpkit's runtime on every backend of the export, transformers PyTorch CPU generate() plain and with
assistant_model=drafter on the checkpoints the manifest's source names, each backend's own runtime where it has
one (LiteRT-LM, speculation off and on) and, with the [llama-cpp] extra, llama.cpp plain decoding on the target
converted by llama.cpp's own converter to the GGUF type closest to the export's recipe (fp32 F32, fp16 F16, int8
Q8_0, int4 Q4_0 and Q4_K_M; converted once, cached), each as a ratio to mtpkit, runs interleaved; with the
thread counts each used (--threads N: all use N; by default mtpkit picks per graph, torch and llama.cpp get the
count mtpkit picked for its first backend's target graph, LiteRT-LM all cores as mtpkit's LiteRT backend).
"""


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    from mtpkit.runtime.commands import draft_length, export_arguments

    p.epilog = EPILOG
    export_arguments(p)
    p.add_argument("--prompt", action="append", help="prompt text (repeatable; category 'custom')")
    p.add_argument("--prompts", type=Path, help="JSONL file of {category, prompt[, name]} objects")
    p.add_argument("--repeats", type=int, default=3, help="interleaved runs per prompt (median reported)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-draft", type=int, default=None, help="measure and predict constant k = 1..MAX_DRAFT "
                   "(default 8, or as many drafts as the export's static verify takes: LiteRT 3 by default)")
    p.add_argument("--num-assistant-tokens", "-k", type=draft_length, default=None,
                   help="the speculative column: auto (default) or a fixed k")
    p.add_argument("--schedule", default=None, help="constant | heuristic | auto")
    p.add_argument("--peers", action="store_true",
                   help="also time transformers generate() (plain, assisted), llama.cpp (plain; with the "
                        "llama-cpp extra) and, for LiteRT exports, LiteRT-LM (speculation off, on) on the same "
                        "prompts, as ratios to mtpkit [needs the export extra]")
    p.add_argument("--chat", action="store_true", help="time to first token per turn of a scripted 8-turn "
                   "conversation, the cache kept between turns, beside a fresh prefill of each turn's history")
    p.add_argument("--turns", type=int, default=None, help="--chat: how many of its 8 scripted turns (default 8)")
    p.add_argument("--out", type=Path, help="write bench.json, bench.md and bench.png to this folder")
    p.add_argument("--json", dest="json_file", type=Path, help="also write the full report to this file")


def run(args: argparse.Namespace) -> int:
    from mtpkit.errors import UsageError

    from .report import Progress, print_bench, write_report
    from .sweep import BenchConfig, load_prompts, run_bench

    if args.chat:
        return _chat(args)
    if args.turns is not None:
        raise UsageError("--turns counts the turns of --chat; add --chat or drop --turns")

    run_peers = _peers(args) if args.peers else None  # first: without the [export] extra, one line at once
    cfg = BenchConfig(repeats=args.repeats, max_new_tokens=args.max_new_tokens, max_draft=args.max_draft,
                      num_assistant_tokens=args.num_assistant_tokens, schedule=args.schedule)
    prompts = [*(load_prompts(args.prompts) if args.prompts else []), *(args.prompt or [])]
    peers = None if run_peers is None else (
        lambda engine, items, tell: run_peers(engine, items, cfg, args.threads, tell))
    progress = Progress(getattr(args, "quiet", False))
    try:
        report = run_bench(args.dir, cfg, prompts, args.threads, args.backend, progress, peers)
    finally:
        progress.close()
    if args.json_file:
        args.json_file.write_text(json.dumps(report, indent=2) + "\n")
    notes = write_report(report, args.out) if args.out else []
    print_bench(report, args.repeats)
    for note in notes:
        print(f"mtpkit bench: {note}", file=sys.stderr)
    return 0


def _peers(args: argparse.Namespace):
    """peers.run_peers, once the [export] extra and the export's checkpoints are found: before minutes of mtpkit's
    own bench, not after."""
    from mtpkit.extras import require

    require("export", "mtpkit bench --peers (transformers generate() is a peer)")
    from mtpkit.runtime.manifest import load_manifest

    from .peers import resolve_sources, run_peers

    resolve_sources(load_manifest(args.dir, verify=False))  # the bench opens (and checks) the export itself
    return run_peers


def _chat(args: argparse.Namespace) -> int:
    from mtpkit.errors import UsageError

    from .chat import TURNS, ChatBenchConfig, format_chat_bench, run_chat_bench
    from .report import Progress

    if args.peers or args.prompt or args.prompts or args.out:
        raise UsageError("--chat takes --turns, --max-new-tokens, --repeats, --threads, --backend and --json; drop "
                         "--peers, --prompt, --prompts and --out")
    cfg = ChatBenchConfig(max_new_tokens=args.max_new_tokens, turns=args.turns or len(TURNS), repeats=args.repeats)
    progress = Progress(getattr(args, "quiet", False))
    try:
        report = run_chat_bench(args.dir, cfg, args.threads, args.backend, progress)
    finally:
        progress.close()
    if args.json_file:
        args.json_file.write_text(json.dumps(report, indent=2) + "\n")
    print(format_chat_bench(report))
    return 0
