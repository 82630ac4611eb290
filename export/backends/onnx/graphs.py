"""The ONNX graphs of the target and drafter steps: torch.export (dynamo), streamed to external data, the tied
embedding table written alone to EMBEDDINGS_FILE; their signatures by role."""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from pathlib import Path
from typing import Callable, ContextManager

import torch

from mtpkit.runtime.manifest import Backend, GraphFile, KVLayer, OnnxOptions, Signature, TensorSpec, sha256_file

from ...scoped import logger_level
from .. import ExportJob
from . import fusions, stream

log = logging.getLogger(__name__)
EMBEDDINGS_FILE = "embeddings.bin"
OPSET = 20
_REGISTRATION_LOGGER = "torch.onnx._internal.exporter._registration"
PAST = "past_window.{layer}.{kind}"
NEW = "new.{layer}.{kind}"


def export(job: ExportJob) -> Backend:
    """target.onnx + drafter.onnx + embeddings.bin into job.folder; their manifest entry."""
    sigs = signatures(job.kv_layers, job.store, job.hidden, job.vocab)
    t_path, d_path = job.folder / "target.onnx", job.folder / "drafter.onnx"
    fuse = job.cfg.fuse
    embed = job.target.model.embed_tokens
    embedding = export_graph(job.target_adapter.TargetStep(job.target), sigs["verify"], _target_sample(job.kv_layers),
                             t_path, fused=functools.partial(job.target_adapter.fused_ops, job.target) if fuse else None,
                             table=embed.weight)
    export_graph(job.drafter_adapter.DraftStep(job.drafter), sigs["draft"], _draft_sample(job, job.hidden), d_path,
                 fused=functools.partial(job.drafter_adapter.fused_ops, job.drafter) if fuse else None)
    if embedding is None:
        raise RuntimeError(f"the embedding table is not an initializer of {t_path.name}")
    embedding["scale"] = float(embed.embed_scale.float())  # the graphs' fp32 scale, whatever --dtype holds
    graphs = {name: graph_file(job.folder, p) for name, p in (("target", t_path), ("drafter", d_path))}
    # fused: the contrib kernels' oldest ORT with MultiHeadAttention's grouped mask (fusions.py)
    options = OnnxOptions(embedding=embedding, nodes=_log_nodes(job, graphs), min_onnxruntime="1.20" if fuse else None)
    return Backend("onnx", "window", graphs, sigs, options)


def _log_nodes(job: ExportJob, graphs: dict[str, GraphFile]) -> dict[str, int]:
    """Node count per graph, logged and returned for the manifest: what op fusion (fusions.py) shrinks."""
    layers = {"target": job.target.config.num_hidden_layers,
              "drafter": job.drafter.config.get_text_config().num_hidden_layers}
    nodes = {name: node_count(job.folder / g.file) for name, g in graphs.items()}
    for name, count in nodes.items():
        log.info("  %s: %d nodes, %.1f per decoder layer", graphs[name].file, count, count / layers[name])
    return nodes


def node_count(path: Path) -> int:
    import onnx

    return len(onnx.load(str(path), load_external_data=False).graph.node)


def signatures(kv_layers, store: dict[str, int], hidden: int, vocab: int) -> dict[str, Signature]:
    t_in, t_out = _target_io(kv_layers, hidden, vocab)
    d_in, d_out = _drafter_io({t: next(d for d in kv_layers if d.layer == i) for t, i in store.items()}, hidden, vocab)
    return {"prefill": Signature("target", t_in, t_out, None), "decode": Signature("target", t_in, t_out, 1),
            "verify": Signature("target", t_in, t_out, None), "draft": Signature("drafter", d_in, d_out, 1)}


def _target_io(kv_layers, hidden: int, vocab: int) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """(input_ids [1,T], input_pos [1], past windows) -> logits, final-norm hidden states, new K/V."""
    inputs = [TensorSpec("input_ids", "input_ids", [1, "T"], "int64"),
              TensorSpec("input_pos", "input_pos", [1], "int64")]
    outputs = [TensorSpec("logits", "logits", [1, "T", vocab], "float32"),
               TensorSpec("hidden_states", "activations", [1, "T", hidden], "float32")]
    for d in kv_layers:
        past = "past_sliding" if d.type == "sliding_attention" else "past_full"
        for kind in ("key", "value"):
            inputs.append(TensorSpec(PAST.format(layer=d.layer, kind=kind), f"past_{kind}",
                                     [1, d.kv_heads, past, d.head_dim], "float32", d.layer))
            outputs.append(TensorSpec(NEW.format(layer=d.layer, kind=kind), f"new_{kind}",
                                      [1, d.kv_heads, "T", d.head_dim], "float32", d.layer))
    return inputs, outputs


