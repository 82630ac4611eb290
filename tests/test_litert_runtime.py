"""The LiteRT backend through the same runtime: parity with transformers, cross-backend agreement, static k."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("ai_edge_litert")
pytest.importorskip("litert_torch")

from conftest import LITERT_VARIANTS  # noqa: E402
from mtpkit.runtime.engine import Engine, GenConfig  # noqa: E402
from mtpkit.runtime.manifest import load_manifest  # noqa: E402
from mtpkit.runtime.parity import run_parity  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.litert]


@pytest.fixture(scope="module", params=LITERT_VARIANTS)
def both(request, litert_exports):
    """One export with ONNX and LiteRT graphs per target layout / drafter head (conftest.litert_exports)."""
    return litert_exports(request.param)


def test_manifest_describes_both_backends(both):
    manifest = load_manifest(both)
    assert set(manifest.backends) == {"onnx", "litert"}
    lite = manifest.backend("litert")
    assert lite.kv_io == "state" and lite.options.max_draft == 8  # verify takes max_draft + 1 tokens
    # conftest exports with --max-cache-len 256, except the checkpoint that holds 512 positions: exported without
    # it, the default 4096 adapts to the model
    limit = manifest.model.max_position_embeddings
    assert manifest.kv_cache.capacity == (512 if limit == 512 else 256)  # every backend's capacity
    written = json.loads((both / "manifest.json").read_text())["backends"]["litert"]["options"]
    assert set(written) & {"cache_len", "verify" + "_len"} == set()  # capacity and verify length: stored once
    assert {"decode", "verify", "draft", "draft_masked", "embed_decode", "prefill_16"} <= set(lite.signatures)
    assert lite.signatures["draft"].backend_name == "draft"
    assert (both / lite.graphs["bundle"].file).read_bytes()[:8] == b"LITERTLM"
    kv = [t for t in lite.signatures["decode"].inputs if t.role == "kv_value"]
    assert kv and all(t.seq_axis == 3 for t in kv)  # LiteRT keeps V transposed; the manifest says so


def test_litert_parity_passes_like_onnx(both):
    onnx_report, lite_report = run_parity(both, backend="onnx"), run_parity(both, backend="litert")
    assert onnx_report["ok"] and lite_report["ok"], [r for r in lite_report["results"] if not r["ok"]][:3]
    assert lite_report["draft_lengths"] == [1, 2, 4, 8] and lite_report["checks"] == onnx_report["checks"]


def test_onnx_and_litert_give_the_same_greedy_tokens(both):
    prompts = [[2, 80, 81, 82], [2] + list(range(40, 70))]
    for ids in prompts:
        for mtp in (False, True):
            cfg = GenConfig(max_new_tokens=20, mtp=mtp, num_assistant_tokens=3)
            onnx = [t for t, _ in Engine(both, backend="onnx").generate(ids, cfg)]
            lite = [t for t, _ in Engine(both, backend="litert").generate(ids, cfg)]
            assert onnx == lite


def test_a_k_beyond_the_static_verify_length_is_refused(both):
    result = subprocess.run([sys.executable, "-m", "mtpkit", "run", str(both), "--backend", "litert", "--prompt", "hi",
                             "-k", "9"], capture_output=True, text=True)
    assert result.returncode == 2 and "verifies at most 8 drafts per round" in result.stderr


def test_run_cli_on_litert(both):
    result = subprocess.run([sys.executable, "-m", "mtpkit", "run", str(both), "--backend", "litert", "--prompt",
                             "def f(x):", "--max-new-tokens", "10", "--json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["output_ids"]) == 10
    assert "XNNPACK" not in result.stderr  # LiteRT's own INFO line at the first invoke (runtime/quiet.py)


def test_demo_times_litert_lm_with_speculation_off_and_on(litert_exports):
    """mtpkit demo's LiteRT-LM step on one shared export: both rows run every prompt, speculation keeps the
    greedy text, and the report has what the demo prints (speed is reported, never asserted)."""
    pytest.importorskip("litert_lm")
    from mtpkit.tiny.demo_litert_lm import _agree, litert_lm_check

    report = litert_lm_check(litert_exports(LITERT_VARIANTS[0]), ["def add(a, b):", "Hello, world"], 8, repeats=1)
    assert report["prompts"] == 2 and report["same_text"] == 2 and report["runtime"].startswith("litert-lm ")
    assert report["plain_ms_per_token"] > 0 and report["speculative_ms_per_token"] > 0
    assert 0 < report["min_speedup"] <= report["median_speedup"]
    assert _agree("abc", "abcd") and not _agree("abc", "abd") and not _agree("", "")


def test_target_calls_with_caches_bound_in_place_equal_litert_s_own_signature_runner(both):
    """The target graph through CompiledModel, each cache one buffer bound as input and output of every signature,
    against ai_edge_litert's Interpreter runner given the same caches: logits and updated caches bit for bit, over a
    prefill, decodes and a verify (one signature's in-place update feeds the next's)."""
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter

    from mtpkit.runtime.backends import open_backend

    manifest = load_manifest(both)
    target, _ = open_backend(manifest, "litert", threads=1)
    kv, backend = target.kv, manifest.backend("litert")
    interp = Interpreter(model_path=str(manifest.path(backend.graphs[backend.signatures["decode"].graph].file)),
                         num_threads=1)
    caches = {key: np.zeros(shape, dtype) for key, (shape, dtype) in kv.specs.items()}
    calls = [("prefill", [2, 80, 81, 82, 83], 0), ("decode", [84], 5), ("verify", [85, 86, 87], 6),
             ("decode", [86], 7)]
    for kind, ids, pos in calls:
        signature = target.prefill[-1]["signature"] if kind == "prefill" else kind
        sig = backend.signatures[signature]
        n = {"prefill": target.prefill[-1]["num_tokens"], "verify": target.max_draft + 1}.get(kind, 1)
        padded = ids + [0] * (n - len(ids))
        feeds = {**target.feeds(padded, pos), **caches}
        want = interp.get_signature_runner(sig.backend_name)(**{t.name: feeds[t.key] for t in sig.inputs})
        got = kv.graph.run(signature, target.feeds(padded, pos))
        kv.version += 1
        for t in sig.outputs:
            value = kv.read(t.key) if t.key in caches else got[t.key]
            assert np.array_equal(value, want[t.name]), (signature, t.name)
            if t.key in caches:
                caches[t.key] = want[t.name]
        assert not any(key in got for key in caches)  # caches are not copied out


def test_drafter_steps_after_the_first_of_a_round_reuse_its_inputs(both, monkeypatch):
    """A round's caches, windows and masks are set by its first step only; later steps (with a call of the other
    drafter signature, other inputs, in between) draft exactly what steps that set everything draft, and after a
    target call the next step sets them again."""
    import numpy as np

    from mtpkit.runtime.backends import open_backend

    target, drafter = open_backend(load_manifest(both), "litert", threads=1)
    _, hidden = target.forward([2, 80, 81, 82, 83, 84, 85, 86, 87, 88], 0)
    view = target.kv.drafter_view(10, "clean")
    session, held = drafter.session, []
    run = session.run

    def spy(signature, feeds, **kw):
        if signature.startswith("draft_masked"):
            held.append(len(kw.get("held", ())))
        return run(signature, feeds, **kw)

    monkeypatch.setattr(session, "run", spy)

    def steps(fresh: bool) -> list[np.ndarray]:
        out = []
        for i, token in enumerate([89, 90, 91]):
            drafter._held = drafter._held and not fresh
            out.append(drafter.step(token, hidden[-1], 10 + i, view)[0])
            other = session.backend.signatures["draft"]  # same interpreter, its own input buffers
            session.run("draft", {t.key: np.zeros(t.shape, np.dtype(t.dtype)) for t in other.inputs})
        return out

    with_held = steps(False)
    assert held[0] == 0 and held[1] == held[2] >= 4  # caches and masks (and windows) held after step 1
    assert all(np.array_equal(a, b) for a, b in zip(with_held, steps(True)))
    target.forward([89], 10)
    held.clear()
    drafter.step(90, hidden[-1], 11, target.kv.drafter_view(11, "clean"))
    assert held == [0]


def test_drafter_runs_the_shortest_full_prefix_that_holds_the_view(both):
    """Of draft_masked's signatures, a step runs the one whose full-layer prefix is the shortest that holds the
    visible range, and drafts what the whole-cache signature drafts."""
    import numpy as np

    from mtpkit.runtime.backends import open_backend

    manifest = load_manifest(both)
    windows = manifest.backend("litert").options.draft_windows
    target, drafter = open_backend(manifest, "litert", threads=1)
    cap = target.kv.capacity
    assert [w["full_slots"] for w in windows] == [2 ** i for i in range(5, 12) if 2 ** i < cap] + [cap]
    assert windows[-1]["signature"] == "draft_masked"
    ids = [2] + [40 + (7 * i) % 90 for i in range(79)]
    _, hidden = target.forward(ids, 0)
    for pos in (5, 32, 33, 70):
        view = target.kv.drafter_view(pos, "clean")
        logits, projected = drafter.step(ids[pos], hidden[-1], pos, view)
        want_slots = min(w["full_slots"] for w in windows if w["full_slots"] >= view["full_attention"][1])
        assert drafter._round[2] == next(w["signature"] for w in windows if w["full_slots"] == want_slots)
        whole = drafter.signatures
        drafter.signatures, drafter._round = whole[-1:], (None, -1, "", {})
        full_logits, full_projected = drafter.step(ids[pos], hidden[-1], pos, view)
        drafter.signatures = whole
        assert np.allclose(logits, full_logits, atol=1e-5) and np.argmax(logits) == np.argmax(full_logits)
        assert np.allclose(projected, full_projected, atol=1e-5)


@pytest.mark.parametrize("signature,io,index,field,value,line", [
    ("decode", "inputs", 0, "name", "embedz",  # the target graph: a CompiledModel
     "manifest.json: backends.litert.signatures.decode declares input 'embedz', which graph target (target.tflite) "
     "does not have; re-export the model"),
    ("draft_masked", "outputs", 0, "name", "projected",  # the drafter: an Interpreter
     "manifest.json: backends.litert.signatures.draft_masked declares output 'projected', which graph drafter "
     "(drafter.tflite) does not have; re-export the model"),
    ("verify", "inputs", 2, "shape", [1, 1, 256],
     "manifest.json: backends.litert.signatures.verify declares input 'kv_cache_k_0' with rank 3, but graph target "
     "(target.tflite) has it with rank 4; re-export the model"),
], ids=["input-renamed", "output-renamed", "rank-changed"])
def test_a_signature_that_does_not_match_its_graph_is_refused_before_any_call(litert_exports, tmp_path, signature, io,
                                                                              index, field, value, line):
    import shutil

    import mtpkit
    from mtpkit.errors import ManifestError

    export = tmp_path / "export"
    shutil.copytree(litert_exports(LITERT_VARIANTS[0]), export)
    manifest = json.loads((export / "manifest.json").read_text())
    manifest["backends"]["litert"]["signatures"][signature][io][index][field] = value
    (export / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError) as refused:
        mtpkit.load(export, threads=1, backend="litert")
    assert str(refused.value) == line
