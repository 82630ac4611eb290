"""The streaming ONNX export (export/backends/onnx/stream.py) and --dtype: graphs traced on fake fp32 weights,
each weight converted only as it is written, the target held in the checkpoint's own dtype."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx_ir")

from torch._subclasses.fake_tensor import FakeTensor  # noqa: E402

from mtpkit.errors import MemoryBudgetError, UsageError  # noqa: E402
from mtpkit.export.backends.onnx import stream as onnx_stream  # noqa: E402


class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(6, 4)
        self.head = torch.nn.Linear(4, 6, bias=False)
        self.head.weight = self.embed.weight  # tied, as Gemma's lm_head
        self.proj = torch.nn.Linear(4, 4, bias=False).to(torch.bfloat16)
        self.register_buffer("scale", torch.tensor(2.0))


def test_fake_weights_fakes_every_parameter_in_fp32_keeps_ties_and_restores():
    module = _Tied()
    before = {name: p for name, p in module.named_parameters(remove_duplicate=False)}
    with onnx_stream.fake_weights(module) as real:
        assert all(isinstance(p, FakeTensor) and p.dtype == torch.float32 for p in module.parameters())
        assert module.head.weight is module.embed.weight  # still one tensor: one initializer
        assert module.proj.weight.dtype == torch.float32  # traced as fp32 whatever the held dtype
        assert not isinstance(module.scale, FakeTensor)  # buffers stay real
        assert set(real) == {"embed.weight", "head.weight", "proj.weight"}
        assert real["proj.weight"].dtype == torch.bfloat16 and not isinstance(real["proj.weight"], FakeTensor)
    after = {name: p for name, p in module.named_parameters(remove_duplicate=False)}
    assert all(after[name] is p for name, p in before.items())


def _matmul_graph(weights: dict[str, torch.Tensor], gathered: str):
    """y_i = x @ W_i^T for every weight, plus a Gather of `gathered` (a tied table): the exporter's patterns."""
    import onnx_ir as ir

    width = next(iter(weights.values())).shape[1]
    x = ir.Value(name="x", shape=ir.Shape([1, width]), type=ir.TensorType(ir.DataType.FLOAT))
    ids = ir.Value(name="ids", shape=ir.Shape([1]), type=ir.TensorType(ir.DataType.INT64))
    inits, nodes, outputs = [], [], []
    for name, w in weights.items():
        value = ir.Value(name=name, shape=ir.Shape(list(w.shape)), type=ir.TensorType(ir.DataType.FLOAT),
                         const_value=ir.tensor(np.zeros(w.shape, np.float32), name=name))
        inits.append(value)
        t = ir.node("Transpose", [value], attributes={"perm": [1, 0]})
        mm = ir.node("MatMul", [x, t.outputs[0]])
        nodes += [t, mm]
        outputs.append(mm.outputs[0])
        if name == gathered:
            g = ir.node("Gather", [value, ids])
            nodes.append(g)
            outputs.append(g.outputs[0])
    graph = ir.Graph([x, ids], outputs, nodes=nodes, initializers=inits, opset_imports={"": 20})
    return ir.Model(graph, ir_version=10)


def test_weight_transposes_fold_lazily_and_the_tied_table_stays_one_copy():
    import onnx_ir as ir

    weights = {"w": torch.arange(12, dtype=torch.bfloat16).view(3, 4), "table": torch.randn(6, 4)}
    model = _matmul_graph(weights, gathered="table")
    assert onnx_stream.bind_lazy(model, weights) == 2
    assert onnx_stream.fold_weight_transposes(model, weights) == 1  # the table also feeds the Gather: kept
    ops = [n.op_type for n in model.graph]
    assert ops.count("Transpose") == 1 and set(model.graph.initializers) == {"table", "w.T"}  # W no longer stored
    folded = model.graph.initializers["w.T"].const_value
    assert isinstance(folded, ir.LazyTensor)  # nothing computed until written
    np.testing.assert_array_equal(folded.numpy(), weights["w"].float().numpy().T)
    assert onnx_stream.initializer_of(model, weights, weights["table"]) == "table"


