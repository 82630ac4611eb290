"""`mtpkit bench --peers`: what a user would otherwise run, beside mtpkit, on the same checkpoint and prompts.

- transformers PyTorch CPU generate(), greedy, plain and with assistant_model=drafter, on the checkpoints the
  manifest's `source` entry names, loaded as the exporter loads them (export/reference.py).
- the official LiteRT-LM runtime on the export's .litertlm bundle, speculative decoding off and on.
The measurement and the report are runtime/peers.py's; this module only builds the peers (it needs torch).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys

from mtpkit.runtime.engine import Engine, GenConfig
from mtpkit.runtime.peers import Peer, PeerOutput, PeerPrompt

from .scoped import import_quietly, output_captured, patched


def run_peers(engine, prompts: list[PeerPrompt], cfg, threads: int | None = None, progress=None) -> dict:
    """The `peers` section of `mtpkit bench --peers` (runtime/peers.py section()).

    engine: the bench's open Engine (the export's other backend is opened beside it); cfg: its BenchConfig;
    threads: --threads, given to every peer when set. Otherwise mtpkit keeps its own per-graph pick, torch gets
    the count mtpkit picked for its ONNX target graph and LiteRT-LM gets what mtpkit's LiteRT backend uses.
    """
    from mtpkit.runtime import peers as lib

    engines, notes = _engines(engine, threads)
    plain = GenConfig(max_new_tokens=cfg.max_new_tokens, mtp=False)
    own = {kind: lib.mtpkit_peers(e, plain, cfg.spec_config(), _engine_threads(e, threads))
           for kind, e in engines.items()}
    torch_n = threads or _target_threads(engines.get("onnx")) or 1
    litert_n = threads or os.cpu_count() or 1  # as runtime/backends/litert.py
    with contextlib.ExitStack() as stack:
        others = {"onnx": transformers_peers(engine.manifest, torch_n, cfg.max_new_tokens)}
        if "litert" in engines:
            others["litert"] = litert_lm_peers(engine.manifest, litert_n, cfg.max_new_tokens, stack)
        # each peer right after the mtpkit row it is compared with: the pair sees the same moment's load
        peers = [p for kind in own for i, row in enumerate(own[kind]) for p in (row, *others.get(kind, [])[i:i + 1])]
        with torch_threads(torch_n):
            with output_captured("the peers' first calls"):  # LiteRT's C++ logs its XNNPACK delegate on fd 2
                lib.warm_up(peers, prompts[0])
            runs = lib.measure(peers, prompts, cfg.repeats, progress)
    return lib.section(peers, prompts, runs, engine.codec.decode, cfg.max_new_tokens, cfg.repeats, notes)


def resolve_sources(manifest) -> tuple:
    """The target and drafter checkpoints the manifest's `source` names, as Sources (no weights read yet).

    Raises:
        CheckpointError: one is not found, or its config.json changed since the export.
    """
    from mtpkit.runtime.manifest import sha256_file

    from .checkpoint import CheckpointError, resolve

    sources = []
    for role in ("target", "drafter"):
        entry = manifest.source[role]
        folder = entry.get("folder")
        ref = folder if isinstance(folder, str) and os.path.isdir(folder) else entry["ref"]
        try:
            src = resolve(ref, role, entry.get("revision"))
        except CheckpointError:
            raise CheckpointError(f"the {role} checkpoint this export was made from, {entry['ref']!r} (manifest.json "
                                  f"source.{role}.ref), is not found from {os.getcwd()}; a relative path is relative "
                                  "to where `mtpkit export` ran, so run from there") from None
        if entry.get("config_sha256") and sha256_file(src.folder / "config.json") != entry["config_sha256"]:
            raise CheckpointError(f"{role} checkpoint {src.folder} is not the one this export was made from (its "
                                  "config.json changed since); re-export it to compare the two")
        sources.append(src)
    return tuple(sources)


def _engines(engine, threads: int | None) -> tuple[dict, list[str]]:
    """{backend kind: Engine} for onnx and litert where the export has them (onnx first), and notes."""
    from mtpkit.extras import missing_modules

    engines, notes = {engine.backend.kind: engine}, []
    for kind in ("onnx", "litert"):
        if kind in engines or kind not in engine.manifest.backends:
            continue
        missing = missing_modules(("ai_edge_litert", "litert_lm")) if kind == "litert" else []
        if missing:
            notes.append(f"LiteRT rows skipped: they need the [litert] extra ({', '.join(missing)} not installed)")
            continue
        with output_captured(f"opening the {kind} backend"):
            engines[kind] = Engine(engine.manifest.root, threads, kind)
    if "litert" not in engine.manifest.backends:
        notes.append("no LiteRT-LM rows: this export has no LiteRT graphs (export with --backend onnx,litert)")
    return {k: engines[k] for k in ("onnx", "litert") if k in engines}, notes


def _engine_threads(engine, threads: int | None = None):
    """What mtpkit runs with: ONNX records its per-graph pick; LiteRT uses --threads or all cores."""
    return engine.threads or threads or os.cpu_count() or 1


def _target_threads(engine) -> int | None:
    """The intra-op threads mtpkit runs its ONNX target graph with."""
    if engine is None:
        return None
    threads = _engine_threads(engine)
    graph = engine.manifest.backend("onnx").signatures["decode"].graph
    return threads.get(graph, max(threads.values())) if isinstance(threads, dict) else threads


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's intra-op threads inside the block; the caller's count is restored after."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def transformers_peers(manifest, threads: int, max_new_tokens: int) -> list[Peer]:
    """transformers plain greedy (baseline: mtpkit onnx plain) and assisted (baseline: mtpkit onnx spec)."""
    import torch

    from .reference import greedy_kwargs, load_pair

    import_quietly()
    target, drafter = load_pair(*resolve_sources(manifest))
    gen = greedy_kwargs(max_new_tokens, manifest.eos_ids)
    assistant = drafter.generation_config
    k, schedule = assistant.num_assistant_tokens, assistant.num_assistant_tokens_schedule

    def runner(assisted: bool):
        def run(prompt: PeerPrompt) -> PeerOutput:
            x = torch.tensor([prompt.ids])
            extra = {"assistant_model": drafter} if assisted else {}
            # the heuristic schedule adapts k on the drafter's config: every call starts from the user's value
            with torch.no_grad(), patched(assistant, "num_assistant_tokens", k):
                out = target.generate(x, **extra, **gen)[0, len(prompt.ids):].tolist()
            return PeerOutput(len(out), tuple(out))
        return run

    return [Peer("transformers plain", runner(False), threads, "mtpkit onnx plain", f"torch {torch.__version__}"),
            Peer("transformers assisted", runner(True), threads, "mtpkit onnx spec",
                 f"assistant_model=drafter, k {k} {schedule}")]


def litert_lm_peers(manifest, threads: int, max_new_tokens: int, stack: contextlib.ExitStack) -> list[Peer]:
    """LiteRT-LM on model.litertlm with speculative decoding off and on (baselines: mtpkit litert plain / spec).

    Its engines log to fd 2 from C++ when they open and close; that output goes to the DEBUG log, not the
    terminal. The engines close when `stack` does.
    """
    import litert_lm

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


def _litert_lm_runner(engine, max_new_tokens: int):
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


def _quietly_closed(engine) -> None:
    with output_captured("LiteRT-LM close"):
        engine.close()


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"
