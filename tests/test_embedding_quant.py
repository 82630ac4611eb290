"""The tied embedding / lm_head table quantized once (MatMulNBits + GatherBlockQuantized on the same bytes), and
the host-side QuantizedTable row lookup: synthetic graphs only, no model export."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from mtpkit.export.backends.onnx.embedding import quantize_shared_table, save_with_table_external  # noqa: E402
from mtpkit.runtime.embedding_table import QuantizedTable  # noqa: E402

T = 5


def _tied_graph(w: np.ndarray, form: str = "transpose") -> onnx.ModelProto:
    v, h = w.shape
    inits = [numpy_helper.from_array(w, "embed_weight")]
    nodes = [helper.make_node("Gather", ["embed_weight", "input_ids"], ["embeds"], name="embed", axis=0)]
    if form == "transpose":
        nodes += [helper.make_node("Transpose", ["embed_weight"], ["w_t"], perm=[1, 0]),
                  helper.make_node("MatMul", ["hidden", "w_t"], ["logits"], name="lm_head")]
    elif form == "gemm":  # Gemm wants 2-D A: flatten [1, T, H] -> [T, H] and back
        inits.append(numpy_helper.from_array(np.array([-1, h], np.int64), "flat"))
        inits.append(numpy_helper.from_array(np.array([1, -1, v], np.int64), "unflat"))
        nodes += [helper.make_node("Reshape", ["hidden", "flat"], ["hidden2d"]),
                  helper.make_node("Gemm", ["hidden2d", "embed_weight"], ["logits2d"], transB=1),
                  helper.make_node("Reshape", ["logits2d", "unflat"], ["logits"])]
    graph = helper.make_graph(
        nodes, "tied",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "T"]),
         helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, "T", h])],
        [helper.make_tensor_value_info("embeds", TensorProto.FLOAT, [1, "T", h]),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "T", v])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


CASES = [(4, 32, 64), (4, 64, 64), (8, 32, 64), (8, 64, 64),
         (4, 32, 96), (8, 32, 96),  # 3 blocks per row
         (4, 64, 96), (8, 64, 96)]  # H not a multiple of the block: padded block + Slice


def _run(path, ids, hidden):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(["embeds", "logits"], {"input_ids": ids, "hidden": hidden})


@pytest.mark.parametrize("accuracy_level", [0, 4])
@pytest.mark.parametrize("bits,block_size,h", CASES)
def test_shared_table(tmp_path, bits, block_size, h, accuracy_level):
    rng = np.random.default_rng(bits * 1000 + block_size + h)
    v = 64
    w = rng.standard_normal((v, h)).astype(np.float32)
    w[3, :block_size] = 0  # an all-zero block: scale 0 must still dequantize to 0
    model, layout = quantize_shared_table(_tied_graph(w), "embed_weight", bits, block_size, accuracy_level)
    assert layout["zero_point"] == (8 if bits == 4 else 128)
    entry = save_with_table_external(model, tmp_path / "target.onnx", layout)

    # (a) W is gone, one copy of the packed data on disk
    saved = onnx.load(str(tmp_path / "target.onnx"), load_external_data=False)
    assert not [t for t in saved.graph.initializer if list(t.dims) == [v, h] and t.data_type == TensorProto.FLOAT]
    assert {n.op_type for n in saved.graph.node} >= {"MatMulNBits", "GatherBlockQuantized"}
    assert "Transpose" not in {n.op_type for n in saved.graph.node}
    n_blocks = -(-h // block_size)
    data_len = v * n_blocks * block_size * bits // 8
    assert entry["data"]["length"] == data_len and entry["scales"]["length"] == v * n_blocks * 4
    assert (tmp_path / "embeddings.bin").stat().st_size == data_len + entry["scales"]["length"]
    external = [t.name for t in saved.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    assert sorted(external) == sorted([layout["initializer_data"], layout["initializer_scales"]])
    assert entry["dtype"] == f"int{bits}" and entry["shape"] == [v, h]

    table = QuantizedTable(entry, tmp_path)
    ids = np.array([list(range(v)) + [3, 0, v - 1]], np.int64)  # every id, plus repeats
    hidden = rng.standard_normal((1, ids.shape[1], h)).astype(np.float32)
    embeds, logits = _run(tmp_path / "target.onnx", ids, hidden)

    # (b) the graph's Gather and the host lookup read the same bytes the same way
    assert embeds.shape == (1, ids.shape[1], h)
    host = table.rows(ids[0])
    np.testing.assert_allclose(embeds[0], host, rtol=0, atol=1e-6)

    # (c) the lm_head multiplies by the same dequantized table
    deq = table.dense()
    ref = hidden[0].astype(np.float64) @ deq.T.astype(np.float64)
    if accuracy_level == 0:
        np.testing.assert_allclose(logits[0], ref, rtol=1e-4, atol=1e-4 * np.sqrt(h))
    else:  # accuracy_level 4 quantizes the activations to int8 per block
        err = np.abs(logits[0] - ref).max()
        assert err <= 0.05 * np.abs(ref).max(), err

    # (d) the dequantized table is within half a step of W, per block
    scales = np.asarray(table.scales, np.float32)
    bound = np.repeat(scales, block_size, axis=1)[:, :h] / 2
    assert np.all(np.abs(deq - w) <= bound * (1 + 1e-5) + 1e-7)
    assert np.all(deq[3, :block_size] == 0)


def test_gemm_form(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    model, layout = quantize_shared_table(_tied_graph(w, "gemm"), "embed_weight", 4, 32, 0)
    entry = save_with_table_external(model, tmp_path / "target.onnx", layout)
    ids = np.array([[1, 2, 63]], np.int64)
    hidden = rng.standard_normal((1, 3, 64)).astype(np.float32)
    embeds, logits = _run(tmp_path / "target.onnx", ids, hidden)
    table = QuantizedTable(entry, tmp_path)
    np.testing.assert_allclose(embeds[0], table.rows(ids[0]), rtol=0, atol=1e-6)
    np.testing.assert_allclose(logits[0], hidden[0] @ table.dense().T, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_tables_are_quantized_a_slab_of_rows_at_a_time_with_the_same_result(tmp_path, dtype):
    """E2B's PLE table (9.4 GB of fp32) is read through a memory map and quantized in slabs: byte-equal to the
    whole-table quantization, since blocks never cross rows."""
    from onnx.external_data_helper import set_external_data

    from mtpkit.export.backends.onnx import embedding as onnx_embedding

    w = np.random.default_rng(0).standard_normal((30, 40)).astype(dtype)
    whole = onnx_embedding.quantize_blockwise(w, 4, 32)
    for got, want in zip(onnx_embedding._quantize_rows(w, 4, 32, rows=7), whole):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    (tmp_path / "t.bin").write_bytes(b"\0" * 16 + w.tobytes())
    tensor = numpy_helper.from_array(w, "table")
    set_external_data(tensor, location="t.bin", offset=16, length=w.nbytes)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    mapped = onnx_embedding._table(tensor, str(tmp_path))
    assert isinstance(mapped, np.memmap) and np.array_equal(mapped, w)


def _lookup_graph(w: np.ndarray) -> onnx.ModelProto:
    """A table read by a Gather alone (the PLE table's, the drafter's centroid table's use)."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "input_ids"], ["embeds"], name="lookup", axis=0)], "lookup",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "T"])],
        [helper.make_tensor_value_info("embeds", TensorProto.FLOAT, [1, "T", w.shape[1]])],
        [numpy_helper.from_array(w, "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("bits,block_size,h", [(4, 32, 64), (8, 32, 64), (4, 64, 96)])
def test_a_lookup_only_table_keeps_float16_scales_and_float32_rows(tmp_path, bits, block_size, h):
    """half_scales: the scales stored in float16, GatherBlockQuantized's float16 rows cast back to float32, each
    row the codes times the float16 scales (to float16's rounding); a table an lm_head also reads is refused."""
    from mtpkit.export.backends.onnx.embedding import dequantize_blockwise

    rng = np.random.default_rng(bits + h)
    w = (0.05 * rng.standard_normal((64, h))).astype(np.float32)
    model, layout = quantize_shared_table(_lookup_graph(w), "table", bits, block_size, 0, half_scales=True)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    scales, packed = inits[layout["initializer_scales"]], inits[layout["initializer_data"]]
    assert scales.dtype == np.float16 and [n.op_type for n in model.graph.node][-2 if h % block_size else -1] == "Cast"
    onnx.save(model, str(tmp_path / "lookup.onnx"))
    ids = np.array([[0, 5, 63, 5]], np.int64)
    rows, = ort.InferenceSession(str(tmp_path / "lookup.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"input_ids": ids})
    assert rows.dtype == np.float32
    want = dequantize_blockwise(packed, scales, bits, block_size, h)[ids[0]]
    np.testing.assert_allclose(rows[0], want, rtol=2 ** -10, atol=1e-7)
    assert np.abs(rows[0] - w[ids[0]]).max() <= np.abs(w).max() / (7 if bits == 4 else 127)  # within a step
    with pytest.raises(ValueError, match="lm_head"):
        quantize_shared_table(_tied_graph(w), "embed_weight", bits, block_size, 0, half_scales=True)
