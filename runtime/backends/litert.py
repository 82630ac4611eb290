"""LiteRT backend: every graph through CompiledModel, XNNPACK's packed weights kept in a weight cache file
(litert_cache.py), the target's caches bound in place; static shapes.

Driven the way LiteRT-LM drives these graphs: the prompt (all but its last token) is prefilled in padded
chunks of the exported prefill length, the last prompt token goes through `decode`, drafts are verified with
`verify` padded to its static length. Padded slots write garbage K/V beyond the committed positions; masks
are positional, so that garbage is never visible and is overwritten later, exactly like a rejected draft.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import sys
import weakref
from typing import Any

import numpy as np

from ..handoff import CacheFullError, LastCall, Ranges, drafter_ranges
from ..manifest import Backend, GraphFile, LiteRtOptions, Manifest, Signature
from ..quiet import output_captured
from . import Drafter, Feeds, GraphTensors, LoadOptions, Target, check_signatures
from .litert_cache import WeightCache, weight_cache


def cpu_options(options: LoadOptions, threads: int, cache: WeightCache | None = None) -> Any:
    """A graph's CPU options. Without weight packing, TFLite's builtin kernels run on the weights where the file maps
    them, instead of XNNPACK, which packs a private copy of every fully-connected weight when a graph is opened (a
    float E2B decoder: about 9 GB). With it, XNNPACK packs into (or maps) the graph's weight cache file, if any."""
    from ai_edge_litert.cpu_options import CpuKernelMode, CpuOptions

    if not options.pack_weights:
        return CpuOptions(num_threads=threads, kernel_mode=CpuKernelMode.BUILTIN)
    return CpuOptions(num_threads=threads, xnnpack_weight_cache_path=str(cache.path) if cache else "")


def default_threads(threads: int | None) -> int:
    """Every graph runs with --threads, else all cores (LiteRT-LM, a peer, gets the same)."""
    return threads or os.cpu_count() or 1


class LiteRtSession:
    """Every .tflite graph of the backend as a CompiledGraph (the target's with its caches bound in place);
    signatures run by name through the graph that holds them."""

    def __init__(self, manifest: Manifest, backend: Backend, threads: int | None = None,
                 options: LoadOptions = LoadOptions()):
        self.backend = backend
        target = backend.signatures["decode"].graph
        # the .litertlm bundle is for LiteRT-LM
        self.graphs = {name: CompiledGraph(manifest, backend, name, default_threads(threads), options,
                                           bind_caches=name == target)
                       for name, graph in backend.graphs.items() if graph.file.endswith(".tflite")}
        self.target = self.graphs[target]
        self.threads = {name: default_threads(threads) for name in self.graphs}

    def run(self, signature: str, feeds: Feeds, held: frozenset = frozenset()) -> Feeds:
        """Outputs by key, fresh arrays. Inputs whose key is in `held` are not set: the signature's input buffers
        keep what its previous call was given."""
        return self.graphs[self.backend.signatures[signature].graph].run(signature, feeds, held)


def _compiled_tensors(model: Any, sig: Signature) -> GraphTensors | None:
    """A signature's own inputs and outputs with their ranks, as a CompiledModel describes them (no tensor is
    allocated); None if the graph has no signature of that name."""
    if sig.backend_name not in model.get_signature_list():
        return None
    return _ranks(model.get_input_tensor_details(sig.backend_name)), _ranks(model.get_output_tensor_details(
        sig.backend_name))


def _ranks(details: dict[str, dict]) -> dict[str, int | None]:
    return {name: len(d["shape"]) for name, d in details.items()}


def open_model(manifest: Manifest, graph: GraphFile, threads: int, options: LoadOptions) -> tuple[Any, Any]:
    """(CompiledModel, its Environment) for one graph file; with weight packing and options.weight_cache, XNNPACK
    maps the graph's weight cache, or packs into a new one that is kept only once the model was created."""
    import ai_edge_litert
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.environment import Environment
    from ai_edge_litert.options import Options

    path = manifest.path(graph.file)
    cache = weight_cache(path, graph.sha256, graph.bytes) if options.pack_weights and options.weight_cache else None
    try:
        with output_captured("LiteRT's CompiledModel"):  # environment, accelerator and cache notices on fd 2
            env = Environment.create(runtime_path=os.path.dirname(ai_edge_litert.__file__))
            model = CompiledModel.from_file(str(path), environment=env,
                                            options=Options(cpu_options=cpu_options(options, threads, cache)))
    except BaseException:
        if cache is not None:
            cache.discard()
        raise
    if cache is not None:
        cache.commit()
    return model, env