def _drafter_io(store: dict[str, KVLayer], hidden: int, vocab: int) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Store-layer K/V are read-only inputs, tagged with the target layer and layer type they come from."""
    inputs = [TensorSpec("inputs_embeds", "inputs_embeds", [1, 1, hidden], "float32"),
              TensorSpec("activations", "activations", [1, 1, hidden], "float32"),
              TensorSpec("input_pos", "input_pos", [1], "int64")]
    for layer_type in ("full_attention", "sliding_attention"):  # DraftStep.forward's argument order
        d, short = store[layer_type], layer_type.split("_")[0]
        for kind in ("key", "value"):
            inputs.append(TensorSpec(f"{short}_{kind}", f"store_{kind}", [1, d.kv_heads, f"{short}_len", d.head_dim],
                                     "float32", d.layer, layer_type=layer_type))
    outputs = [TensorSpec("logits", "logits", [1, 1, vocab], "float32"),
               TensorSpec("projected_activations", "projected_activations", [1, 1, hidden], "float32")]
    return inputs, outputs


def _target_sample(kv_layers) -> tuple:
    t, p = 3, 5  # avoid 0/1 so torch.export keeps T and the past lengths dynamic
    past = [torch.randn(1, d.kv_heads, p, d.head_dim) for d in kv_layers for _ in (0, 1)]
    return (torch.randint(0, 8, (1, t)), torch.tensor([p]), *past)


def _draft_sample(job: ExportJob, hidden: int) -> tuple:
    full, sliding = job.kv_layer(job.store["full_attention"]), job.kv_layer(job.store["sliding_attention"])
    return (torch.randn(1, 1, hidden), torch.randn(1, 1, hidden), torch.tensor([6]),
            torch.randn(1, full.kv_heads, 6, full.head_dim), torch.randn(1, full.kv_heads, 6, full.head_dim),
            torch.randn(1, sliding.kv_heads, 5, sliding.head_dim),
            torch.randn(1, sliding.kv_heads, 5, sliding.head_dim))


def graph_file(folder: Path, path: Path) -> GraphFile:
    data = {p.name: sha256_file(p) for p in data_files(path)}
    size = path.stat().st_size + sum((folder / n).stat().st_size for n in data)
    return GraphFile(file=path.name, sha256=sha256_file(path), bytes=size, backend="onnx", data_files=data)


def _names(specs) -> list[str]:
    return [t.name for t in specs]


def _dims(signature: Signature) -> tuple:
    """torch.export dynamic shapes built from the signature table's symbolic dims."""
    cache: dict[str, torch.export.Dim] = {}

    def dim(name: str) -> torch.export.Dim:
        if name not in cache:
            cache[name] = torch.export.Dim(name, min=1 if name == "T" else 0, max=1 << 20)
        return cache[name]

    specs = [{i: dim(s) for i, s in enumerate(t.shape) if isinstance(s, str)} or None for t in signature.inputs]
    return specs


def export_graph(step: torch.nn.Module, signature: Signature, sample: tuple, path: Path,
                 fused: Callable[[], ContextManager] | None = None, table: torch.Tensor | None = None) -> dict | None:
    """Export one step module with the signature's names and dynamic dims, streaming (stream.py): traced
    on fake fp32 weights, each weight converted to fp32 only as it is written to external data.

    Args:
        fused: makes the model adapter's fused_ops(model) patch; inside it the step calls fused_ops.py's
            custom ops, lowered here to fused ORT kernels (fusions.py). None exports the modules as they are.
        table: the tied embedding table (a parameter of step), written alone to EMBEDDINGS_FILE.

    Returns:
        the manifest's `embedding` entry (file, offset, shape, dtype, initializer) when table is given.
    """
    dims = _dims(signature)
    fixed = _n_positional(step)
    if len(dims) > fixed:  # *past varargs need a nested spec
        dims = [*dims[:fixed], tuple(dims[fixed:])]
    # torch.onnx logs one warning per missing torchvision op; irrelevant here (scoped: the caller's level returns)
    # fused_ops first: the regrouped attention weights it registers are faked and bound like the others
    with warnings.catch_warnings(), torch.no_grad(), logger_level(_REGISTRATION_LOGGER, logging.ERROR), \
            (fused() if fused else contextlib.nullcontext()), stream.fake_weights(step) as real:
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            step, sample, input_names=_names(signature.inputs), output_names=_names(signature.outputs),
            dynamic_shapes=tuple(dims), dynamo=True, optimize=False, opset_version=OPSET, verbose=False,
            custom_translation_table=fusions.translation_table() if fused else None,
        )
    stream.bind_lazy(program.model, real)
    stream.fold_weight_transposes(program.model, real)
    program.optimize()  # after the lazy folds: what is left to fold is small
    if fused:
        fusions.fuse_graph(program.model)
    return stream.save(program.model, path, stream.initializer_of(program.model, real, table),
                       EMBEDDINGS_FILE)


def _n_positional(step: torch.nn.Module) -> int:
    import inspect

    params = inspect.signature(step.forward).parameters.values()
    return sum(1 for p in params if p.kind == p.POSITIONAL_OR_KEYWORD)


def data_files(graph_path: Path) -> list[Path]:
    """External data files a saved ONNX graph refers to."""
    import onnx

    model = onnx.load(str(graph_path), load_external_data=False)
    names = set()
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            names.update(e.value for e in t.external_data if e.key == "location")
    return [graph_path.parent / n for n in sorted(names)]
