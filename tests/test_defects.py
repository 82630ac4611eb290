"""Regression tests for defects found while reshaping the backends; each failed before its fix."""

from __future__ import annotations

import logging
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")


def test_litert_prefill_records_the_whole_logical_call():
    """runtime/backends/litert.py: the chunked prefill loop reused `start`, so kv.last.start was the last chunk's."""
    from mtpkit.runtime.backends.litert import StateTarget
    from mtpkit.runtime.handoff import LastCall

    target = StateTarget.__new__(StateTarget)
    target.kv = types.SimpleNamespace(last=LastCall(), capacity=256)
    target.prefill, target.max_draft, target.calls = [{"num_tokens": 4, "signature": "prefill_4"}], 4, 0
    calls = []

    def fake_call(signature, ids, pos):
        calls.append((signature, pos))
        return {("logits", None): np.zeros((1, len(ids), 3)), ("activations", None): np.zeros((1, len(ids), 2))}

    target._call = fake_call
    target.forward(list(range(11)), 0)  # 10 prompt tokens in chunks at 0, 4, 8, then decode of the last at 10
    assert calls == [("prefill_4", 0), ("prefill_4", 4), ("prefill_4", 8), ("decode", 10)]
    assert (target.kv.last.start, target.kv.last.end) == (0, 11)


def test_litert_prefill_counts_as_one_target_call():
    """runtime/backends/litert.py counted every graph call of a chunked prefill (chunks + the last token's decode)
    in `calls`, so tokens per target call on LiteRT read 2.12 where ONNX read 2.62 on the same drafts."""
    from mtpkit.runtime.backends.litert import StateTarget
    from mtpkit.runtime.handoff import LastCall

    target = StateTarget.__new__(StateTarget)
    target.kv = types.SimpleNamespace(last=LastCall(), capacity=256)
    target.prefill, target.max_draft, target.calls = [{"num_tokens": 4, "signature": "prefill_4"}], 4, 0
    graph_calls = []

    def fake_call(signature, ids, pos):
        graph_calls.append(signature)
        return {("logits", None): np.zeros((1, len(ids), 3)), ("activations", None): np.zeros((1, len(ids), 2))}

    target._call = fake_call
    target.forward(list(range(11)), 0)  # four graph calls, one logical prefill
    target.forward([1, 2, 3], 11)  # one verify
    target.forward([4], 14)  # one decode
    assert len(graph_calls) == 6 and target.calls == 3


def test_reference_restores_num_assistant_tokens_when_generate_fails():
    """export/reference.py restored the drafter's num_assistant_tokens outside a finally."""
    from mtpkit.export import reference

    class Target:
        def __call__(self, x):
            return types.SimpleNamespace(logits=torch.zeros(1, x.shape[1], 3))

        def generate(self, x, **kwargs):
            if "assistant_model" in kwargs:
                raise RuntimeError("generate failed")
            return torch.zeros(1, x.shape[1] + 2, dtype=torch.long)

    drafter = types.SimpleNamespace(generation_config=types.SimpleNamespace(num_assistant_tokens=5))
    with pytest.raises(RuntimeError, match="generate failed"):
        reference.record(Target(), drafter, [("p", [2, 3])], max_new_tokens=2, eos_ids=[1])
    assert drafter.generation_config.num_assistant_tokens == 5


def test_onnx_export_leaves_the_torch_logger_level_alone(tmp_path):
    """export/backends/onnx/graphs.py set a torch.onnx logger to ERROR for the whole process and never restored it."""
    from mtpkit.export.backends.onnx import graphs as onnx_backend
    from mtpkit.runtime.manifest import Signature, TensorSpec

    class Double(torch.nn.Module):
        def forward(self, input_ids):
            return input_ids * 2

    logger = logging.getLogger(onnx_backend._REGISTRATION_LOGGER)
    logger.setLevel(logging.WARNING)
    sig = Signature("g", [TensorSpec("x", "input_ids", [1, "T"], "float32")],
                    [TensorSpec("y", "logits", [1, "T"], "float32")])
    onnx_backend.export_graph(Double(), sig, (torch.ones(1, 3),), tmp_path / "g.onnx")
    assert (tmp_path / "g.onnx").is_file() and logger.level == logging.WARNING


def test_litert_drafter_caches_are_named_by_owner_index():
    """export/backends/litert/ read the drafter's kv_cache_<k|v>_<n> as layer n but the target's as the n-th
    KV owner; LiteRT-LM hands the drafter the target's caches by name, so both must mean the n-th owner."""
    pytest.importorskip("litert_torch")
    from mtpkit.export.backends.litert import describe as litert_describe

    owners = [0, 1, 2, 5]  # a layout where a KV owner comes after a shared layer
    detail = {"shape": [1, 1, 16, 8], "dtype": np.float32}
    stores = {2: "sliding_attention", 3: "full_attention"}
    assert litert_describe._tensor("kv_cache_k_3", detail, "drafter", owners, stores)["layer"] == 5
    assert litert_describe._tensor("kv_cache_k_3", detail, "target", owners, stores)["layer"] == 5
    window = litert_describe._tensor("window_k_3", detail, "drafter", owners, stores)  # a full-layer prefix
    assert (window["layer"], window["layer_type"], window["role"]) == (5, "full_attention", "store_key")