class CompiledGraph:
    """One graph through LiteRT's CompiledModel, one TensorBuffer per signature input and output, kept across
    calls (an input not set keeps what its previous call was given: the drafter's held caches). With bind_caches
    (the target), each cache is one TensorBuffer, the same for the input and the output of every signature, so a
    call updates the caches where they are instead of copying each in and out (at E2B 2 x 38 MB per call;
    docs/performance.md). ai-edge-litert 2.3.0's Interpreter cannot bind one buffer to an input and an output, nor
    map a weight cache."""

    def __init__(self, manifest: Manifest, backend: Backend, graph: str, threads: int,
                 options: LoadOptions = LoadOptions(), bind_caches: bool = False):
        self.backend = backend
        self.caches: dict[tuple, Any] = {}  # cache key -> TensorBuffer
        self._shared = CACHE_ROLES if bind_caches else ()
        self._bound: dict[str, tuple[dict, dict, list]] = {}  # signature -> (inputs, outputs, outputs read)
        self._ran: set[str] = set()
        self.model, env = open_model(manifest, backend.graphs[graph], threads, options)
        weakref.finalize(self, _release, self.model, env, self.caches, self._bound)
        _quiet_teardown()
        # outside the capture, which would replay LiteRT's notices beside the one-line error; before any buffer is
        # created by a tensor name the graph may not have
        check_signatures(backend, graph, functools.partial(_compiled_tensors, self.model))
        if bind_caches:
            with output_captured("LiteRT's cache buffers"):
                self._bind("decode")  # the (zeroed) cache buffers, which every signature shares

    def run(self, signature: str, feeds: Feeds, held: frozenset = frozenset()) -> Feeds:
        """The signature's outputs but the caches, as fresh arrays; the caches are updated in place, inputs in
        `held` keep their previous values."""
        sig = self.backend.signatures[signature]
        # a signature's first call may apply XNNPACK, which LiteRT announces on fd 2 (kept out of our output)
        with output_captured(f"LiteRT's first {signature} call") if signature not in self._ran else _NO_CAPTURE:
            self._ran.add(signature)
            inputs, outputs, read = self._bind(signature)
            for t in sig.inputs:
                if t.key not in self.caches and t.key not in held:
                    inputs[t.name].write(np.asarray(feeds[t.key], np.dtype(t.dtype)))
            self.model.run_by_name(sig.backend_name, inputs, outputs)
        return {key: outputs[name].read(size, dtype).reshape(shape) for key, name, size, shape, dtype in read}

    def _bind(self, signature: str) -> tuple[dict, dict, list]:
        """The signature's buffers, created on first use; the caches' are shared by every signature. The first
        read or write of any buffer creates LiteRT's process-wide buffer environment, with notices on fd 2."""
        if signature not in self._bound:
            sig = self.backend.signatures[signature]
            for t in (t for t in sig.inputs if t.role in self._shared and t.key not in self.caches):
                self.caches[t.key] = self.model.create_input_buffer_by_name(sig.backend_name, t.name)
                self.caches[t.key].write(np.zeros(t.shape, np.dtype(t.dtype)))  # new buffers are not zeroed
            inputs = {t.name: self.caches.get(t.key) or self.model.create_input_buffer_by_name(sig.backend_name, t.name)
                      for t in sig.inputs}
            outputs = {t.name: self.caches.get(t.key) or self.model.create_output_buffer_by_name(sig.backend_name,
                                                                                                 t.name)
                       for t in sig.outputs}
            read = [(t.key, t.name, int(np.prod(t.shape)), tuple(t.shape), np.dtype(t.dtype)) for t in sig.outputs
                    if t.key not in self.caches]
            self._bound[signature] = inputs, outputs, read
        return self._bound[signature]


CACHE_ROLES = ("kv_key", "kv_value")


_NO_CAPTURE = contextlib.nullcontext()


