"""`mtpkit run` and `mtpkit parity` (torch-free)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .roles import BACKENDS

RUN_EPILOG = """Streams text as it is produced; --json prints prompt ids, output ids, text and stats instead.
Greedy by default (output identical to transformers). With --temperature > 0 drafts are sampled from the
drafter's processed distribution and accepted with the rejection rule, so samples follow the target's own
distribution exactly. Defaults for --num-assistant-tokens and --schedule come from the drafter's
generation_config recorded in the manifest.

examples:
  mtpkit run DIR --prompt "def fib(n):" --max-new-tokens 64
  mtpkit run DIR --prompt "Write a haiku" --chat --temperature 0.8 --top-p 0.95 --seed 1
  mtpkit run DIR --prompt "hello" --no-mtp --json
"""


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("dir", type=Path, help="export folder written by 'mtpkit export'")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: all cores)")
    p.add_argument("--backend", default=None, help=f"{' | '.join(BACKENDS)} (default: onnx when the export has it)")
    if name == "parity":
        p.add_argument("--json", dest="json_file", type=Path, help="also write the full report to this file")
        return
    if name == "bench":
        p.epilog = "Without --prompt, benchmarks the export's reference prompts. Reports ratios from one run."
        p.add_argument("--prompt", action="append", help="prompt text (repeatable)")
        p.add_argument("--repeats", type=int, default=3, help="interleaved runs per prompt (median reported)")
        p.add_argument("--max-new-tokens", type=int, default=64)
        p.add_argument("--num-assistant-tokens", "-k", type=int, default=None)
        p.add_argument("--schedule", default=None, help="constant | heuristic")
        p.add_argument("--json", dest="json_file", type=Path, help="also write the full report to this file")
        return
    p.epilog = RUN_EPILOG
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn in the chat template")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--num-assistant-tokens", "-k", type=int, default=None, help="draft length k per round")
    p.add_argument("--schedule", default=None, help="constant | heuristic (+2 after a fully accepted round, -1 otherwise)")
    p.add_argument("--draft-cap", type=int, default=16, help="largest k the heuristic schedule may reach")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no-mtp", dest="mtp", action="store_false", help="plain decoding, no drafter")
    p.add_argument("--kv-handoff", default="clean", help="clean (committed K/V only) | hf (as transformers)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")


def run(args: argparse.Namespace) -> int:
    if args.command == "parity":
        return _parity(args)
    if args.command == "bench":
        return _bench(args)
    from .engine import Engine, GenConfig
    from .sampling import SamplingConfig
    from .stats import Stats
    from .tokenizer import StreamDecoder

    cfg = GenConfig(max_new_tokens=args.max_new_tokens, mtp=args.mtp, num_assistant_tokens=args.num_assistant_tokens,
                    schedule=args.schedule, draft_cap=args.draft_cap, kv_handoff=args.kv_handoff,
                    sampling=SamplingConfig(args.temperature, args.top_k, args.top_p, args.seed))
    engine = Engine(args.dir, args.threads, args.backend)
    prompt_ids = engine.codec.encode(args.prompt, chat=args.chat)
    stats, out = Stats(), []
    stream = StreamDecoder(engine.codec)
    for token, _ in engine.generate(prompt_ids, cfg, stats):
        out.append(token)
        if not args.json:
            sys.stdout.write(stream.push(token))
            sys.stdout.flush()
    summary = stats.summary()
    if args.json:
        print(json.dumps({"prompt_ids": prompt_ids, "output_ids": out, "text": engine.codec.decode(out),
                          "stats": summary}))
    else:
        print(flush=True)  # end the streamed text before the stats line on stderr
        sys.stderr.write(_stats_line(summary, cfg.mtp) + "\n")
        sys.stderr.flush()
    return 0


def _stats_line(s: dict, mtp: bool) -> str:
    line = f"mtpkit: {s['new_tokens']} tokens, {s['tokens_per_s'] or 0:.1f} tok/s, ttft {s['ttft_ms']:.1f} ms"
    if mtp and s["drafted"]:
        line += (f", accepted {s['accepted']}/{s['drafted']} drafts ({100 * s['acceptance_rate']:.0f}%), "
                 f"{s['tokens_per_target_call']:.2f} tokens per target call")
    return line


def _parity(args) -> int:
    from .parity import run_parity

    report = run_parity(args.dir, args.threads, args.backend)
    if args.json_file:
        args.json_file.write_text(json.dumps(report, indent=2) + "\n")
    for r in report["results"]:
        if not r["ok"]:
            print(f"MISMATCH [{r['prompt']}] {r['name']} (first at {r['first_mismatch']})", file=sys.stderr)
    verdict = "PASS" if report["ok"] else "FAIL"
    print(f"parity {verdict} ({report['backend']}): {report['checks'] - report['failed']}/{report['checks']} checks "
          f"passed over {len(report['prompts'])} prompts, k in {report['draft_lengths']}")
    if report["draft_lengths_not_supported"]:
        print(f"  not run: k in {report['draft_lengths_not_supported']} (beyond this export's static verify length)")
    return 0 if report["ok"] else 1


def _bench(args) -> int:
    from .bench import BenchConfig, run_bench

    cfg = BenchConfig(repeats=args.repeats, max_new_tokens=args.max_new_tokens,
                      num_assistant_tokens=args.num_assistant_tokens, schedule=args.schedule)
    report = run_bench(args.dir, cfg, args.prompt, args.threads, args.backend)
    if args.json_file:
        args.json_file.write_text(json.dumps(report, indent=2) + "\n")
    print_bench(report, args.repeats)
    return 0


def print_bench(report: dict, repeats: int) -> None:
    print(f"{'prompt':<10} {'plain ms/tok':>12} {'spec ms/tok':>12} {'speedup':>8} {'accept':>7} {'tok/call':>8}")
    for r in report["rows"]:
        acc = f"{100 * r['acceptance_rate']:.0f}%" if r["acceptance_rate"] is not None else "-"
        per_call = f"{r['tokens_per_target_call']:.2f}" if r["tokens_per_target_call"] else "-"
        print(f"{r['prompt']:<10} {r['plain_ms_per_token']:>12.2f} {r['speculative_ms_per_token']:>12.2f} "
              f"{r['speedup']:>7.2f}x {acc:>7} {per_call:>8}")
    print(f"median speedup {report['median_speedup']:.2f}x ({report['backend']}, speculative vs plain on the same "
          f"graphs, {repeats} interleaved repeats)")
