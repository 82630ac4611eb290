"""What rendering a conversation's answers as their generated ids buys: `mtpkit bench --chat`'s scripted
conversation with earlier answers rendered as the ids the model generated (runtime/conversation.py, the default)
and as their text (Conversation._kept emptied here, as before that rendering existed), alternating in one process,
per backend. Prints each run's time to first token, turn 8 / turn 1, and the median ratio per rendering with the
tokens each turn found cached.

    python tools/chat_answers_ab.py EXPORT [--rounds 4] [--backends onnx,litert]
"""

from __future__ import annotations

import argparse
import statistics

from mtpkit.bench.chat import ChatBenchConfig, run_chat_bench
from mtpkit.runtime.conversation import Conversation


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("export")
    p.add_argument("--rounds", type=int, default=4, help="conversations per rendering (alternating order)")
    p.add_argument("--backends", default="onnx,litert")
    args = p.parse_args()
    as_ids = Conversation._kept
    for backend in args.backends.split(","):
        ratios: dict[str, list[float]] = {"ids": [], "text": []}
        cached: dict[str, list[int]] = {}
        for r in range(args.rounds):
            for mode in ("ids", "text") if r % 2 == 0 else ("text", "ids"):
                Conversation._kept = as_ids if mode == "ids" else (lambda self: {})  # type: ignore[method-assign]
                report = run_chat_bench(args.export, ChatBenchConfig(repeats=1), None, backend)
                ratios[mode].append(report["last_over_first"])
                cached[mode] = [t["cached_tokens"] for t in report["turns"]]
                print(f"{backend} answers as {mode}: turn 8 / turn 1 {report['last_over_first']:.2f}, turn 8 "
                      f"{report['turns'][-1]['ttft_ms']:.1f} ms", flush=True)
        Conversation._kept = as_ids  # type: ignore[method-assign]
        print(f"{backend} median turn 8 / turn 1: answers as ids {statistics.median(ratios['ids']):.2f}, as text "
              f"{statistics.median(ratios['text']):.2f}; cached per turn: as ids {cached['ids']}, as text "
              f"{cached['text']}", flush=True)


if __name__ == "__main__":
    main()