@functools.cache
def _quiet_teardown() -> None:
    """ai-edge-litert 2.3.0 destroys the process-wide environment of its buffers in a C++ static destructor after
    Python has finished, logging "DestroyAccelerator" on fd 2 where nothing of ours runs: so, once a CompiledGraph
    was opened, fd 2 points to /dev/null from this exit handler on (all of mtpkit's output is written by then)."""

    def silence() -> None:
        sys.stderr.flush()
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)

    atexit.register(silence)


def _release(model: Any, env: Any, *buffers: dict) -> None:
    """Destroys a CompiledGraph's buffers, model and environment (when it is collected, or at exit) with LiteRT's
    own notices on fd 2 ("DestroyAccelerator") kept out of our output."""
    with output_captured("LiteRT's CompiledModel release"):
        for held in buffers:
            held.clear()
        model.close()
        env.close()


class StateKV:
    """The target's cache tensors (K [1,h,C,d], V [1,h,d,C]), held by the target graph's buffers and updated in
    place by every call; read(key) gives one as an array (the drafter reads the store layers')."""

    def __init__(self, manifest: Manifest, backend: Backend, graph: CompiledGraph):
        opts = litert_options(backend)
        self.graph = graph
        self.specs = {t.key: (tuple(t.shape), np.dtype(t.dtype)) for t in backend.signatures["decode"].inputs
                      if t.role in CACHE_ROLES}
        self.version = 0  # counts changes of the caches: every target call updates them in place
        self._read: dict[tuple, tuple[int, np.ndarray]] = {}  # key -> (version, array), read once per version
        spec = manifest.kv_cache
        self.capacity = spec.capacity  # every backend's cache length
        self.hidden = np.float32(opts.mask["hidden"])
        self.sliding_past = spec.sliding_past
        self.drafter_sliding = spec.drafter_sliding_visible
        self.last = LastCall()

    def read(self, key: tuple) -> np.ndarray:
        """One cache as of the last target call (read from its buffer once per call)."""
        version, array = self._read.get(key, (-1, None))
        if version != self.version or array is None:
            shape, dtype = self.specs[key]
            array = self.graph.caches[key].read(int(np.prod(shape)), dtype).reshape(shape)
            self._read[key] = (self.version, array)
        return array

    def write(self, layer: int, key: np.ndarray, value: np.ndarray) -> None:
        """Positions 0..S-1 of layer's cache from K and V given as [1, h, S, d] (the export's check feeds the
        drafter PyTorch's own K/V this way, so the drafter graph is compared on the same inputs as PyTorch)."""
        n = key.shape[2]
        k, v = (self.read((role, layer)).copy() for role in CACHE_ROLES)
        k[:, :, :n], v[:, :, :, :n] = key, np.swapaxes(value, 2, 3)
        self.graph.caches[("kv_key", layer)].write(k)
        self.graph.caches[("kv_value", layer)].write(v)
        self.version += 1

    def resumable(self, pos: int) -> bool:
        """Every layer holds every position up to its capacity: a call may start at any position written."""
        return True

    def keep_from(self, pos: int) -> None:
        """Every position is kept (see KVStore.keep_from)."""

    def causal_mask(self, pos: int, count: int) -> np.ndarray:
        """[1,1,count,C]: row i (query at pos+i) sees every slot <= pos+i; the graph adds the sliding window."""
        slots = np.arange(self.capacity)
        rows = pos + np.arange(count)[:, None]
        return np.where(slots[None, :] <= rows, np.float32(0), self.hidden).astype(np.float32)[None, None]

    def drafter_view(self, pos: int, mode: str) -> Ranges:
        """[lo, hi) per layer type, which the drafter step turns into masks."""
        return drafter_ranges(pos, mode, self.last, self.sliding_past, self.drafter_sliding)

    def range_mask(self, lo: int, hi: int, size: int | None = None) -> np.ndarray:
        slots = np.arange(self.capacity if size is None else size)
        return np.where((slots >= lo) & (slots < hi), np.float32(0), self.hidden).astype(np.float32).reshape(1, 1, 1, -1)


