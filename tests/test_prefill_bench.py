"""tools/prefill_bench.py: mtpkit's prefill beside LiteRT-LM's on one export (timings reported, never asserted)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_every_runtime_times_every_length_and_the_table_gives_ratios(litert_exports, tool):
    pytest.importorskip("litert_lm")
    bench = tool("prefill_bench")
    rows = bench.measure(litert_exports("e2b_gemma4_centroid"), [8, 40], [1], 1)
    lengths = sorted({r["prompt_tokens"] for r in rows})  # the prompt's real token counts, at most the lengths asked
    assert len(lengths) == 2 and lengths[1] <= 40 and sorted((r["runtime"], r["prompt_tokens"]) for r in rows) == sorted(
        (name, n) for name in ("litert-lm", "mtpkit litert", "mtpkit onnx") for n in lengths)
    assert all(r["ttft_ms"] > 0 and r["tokens_per_s"] == pytest.approx(1e3 * r["prompt_tokens"] / r["ttft_ms"])
               for r in rows)
    table = bench.table(rows).splitlines()
    assert len(table) == 2 + len(rows) and sum(line.endswith("x |") for line in table) == 4  # mtpkit's rows only