def test_save_writes_the_table_alone_and_everything_else_to_the_data_file(tmp_path):
    import onnx
    from onnx import numpy_helper

    weights = {"w": torch.randn(300, 4), "table": torch.randn(600, 4).to(torch.bfloat16)}
    model = _matmul_graph(weights, gathered="table")
    onnx_stream.bind_lazy(model, weights)
    onnx_stream.fold_weight_transposes(model, weights)
    entry = onnx_stream.save(model, tmp_path / "g.onnx", "table", "embeddings.bin")
    assert entry == {"file": "embeddings.bin", "offset": 0, "shape": [600, 4], "dtype": "float32",
                     "initializer": "table"}
    table = np.fromfile(tmp_path / "embeddings.bin", np.float32).reshape(600, 4)
    np.testing.assert_array_equal(table, weights["table"].float().numpy())  # bf16 upcast exactly
    loaded = onnx.load(str(tmp_path / "g.onnx"), load_external_data=False)
    locations = {t.name: {e.key: e.value for e in t.external_data}.get("location") for t in loaded.graph.initializer}
    assert locations == {"table": "embeddings.bin", "w.T": "g.onnx.data"}
    w_t = next(t for t in loaded.graph.initializer if t.name == "w.T")
    np.testing.assert_array_equal(numpy_helper.to_array(w_t, base_dir=str(tmp_path)), weights["w"].numpy().T)


def test_unknown_dtype_is_refused_with_a_suggestion():
    from mtpkit.export.config import ExportConfig

    with pytest.raises(UsageError, match="unknown --dtype 'bf61'.*did you mean 'bf16'"):
        ExportConfig(target="t", drafter="d", out="/nonexistent/x", dtype="bf61")


@pytest.fixture(scope="module")
def e2b_wide_bf16(tmp_path_factory):
    """The E2B-configured model reduced to 3 layers and a 512-token vocabulary (E2B's widths: hidden 1536, MLP
    6144/12288, head dims 256/512, PLE 256), its weights stored in bf16 as on the hub, exported with defaults."""
    import mtpkit
    from mtpkit.tiny.make import TinySpec, make_tiny
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("wide")
    target, drafter = make_tiny(root / "ckpt", TinySpec(shape="e2b-wide"))
    for f in target.glob("*.safetensors"):
        state = load_file(str(f))
        save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in state.items()}, str(f),
                  metadata={"format": "pt"})
    return target, drafter, mtpkit.export_pair(target, drafter, root / "out", reference_tokens=3, max_cache_len=256,
                                             dtype="bf16")


def test_e2b_configured_bf16_model_streams_checks_in_fp32_and_holds_bf16(e2b_wide_bf16):
    from safetensors import safe_open

    target, _, out = e2b_wide_bf16
    parity = json.loads((out / "graph_parity.json").read_text())
    assert parity and all(c["ok"] and c["tolerance"] <= 1e-3 for c in parity)  # fp32 tolerances, bf16 weights
    manifest = json.loads((out / "manifest.json").read_text())
    embedding = manifest["backends"]["onnx"]["options"]["embedding"]
    with safe_open(str(next(target.glob("*.safetensors"))), framework="pt") as f:
        key = next(k for k in f.keys() if k.endswith("embed_tokens.weight"))
        table = f.get_tensor(key)
    assert table.dtype == torch.bfloat16 and embedding["dtype"] == "float32"
    stored = np.fromfile(out / embedding["file"], np.float32).reshape(embedding["shape"])
    np.testing.assert_array_equal(stored, table.float().numpy())
    assert manifest["measured"]["preflight"]["dtype"] == "bf16"
    phases = {p["phase"]: p["peak_rss_mb"] for p in manifest["measured"]["phases"]}
    held_mb = sum(p.stat().st_size for p in target.glob("*.safetensors")) / 2**20  # bf16, read lazily from here on
    # the graphs phase adds the bf16 model's pages and the tensors in flight, not the 2.9 fp32 copies of the
    # weights the whole-graph serialization took (docs/export-memory.md)
    assert phases["onnx graphs"] - phases["load"] < held_mb + 0.5 * (2 * held_mb), (phases, held_mb)


def test_e2b_configured_export_is_refused_below_its_estimate(e2b_wide_bf16, tmp_path):
    import mtpkit

    target, drafter, _ = e2b_wide_bf16
    with pytest.raises(MemoryBudgetError, match="this export needs an estimated"):
        mtpkit.export_pair(target, drafter, tmp_path / "refused", memory_budget=0.5)
    assert not (tmp_path / "refused").exists()