class StateTarget:
    def __init__(self, session: LiteRtSession, kv: StateKV):
        self.session, self.kv = session, kv
        opts = litert_options(session.backend)
        self.prefill = sorted(opts.prefill, key=lambda p: p["num_tokens"])  # [{num_tokens, signature}]
        self.max_draft = opts.max_draft  # verify takes max_draft + 1 tokens, padded
        self.calls = 0

    @property
    def threads(self) -> dict[str, int]:
        return self.session.threads

    def positions_needed(self, prompt_len: int, max_new_tokens: int) -> int:
        return prompt_len + max_new_tokens + self.max_draft + 1  # a padded verify may overhang

    def _call(self, signature: str, ids: list[int], pos: int) -> Feeds:
        if pos + len(ids) > self.kv.capacity:
            raise CacheFullError(f"KV cache full: position {pos + len(ids)} is past the export's kv_cache.capacity "
                                 f"{self.kv.capacity}; re-export with a larger --max-cache-len")
        out = self.kv.graph.run(signature, self.feeds(ids, pos))  # caches updated in place
        self.kv.version += 1
        return out

    def feeds(self, ids: list[int], pos: int) -> Feeds:
        """A target signature's inputs for ids at pos but the caches: embeddings, positions, causal mask."""
        emb, ple = embed(self.session, ids)
        feeds: Feeds = {("embeddings", None): emb, ("input_pos", None): np.arange(pos, pos + len(ids), dtype=np.int32),
                 ("mask", None): self.kv.causal_mask(pos, len(ids))}
        if ple is not None:
            feeds[("per_layer_embeddings", None)] = ple
        return feeds

    def forward(self, ids: list[int], pos: int) -> tuple[np.ndarray, np.ndarray]:
        """Same contract as the ONNX Target; after a prefill only the last row is returned."""
        start = pos  # the logical call covers all of ids, however many graph calls it takes
        if len(ids) > 1 and (pos == 0 or len(ids) > self.max_draft + 1):  # a prompt, or a conversation's next turn
            pos, ids = self._prefill(ids[:-1], pos), ids[-1:]
        if len(ids) == 1:
            out = self._call("decode", ids, pos)
        else:
            if len(ids) > self.max_draft + 1:
                raise ValueError(f"{len(ids) - 1} drafts do not fit the static verify, max_draft {self.max_draft}")
            out = self._call("verify", ids + [0] * (self.max_draft + 1 - len(ids)), pos)
        self.kv.last.start, self.kv.last.end = start, pos + len(ids)
        self.calls += 1  # one logical call, as on ONNX: tokens per target call must not depend on prefill chunks
        n = len(ids)
        return out[("logits", None)][0, :n], out[("activations", None)][0, :n]


    def _prefill(self, ids: list[int], pos: int) -> int:
        """ids into the cache from pos in static prefill chunks, padded (the pad's K/V lie past the prompt, masked
        and overwritten later); where a chunk would overhang the cache, in verify calls, then decode calls."""
        while ids:
            for n, signature in ((self.prefill[-1]["num_tokens"], self.prefill[-1]["signature"]),
                                 (self.max_draft + 1, "verify"), (1, "decode")):
                if pos + n <= self.kv.capacity or n == 1:
                    break
            part, ids = ids[:n], ids[n:]
            self._call(signature, part + [0] * (n - len(part)), pos)
            pos += len(part)
        return pos


