"""The ONNX backend's host KV cache (runtime/backends/window_kv.py): a sliding-window layer's ring gives every window
a full buffer would give through prefill, verify, rewinds and growth; the engine keeps it at the window plus the
answer on a long prompt, gives the same tokens as with full buffers, and prefills again where a rewind goes
further back than a ring holds."""

from __future__ import annotations

import numpy as np
import pytest

from mtpkit.runtime.backends.window_kv import Ring

W = 8  # the window a ring must hold before any call: W + 1 positions, as the drafter reads them


def _entries(pos: int, n: int) -> np.ndarray:
    """[1, 2, n, 3] entries whose values name their position."""
    return np.broadcast_to(np.arange(pos, pos + n, dtype=np.float32)[None, None, :, None], (1, 2, n, 3)).copy()


def test_a_ring_reads_what_a_full_buffer_reads_through_verify_rewinds_and_growth():
    rng = np.random.default_rng(0)
    ring, keep = Ring(2, W + 1 + 4, 3), 40
    ring.write(0, *(_entries(0, keep),) * 2)  # a prompt longer than the ring: only its last entries are kept
    assert ring.holds(keep - ring.size, keep) and not ring.holds(keep - ring.size - 1, keep)
    pos = keep
    for _ in range(60):
        count = int(rng.integers(1, 12))
        ring.grow(pos + count - (keep - W - 1), 1000)  # as WindowKV.commit asks: the answer and the window before it
        ring.write(pos, *(_entries(pos, count),) * 2)
        pos += int(rng.integers(1, count + 1))  # accepted drafts, then a rewind of the rest
        for lo in range(max(0, pos - W - 1), pos):
            k, v = ring.read(lo, pos)
            np.testing.assert_array_equal(k[0, 0, :, 0], np.arange(lo, pos))
            np.testing.assert_array_equal(v, k)
        assert ring.holds(keep - W - 1, pos)
    assert ring.size <= 2 * (pos - (keep - W - 1))  # the answer and the window, doubled at most


def test_a_rewind_before_what_a_ring_holds_is_not_resumable():
    ring = Ring(2, W + 1 + 4, 3)
    ring.write(0, *(_entries(0, 30),) * 2)
    assert ring.holds(30 - W - 1, 30) and not ring.holds(10 - W - 1, 10)
    ring.write(5, *(_entries(5, 3),) * 2)  # written again from 5: it holds 5..7 and nothing after
    assert ring.holds(5, 8) and not ring.holds(5, 9) and ring.end == 8


@pytest.mark.slow
def test_long_prompt_keeps_the_window_and_gives_the_same_tokens(tiny_exports):
    """e2b_gemma4_centroid (window 8): a 120-token prompt crosses the window 15 times; plain and speculative give
    the tokens a cache with full sliding buffers gives, and the rings hold the window plus the answer."""
    from mtpkit.runtime.backends import window_kv
    from mtpkit.runtime.engine import Engine, GenConfig

    export = tiny_exports("e2b_gemma4_centroid")
    prompt = [2, *[(i * 37) % 200 + 5 for i in range(119)]]
    runs = {}
    for keep in (True, False):
        engine = Engine(export, threads=1, backend="onnx")
        if not keep:  # every position kept: the full buffers' tokens
            engine.kv.keep_from = lambda pos: None
        runs[keep] = [[t for t, _ in engine.generate(prompt, GenConfig(max_new_tokens=24, mtp=mtp))]
                      for mtp in (False, True)]
        sizes = {r.size for r in engine.kv.rings}
        if keep:
            assert max(sizes) <= 2 * (engine.manifest.kv_cache.drafter_sliding_visible + 24 + window_kv.VERIFY_ROOM)
        else:
            assert max(sizes) >= len(prompt)
    assert runs[True] == runs[False] and runs[True][0] == runs[True][1]


@pytest.mark.slow
def test_chat_that_differs_before_the_ring_prefills_again(tiny_exports):
    """A history edited before the last answer: the cache cannot resume there, so the turn prefills from the
    start and answers as a fresh load does."""
    from mtpkit.runtime.engine import Engine, GenConfig

    export = tiny_exports("e2b_gemma4_centroid")
    engine = Engine(export, threads=1, backend="onnx")
    cfg = GenConfig(max_new_tokens=8, num_assistant_tokens=3)  # constant k: no timing calls, which keep everything
    first = [2, *range(10, 90)]
    list(engine.generate(first, cfg, reuse=True))
    edited = first[:20] + [7] + first[21:]
    assert not engine.kv.resumable(20) and engine.cached_prefix(edited) == 0
    again = [t for t, _ in engine.generate(edited, cfg, reuse=True)]
    fresh = [t for t, _ in Engine(export, threads=1, backend="onnx").generate(edited, cfg)]
    assert again == fresh
