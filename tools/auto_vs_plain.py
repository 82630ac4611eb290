"""`mtpkit run` with no draft-length flag (auto) against `--no-mtp`, as a fresh process sees it (docs/performance.md).

    .venv/bin/python tools/auto_vs_plain.py EXPORT_DIR [--repeats 5] [--max-new-tokens 64]

Every run opens a fresh Engine (what `mtpkit run` does, calibration included), alternating auto and plain per
prompt; the decode phase is compared (ms per token after the first): the median of the per-repeat ratios, each
from two adjacent runs. Prompts: the bench's built-in set and the export's reference prompts.
"""

from __future__ import annotations

import argparse
import json
import statistics

from mtpkit.bench.sweep import PROMPTS, ms_per_token
from mtpkit.runtime.engine import Engine, GenConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("export")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=None, help="fixed intra-op threads (default: the runtime's pick)")
    args = p.parse_args()
    probe = Engine(args.export)
    ref = json.loads((probe.manifest.root / "reference.json").read_text())
    items = [(f"{q.category}/{q.name}", probe.codec.encode(q.text)) for q in PROMPTS]
    items += [(f"reference/{q['name']}", q["prompt_ids"]) for q in ref["prompts"]]
    modes = {"auto": GenConfig(max_new_tokens=args.max_new_tokens),
             "plain": GenConfig(max_new_tokens=args.max_new_tokens, mtp=False)}
    print("| prompt | plain ms/tok | auto ms/tok | auto / plain time | auto accepted/drafted (tokens) |")
    print("|---|---|---|---|---|")
    worst = 0.0
    for name, ids in items:
        ms, threads = {m: [] for m in modes}, {m: set() for m in modes}
        drafted = []
        for _ in range(args.repeats):
            for mode, cfg in modes.items():
                engine = Engine(args.export, args.threads)
                stats = engine.run(ids, cfg)
                threads[mode].add(str(engine.threads))
                ms[mode].append(ms_per_token(stats))
                if mode == "auto":
                    drafted.append(f"{stats.accepted}/{stats.drafted} ({stats.new_tokens})")
        plain, auto = statistics.median(ms["plain"]), statistics.median(ms["auto"])
        ratio = statistics.median(a / b for a, b in zip(ms["auto"], ms["plain"]))
        worst = max(worst, ratio)
        print(f"| {name} | {plain:.3f} | {auto:.3f} | {ratio:.3f} | {drafted[-1]} |"
              + (f" threads picked: {threads}" if len(threads["auto"] | threads["plain"]) > 1 else ""))
    print(f"\nworst auto / plain time: {worst:.3f} (median of per-repeat ratios; drafts: the last repeat)")


if __name__ == "__main__":
    main()
