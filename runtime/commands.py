"""`mtpkit run` and `mtpkit parity` (torch-free)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from mtpkit.errors import UsageError

from .roles import BACKENDS

if TYPE_CHECKING:
    from .engine import GenConfig

RUN_EPILOG = """Streams text as it is produced; --json prints prompt ids, output ids, text and stats instead.
Greedy by default (output identical to transformers). With --temperature > 0 drafts are sampled from the
drafter's processed distribution and accepted with the rejection rule, so samples follow the target's own
distribution exactly. By default the draft length is auto: chosen each round by a cost model from the
measured cost of each call and the acceptance seen so far, including plain decoding when drafting does not pay.
Give -k N and/or --schedule constant|heuristic for a fixed rule (the missing one comes from the drafter's
generation_config recorded in the manifest); that rule is also the default for seeded sampling (--seed with
--temperature > 0), whose samples would otherwise depend on timing through the rounds auto chooses.

examples:
  mtpkit run DIR --prompt "def fib(n):" --max-new-tokens 64
  mtpkit run DIR --prompt "Write a haiku" --chat --temperature 0.8 --top-p 0.95 --seed 1
  mtpkit run DIR --prompt "hello" --no-mtp --json
  mtpkit run DIR --prompt "def fib(n):" -k 4 --schedule constant
"""

def draft_length(text: str) -> int | str:
    """-k: a positive integer or 'auto' (checked again by GenConfig, which names the flag)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer or 'auto' (got {text!r})") from None


GENERATION_FLAGS = ("max_new_tokens", "mtp", "num_assistant_tokens", "schedule", "max_draft", "kv_handoff",
                    "temperature", "top_k", "top_p", "seed")


def generation_config(args: argparse.Namespace) -> GenConfig:
    """GenConfig.from_options over the generation flags a command defines (run and chat share their spelling)."""
    from .engine import GenConfig

    return GenConfig.from_options(**{k: getattr(args, k) for k in GENERATION_FLAGS if hasattr(args, k)})


def export_arguments(p: argparse.ArgumentParser) -> None:
    """DIR, --threads and --backend: how every command that runs an export opens it."""
    p.add_argument("dir", type=Path, help="export folder written by 'mtpkit export'")
    p.add_argument("--threads", type=int, default=None,
                   help="intra-op threads (default: per graph, the faster of 1 and all cores, timed at start)")
    p.add_argument("--backend", default=None,
                   help=f"{' | '.join(BACKENDS)} (default: the first of these the export has)")


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    export_arguments(p)
    if name == "parity":
        p.add_argument("--json", dest="json_file", type=Path, help="also write the full report to this file")
        return
    p.epilog = RUN_EPILOG
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text")
    source.add_argument("--prompt-file", type=Path, help="read the prompt from this UTF-8 text file")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn in the chat template")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--num-assistant-tokens", "-k", type=draft_length, default=None,
                   help="draft length k per round, or auto (default: auto unless --schedule is given)")
    p.add_argument("--schedule", default=None,
                   help="constant | heuristic (+2 after a fully accepted round, -1 otherwise) | auto")
    p.add_argument("--max-draft", type=int, default=16, help="largest k the heuristic and auto schedules may reach "
                   "(never above the export's static verify: LiteRT's --max-draft)")
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
    from .engine import Engine
    from .stats import Stats, stats_line
    from .tokenizer import StreamDecoder

    cfg = generation_config(args)
    prompt = prompt_text(args.prompt, args.prompt_file)  # before the export opens: bad input fails fast
    engine = Engine(args.dir, args.threads, args.backend)
    prompt_ids = engine.codec.encode(prompt, chat=args.chat)
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
        sys.stderr.write(stats_line(summary, cfg.mtp) + "\n")
        sys.stderr.flush()
    return 0


def prompt_text(text: str | None, path: Path | None) -> str:
    """The prompt of --prompt or --prompt-file; refused when empty or when the file is not valid UTF-8."""
    flag = "--prompt"
    if path is not None:
        flag = f"--prompt-file {path}"
        try:
            data = path.read_bytes()
        except OSError as e:
            raise UsageError(f"{flag}: cannot read it ({e.strerror})") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(f"{flag} is not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); "
                             "save it as UTF-8") from None
    if not text:
        raise UsageError(f"{flag} is empty; pass some text")
    return text


def _parity(args: argparse.Namespace) -> int:
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
