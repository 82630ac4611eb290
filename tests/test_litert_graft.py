"""Weightless LiteRT conversion and the streamed weight graft (export/backends/litert/graft.py, sources.py) on a toy
module."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")
pytest.importorskip("litert_torch")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from mtpkit.export.recipes import recipe as recipe_named  # noqa: E402
from mtpkit.export.backends.litert import graft as lg  # noqa: E402
from mtpkit.export.backends.litert import sources  # noqa: E402
from mtpkit.export.backends.litert.quantization import encoding_for  # noqa: E402
from mtpkit.runtime.quiet import output_captured  # noqa: E402

pytestmark = pytest.mark.litert


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(100, 64)
        self.up = nn.Linear(64, 128, bias=False)
        self.down = nn.Linear(128, 32, bias=False)
        self.norm = nn.Parameter(torch.randn(128))
        self.unused = nn.Linear(64, 64, bias=False)  # reached by the wrapper, read by no op

    def forward(self, x, ids):
        h = self.up(x + self.table(ids)) * (1 + self.norm)
        return {"y": self.down(h)}


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    import litert_torch

    torch.manual_seed(0)
    module = Toy().eval()
    x, ids = torch.randn(1, 3, 64), torch.tensor([[1, 5, 7]], dtype=torch.int32)
    weights = lg.WeightInputs()
    converter = litert_torch.Converter()
    with weights.converting(), output_captured("litert-torch"):
        converter.signature("toy", module, sample_kwargs={"x": x, "ids": ids})
        skeleton = tmp_path_factory.mktemp("graft") / "skeleton.tflite"
        converter.convert(strict_export=False).export(str(skeleton))
    want = module(x, ids)["y"].detach().numpy()
    return module, skeleton, weights.names, (x.numpy(), ids.numpy()), want


def run(path, inputs):
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=str(path)).get_signature_runner("toy")
    assert set(runner.get_input_details()) == {"x", "ids"}  # no weight is an input any more
    return runner(x=inputs[0], ids=inputs[1])["y"]


def weight_buffers(path):
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(path.read_bytes(), 0)
    return {t.name.decode(): model.buffers[t.buffer] for t in model.subgraphs[0].tensors
            if t.name.decode().startswith(lg.WEIGHT) and not t.name.decode().endswith(";scales")}


def test_the_skeleton_holds_no_weights_and_the_graft_gives_the_module(toy, tmp_path):
    module, skeleton, names, inputs, want = toy
    assert skeleton.stat().st_size < 20_000  # the module's weights alone are 60 kB
    done = lg.graft(skeleton, tmp_path / "float.tflite", sources.StateSource(module.state_dict()),
                    encoding_for(recipe_named("fp32"), "target", 32, 8), names=names)
    assert set(done) == {"table.weight", "up.weight", "down.weight", "norm"}  # "unused" is stored nowhere
    np.testing.assert_allclose(run(tmp_path / "float.tflite", inputs), want, atol=1e-5)
    buffers = weight_buffers(tmp_path / "float.tflite")
    assert all(b.offset > 1 and b.size > 0 for b in buffers.values())  # every weight after the flatbuffer


@pytest.mark.parametrize("recipe,kinds", [("int8", {"table.weight": "int8", "up.weight": "int8"}),
                                          ("int4", {"table.weight": "int4/b64", "down.weight": "int4/b128"}),
                                          ("fp16", {"table.weight": "float16", "up.weight": "float16"})])
def test_a_recipe_regrafted_from_the_float_file_equals_one_grafted_from_the_module(toy, tmp_path, recipe, kinds):
    from ai_edge_litert import schema_py_generated as schema

    module, skeleton, names, inputs, want = toy
    choose = encoding_for(recipe_named(recipe), "target", 128, 8)  # block 128: the 64-wide weights fall back to 64
    float_file, direct, regrafted = tmp_path / "float.tflite", tmp_path / "direct.tflite", tmp_path / "re.tflite"
    lg.graft(skeleton, float_file, sources.StateSource(module.state_dict()),
             encoding_for(recipe_named("fp32"), "target", 32, 8),
             names=names)
    done = lg.graft(skeleton, direct, sources.StateSource(module.state_dict()), choose, names=names)
    model = schema.ModelT.InitFromPackedBuf(lg.read_map(float_file), 0)
    assert lg.graft(float_file, regrafted, sources.GraftedSource(float_file, model), choose) == done
    assert {k: done[k] for k in kinds} == kinds and done["norm"] == "float32"
    np.testing.assert_array_equal(run(regrafted, inputs), run(direct, inputs))
    tol = {"int8": 0.05, "int4": 0.5, "fp16": 0.01}[recipe]
    assert np.abs(run(direct, inputs) - want).max() < tol


def test_safetensors_source_reads_rows_of_bf16_as_float32(tmp_path):
    from safetensors.torch import save_file

    w = torch.randn(7, 5).to(torch.bfloat16)
    save_file({"model.layers.0.w": w, "model.s": torch.ones(())}, str(tmp_path / "model.safetensors"))
    source = sources.SafetensorsSource(tmp_path)
    source.resolve = sources.checkpoint_resolver(source.where)
    assert source.shape("inner.layers.0.w") == (7, 5)
    np.testing.assert_array_equal(source.rows("inner.layers.0.w", 2, 6), w[2:6].float().numpy())
    assert source.rows("s", 0, 1) == 1.0
    with pytest.raises(KeyError, match="no checkpoint tensor"):
        source.shape("layers.1.w")


def test_progress_shows_on_a_terminal_only(monkeypatch, capsys):
    from mtpkit.export import progress as progress_lib

    for tty in (False, True):
        monkeypatch.setattr(progress_lib, "on_terminal", lambda tty=tty: tty)
        with progress_lib.progress(3, "writing x.tflite", "tensors") as advance:
            for _ in range(3):
                advance(1)
        err = capsys.readouterr().err
        assert ("writing x.tflite" in err) is tty


def test_the_export_check_opens_litert_graphs_without_weight_packing(toy, tmp_path):
    """Without weight packing a graph runs TFLite's builtin kernels on the mapped weights (no XNNPACK copy, no
    weight cache), with the same results; the runtime's defaults keep XNNPACK and its cache file."""
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.cpu_options import CpuKernelMode
    from ai_edge_litert.options import Options

    from mtpkit.runtime.backends import LoadOptions
    from mtpkit.runtime.backends import litert as runtime_litert
    from mtpkit.runtime.backends.litert_cache import WeightCache

    module, skeleton, names, inputs, want = toy
    path = tmp_path / "float.tflite"
    lg.graft(skeleton, path, sources.StateSource(module.state_dict()),
             encoding_for(recipe_named("fp32"), "target", 32, 8),
             names=names)
    cache = WeightCache(tmp_path / "c", tmp_path / "c", building=False)
    unpacked = runtime_litert.cpu_options(LoadOptions(pack_weights=False), 1, cache)
    assert unpacked.kernel_mode == CpuKernelMode.BUILTIN and unpacked.xnnpack_weight_cache_path == ""
    packed = runtime_litert.cpu_options(LoadOptions(), 1, cache)
    assert packed.kernel_mode is None and packed.xnnpack_weight_cache_path == str(tmp_path / "c")
    model = CompiledModel.from_file(str(path), options=Options(cpu_options=unpacked))
    feeds = {name: model.create_input_buffer_by_name("toy", name) for name in ("x", "ids")}
    for buffer, value in zip(feeds.values(), inputs):
        buffer.write(np.asarray(value))
    out = {"y": model.create_output_buffer_by_name("toy", "y")}
    model.run_by_name("toy", feeds, out)
    got = out["y"].read(int(np.prod(want.shape)), np.float32).reshape(want.shape)
    np.testing.assert_allclose(got, want, atol=1e-5)
