"""Reproducible exports (export/reproduce.py): a second export of the same checkpoints and flags, made in another
process, is byte-identical on both backends, model.litertlm included, with a manifest equal outside `measured`;
`mtpkit export --verify DIR` reports MATCH on it and names a file that was changed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ai_edge_litert")
pytest.importorskip("litert_torch")

from mtpkit import cli  # noqa: E402
from mtpkit.export import reproduce  # noqa: E402
from mtpkit.export.scoped import (LITERTLM_TIME, gemma4_layer_types_in_order, insertion_ordered_sets,  # noqa: E402
                                  litertlm_identity)

pytestmark = [pytest.mark.slow, pytest.mark.litert]
PAIR = "e2b_gemma4_centroid"
# `mtpkit export --verify DIR ...` in a child process that also keeps the re-export (argv[2]), so the test compares it
# with DIR on its own instead of trusting verify's comparison
VERIFY_AND_KEEP = """
import shutil, sys
from mtpkit import cli
from mtpkit.export import reproduce
compare = reproduce.first_difference
def kept(folder, other):
    shutil.copytree(other, sys.argv[2])
    return compare(folder, other)
reproduce.first_difference = kept
sys.exit(cli.main(["-q", "export", "--verify", sys.argv[1]]))
"""


@pytest.fixture(scope="module")
def int4_export(tmp_path_factory, tiny_checkpoints):
    """Both backends under the calibrated int4 recipe: a small export (short reference, no graph check; the gates
    are meaningless on random logits), made in a process whose string hashing is fixed at seed 0."""
    target, drafter = tiny_checkpoints(PAIR)
    out = tmp_path_factory.mktemp("repro") / "int4"
    done = subprocess.run([sys.executable, "-m", "mtpkit", "-q", "export", str(target), "--drafter", str(drafter),
                           "--out", str(out), "--backend", "onnx,litert", "--quant", "int4", "--no-quality-gate",
                           "--no-check", "--reference-tokens", "4", "--max-cache-len", "128", "--prefill-len", "16",
                           "--max-draft", "3"], capture_output=True, text=True, timeout=1500,
                          env={**os.environ, "PYTHONHASHSEED": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture
def export(int4_export):
    """The int4 export: its graphs are derived from its float conversion, so its bytes hold that step too (an fp32
    case would re-export for 2.4 minutes and check nothing more)."""
    return Path(int4_export)


def _files(folder: Path) -> list[str]:
    """What the export wrote: LiteRT-LM's weight caches, which other tests' runs leave beside the shared export,
    are not part of it (verify ignores them too)."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and not p.name.endswith(reproduce.RUNTIME_CACHES))


def assert_identical(folder: Path, other: Path) -> None:
    """Every file byte for byte, manifest.json outside its measured section (which both have)."""
    assert _files(folder) == _files(other)
    for name in _files(folder):
        if name == "manifest.json":
            mine, theirs = (json.loads((f / name).read_text()) for f in (folder, other))
            assert mine.pop("measured")["phases"] and theirs.pop("measured")["phases"]
            assert mine == theirs
        else:
            assert (folder / name).read_bytes() == (other / name).read_bytes(), name


def test_a_second_export_in_another_process_is_byte_identical_and_verify_says_match(export, tmp_path):
    """The re-export runs with string hashing at seed 1 (the int4 export had 0; the fixture's process a random one):
    whatever a set of strings orders would differ."""
    kept = tmp_path / "re-export"
    done = subprocess.run([sys.executable, "-c", VERIFY_AND_KEEP, str(export), str(kept)], capture_output=True,
                          text=True, timeout=1500, env={**os.environ, "PYTHONHASHSEED": "1"})
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.startswith(f"MATCH {export}: every file is byte-identical"), done.stdout
    assert {"model.litertlm", "target.tflite", "target.onnx", "reference.npz"} <= set(_files(export))
    assert_identical(export, kept)
    assert not [p for p in export.parent.iterdir() if p.name.startswith(f".{export.name}.verify-")]


def test_the_manifest_records_flags_and_versions_apart_from_what_was_measured(litert_exports):
    from mtpkit.runtime.manifest import load_manifest

    folder = Path(litert_exports(PAIR))
    manifest = json.loads((folder / "manifest.json").read_text())
    flags, versions = manifest["export"]["flags"], manifest["export"]["versions"]
    assert {k: flags[k] for k in ("backend", "quant", "max_cache_len", "prefill_len", "max_draft")} == {
        "backend": ["onnx", "litert"], "quant": "fp32", "max_cache_len": 256, "prefill_len": 16, "max_draft": 8}
    assert "out" not in flags and "force" not in flags and "workdir" not in manifest["export"]  # absolute paths
    assert {"mtpkit", "torch", "transformers", "onnx", "onnxruntime", "litert-torch", "ai-edge-litert",
            "ai-edge-quantizer", "litert-lm-builder"} <= set(versions) and all(versions.values())
    measured = manifest["measured"]
    assert measured["phases"][0]["phase"] == "load" and measured["preflight"] and measured["started"]
    assert load_manifest(folder).measured == measured and load_manifest(folder).export == manifest["export"]


