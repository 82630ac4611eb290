"""LiteRT-LM, the runtime the Android app ships, as a peer of the LiteRT backend in `mtpkit bench --peers` and in
`mtpkit demo --backend onnx,litert` (peer_timing.py measures and reports; this module only builds the peers)."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import Any, Callable

from mtpkit.extras import require
from mtpkit.runtime.backends.litert import default_threads
from mtpkit.runtime.manifest import Manifest
from mtpkit.runtime.quiet import output_captured

from .peer_timing import Peer, PeerOutput, PeerPrompt


def litert_lm_peers(manifest: Manifest, threads: int | None, max_new_tokens: int,
                    stack: contextlib.ExitStack) -> list[Peer]:
    """LiteRT-LM on model.litertlm with speculative decoding off and on (baselines: mtpkit litert plain / spec);
    threads: --threads, else what mtpkit's LiteRT backend uses.

    Its engines log to fd 2 from C++ when they open and close; that output goes to the DEBUG log, not the
    terminal. The engines close when `stack` does.
    """
    require("litert", "the LiteRT-LM peers", ("litert_lm",))
    import litert_lm  # type: ignore[import-untyped, import-not-found, unused-ignore]  # no type information

    threads = default_threads(threads)
    path = str(manifest.path(manifest.backend("litert").graphs["bundle"].file))
    atexit.register(_silent_exit)
    peers = []
    for speculative in (False, True):
        with output_captured("LiteRT-LM engine"):
            engine = litert_lm.Engine(path, backend=litert_lm.Backend.CPU(thread_count=threads),
                                      enable_speculative_decoding=speculative, enable_benchmark=True)
        stack.callback(_quietly_closed, engine)
        name = "litert-lm speculative" if speculative else "litert-lm plain"
        baseline = "mtpkit litert spec" if speculative else "mtpkit litert plain"
        peers.append(Peer(name, _litert_lm_runner(engine, max_new_tokens), threads, baseline,
                          f"litert-lm {_version('litert-lm-api')}, text in and out"))
    return peers


def _litert_lm_runner(engine: Any, max_new_tokens: int) -> Callable[[PeerPrompt], PeerOutput]:
    def run(prompt: PeerPrompt) -> PeerOutput:
        session = engine.create_session(apply_prompt_template=False, max_output_tokens=max_new_tokens)
        try:  # LiteRT-LM tokenizes the text itself (BOS added), as mtpkit's codec does
            session.run_prefill([prompt.text])
            text = session.run_decode().texts[0]
            count = session.get_benchmark_info().last_decode_token_count  # a last draft round may overshoot
        finally:
            session.close()
        return PeerOutput(count, None, text)
    return run


def _silent_exit() -> None:
    """LiteRT-LM's process-wide LiteRT environment logs its teardown on fd 2 after Python's atexit handlers, once
    mtpkit has printed everything; send fd 2 to /dev/null for that last moment instead of showing it."""
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


def _quietly_closed(engine: Any) -> None:
    with output_captured("LiteRT-LM close"):
        engine.close()


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"
