"""Shared fixtures: tiny checkpoints and their exports, built once per test session."""

from __future__ import annotations

import os
import tempfile

import pytest

# the runtime's record of verified files (runtime/verified.py) lives in the test session, not in ~/.cache
os.environ["MTPKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="mtpkit-test-cache-")

VARIANTS = {
    # name: make-tiny spec; together they cover both target layouts, both drafter heads, e2b/e4b, k_eq_v
    "e2b_gemma4_centroid": dict(shape="e2b", layout="gemma4", head="centroid"),
    # max_positions 512: the LiteRT export below takes the default KV capacity, which must adapt to it
    "e4b_text_dense_kv_eq": dict(shape="e4b", layout="gemma4_text", head="dense", k_eq_v=True, max_positions=512),
    "e2b_text_kv_eq": dict(shape="e2b", layout="gemma4_text", head="centroid", k_eq_v=True),
}
# LiteRT exports cost minutes each: these two cover both target layouts, both drafter heads and k_eq_v
LITERT_VARIANTS = ("e2b_gemma4_centroid", "e4b_text_dense_kv_eq")


def load_tool(name: str):
    """The module tools/<name>.py (scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tool():
    """name -> the module tools/<name>.py."""
    return load_tool


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """name -> (target_dir, drafter_dir)"""
    from mtpkit.tiny.make import TinySpec, make_tiny

    root = tmp_path_factory.mktemp("tiny")
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = make_tiny(root / name, TinySpec(**VARIANTS[name]))
        return cache[name]

    return get


@pytest.fixture(scope="session")
def tiny_exports(tmp_path_factory, tiny_checkpoints):
    """name -> export folder (ONNX), exported with the built-in graph parity check on, through the public API."""
    import mtpkit

    root = tmp_path_factory.mktemp("exports")
    cache = {}

    def get(name: str):
        if name not in cache:
            target, drafter = tiny_checkpoints(name)
            cache[name] = mtpkit.export_pair(target, drafter, root / name, reference_tokens=24, max_cache_len=256)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def litert_exports(tmp_path_factory, tiny_checkpoints):
    """name -> export folder with ONNX and LiteRT graphs (verify length 9, so k in {1,2,4,8} fits; prefill 16),
    shared by the LiteRT runtime and LiteRT quantization tests. KV capacity 256, except for a checkpoint with a
    smaller max_positions: that one is exported without --max-cache-len, so the default adapts to the model."""
    import mtpkit

    root = tmp_path_factory.mktemp("litert")
    cache = {}

    def get(name: str):
        if name not in cache:
            target, drafter = tiny_checkpoints(name)
            capacity = {} if "max_positions" in VARIANTS[name] else {"max_cache_len": 256}
            cache[name] = mtpkit.export_pair(target, drafter, root / name, backend="onnx,litert", reference_tokens=24,
                                             prefill_len=16, max_draft=8, **capacity)
        return cache[name]

    return get


def litertlm_texts(path: str, max_new: int, capfd) -> dict[bool, str]:
    """Greedy text from LiteRT-LM for the prompt "Hello, world" with speculation off (False) and on (True);
    asserts the drafter section ran exactly when speculation was on (LiteRT-LM logs its success rate on close)."""
    import litert_lm

    assert litert_lm.ModelInfo(path).llm.has_speculative_decoding_support()
    texts = {}
    for speculative in (False, True):
        engine = litert_lm.Engine(path, backend=litert_lm.Backend.CPU(), enable_speculative_decoding=speculative)
        session = engine.create_session(apply_prompt_template=False, max_output_tokens=max_new)
        session.run_prefill(["Hello, world"])
        texts[speculative] = session.run_decode().texts[0]
        session.close()
        engine.close()
        ran_drafter = "MTP Drafter" in capfd.readouterr().err
        assert ran_drafter == speculative, "speculative decoding did not run the drafter section"
    return texts


def planned_and_written(folder, quant: str, out, **flags_too) -> tuple[dict[str, tuple[int, int]], object]:
    """(file -> (bytes `mtpkit export --dry-run` plans for it, bytes on disk; a graph with its .data file), the plan)
    for an export folder, planned from the checkpoints and flags its manifest records, under --quant `quant` (a
    derived copy records its float export's flags). out: a path that does not exist (the dry run's --out).
    flags_too: more ExportConfig fields for the plan (max_size=...)."""
    from pathlib import Path

    from mtpkit.export.config import ExportConfig
    from mtpkit.export.pipeline import plan_export
    from mtpkit.runtime.manifest import load_manifest

    folder, flags = Path(folder), dict(load_manifest(folder).export["flags"])
    # a derived copy takes its recipe's own --ple-quant (derive_quantized), not the float export's recorded one
    plan = plan_export(ExportConfig(**{**flags, "quant": quant, "drafter_quant": None, "ple_quant": None, "out": out,
                                       "dry_run": True, **flags_too}))
    sizes = {}
    for backend in plan.backends.values():
        for f in backend.files:
            data = folder / f"{f.name}.data"
            sizes[f.name] = (f.bytes, (folder / f.name).stat().st_size + (data.stat().st_size if data.exists() else 0))
    return sizes, plan


def grafted_linear(linear, encoding, tmp_path):
    """A bias-free nn.Linear converted with its weight as an input, then grafted with `encoding` (graft.Encoding)
    into tmp_path / "fc.tflite" (signature "fc", input "input"). Returns (path, graft's labels, skeleton path)."""
    import litert_torch
    import torch

    from mtpkit.export.backends.litert import graft, sources

    weights = graft.WeightInputs()
    converter = litert_torch.Converter()
    with weights.converting():
        converter.signature("fc", linear.eval(), sample_kwargs={"input": torch.randn(1, linear.in_features)})
    skeleton, path = tmp_path / "skeleton.tflite", tmp_path / "fc.tflite"
    converter.convert(strict_export=False).export(str(skeleton))
    done = graft.graft(skeleton, path, sources.StateSource(linear.state_dict()), lambda *a: encoding,
                       names=weights.names)
    return path, done, skeleton
