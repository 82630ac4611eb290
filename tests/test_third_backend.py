"""A third backend, registered through exactly the three places docs/design.md ("Adding a backend") names: its row in
runtime/roles.py BACKENDS (with its options record), export/backends/<kind>/ and runtime/backends/<kind>.py (here
injected as modules).

The "relay" backend writes and runs the ONNX exporter's graphs under its own name, with an extra that mtpkit has
never heard of; the export holds no onnx backend at all. Everything else (config, extras, preflight, pipeline,
manifest and its schema, engine, load errors, parity, CLI, bench --peers, fidelity's layout) must find it through
the table and the modules' hooks.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types

import pytest

KIND = "relay"


def _export_module() -> types.ModuleType:
    from mtpkit.export.backends import ExportMemory
    from mtpkit.export.backends import onnx as onnx_export
    from mtpkit.export.phases import MB

    def export(job):
        entry = onnx_export.export(job)  # graphs written by the ONNX exporter, claimed as this backend's
        graphs = {name: dataclasses.replace(g, backend=KIND) for name, g in entry.graphs.items()}
        return dataclasses.replace(entry, kind=KIND, graphs=graphs)

    def check(manifest, job, ids):  # the graph check any backend gets: its graphs driven through its runtime
        from mtpkit.export.verify import check_runtime

        return check_runtime(manifest, KIND, job.target, job.drafter, ids)

    module = types.ModuleType(f"mtpkit.export.backends.{KIND}")
    module.export, module.check = export, check
    module.MEMORY = ExportMemory(base=600 * MB, graphs=0.15, quantize=lambda recipes: 1.8)
    return module


class ProtocolOnly:
    """Only the members of a runtime Protocol (runtime/backends/__init__.py) of what it wraps: whatever reads more
    of a backend's target, drafter or KV store fails on this backend."""

    def __init__(self, inner, protocol):
        self._inner, self._members = inner, {n for n in (*vars(protocol), *protocol.__annotations__)
                                             if not n.startswith("_")}

    def __getattr__(self, name):
        if name not in self._members:
            raise AttributeError(f"{name!r} is not in the Protocol")
        return getattr(self._inner, name)


def _runtime_module() -> types.ModuleType:
    from mtpkit.runtime.backends import Drafter, KVStore, Target
    from mtpkit.runtime.backends import onnx as onnx_runtime

    def load(manifest, backend, threads, options):
        target, drafter = onnx_runtime.load(manifest, backend, threads, options)  # the graphs the relay entry names
        wrapped = ProtocolOnly(target, Target)
        wrapped._members.discard("kv")
        wrapped.kv = ProtocolOnly(target.kv, KVStore)
        return wrapped, ProtocolOnly(drafter, Drafter)

    module = types.ModuleType(f"mtpkit.runtime.backends.{KIND}")
    module.load = load
    module.load_errors = onnx_runtime.load_errors
    return module


@pytest.fixture
def relay(monkeypatch):
    """Register the backend in those places, for this test only."""
    from mtpkit.runtime.roles import BACKENDS, BackendKind, OnnxOptions

    # it writes and reads ONNX's options
    monkeypatch.setitem(BACKENDS, KIND, BackendKind("window", "relay-extra", ("numpy",), False, ("numpy",),
                                                    options=OnnxOptions))
    monkeypatch.setitem(sys.modules, f"mtpkit.export.backends.{KIND}", _export_module())
    monkeypatch.setitem(sys.modules, f"mtpkit.runtime.backends.{KIND}", _runtime_module())