def test_the_bundle_header_is_named_by_its_sections_and_litert_lm_loads_it(litert_exports, tmp_path):
    import litert_lm
    from ai_edge_quantizer.utils import litertlm_utils

    from mtpkit.export.backends.litert.bundle import BUNDLE_SECTIONS, rebuild_bundle

    folder = Path(litert_exports(PAIR))
    header = litertlm_utils.LiteRTLMFile(folder / "model.litertlm").get_system_metadata()
    assert header["creation_timestamp"] == LITERTLM_TIME and len(header["uuid"]) == 36
    assert litert_lm.ModelInfo(str(folder / "model.litertlm")).llm.has_speculative_decoding_support()
    copy = Path(shutil.copytree(folder, tmp_path / "copy"))
    drafter = bytearray((copy / "drafter.tflite").read_bytes())
    drafter[-1] ^= 0xFF  # a changed section: the rebuilt bundle gets another uuid, as a drawn one would be
    (copy / "drafter.tflite").write_bytes(bytes(drafter))
    rebuild_bundle(copy / "model.litertlm", {s: copy / f"{n}.tflite" for n, s in BUNDLE_SECTIONS.items()})
    assert litertlm_utils.LiteRTLMFile(copy / "model.litertlm").get_system_metadata()["uuid"] != header["uuid"]


def test_the_litertlm_identity_patch_is_scoped_and_still_needed():
    """litert-lm-builder 0.18.1 draws the header's uuid and time (populate_system_metadata): when it stops, this
    test fails and the patch can go. The patch fixes both, keeps the other entries and is undone, also on error."""
    from litert_lm_builder import litertlm_builder as builder

    drawn = builder.populate_system_metadata
    authors = builder.Metadata("Authors", "ODML", builder.DType.STRING)
    first, second = ({m.key: m.value for m in builder.populate_system_metadata([authors])} for _ in range(2))
    assert first["uuid"] != second["uuid"]
    with litertlm_identity("0000-uuid"):
        fixed = {m.key: m.value for m in builder.populate_system_metadata([authors])}
    assert fixed == {"Authors": "ODML", "uuid": "0000-uuid", "creation_timestamp": LITERTLM_TIME}
    assert builder.populate_system_metadata is drawn
    with pytest.raises(RuntimeError), litertlm_identity("1111-uuid"):
        raise RuntimeError
    assert builder.populate_system_metadata is drawn


def test_the_fixed_order_patches_change_only_the_order_and_are_undone():
    """Sets of strings iterate in an order that changes from process to process: inside the patches a module's
    set() and Gemma 4's layer types keep their insertion / config order; the model computes exactly what it did."""
    import inspect
    import types

    import torch
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextModel

    from mtpkit.export.backends.litert.patches import import_export_hf

    import_export_hf()  # litert-torch's export modules import only under its tensorflow alias (B1)
    from litert_torch.generative.export_hf.core import litert_lm_builder

    assert "stop_tokens = set()" in inspect.getsource(litert_lm_builder)  # litert-torch 0.10.0: still a set
    module = types.ModuleType("collector")
    exec("def collect(items):\n    s = set()\n    for x in items:\n        s.add(x)\n    return list(s)", vars(module))
    words = [f"w{i}" for i in range(30, 0, -1)]
    with insertion_ordered_sets(module):
        assert module.collect(words + words) == words
    assert "set" not in vars(module) and sorted(module.collect(words)) == sorted(words)

    cfg = Gemma4TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=16,
                           layer_types=["sliding_attention", "full_attention"], sliding_window=4,
                           hidden_size_per_layer_input=0, num_kv_shared_layers=0)
    torch.manual_seed(0)
    before = Gemma4TextModel(cfg).eval()
    ids = torch.tensor([[1, 5, 9, 3, 7, 2]])
    with torch.no_grad(), gemma4_layer_types_in_order():
        inside = Gemma4TextModel(cfg)
        assert before.unique_layer_types == inside.unique_layer_types == ("sliding_attention", "full_attention")
        patched_out = before(ids).last_hidden_state
    assert isinstance(before.unique_layer_types, set) and inside.unique_layer_types == set(cfg.layer_types)
    assert "unique_layer_types" not in vars(Gemma4TextModel)
    with torch.no_grad():
        torch.testing.assert_close(patched_out, before(ids).last_hidden_state, rtol=0, atol=1e-5)


def test_first_difference_names_the_file_and_where(litert_exports, tmp_path):
    folder = Path(litert_exports(PAIR))
    copy = Path(shutil.copytree(folder, tmp_path / "copy"))
    assert reproduce.first_difference(folder, copy) is None
    (copy / "model.litertlm_1_2.mtp_drafter.xnnpack_cache").write_bytes(b"x")  # LiteRT-LM's, written beside it
    assert reproduce.first_difference(copy, folder) is None
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["measured"]["seconds"] += 100  # measured: never compared
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert reproduce.first_difference(folder, copy) is None
    manifest["quantization"]["block_size"] = 64
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert reproduce.first_difference(folder, copy) == "manifest.json (`quantization.block_size` differs)"
    parity = bytearray((copy / "graph_parity.json").read_bytes())  # hashed nowhere: only a comparison sees it
    parity[10] ^= 1
    (copy / "graph_parity.json").write_bytes(bytes(parity))
    assert reproduce.first_difference(folder, copy) == "graph_parity.json (first difference at byte 10)"
    (copy / "extra.txt").write_text("x")
    assert reproduce.first_difference(copy, folder) == "extra.txt (not in the re-export)"


def test_verify_names_a_changed_file_without_re_exporting(litert_exports, tmp_path, capsys):
    copy = Path(shutil.copytree(litert_exports(PAIR), tmp_path / "copy"))
    bundle = bytearray((copy / "model.litertlm").read_bytes())
    bundle[-1] ^= 0xFF
    (copy / "model.litertlm").write_bytes(bytes(bundle))
    assert cli.main(["-q", "export", "--verify", str(copy)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"MISMATCH {copy}: model.litertlm (its sha256 is not the one in manifest.json; not re-exported)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]
