"""Pre-quantized (QAT) checkpoints: each format read back to the writer's own codes and scales, PyTorch on the read
model equal to transformers on the QAT checkpoint, hostile files refused in one line, and an export with the default
flags that keeps the lattice: every graph weight's codes and scales equal to the checkpoint's, parity with the
checkpoint's transformers reference."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from mtpkit.errors import CheckpointError, UsageError

FORMATS = ("gemma", "compressed-tensors", "q4_0")


@pytest.fixture(scope="session")
def qat_pairs(tmp_path_factory, tiny_checkpoints):
    """fmt -> (target, drafter) QAT pair of the e2b_text_kv_eq tiny pair (mobile widths, static activations)."""
    from mtpkit.tiny.qat import write_pair

    root, cache = tmp_path_factory.mktemp("qat"), {}

    def get(fmt: str):
        if fmt not in cache:
            cache[fmt] = write_pair(*tiny_checkpoints("e2b_text_kv_eq"), root / fmt, fmt)
        return cache[fmt]

    return get


def _load(folder):
    from mtpkit.export.checkpoint import resolve
    from mtpkit.export.models import gemma4_text

    return gemma4_text.load(resolve(str(folder), "target"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_reader_returns_the_writers_codes_and_scales(qat_pairs, fmt):
    from mtpkit.tiny.qat import mobile_bits, snap

    target, _ = qat_pairs(fmt)
    model = _load(target)
    lattice = model.lattice
    assert lattice is not None and lattice.format == fmt
    down = lattice.weights["layers.9.mlp.down_proj"]  # a KV-shared layer's MLP: 2 bits (4 in Q4_0)
    assert down.bits == (4 if fmt == "q4_0" else 2)
    if fmt != "q4_0":
        assert lattice.weights["layers.0.mlp.up_proj"].bits == 4
        assert lattice.weights["layers.0.per_layer_projection"].bits == 8
        assert any(a[0] > 0 and a[1] > 0 for a in lattice.activations.values())  # static activation scales
        assert mobile_bits(json.loads((target / "config.json").read_text()))  # the widths the writer used
    w = model.model.layers[0].mlp.gate_proj.weight.detach().numpy()
    mine = lattice.weights["layers.0.mlp.gate_proj"]
    exact = slice(1, None) if fmt == "q4_0" else slice(None)  # Q4_0: row 0 holds the blocks left off the lattice
    np.testing.assert_array_equal(mine.dequantized()[exact], w[exact])  # the model computes the lattice's values
    if fmt != "q4_0":
        codes, scales = snap(torch.from_numpy(mine.dequantized()), mine.bits)
        np.testing.assert_array_equal(codes.numpy(), mine.codes)
    else:
        assert sum(off for off, _ in lattice.off_lattice.values()) == 3  # counted, re-encoded
        assert lattice.off_lattice["layers.0.mlp.gate_proj"] == (2, mine.scales.size)
        assert not np.array_equal(mine.dequantized()[0], w[0])


@pytest.mark.parametrize("fmt", ("gemma", "q4_0"))
def test_read_model_computes_what_transformers_computes_on_the_checkpoint(qat_pairs, fmt):
    """transformers loads the gemma layout with its own GemmaQuantizer (apply_srq included) and Q4_0 as bf16."""
    from transformers import AutoModelForCausalLM

    target, _ = qat_pairs(fmt)
    ours = _load(target)
    theirs = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    ids = torch.tensor([[2, *range(10, 300, 9)]])
    with torch.no_grad():
        diff = (ours(ids).logits - theirs(ids).logits).abs().max().item()
    assert diff <= 1e-4, diff  # the fp32 graph check's tolerance: eager vs sdpa attention


def test_compressed_tensors_reads_the_same_lattice_as_gemma(qat_pairs):
    """The same snapped linear weights written in both layouts read back the same codes and scales (the
    compressed-tensors layout keeps the tables float, so its activation scales are measured on another model)."""
    a, b = _load(qat_pairs("gemma")[0]).lattice, _load(qat_pairs("compressed-tensors")[0]).lattice
    linear = [k for k in a.weights if "embed" not in k]
    assert sorted(linear) == sorted(b.weights) and len(linear) > 40
    for k in linear:
        np.testing.assert_array_equal(a.weights[k].codes, b.weights[k].codes, err_msg=k)
        np.testing.assert_array_equal(a.weights[k].scales, b.weights[k].scales, err_msg=k)
        assert (a.activations[k][0] > 0) == (b.activations[k][0] > 0), k  # measured on each layout's own model


def _edit(src, dst, change_config=None, change_state=None):
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    if change_config:
        cfg = json.loads((dst / "config.json").read_text())
        change_config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    if change_state:
        state = load_file(str(dst / "model.safetensors"))
        change_state(state)
        save_file(state, str(dst / "model.safetensors"))
    return dst


def test_hostile_checkpoints_are_refused_in_one_line(qat_pairs, tmp_path):
    target, _ = qat_pairs("gemma")
    key = "model.layers.0.mlp.down_proj"
    cases = {
        "truncated": (None, lambda s: s.__setitem__(key + ".weight", s[key + ".weight"][:, :-1].contiguous()),
                      f"{key}.weight is uint8"),
        "scales": (None, lambda s: s.__setitem__(key + ".weight_scale", s[key + ".weight_scale"][:-2].contiguous()),
                   f"{key}.weight_scale has shape"),
        "bits": (lambda c: c["quantization_config"].__setitem__("num_bits", 3), None, "3 bits are not supported"),
        "method": (lambda c: c["quantization_config"].__setitem__("quant_method", "awq"), None,
                   "quant_method 'awq' is not supported"),
    }
    for name, (config, state, message) in cases.items():
        folder = _edit(target, tmp_path / name, config, state)
        with pytest.raises(CheckpointError) as e:
            _load(folder)
        assert message in str(e.value) and "\n" not in str(e.value), (name, str(e.value))
        assert "config expects" not in str(e.value)


def test_default_quant_adapts_and_checkpoint_on_a_float_target_is_refused(qat_pairs, tiny_checkpoints, tmp_path):
    from mtpkit.export.config import ExportConfig
    from mtpkit.export.pipeline import prepare

    target, drafter = qat_pairs("gemma")
    assert ExportConfig(str(target), str(drafter), tmp_path / "a").quant == "checkpoint"
    float_target, float_drafter = tiny_checkpoints("e2b_text_kv_eq")
    assert ExportConfig(str(float_target), str(float_drafter), tmp_path / "b").quant == "fp32"
    assert ExportConfig(str(target), str(drafter), tmp_path / "d", backend="litert").quant == "checkpoint"
    with pytest.raises(UsageError, match="is a float checkpoint"):
        prepare(ExportConfig(str(float_target), str(float_drafter), tmp_path / "c", quant="checkpoint"))


@pytest.fixture(scope="module", params=FORMATS)
def qat_export(request, tmp_path_factory):
    """The shipped trained pair snapped, per format: the target to mobile widths (gemma, compressed-tensors) or Q4_0
    (weights only: static activation scales turn float reordering into whole int8 steps, so token parity is held on
    the weight lattice and the rounding is held in PyTorch above), the drafter to a Q4_0 lattice (Google's QAT
    assistants' format), exported with default flags to both backends: one export per format, shared by the tests
    below."""
    from pathlib import Path

    import mtpkit
    from mtpkit.tiny.qat import write_pair

    root = tmp_path_factory.mktemp(f"qat_export_{request.param}")
    shipped = Path(mtpkit.__file__).parent / "tiny" / "assets" / "tiny_pair"
    # the compressed-tensors target carries static activation scales; the others are weight-only lattices
    target, drafter = write_pair(shipped / "target", shipped / "drafter", root / "pair", request.param,
                                 drafter_fmt="q4_0", srq=request.param == "compressed-tensors")
    asked = {"quant": "checkpoint"} if request.param == "q4_0" else {}  # a Q4_0 lattice is not in the config
    out = mtpkit.export_pair(target, drafter, root / "out", backend="onnx,litert", reference_tokens=12,
                             max_cache_len=128, **asked)
    return target, out, request.param


def _onnx_codes(path):
    """weight name -> (codes, per-input-channel scales) of every MatMulNBits of an .onnx graph, decoded."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path))
    inits = {t.name: numpy_helper.to_array(t) for t in graph.graph.initializer}
    found = {}
    for node in (n for n in graph.graph.node if n.op_type == "MatMulNBits"):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        packed, scales, bits = inits[node.input[1]], inits[node.input[2]], attrs["bits"]
        u = np.stack([(packed >> (bits * i)) & ((1 << bits) - 1) for i in range(8 // bits)], -1).reshape(len(packed), -1)
        codes = u.astype(np.int16)[:, :attrs["K"]] - (1 << (bits - 1))
        found[node.input[1].rsplit("_Q", 1)[0]] = (codes, np.repeat(scales, attrs["block_size"], 1)[:, :attrs["K"]])
    return found


def _litert_codes(path, lattice=None):
    """weight name -> (codes, per-input-channel scales) of every quantized weight of a .tflite, decoded."""
    from ai_edge_litert import schema_py_generated as schema

    raw = path.read_bytes()
    model = schema.ModelT.InitFromPackedBuf(raw, 0)
    found, types = {}, {schema.TensorType.INT8: 8, schema.TensorType.INT4: 4, schema.TensorType.INT2: 2}
    for sg in model.subgraphs:
        for t in sg.tensors:
            name = t.name.decode()
            if not name.startswith("w:") or t.type not in types or name.endswith(";scales") or name in found:
                continue
            bits, buf = types[t.type], model.buffers[t.buffer]
            data = np.frombuffer(raw, np.uint8, count=buf.size, offset=buf.offset)
            rows, width = (int(v) for v in t.shape)
            u = np.stack([(data >> (bits * i)) & ((1 << bits) - 1) for i in range(8 // bits)], -1).reshape(-1)
            codes = u[:rows * width].astype(np.int16).reshape(rows, width)
            codes = np.where(codes >= 1 << (bits - 1), codes - (1 << bits), codes)
            q = t.quantization
            if q.details is not None:  # blockwise int4: float16 scales in their own tensor
                st = sg.tensors[q.details.scales]
                sb = model.buffers[st.buffer]
                per_block = np.frombuffer(raw, np.float16, count=sb.size // 2, offset=sb.offset).reshape(rows, -1)
                scales = np.repeat(per_block.astype(np.float32), q.details.blockSize, 1)
            else:
                scales = np.repeat(np.asarray(q.scale, np.float32)[:, None], width, 1)
            found[name] = (codes, scales)
    if lattice is not None:
        found.update(_packed_tables(raw, model, lattice))
    return found


def _packed_tables(raw, model, lattice):
    """The embedders' packed tables (uint8 bytes, code + 2^(bits-1), the first value lowest; float32 scales in
    the tensor beside): table name -> (codes, per-column scales), decoded with the checkpoint's bits and width."""
    from ai_edge_litert import schema_py_generated as schema

    tensors = {t.name.decode(): t for sg in model.subgraphs for t in sg.tensors}
    found = {}
    for name, t in tensors.items():
        if not name.endswith(".embedding_quantized") or t.type != schema.TensorType.UINT8:
            continue
        table = name.replace(".embedding_quantized", ".weight")
        bits, width = lattice.weight(table).bits, lattice.weight(table).shape[1]
        buf, sb = model.buffers[t.buffer], model.buffers[tensors[name.replace("_quantized", "_scale")].buffer]
        rows = int(t.shape[0])
        data = np.frombuffer(raw, np.uint8, count=buf.size, offset=buf.offset).reshape(rows, -1)
        scales = np.frombuffer(raw, np.float32, count=sb.size // 4, offset=sb.offset).reshape(rows, -1)
        u = np.stack([(data >> (bits * i)) & ((1 << bits) - 1) for i in range(8 // bits)], -1).reshape(rows, -1)
        found[table] = (u[:, :width].astype(np.int16) - (1 << (bits - 1)),
                        np.repeat(scales, width // scales.shape[1], 1))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["onnx", "litert"])
def test_every_graph_weight_holds_the_checkpoints_codes_and_scales(qat_export, backend):
    """Default flags keep the lattice of both sides (the gemma-layout target, the Q4_0 drafter): each of the
    checkpoints' weights decodes from the graphs to exactly its codes and scales, and the manifest records each."""
    from mtpkit.export.checkpoint import resolve
    from mtpkit.export.lattice import key
    from mtpkit.export.models import gemma4_assistant

    target, out, _ = qat_export
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["quantization"]["recipe"] == "checkpoint"
    assert manifest["quantization"]["drafter_recipe"] == "checkpoint"
    files = manifest["backends"][backend]["graphs"]
    sides = {"target": (_load(target).lattice, ("target", "per_layer_embedder")),
             "drafter": (gemma4_assistant.load(resolve(str(target.parent / "drafter"), "drafter")).lattice,
                         ("drafter",))}
    for side, (lattice, graphs) in sides.items():
        found = {}
        for g in graphs if backend == "litert" else graphs[:1]:
            path = out / files[g]["file"]
            found.update(_onnx_codes(path) if backend == "onnx" else _litert_codes(path, lattice))
        checked = set()
        for name, (codes, scales) in found.items():
            weight = lattice.weight(name)
            if weight is None:
                continue
            np.testing.assert_array_equal(codes, weight.codes, err_msg=name)
            np.testing.assert_array_equal(scales, np.repeat(weight.scales, weight.group, axis=1), err_msg=name)
            checked.add(key(name))
        expected = {k for k in lattice.weights if backend == "litert" or "embed" not in k}
        assert expected and expected <= checked, (side, sorted(expected - checked)[:5])
        recorded = manifest["backends"][backend]["options"]["quantization"][side]["tensors"]
        assert sum("checkpoint" in v for v in recorded.values()) >= len([k for k in expected if "embed" not in k])


@pytest.mark.slow
def test_checkpoint_export_gives_transformers_tokens(qat_export):
    """ONNX: greedy tokens, plain and speculative, equal the reference transformers recorded on the QAT checkpoint
    (the read model equals transformers' own on it: test above), and the graphs equal the PyTorch model to float
    noise (the export's fidelity figures). LiteRT with static activation scales: the same, its int8 kernels at the
    checkpoint's scales (static_int8.py). LiteRT on a weight-only lattice quantizes activations at run time: held
    to its speculative tokens equal to its plain ones, and to teacher-forced top-1 0.95 against transformers."""
    from mtpkit.runtime.parity import run_parity

    out, fmt = qat_export[1], qat_export[2]
    static = fmt == "compressed-tensors"
    report = run_parity(out, backend="onnx")
    assert report["ok"], [r for r in report["results"] if not r["ok"]][:3]
    if static:  # every token; the drafter (a weight-only Q4_0 lattice) proposes through dynamic-range kernels
        results = run_parity(out, backend="litert")["results"]
        tokens = [r for r in results if r["name"].endswith("== transformers greedy")]
        assert tokens and all(r["ok"] for r in tokens), [r for r in tokens if not r["ok"]][:3]
    figures = json.loads((out / "quant_fidelity.json").read_text())
    onnx, litert = figures["onnx"]["teacher_forced"], figures["litert"]["teacher_forced"]
    # Q4_0: the 3 blocks left off the lattice are re-encoded, so those weights differ from the checkpoint's floats
    # static activation scales: another summation order moves a few values across a rounding boundary (0.21 here)
    bound = {"q4_0": 0.05, "compressed-tensors": 1.0}.get(fmt, 1e-3)
    assert onnx["top1_agreement"] == 1.0 and onnx["max_abs_logit"] < bound, onnx
    # LiteRT's int8 kernels round at the static scales exactly as PyTorch does (6.7e-6 here); without static
    # scales they quantize activations at run time
    assert litert["top1_agreement"] == 1.0 and litert["max_abs_logit"] < 1e-3 if static else \
        litert["top1_agreement"] >= 0.95, litert
    from mtpkit.runtime.engine import Engine, GenConfig

    engine = Engine(out, backend="litert")
    for prompt in json.loads((out / "reference.json").read_text())["prompts"]:
        ids = prompt["prompt_ids"]
        plain = [t for t, _ in engine.generate(ids, GenConfig(max_new_tokens=12, mtp=False))]
        spec = [t for t, _ in engine.generate(ids, GenConfig(max_new_tokens=12, num_assistant_tokens=3))]
        assert spec == plain, prompt["name"]


@pytest.mark.slow
def test_static_activation_scales_round_in_every_graph(qat_export):
    """Each linear layer with static activation scales rounds its input and its output in the ONNX target graph
    and in LiteRT's decode signature, every layer that the graph computes; a weight-only lattice rounds nothing.
    Both exporters compute some layers outside their modules (the fused attention's reordered query and output
    projections, litert-torch's wrapped modules), where the rounding was once lost."""
    import onnx
    from ai_edge_litert import schema_py_generated as schema

    from mtpkit.export.lattice import key

    target, out, fmt = qat_export
    scaled = {k for k, scales in _load(target).lattice.activations.items() if all(scales)}
    assert bool(scaled) == (fmt == "compressed-tensors")
    files = json.loads((out / "manifest.json").read_text())["backends"]
    graph = onnx.load(str(out / files["onnx"]["graphs"]["target"]["file"]), load_external_data=False).graph
    nodes = [(n.op_type.upper(), list(n.input), list(n.output)) for n in graph.node]
    onnx_layers = _rounded_layers(nodes, ("MATMUL", "MATMULNBITS"), lambda name: key(name.rsplit("_Q", 1)[0]))
    model = schema.ModelT.InitFromPackedBuf((out / files["litert"]["graphs"]["target"]["file"]).read_bytes(), 0)
    ops = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    decode = next(sg for sg in model.subgraphs if sg.name == b"decode")
    # LiteRT's activation names repeat: tensors by index, weights by name
    nodes = [(ops[model.operatorCodes[o.opcodeIndex].builtinCode], list(o.inputs), list(o.outputs))
             for o in decode.operators]
    litert_layers = _rounded_layers(nodes, ("FULLY_CONNECTED",), lambda i: key(decode.tensors[i].name.decode()))
    for layers in (onnx_layers, litert_layers):
        assert layers and bool(set(layers) & scaled) == bool(scaled)
        rounded = {k for k, both in layers.items() if both}
        assert rounded == set(layers) & scaled, sorted(rounded ^ (set(layers) & scaled))[:4]
    # LiteRT computes each of them with int8 activations at its scales (static_int8.py), in every signature
    static = {k for k, ops_around in _int8_layers(nodes, decode).items() if ops_around == ("QUANTIZE", "DEQUANTIZE")}
    assert static == set(litert_layers) & scaled, sorted(static ^ (set(litert_layers) & scaled))[:4]
    everywhere = sum(len(_int8_layers([(ops[model.operatorCodes[o.opcodeIndex].builtinCode], list(o.inputs),
                                        list(o.outputs)) for o in sg.operators], sg)) for sg in model.subgraphs)
    recorded = files["litert"]["options"]["quantization"]["target"]
    assert recorded.get("static_int8", 0) == everywhere and bool(everywhere) == bool(scaled)


def _int8_layers(nodes: list, sg) -> dict[str, tuple[str, str]]:
    """weight key -> (the op making its input, the op reading its output) of each FULLY_CONNECTED with an int8
    input in LiteRT subgraph `sg`, given as (op, inputs, outputs)."""
    from ai_edge_litert import schema_py_generated as schema

    from mtpkit.export.lattice import key

    made = {o: op for op, ins, outs in nodes for o in outs}
    read = {i: op for op, ins, outs in nodes for i in ins}
    return {key(sg.tensors[ins[1]].name.decode()): (made.get(ins[0]), read.get(outs[0])) for op, ins, outs in nodes
            if op == "FULLY_CONNECTED" and sg.tensors[ins[0]].type == schema.TensorType.INT8}


def _rounded_layers(nodes: list, matmuls: tuple, key_of) -> dict[str, bool]:
    """weight key -> whether the layer's input comes out of a ROUND (through the clamp and the rescale) and its
    output goes into one (through the division by its scale), in a graph given as (op, inputs, outputs)."""
    made = {o: (op, ins) for op, ins, outs in nodes for o in outs}
    used: dict[str, list] = {}
    for op, ins, outs in nodes:
        for i in ins:
            used.setdefault(i, []).append((op, outs))

    def before(name, depth=6):
        op, ins = made.get(name, (None, []))
        return op == "ROUND" or (depth > 0 and op in ("MUL", "CLIP", "MINIMUM", "MAXIMUM", "RESHAPE", "QUANTIZE")
                                 and before(ins[0], depth - 1))

    def after(name, depth=3):
        return any(op == "ROUND" or (depth > 0 and op in ("DIV", "MUL", "DEQUANTIZE") and any(after(o, depth - 1)
                                                                                             for o in outs))
                   for op, outs in used.get(name, []))

    return {key_of(ins[1]): before(ins[0]) and after(outs[0]) for op, ins, outs in nodes if op in matmuls}


@pytest.mark.slow
def test_litertlm_gives_the_same_tokens_with_speculation_on_and_off(qat_export, capfd):
    from conftest import litertlm_texts
    from mtpkit.runtime.manifest import load_manifest

    out = qat_export[1]
    bundle = out / load_manifest(out).backend("litert").graphs["bundle"].file
    texts = litertlm_texts(str(bundle), 12, capfd)
    assert texts[False]
    # LiteRT-LM 0.18.1 may emit one token past max_output_tokens with speculation (it commits whole rounds)
    assert texts[True].startswith(texts[False])


@pytest.mark.slow
def test_dry_run_plans_the_checkpoint_export(qat_export, tmp_path):
    """`--dry-run` reads the lattice from the headers (packed tensors as the weights they hold, their widths and
    scale groups): every file within 3% of what the export wrote. The Q4_0 drafter's table stays float on both."""
    from conftest import planned_and_written

    sizes, _ = planned_and_written(qat_export[1], "checkpoint", tmp_path / "dry")
    off = {name: (planned, written) for name, (planned, written) in sizes.items()
           if abs(planned - written) > 0.03 * written}
    assert not off, off


def test_preflight_counts_a_pre_quantized_target_as_it_loads(qat_pairs, tiny_checkpoints):
    """The memory preflight reads a packed checkpoint's weights at their float shapes and in its float tensors'
    dtype (what --dtype auto holds them in): the same count as the float checkpoint it was snapped from."""
    from mtpkit.export import preflight
    from mtpkit.export.checkpoint import resolve

    packed = preflight.read_weights(*(resolve(str(p), s) for p, s in zip(qat_pairs("gemma"), ("target", "drafter"))))
    plain = preflight.read_weights(*(resolve(str(p), s) for p, s in
                                     zip(tiny_checkpoints("e2b_text_kv_eq"), ("target", "drafter"))))
    assert (packed.target, packed.ple, packed.stored) == (plain.target, plain.ple, plain.stored)


def test_quantization_aware_training_trains_the_model_transformers_loads_from_the_written_checkpoint(tmp_path):
    """The tiny QAT trainer's forward (weights snapped, linears rounded to its fixed scales) is the model that
    transformers computes on the gemma checkpoint written from it: what it trains is what the report measures."""
    from transformers import AutoModelForCausalLM

    from mtpkit.tiny import qat, qat_train

    shipped = Path(__file__).resolve().parents[1] / "mtpkit" / "tiny" / "assets" / "tiny_pair" / "target"
    cfg = qat_train.QATConfig(steps=2, batch=2, seq_len=32, calibration_batches=1)
    trained = qat_train.train(shipped, tmp_path / "trained", cfg)
    scales = json.loads((trained / qat.TRAINED_SCALES).read_text())["scales"]
    assert len(scales) == len(qat.linears(AutoModelForCausalLM.from_pretrained(str(trained))))
    written = qat.write(trained, tmp_path / "gemma", "gemma")
    assert not (written / qat.TRAINED_SCALES).exists()
    model = AutoModelForCausalLM.from_pretrained(str(trained), dtype=torch.float32).eval()
    qat_train._quantize_in_training(model, qat.mobile_bits(json.loads((trained / "config.json").read_text())),
                                    {n: tuple(s) for n, s in scales.items()})
    loaded = AutoModelForCausalLM.from_pretrained(str(written), dtype=torch.float32).eval()
    ids = torch.tensor([[2, *range(40, 80)]])
    with torch.no_grad():
        want, got = model(ids).logits, loaded(ids).logits
    assert torch.equal(want.argmax(-1), got.argmax(-1))
    assert float((want - got).abs().max()) < 1e-3
