"""The export's graph check covers every backend's float graphs, and a wrong LiteRT graph fails it."""

from __future__ import annotations

import json
import shutil
import types

import numpy as np
import pytest

pytest.importorskip("litert_torch")
torch = pytest.importorskip("torch")

from conftest import LITERT_VARIANTS  # noqa: E402
from mtpkit.export import pipeline  # noqa: E402
from mtpkit.export.checkpoint import resolve  # noqa: E402
from mtpkit.export.phases import PhaseLog  # noqa: E402
from mtpkit.export.reference import load_pair  # noqa: E402
from mtpkit.export.verify import GraphParityError  # noqa: E402
from mtpkit.runtime.manifest import load_manifest, sha256_file  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.litert]
NAME = LITERT_VARIANTS[0]


def test_graph_parity_lists_the_litert_signatures_beside_the_onnx_ones(litert_exports):
    checks = json.loads((litert_exports(NAME) / "graph_parity.json").read_text())
    by_backend = {kind: {c["signature"] for c in checks if c["backend"] == kind} for kind in ("onnx", "litert")}
    expected = {"prefill", "verify", "decode", "draft[0]", "draft[1]"}
    assert expected <= by_backend["onnx"] and by_backend["litert"] == by_backend["onnx"]
    assert all(c["ok"] for c in checks)


def _scale_largest_float_buffer(path, factor: float) -> None:
    """Multiply the largest float32 weight of a .tflite in place (through flatbuffer views, no re-serialization);
    weights sit after the flatbuffer (buffer offsets), small constants inside it."""
    from ai_edge_litert import schema_py_generated as schema

    data = bytearray(path.read_bytes())
    model = schema.Model.GetRootAsModel(data, 0)
    subgraph = model.Subgraphs(0)

    def span(t) -> tuple[int, int]:
        buf = model.Buffers(t.Buffer())
        if buf.Offset() > 1:
            return buf.Offset(), buf.Size()
        return (buf.DataAsNumpy().ctypes.data - np.frombuffer(data, np.uint8).ctypes.data, buf.DataLength()) \
            if buf.DataLength() else (0, 0)

    weights = [subgraph.Tensors(t) for t in range(subgraph.TensorsLength())]
    start, size = max((span(t) for t in weights if t.Type() == schema.TensorType.FLOAT32), key=lambda s: s[1])
    view = np.frombuffer(memoryview(data)[start:start + size], np.float32)
    view *= np.float32(factor)
    path.write_bytes(data)


def test_a_wrong_litert_graph_fails_the_check(tmp_path, litert_exports, tiny_checkpoints):
    folder = tmp_path / "export"
    shutil.copytree(litert_exports(NAME), folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    graph = manifest["backends"]["litert"]["graphs"]["target"]
    _scale_largest_float_buffer(folder / graph["file"], 1.5)
    graph["sha256"] = sha256_file(folder / graph["file"])  # signed again: only the check can tell
    (folder / "manifest.json").write_text(json.dumps(manifest))
    target_dir, drafter_dir = tiny_checkpoints(NAME)
    target, drafter = load_pair(resolve(str(target_dir), "target"), resolve(str(drafter_dir), "drafter"))
    job = types.SimpleNamespace(target=target, drafter=drafter, folder=folder)
    with pytest.raises(GraphParityError, match=r"litert (prefill|verify|decode)"):
        pipeline._check(load_manifest(folder), job, PhaseLog(total=1))
    failed = [c for c in json.loads((folder / "graph_parity.json").read_text()) if not c["ok"]]
    assert failed and {c["backend"] for c in failed} == {"litert"}
