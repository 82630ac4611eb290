"""ONNX backend: torch.export (dynamo) of the step modules, then the embedding table moved to a shared file.

The target graph's tied embedding/lm_head table is written once, as ONNX external data in `embeddings.bin`;
the runtime memory-maps the same file to look up the drafter's token embeddings, so the 262k-row table is
stored once. Graphs larger than 2 GB keep the rest of their weights in `<graph>.onnx.data`.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import torch

from mtpkit.runtime.manifest import Signature

log = logging.getLogger(__name__)
EMBEDDINGS_FILE = "embeddings.bin"
OPSET = 20
_TWO_GB = 2**31 - 2**26  # protobuf's hard limit, with headroom for the graph itself


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


def export_graph(step: torch.nn.Module, signature: Signature, sample: tuple, path: Path) -> None:
    """Export one step module with the signature's names and dynamic dims."""
    dims = _dims(signature)
    fixed = _n_positional(step)
    if len(dims) > fixed:  # *past varargs need a nested spec
        dims = [*dims[:fixed], tuple(dims[fixed:])]
    # torch.onnx logs one warning per missing torchvision op; irrelevant here
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            step, sample, input_names=_names(signature.inputs), output_names=_names(signature.outputs),
            dynamic_shapes=tuple(dims), dynamo=True, optimize=True, opset_version=OPSET, verbose=False,
        )
    program.save(str(path), external_data=not _small(program))


def _n_positional(step: torch.nn.Module) -> int:
    import inspect

    params = inspect.signature(step.forward).parameters.values()
    return sum(1 for p in params if p.kind == p.POSITIONAL_OR_KEYWORD)


def _small(program) -> bool:
    return sum(t.const_value.nbytes for t in program.model.graph.initializers.values() if t.const_value is not None) < _TWO_GB


def share_embedding(graph_path: Path, table: np.ndarray) -> dict:
    """Move the initializer equal to `table` into EMBEDDINGS_FILE (external data) and describe it.

    Returns:
        the manifest's `embedding` entry (file, offset, shape, dtype); the caller adds the scale.
    """
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import set_external_data

    folder = graph_path.parent
    model = onnx.load(str(graph_path), load_external_data=True)
    matches = [t for t in model.graph.initializer
               if tuple(t.dims) == table.shape and np.array_equal(numpy_helper.to_array(t), table)]
    if len(matches) != 1:
        raise RuntimeError(f"expected one embedding initializer in {graph_path.name}, found {len(matches)}")
    tensor = matches[0]
    raw = np.ascontiguousarray(table, dtype=np.float32).tobytes()
    (folder / EMBEDDINGS_FILE).write_bytes(raw)
    set_external_data(tensor, location=EMBEDDINGS_FILE, offset=0, length=len(raw))
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    big = sum(t.ByteSize() for t in model.graph.initializer) > _TWO_GB
    for stale in folder.glob(graph_path.name + ".data"):
        stale.unlink()  # rewritten below when still needed
    onnx.save_model(model, str(graph_path), save_as_external_data=big, all_tensors_to_one_file=True,
                    location=graph_path.name + ".data", size_threshold=1024)
    return {"file": EMBEDDINGS_FILE, "offset": 0, "shape": list(table.shape), "dtype": "float32"}


def data_files(graph_path: Path) -> list[Path]:
    """External data files a saved ONNX graph refers to."""
    import onnx

    model = onnx.load(str(graph_path), load_external_data=False)
    names = set()
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            names.update(e.value for e in t.external_data if e.key == "location")
    return [graph_path.parent / n for n in sorted(names)]