@pytest.mark.parametrize("bits", [4, 8])
def test_streamed_quantization_equals_onnxruntimes_quantizer(tmp_path, bits):
    """quantize_matmuls packs each weight from the memory-mapped float data exactly as MatMulNBitsQuantizer
    packs the loaded graph: same initializers (names, dtypes, bytes), same nodes, same outputs."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    from mtpkit.export.backends.onnx import quantization as onnx_backend

    # v: its fp32 weight is external data (1280 B), its packed copy small enough to stay inline (256 / 512 B)
    weights = {"w": torch.randn(96, 40), "v": torch.randn(8, 40), "table": torch.randn(600, 40)}
    model = _matmul_graph(weights, gathered="table")
    onnx_stream.bind_lazy(model, weights)
    onnx_stream.fold_weight_transposes(model, weights)
    onnx_stream.save(model, tmp_path / "g.onnx", "table", "embeddings.bin")
    expected = onnx_backend.ort_matmul_nbits(onnx.load(str(tmp_path / "g.onnx")), bits, 32, 4)
    chosen = onnx_stream.quantize_matmuls(tmp_path / "g.onnx", bits, 32, 4, skip={"table"})
    assert chosen == {"w.T": f"int{bits}/b32", "v.T": f"int{bits}/b32"}
    got = onnx.load(str(tmp_path / "g.onnx"))
    arrays = lambda m: {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}  # noqa: E731
    want, have = arrays(expected), arrays(got)
    assert set(want) == set(have) and all(want[k].dtype == have[k].dtype and np.array_equal(want[k], have[k])
                                          for k in want)
    describe = lambda m: sorted(str((n.op_type, n.name, list(n.input), list(n.output),  # noqa: E731
                                     sorted((a.name, onnx.helper.get_attribute_value(a)) for a in n.attribute)))
                                for n in m.graph.node)
    assert describe(expected) == describe(got)
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 40)).astype(np.float32), "ids": np.array([3])}
    run = lambda m: ort.InferenceSession(m.SerializeToString()).run(None, feeds)  # noqa: E731
    for a, b in zip(run(expected), run(got)):
        np.testing.assert_array_equal(a, b)
    assert not list(tmp_path.glob("*.new"))  # nothing half-written left behind


def test_graph_check_allows_argmax_flips_only_at_near_ties_and_scales_with_pytorchs_own_noise():
    from mtpkit.export import verify

    want = np.array([[0.0, 1.0, 0.99995], [0.0, 2.0, 1.0]], np.float32)
    assert verify._compare("x", want.copy(), want).ok
    tie = want.copy()
    tie[0, 2] += 1e-4  # the graph picks column 2 where the reference's top two are 5e-5 apart
    check = verify._compare("x", tie, want)
    assert check.ok and (check.flips, check.near_ties) == (1, 1) and check.argmax_agree == 0.5
    far = want.copy()
    far[1, 2] += 1.5  # a flip 1.0 below the reference's pick: a wrong graph
    assert not verify._compare("x", far, want).ok
    assert verify._compare("x", far, want, noise=0.5).ok  # unless PyTorch itself moves that much (deep random nets)
    hidden = verify._compare("h", want + 2e-3, want, logits=False, noise=1e-3)
    assert hidden.ok and hidden.tolerance == verify.NOISE_FACTOR * 1e-3


class _Stack(torch.nn.Module):
    """A residual stack of random Linears called like a transformers model, deep enough to amplify rounding."""

    def __init__(self, depth: int, width: int = 64, gain: float = 1.5):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(32, width)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))
        for layer in self.layers:
            torch.nn.init.normal_(layer.weight, std=gain / width ** 0.5)
        self.head = torch.nn.Linear(width, 32)

    def forward(self, ids, output_hidden_states=True, use_cache=False):
        from types import SimpleNamespace

        x = self.embed(ids)
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
        return SimpleNamespace(logits=self.head(x), hidden_states=[x])


def test_reference_noise_is_seeded_jitter_amplified_by_depth_and_leaves_no_hooks():
    from mtpkit.export import verify

    def noise(model):
        with torch.no_grad():
            out = model(torch.tensor([list(range(20))]))
        return verify._reference_noise(model, list(range(20)), out.logits[0].numpy(), out.hidden_states[-1][0].numpy())

    shallow, deep = _Stack(2), _Stack(48)
    assert noise(deep) == noise(deep)  # seeded: the same export checks against the same tolerance
    assert 0 < noise(shallow)[0] < verify.ATOL / verify.NOISE_FACTOR  # small models keep the fixed 1e-4
    assert noise(deep)[0] > 10 * noise(shallow)[0] and noise(deep)[1] > 10 * noise(shallow)[1]
    assert not any(m._forward_hooks for m in deep.modules())
