"""`mtpkit bench --peers`: what a user would otherwise run, beside mtpkit, on the same checkpoint and prompts.

- transformers PyTorch CPU generate(), greedy, plain and with assistant_model=drafter, on the checkpoints the
  manifest's `source` entry names, loaded as the exporter loads them (export/reference.py); compared with mtpkit
  on the export's first backend.
- each backend's own runtime where it has one (OWN_RUNTIMES), e.g. LiteRT-LM on the export's .litertlm bundle,
  speculative decoding off and on (litert_lm.py).
- llama.cpp (the [llama-cpp] extra) on the target checkpoint converted by llama.cpp's own converter, plain
  greedy, compared with mtpkit plain on the export's first backend (llama_cpp.py); a note when not installed.
The measurement and the report are peer_timing.py's; this module only builds the peers.
"""

from __future__ import annotations

import contextlib
import os

from mtpkit.export.scoped import import_quietly, output_captured, patched
from mtpkit.extras import MissingExtraError
from mtpkit.runtime.engine import Engine, GenConfig
from mtpkit.runtime.roles import BACKENDS

from . import peer_timing as lib
from .litert_lm import litert_lm_peers
from .peer_timing import Peer, PeerOutput, PeerPrompt

# a backend's own runtime, timed beside mtpkit's rows on that backend: kind -> (its name in notes, its peers)
OWN_RUNTIMES = {"litert": ("LiteRT-LM", litert_lm_peers)}


def run_peers(engine: Engine, prompts: list[PeerPrompt], cfg, threads: int | None = None, progress=None) -> dict:
    """The `peers` section of `mtpkit bench --peers` (peer_timing.py section()).

    engine: the bench's open Engine (the export's other backends are opened beside it); cfg: its BenchConfig;
    threads: --threads, given to every peer when set. Otherwise mtpkit keeps its own per-graph pick, torch and
    llama.cpp get the count mtpkit picked for its first backend's target graph and a backend's own runtime what
    that backend uses.
    """
    engines, notes = _engines(engine, threads)
    plain = GenConfig(max_new_tokens=cfg.max_new_tokens, mtp=False)
    own = [row for e in engines.values() for row in lib.mtpkit_peers(e, plain, cfg.spec_config(), e.threads)]
    first = next(iter(engines.values()))
    torch_n = threads or _decode_threads(first)
    with contextlib.ExitStack() as stack:
        others = transformers_peers(engine.manifest, torch_n, cfg.max_new_tokens, first.backend.kind)
        others += _llama_cpp_peers(engine.manifest, torch_n, cfg.max_new_tokens, first.backend.kind, stack, notes,
                                   progress)
        for kind in engines:
            others += _backend_peers(kind, engine.manifest, threads, cfg.max_new_tokens, stack, notes)
        # each peer right after the mtpkit row it is compared with: the pair sees the same moment's load
        peers = [p for row in own for p in (row, *(o for o in others if o.baseline == row.name))]
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
    from mtpkit.export.checkpoint import CheckpointError, resolve
    from mtpkit.runtime.manifest import sha256_file

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


def _engines(engine: Engine, threads: int | None) -> tuple[dict, list[str]]:
    """{backend kind: Engine} for every backend of the export this install can open, in role-table order, and
    notes on what is left out."""
    engines, notes = {engine.backend.kind: engine}, []
    for kind in BACKENDS:
        if kind not in engine.manifest.backends:
            if kind in OWN_RUNTIMES:
                wanted = ",".join([*engine.manifest.backends, kind])
                notes.append(f"no {OWN_RUNTIMES[kind][0]} rows: this export has no {kind} graphs (export with "
                             f"--backend {wanted})")
            continue
        if kind in engines:
            continue
        try:
            with output_captured(f"opening the {kind} backend"):
                engines[kind] = Engine(engine.manifest.root, threads, kind)
        except MissingExtraError as e:
            notes.append(f"mtpkit {kind} rows skipped: {e}")
    return {k: engines[k] for k in BACKENDS if k in engines}, notes


def _backend_peers(kind: str, manifest, threads: int | None, max_new_tokens: int, stack: contextlib.ExitStack,
                   notes: list[str]) -> list[Peer]:
    """The backend's own runtime as peers (OWN_RUNTIMES), if it has one and it is installed."""
    if kind not in OWN_RUNTIMES:
        return []
    name, peers = OWN_RUNTIMES[kind]
    try:
        return peers(manifest, threads, max_new_tokens, stack)
    except MissingExtraError as e:
        notes.append(f"{name} rows skipped: {e}")
        return []


def _llama_cpp_peers(manifest, threads: int, max_new_tokens: int, kind: str, stack: contextlib.ExitStack,
                     notes: list[str], progress) -> list[Peer]:
    """llama.cpp plain (baseline: mtpkit KIND plain), or a note saying why there is none."""
    from .llama_cpp import LlamaCppError, llama_cpp_peers

    try:
        return llama_cpp_peers(manifest, resolve_sources(manifest)[0].folder, threads, max_new_tokens,
                               f"mtpkit {kind} plain", stack, progress)
    except (MissingExtraError, LlamaCppError) as e:
        notes.append(f"llama.cpp rows skipped: {e}")
        return []


def _decode_threads(engine: Engine) -> int:
    """The intra-op threads mtpkit runs the engine's target decode graph with."""
    threads = engine.threads
    return threads.get(engine.backend.signatures["decode"].graph, max(threads.values()))


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


def transformers_peers(manifest, threads: int, max_new_tokens: int, kind: str) -> list[Peer]:
    """transformers plain greedy (baseline: mtpkit KIND plain) and assisted (baseline: mtpkit KIND spec)."""
    import torch

    from mtpkit.export.reference import greedy_kwargs, load_pair

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

    return [Peer("transformers plain", runner(False), threads, f"mtpkit {kind} plain", f"torch {torch.__version__}"),
            Peer("transformers assisted", runner(True), threads, f"mtpkit {kind} spec",
                 f"assistant_model=drafter, k {k} {schedule}")]
