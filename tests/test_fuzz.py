"""Property-based fuzzing of what mtpkit takes from outside: manifest.json and generation options.

Whatever the value, the manifest loader either loads or raises ManifestError, and the generation options and
prompts either work or raise UsageError: never a TypeError, KeyError, AttributeError or a crash in a library.
Examples are derandomized (the same in every CI run) and bounded, so the file runs in seconds.
"""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mtpkit.errors import ManifestError, MtpkitError, UsageError
from mtpkit.runtime.manifest import load_manifest

PAIR = "e2b_gemma4_centroid"
BOUNDED = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

SCALARS = (st.none() | st.booleans() | st.integers(-2**63, 2**64) | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(st.characters(exclude_categories=()), max_size=12)
           | st.sampled_from(["", ".", "..", "../x", "/etc/passwd", "a\x00b", "x" * 300, "onnx", "float32", "target"]))
JSON = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids,
                                                                                     max_size=3), max_leaves=5)


def _paths(node, prefix=()):
    """Every (path, container) in a JSON tree, containers first."""
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield from _paths(child, (*prefix, key))


def _mutate(manifest: dict, edits) -> object:
    """A copy of manifest with each (path, op, value) applied: op "set" replaces the node, "delete" removes it."""
    doc = json.loads(json.dumps(manifest))
    for path, op, value in edits:
        if not path:
            doc = value
            continue
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            if op == "delete":
                del parent[path[-1]]
            else:
                parent[path[-1]] = value
        except (KeyError, IndexError, TypeError):  # an earlier edit removed or replaced this path
            pass
    return doc


@pytest.fixture(scope="module")
def export_copy(tmp_path_factory, tiny_exports):
    folder = tmp_path_factory.mktemp("fuzz") / "export"
    shutil.copytree(tiny_exports(PAIR), folder)
    return folder


def _edits(base: dict, max_size: int):
    paths = list(_paths(base))
    shallow = [p for p in paths if len(p) <= 3]  # top-level and section fields; deep ones are mostly tensor specs
    edit = st.tuples(st.sampled_from(shallow) | st.sampled_from(paths), st.sampled_from(["set", "set", "delete"]), JSON)
    return st.lists(edit, min_size=1, max_size=max_size)


def _onnx_tensor(signature: str, io: str, index: int, field: str) -> tuple:
    return "backends", "onnx", "signatures", signature, io, index, field


def _loads(folder, manifest: dict) -> bool:
    """Write `manifest` into folder; True if the loader accepts it, False if it refuses it with a ManifestError
    (any other exception fails the test)."""
    (folder / "manifest.json").write_text(json.dumps(manifest))
    try:
        load_manifest(folder)
    except ManifestError:
        return False
    return True


@pytest.mark.slow
def test_any_value_in_any_manifest_field_loads_or_is_a_manifest_error(export_copy):
    base = json.loads((export_copy / "manifest.json").read_text())

    @settings(BOUNDED, max_examples=400)
    @given(edits=_edits(base, 3))
    def check(edits):
        _loads(export_copy, _mutate(base, edits))

    check()


@pytest.mark.slow
def test_a_manifest_the_loader_accepts_runs_or_is_refused_with_a_user_error(export_copy):
    """The loader's checks are enough for the runtime: a manifest that loads opens, generates and chats, or fails
    with an MtpkitError; never a KeyError or TypeError from inside a backend."""
    import mtpkit

    base = json.loads((export_copy / "manifest.json").read_text())

    @settings(BOUNDED, max_examples=100)
    @given(edits=_edits(base, 1))
    # edits the loader cannot see (manifest.json has no sha256) that used to reach ONNX Runtime, depending on the
    # draw: always run (the backend now refuses them when it opens the graphs)
    @example(edits=[(_onnx_tensor("decode", "inputs", 0, "name"), "set", "input_idz")])
    @example(edits=[(_onnx_tensor("draft", "outputs", 1, "name"), "set", "")])
    @example(edits=[(_onnx_tensor("verify", "inputs", 2, "shape"), "set", [1])])
    def check(edits):
        if not _loads(export_copy, _mutate(base, edits)):
            return
        try:
            model = mtpkit.load(export_copy, threads=1)
            model.generate("hello", max_new_tokens=3)
            model.generate("hello", max_new_tokens=2, chat=True)
        except MtpkitError:
            pass

    check()


VALUES = (st.none() | st.booleans() | st.integers(-5, 10**13) | st.floats(allow_nan=True, allow_infinity=True)
          | st.text(max_size=6) | st.sampled_from(["auto", "constant", "heuristic", "clean", "hf"]) | st.just([1]))


@BOUNDED
@given(max_new_tokens=VALUES, mtp=VALUES, k=VALUES, schedule=VALUES, max_draft=VALUES, kv_handoff=VALUES,
       temperature=VALUES, top_k=VALUES, top_p=VALUES, seed=VALUES)
def test_any_generation_option_is_accepted_sanely_or_is_a_usage_error(max_new_tokens, mtp, k, schedule, max_draft,
                                                                      kv_handoff, temperature, top_k, top_p, seed):
    from mtpkit.runtime.engine import GenConfig
    from mtpkit.runtime.sampling import SamplingConfig

    try:
        sampling = SamplingConfig(temperature, top_k, top_p, seed)
        cfg = GenConfig(max_new_tokens=max_new_tokens, mtp=mtp, num_assistant_tokens=k, schedule=schedule,
                        max_draft=max_draft, kv_handoff=kv_handoff, sampling=sampling)
    except UsageError:
        return
    assert 0 <= sampling.temperature < float("inf") and 0 < sampling.top_p <= 1 and sampling.top_k >= 0
    assert cfg.max_new_tokens >= 1 and cfg.max_draft >= 1 and isinstance(cfg.mtp, bool)
    assert cfg.num_assistant_tokens in (None, "auto") or cfg.num_assistant_tokens >= 1


@pytest.mark.slow
def test_any_prompt_generates_or_is_a_usage_error(tiny_exports):
    import mtpkit

    model = mtpkit.load(tiny_exports(PAIR))

    @settings(BOUNDED, max_examples=40)
    @given(text=st.text(st.characters(exclude_categories=()), max_size=300), chat=st.booleans())
    def check(text, chat):
        try:
            out = model.generate(text, max_new_tokens=2, chat=chat)
        except UsageError:
            return
        assert 1 <= len(out.token_ids) <= 2

    check()