def test_litert_cache_indices_of_gemma4_store_layers(tiny_checkpoints):
    pytest.importorskip("litert_torch")
    from mtpkit.export.backends.litert.describe import cache_indices
    from mtpkit.export.checkpoint import resolve
    from mtpkit.export.models import gemma4_text

    config = gemma4_text.hf_config(resolve(str(tiny_checkpoints("e2b_gemma4_centroid")[0]), "target"))
    owners = [d.layer for d in gemma4_text.kv_layers(config)]
    index = cache_indices(gemma4_text, config)
    assert {t: owners[n] for t, n in index.items()} == gemma4_text.store_layers(config)


def test_an_older_manifest_schema_is_refused_with_a_clear_message(tmp_path):
    import json

    from mtpkit.runtime.manifest import ManifestError, load_manifest

    (tmp_path / "manifest.json").write_text(json.dumps({"schema_version": 1, "mtpkit_version": "0.1.0"}))
    with pytest.raises(ManifestError, match=r"schema_version 1 \(written by mtpkit 0.1.0\).*re-export"):
        load_manifest(tmp_path)


def test_a_role_outside_the_role_table_is_refused():
    from mtpkit.runtime.manifest import ManifestError, TensorSpec

    with pytest.raises(ManifestError, match="role 'present_key'"):
        TensorSpec("present.0.key", "present_key", [1, 1, "T", 8], "float32", 0)


@pytest.mark.slow
def test_fidelity_measures_acceptance_with_constant_k_whatever_the_drafter_config_says(tmp_path, tiny_exports,
                                                                                       monkeypatch):
    """export/fidelity.py ran its speculative pass with the drafter's configured schedule (heuristic here) while
    its docstring said constant k."""
    import json
    import shutil

    from mtpkit.export import fidelity
    from mtpkit.runtime.engine import Engine

    folder = tmp_path / "export"
    shutil.copytree(tiny_exports("e2b_gemma4_centroid"), folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["generation"]["num_assistant_tokens_schedule"] = "heuristic"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    kinds, run = [], Engine.run

    def spy(engine, ids, cfg, *args, **kw):
        kinds.append((engine.schedule(cfg).kind, engine.schedule(cfg).k))
        return run(engine, ids, cfg, *args, **kw)

    monkeypatch.setattr(Engine, "run", spy)
    reference = json.loads((folder / "reference.json").read_text())
    figures = fidelity.runtime_figures(folder, reference, num_assistant_tokens=2)
    assert kinds and set(kinds) == {("constant", 2)}
    assert (figures["schedule"], figures["num_assistant_tokens"]) == ("constant", 2)


@pytest.mark.slow
def test_loading_holds_one_session_per_graph(tiny_exports, monkeypatch):
    """runtime/backends/onnx.py pick_threads opened every graph once per thread count it timed and held them all
    at once: a full-size export started with about twice the memory it runs with."""
    import weakref

    import onnxruntime as ort

    from mtpkit.runtime.backends import onnx as onnx_backend
    from mtpkit.runtime.engine import Engine

    alive, peak, real = weakref.WeakSet(), {}, ort.InferenceSession

    class Counted(real):
        def __init__(self, path, *args, **kw):
            super().__init__(path, *args, **kw)
            self.counted_path = str(path)
            alive.add(self)
            peak[self.counted_path] = max(peak.get(self.counted_path, 0),
                                          sum(s.counted_path == self.counted_path for s in alive))

    monkeypatch.setattr(ort, "InferenceSession", Counted)
    monkeypatch.setattr("os.cpu_count", lambda: 2)  # two candidates to time, on any machine
    # two threads win for the target, one for the drafter: one graph is opened again, one is kept
    fake = {2: {"target": [1.0], "drafter": [2.0]}, 1: {"target": [2.0], "drafter": [1.0]}}
    monkeypatch.setattr(onnx_backend, "_time_calls", lambda session, kv, embed, repeats: fake[session.threads["target"]])
    engine = Engine(tiny_exports("e2b_gemma4_centroid"))
    assert len(peak) == 2 and set(peak.values()) == {1}, peak
    assert engine.threads == {"target": 2, "drafter": 1}
    # the sessions are ONNX Runtime's public API (InferenceSession.run), not its private C session
    assert all(run.__func__ is real.run for run in engine.untimed[0].session._run.values())