@pytest.mark.slow
def test_a_third_backend_exports_loads_and_generates(relay, tiny_checkpoints, tmp_path, capfd):
    import mtpkit
    from mtpkit import cli
    from mtpkit.errors import ManifestError
    from mtpkit.runtime.engine import Engine, GenConfig
    from mtpkit.runtime.manifest import load_manifest, sha256_file
    from mtpkit.runtime.parity import run_parity

    target, drafter = tiny_checkpoints("e2b_gemma4_centroid")
    out = mtpkit.export_pair(target, drafter, tmp_path / "relay", backend=KIND, reference_tokens=8,
                             max_cache_len=128)
    manifest = load_manifest(out)
    assert list(manifest.backends) == [KIND] and manifest.backend().kind == KIND
    assert manifest.measured["preflight"]["estimated_phases_mb"][f"{KIND} graphs"] > 0
    assert manifest.backend().options.acceptance_by_position  # measured on the relay graphs by the pipeline
    checks = json.loads((out / "graph_parity.json").read_text())  # its float graphs were checked against PyTorch
    assert checks and {c["backend"] for c in checks} == {KIND} and all(c["ok"] for c in checks)

    # generate: the relay graphs give transformers' greedy tokens, plain and speculative
    engine = Engine(out, threads=1)
    assert engine.backend.kind == KIND and engine.threads == {"target": 1, "drafter": 1}
    reference = json.loads((out / "reference.json").read_text())
    for p in reference["prompts"]:
        want = p["greedy_ids"]
        for mtp in (False, True):
            got = [t for t, _ in engine.generate(p["prompt_ids"], GenConfig(max_new_tokens=len(want), mtp=mtp))]
            assert got == want, (p["name"], mtp)
    report = run_parity(out, threads=1)
    assert report["ok"] and report["backend"] == KIND and report["checks"] > 0

    # the CLI, including bench --peers (transformers compared with mtpkit's relay rows)
    capfd.readouterr()
    assert cli.main(["run", str(out), "--backend", KIND, "--prompt", "def f(x):", "--max-new-tokens", "4",
                     "--threads", "1", "--json"]) == 0
    assert len(json.loads(capfd.readouterr().out)["output_ids"]) == 4
    assert cli.main(["bench", str(out), "--peers", "--prompt", "def f(x):", "--repeats", "1", "--max-draft", "1",
                     "--max-new-tokens", "4", "--threads", "1", "--json", str(tmp_path / "bench.json")]) == 0
    rows = {r["name"]: r for r in json.loads((tmp_path / "bench.json").read_text())["peers"]["rows"]
            if not r["name"].startswith("llama.cpp")}  # present only where the llama-cpp extra is installed
    assert list(rows) == [f"mtpkit {KIND} plain", "transformers plain", f"mtpkit {KIND} spec",
                          "transformers assisted"]
    assert rows["transformers plain"]["baseline"] == f"mtpkit {KIND} plain"
    assert rows["transformers plain"]["same_tokens"] == 1

    # a graph file its runtime cannot read (sha256 updated to match) is a damaged export, not a bug in mtpkit
    data = json.loads((out / "manifest.json").read_text())
    graph = out / data["backends"][KIND]["graphs"]["target"]["file"]
    graph.write_bytes(b"not an onnx graph")
    data["backends"][KIND]["graphs"]["target"]["sha256"] = sha256_file(graph)
    (out / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=f"the {KIND} graphs in .* cannot be loaded"):
        Engine(out, threads=1)


def test_a_third_backend_options_are_checked_by_its_own_record(relay):
    """Reading the manifest reads each backend's options as its kind's record (its BACKENDS row's `options`)."""
    from mtpkit.errors import ManifestError
    from mtpkit.runtime.manifest import SCHEMA_VERSION, Manifest

    layer = {"layer": 0, "type": "full_attention", "kv_heads": 1, "head_dim": 4}
    io = {"name": "x", "role": "logits", "shape": [1], "dtype": "float32"}
    backend = {"kind": KIND, "kv_io": "window", "graphs": {"g": {"file": "g", "sha256": "0", "bytes": 1,
               "backend": KIND}}, "signatures": {"decode": {"graph": "g", "inputs": [io], "outputs": [io]}}}
    data = {"schema_version": SCHEMA_VERSION, "mtpkit_version": "0", "source": {}, "quantization": {},
            "model": {"vocab_size": 8, "hidden_size": 4, "sliding_window": 4}, "tokens": {"eos": [1]},
            "tokenizer": {"file": "t", "sha256": "0"}, "generation": {"num_assistant_tokens": 2},
            "kv_cache": {"capacity": 16, "layers": [layer], "sliding_past": 3, "drafter_sliding_visible": 5,
                         "drafter_layers": {"sliding_attention": 0, "full_attention": 0}},
            "backends": {KIND: backend}}
    with pytest.raises(ManifestError, match=f"backends.{KIND}.options.embedding is missing"):
        Manifest.read(data)


def test_fidelity_files_every_backend_under_its_name(relay, tmp_path, monkeypatch):
    """quant_fidelity.json has one entry per backend, the first one included (none at the top level)."""
    from mtpkit.export import fidelity

    figures = {"top1_agreement": 1.0, "mean_kl": 0.0, "max_abs_logit": 0.0, "positions": 1}
    runtime = {"greedy_prefix_match": 1.0, "acceptance": 0.5, "first_divergence": {}}
    monkeypatch.setattr(fidelity, "teacher_forced", lambda *a, **k: figures)
    monkeypatch.setattr(fidelity, "runtime_figures", lambda *a, **k: runtime)
    (tmp_path / "reference.json").write_text(json.dumps({"prompts": []}))
    graphs = {"target": types.SimpleNamespace(recipe="int8"), "drafter": types.SimpleNamespace(recipe="int8")}
    kinds = ("onnx", KIND)
    calibrated = types.SimpleNamespace(quantization={"target": {"calibration": {"source": "built-in", "prompts": 8}}})
    plain = types.SimpleNamespace(quantization=None)
    manifest = types.SimpleNamespace(reference={"file": "reference.json"}, root=tmp_path, backends=dict.fromkeys(kinds),
                                     backend=lambda kind: types.SimpleNamespace(
                                         graphs=graphs, options=calibrated if kind == KIND else plain),
                                     path=lambda name: tmp_path / name)
    report = fidelity.check(manifest, None, {k: runtime for k in kinds}, gate=True)
    assert set(report) == set(kinds) == set(json.loads((tmp_path / fidelity.FIDELITY_FILE).read_text()))
    assert report[KIND]["teacher_forced"] == figures and report["onnx"]["target_recipe"] == "int8"
    assert report[KIND]["calibration"]["source"] == "built-in" and report["onnx"]["calibration"] is None
