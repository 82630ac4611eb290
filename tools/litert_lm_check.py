"""LiteRT-LM on an export's model.litertlm against mtpkit's LiteRT backend on the same graphs.

    python tools/litert_lm_check.py EXPORT [--max-new-tokens 32] [--threads N] [--json FILE]

For each of three prompts: LiteRT-LM's greedy text with speculative decoding off and on, and mtpkit's LiteRT
backend's greedy text (plain and speculative, k = the drafter's default) on the export's .tflite files. Reports
whether LiteRT-LM says the bundle supports speculative decoding, whether its drafter section ran (its own log),
whether every text agrees (over the common length: LiteRT-LM may stop a draft round past the others) and how many
are identical, and each call's wall time (prefill included) over --max-new-tokens. --threads defaults to all cores.
Exits 1 when any check fails. Needs the litert extra.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = ("def fibonacci(n):", "The three laws of thermodynamics are", "Rewrite more formally: gonna be late, sorry")


def litert_lm_texts(bundle: Path, texts: list[str], max_new: int, threads: int, speculative: bool) -> tuple:
    """(texts, seconds per call, whether LiteRT-LM's log shows its MTP drafter ran)."""
    import litert_lm

    log = tempfile.TemporaryFile()
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)  # LiteRT-LM logs from C++ on fd 2; read back for the drafter line
    try:
        engine = litert_lm.Engine(str(bundle), backend=litert_lm.Backend.CPU(thread_count=threads),
                                  enable_speculative_decoding=speculative)
        out, seconds = [], []
        for text in texts:
            session = engine.create_session(apply_prompt_template=False, max_output_tokens=max_new)
            start = time.perf_counter()
            session.run_prefill([text])
            out.append(session.run_decode().texts[0])
            seconds.append(time.perf_counter() - start)
            session.close()
        engine.close()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    log.seek(0)
    return out, seconds, "MTP Drafter" in log.read().decode(errors="replace")


def mtpkit_texts(export: Path, texts: list[str], max_new: int, threads: int, mtp: bool) -> tuple:
    from mtpkit.runtime.engine import Engine, GenConfig

    engine = Engine(export, threads=threads, backend="litert")
    cfg = GenConfig(max_new_tokens=max_new, mtp=mtp, num_assistant_tokens=None if mtp else 1,
                    schedule="constant" if mtp else None)
    out, seconds = [], []
    for text in texts:
        start = time.perf_counter()
        ids = [t for t, _ in engine.generate(engine.codec.encode(text), cfg)]
        seconds.append(time.perf_counter() - start)
        out.append(engine.codec.decode(ids))
    return out, seconds


def agree(a: str, b: str) -> bool:
    n = min(len(a), len(b))
    return bool(a and b) and a[:n] == b[:n]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("export", type=Path)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    import atexit

    import litert_lm
    from mtpkit.bench.litert_lm import _silent_exit
    from mtpkit.runtime.manifest import load_manifest

    atexit.register(_silent_exit)  # LiteRT-LM logs its teardown on fd 2 after everything is printed

    bundle = load_manifest(a.export).path(load_manifest(a.export).backend("litert").graphs["bundle"].file)
    supported = bool(litert_lm.ModelInfo(str(bundle)).llm.has_speculative_decoding_support())
    runs = {}
    for name, speculative in (("litert-lm plain", False), ("litert-lm speculative", True)):
        texts, secs, drafted = litert_lm_texts(bundle, list(PROMPTS), a.max_new_tokens, a.threads, speculative)
        runs[name] = {"texts": texts, "seconds": secs, "drafter_ran": drafted}
    for name, mtp in (("mtpkit litert plain", False), ("mtpkit litert speculative", True)):
        texts, secs = mtpkit_texts(a.export, list(PROMPTS), a.max_new_tokens, a.threads, mtp)
        runs[name] = {"texts": texts, "seconds": secs}
    reference = runs["litert-lm plain"]["texts"]
    for run in runs.values():
        run["agrees_with_litert_lm_plain"] = [agree(x, y) for x, y in zip(run["texts"], reference)]
        run["identical_to_litert_lm_plain"] = [x == y for x, y in zip(run["texts"], reference)]
    ok = supported and runs["litert-lm speculative"]["drafter_ran"] and not runs["litert-lm plain"]["drafter_ran"] \
        and all(all(r["agrees_with_litert_lm_plain"]) for r in runs.values())
    report = {"bundle": str(bundle), "bytes": bundle.stat().st_size, "speculative_decoding_support": supported,
              "max_new_tokens": a.max_new_tokens, "threads": a.threads, "prompts": list(PROMPTS), "runs": runs,
              "ok": ok}
    for name, run in runs.items():
        per_token = [s / a.max_new_tokens * 1000 for s in run["seconds"]]
        print(f"{name:26s} agrees {sum(run['agrees_with_litert_lm_plain'])}/{len(PROMPTS)} "
              f"(identical {sum(run['identical_to_litert_lm_plain'])})  "
              f"ms/token {' '.join(f'{x:.1f}' for x in per_token)}"
              + (f"  drafter ran: {run['drafter_ran']}" if "drafter_ran" in run else ""))
    print(f"speculative decoding support: {supported}; {'ok' if ok else 'FAILED'}")
    if a.json:
        a.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