class StateDrafter:
    """Runs `draft_masked` with the hand-off's ranges as masks (the clean view's too, so a centroid head's
    selected-token outputs and the windows serve every mode): of its signatures (options.draft_windows), the one
    whose full-layer prefix is the shortest that holds the visible range. `draft`, with the clean view in-graph
    and whole caches, is LiteRT-LM's contract."""

    def __init__(self, session: LiteRtSession, kv: StateKV, vocab_size: int):
        self.session, self.kv, self.vocab_size = session, kv, vocab_size
        windows = litert_options(session.backend).draft_windows or [{"full_slots": kv.capacity,
                                                                    "signature": "draft_masked"}]
        self.signatures = sorted((int(w["full_slots"]), str(w["signature"])) for w in windows)
        self._round: tuple[Ranges | None, int, str, Feeds] = (None, -1, "", {})  # (view, version, signature, feeds)
        self._held = False  # whether draft_masked's input buffers hold the round's feeds (set by its first step)
        self.calls = 0

    def step(self, token: int, activations: np.ndarray, pos: int, view: Ranges) -> tuple[np.ndarray, np.ndarray]:
        emb, _ = embed(self.session, [token], per_layer=False)  # the target's scaled embedding
        feeds: Feeds = {("embeds_and_activations", None): np.concatenate([emb, activations.reshape(1, 1, -1)], axis=-1),
                        ("input_pos", None): np.asarray([pos], np.int32)}
        signature, round_feeds = self._cache_feeds(view)
        # caches, windows and masks are set by a round's first step only: a 4 MB copy per step at E2B widths
        held = frozenset(round_feeds) if self._held else frozenset()
        out = self.session.run(signature, {**feeds, **round_feeds}, held=held)
        self._held = True
        self.calls += 1
        if ("selected_ids", None) in out:
            logits = full_logits(out[("selected_logits", None)][0, -1], out[("selected_ids", None)][0, -1],
                                 self.vocab_size)
        else:
            logits = out[("logits", None)][0, -1]
        return logits, out[("projected_activations", None)][0, -1]

    def _cache_feeds(self, view: Ranges) -> tuple[str, Feeds]:
        """The signature and its caches, windows and masks for a view; built once per round (its steps share view
        and caches)."""
        if self._round[0] is view and self._round[1] == self.kv.version:
            return self._round[2], self._round[3]
        hi = view.get("full_attention", (0, 0))[1]
        signature = next((s for slots, s in self.signatures if slots >= hi), self.signatures[-1][1])
        inputs = self.session.backend.signatures[signature].inputs
        feeds: Feeds = {t.key: self.kv.read(t.key) for t in inputs if t.role in CACHE_ROLES}
        spans = {}  # layer type -> (first cache slot, slots) of what its inputs hold; whole caches by default
        for t in (t for t in inputs if t.role in ("store_key", "store_value")):
            axis, layer_type = int(t.seq_axis or 0), str(t.layer_type)
            slots, (lo, hi) = int(t.shape[axis]), view[layer_type]
            start = min(max(0, hi - slots), self.kv.capacity - slots)
            spans[layer_type] = (start, slots)
            cache = self.kv.read(("kv_key" if t.role == "store_key" else "kv_value", t.layer))
            feeds[t.key] = np.ascontiguousarray(cache[(slice(None),) * axis + (slice(start, start + slots),)])
        for layer_type, (lo, hi) in view.items():
            start, slots = spans.get(layer_type, (0, self.kv.capacity))
            feeds[("mask", layer_type)] = self.kv.range_mask(lo - start, hi - start, slots)
        self._round, self._held = (view, self.kv.version, signature, feeds), False
        return signature, feeds


def litert_options(backend: Backend) -> LiteRtOptions:
    """The entry's options, read as LiteRT's record (its kind's record: runtime/roles.py BACKENDS)."""
    options = backend.options
    assert isinstance(options, LiteRtOptions), type(options)
    return options


def full_logits(selected: np.ndarray, ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """A centroid head's vocabulary-wide logits, filled as the graph's `draft` signature and transformers fill
    them (every unselected token: min(selected) - 1), so greedy and sampled drafts are unchanged."""
    out = np.full(vocab_size, selected.min() - np.float32(1), np.float32)
    out[ids] = selected
    return out


def embed(session: LiteRtSession, ids: list[int], per_layer: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-token lookups through the embedder signatures (as LiteRT-LM's embedding managers do); per_layer=False
    skips the per-layer embeddings (the drafter reads only the token's embedding)."""
    emb, ple = [], []
    for t in ids:
        token: Feeds = {("token_ids", None): np.asarray([[t]], np.int32)}
        emb.append(session.run("embed_decode", token)[("embeddings", None)])
        if per_layer and "per_layer_embed_decode" in session.backend.signatures:
            ple.append(session.run("per_layer_embed_decode", token)[("per_layer_embeddings", None)])
    return np.concatenate(emb, axis=1), (np.concatenate(ple, axis=1) if ple else None)


def load(manifest: Manifest, backend: Backend, threads: int | None = None,
         options: LoadOptions = LoadOptions()) -> tuple[Target[Ranges], Drafter[Ranges]]:
    """The runtime backend contract (runtime/backends/__init__.py), which mypy checks these classes against."""
    session = LiteRtSession(manifest, backend, threads, options=options)
    kv = StateKV(manifest, backend, session.target)
    return StateTarget(session, kv), StateDrafter(session, kv, int(manifest.model.vocab_size))
