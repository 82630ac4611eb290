"""compressed-tensors' `pack-quantized` format (the `compressed-tensors` package's PackedQuantizationCompressor),
read without the package:

- `<m>.weight_packed` int32 [out, ceil(in * bits / 32)]: codes + 2^(bits-1), packed densely from the lowest bit of
  each int32, a row padded to whole 32-value groups; `<m>.weight_shape` the float weight's [out, in];
- `<m>.weight_scale` [out, 1] (strategy "channel") or [out, in / group_size] ("group"); symmetric only;
- `<m>.input_scale` / `<m>.output_scale`: static per-tensor int8 activation scales (Google's wNa8o8 scheme).
Widths per module from `config_groups` (their `targets`: "Linear" or "re:<regex>"), minus `ignore`.
"""

from __future__ import annotations

import re

import numpy as np
import torch

from mtpkit.errors import CheckpointError

from .types import Lattice, Weight, key, supported_bits

FORMAT = "compressed-tensors"
FORMATS = ("pack-quantized",)
STRATEGIES = ("channel", "group")


def check(qc: dict) -> None:
    fmt = qc.get("format")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise CheckpointError("compressed-tensors quantization_config has no config_groups; the checkpoint is damaged")
    for name, group in groups.items():
        group_fmt = group.get("format") or fmt
        if group_fmt not in FORMATS:
            raise CheckpointError(f"compressed-tensors format {group_fmt!r} (config group {name}) is not supported; "
                                  f"mtpkit reads {', '.join(FORMATS)}")
        w = group.get("weights") or {}
        supported_bits(f"config group {name} weights", w.get("num_bits"), "compressed-tensors")
        if w.get("type", "int") != "int" or not w.get("symmetric", True):
            raise CheckpointError(f"config group {name}: {w.get('type')} weights, symmetric {w.get('symmetric')} are "
                                  "not supported; mtpkit reads symmetric int weights")
        if w.get("strategy") not in STRATEGIES:
            raise CheckpointError(f"config group {name}: weight strategy {w.get('strategy')!r} is not supported; "
                                  f"mtpkit reads {' / '.join(STRATEGIES)}")
        for side in ("input_activations", "output_activations"):
            a = group.get(side)
            if a and (a.get("dynamic") or a.get("strategy", "tensor") != "tensor" or a.get("num_bits", 8) != 8
                      or not a.get("symmetric", True)):
                raise CheckpointError(f"config group {name}: {side} other than static symmetric per-tensor int8 are "
                                      "not supported")


def _group_of(qc: dict, module: str) -> dict:
    """The config group of a module, as compressed-tensors matches targets: a "re:" regex before the class name
    "Linear"; a module in `ignore` has none."""
    def matches(target: str) -> bool:
        return target == module or target.startswith("re:") and re.match(target[3:], module) is not None

    if any(matches(i) for i in qc.get("ignore") or []):
        raise CheckpointError(f"{module}.weight_packed is packed but quantization_config ignores {module}")
    groups = list(qc["config_groups"].values())
    found = next((g for g in groups if any(matches(t) for t in g.get("targets") or [])), None) or \
        next((g for g in groups if "Linear" in (g.get("targets") or [])), None)
    if found is None:
        raise CheckpointError(f"{module}.weight_packed matches no config group of quantization_config; the "
                              "checkpoint is damaged")
    return found


def check_packed(name: str, packed: torch.Tensor, bits: int, rows: int, width: int) -> np.ndarray:
    """An int32-packed tensor's words as stored (export/lattice/unpack.compressed), its shape checked against the
    weight's."""
    cols = -(-width * bits // 32)
    if packed.dtype != torch.int32 or tuple(packed.shape) != (rows, cols):
        raise CheckpointError(f"{name} is {str(packed.dtype).removeprefix('torch.')} {tuple(packed.shape)}; int{bits} "
                              f"codes of a ({rows}, {width}) weight pack into int32 ({rows}, {cols}); the checkpoint is "
                              "damaged or its config_groups name other widths")
    return packed.numpy()


def read(qc: dict, state: dict, expected: dict, prefix: str) -> tuple[dict, Lattice]:
    out, weights, activations = {}, {}, {}
    for name in [n for n in state if n.endswith(".weight_packed")]:
        module = name.removesuffix(".weight_packed")
        weights[key(module)] = out[module + ".weight"] = _weight(qc, state, module, expected, prefix)
        scales = [state.get(module + s) for s in (".input_scale", ".output_scale")]
        if any(s is not None for s in scales):
            activations[key(module)] = tuple(0.0 if s is None else float(s.float().reshape(-1)[0]) for s in scales)
    skip = (".weight_packed", ".weight_scale", ".weight_shape", ".input_scale", ".output_scale", ".weight_zero_point")
    for name, tensor in state.items():
        if not name.endswith(skip):
            out.setdefault(name, tensor)
    return out, Lattice(FORMAT, weights, activations)


def _weight(qc: dict, state: dict, module: str, expected: dict, prefix: str) -> Weight:
    original = prefix + module.removeprefix("model.") if prefix else module
    w = _group_of(qc, original)["weights"]
    bits = int(w["num_bits"])
    shape = expected.get(module + ".weight")
    if shape is None or len(shape) != 2:
        raise CheckpointError(f"{original}.weight_packed packs no 2-D weight of this model")
    rows, width = int(shape[0]), int(shape[1])
    recorded = state.get(module + ".weight_shape")
    if recorded is not None and [int(v) for v in recorded.reshape(-1)] != [rows, width]:
        raise CheckpointError(f"{original}.weight_shape is {[int(v) for v in recorded.reshape(-1)]}; the config's "
                              f"weight is [{rows}, {width}]")
    if module + ".weight_zero_point" in state:
        raise CheckpointError(f"{original}.weight_zero_point: asymmetric weights are not supported; mtpkit reads "
                              "symmetric ones")
    stored = check_packed(original + ".weight_packed", state[module + ".weight_packed"], bits, rows, width)
    groups = 1 if w["strategy"] == "channel" else width // int(w.get("group_size") or width)
    scale = state.get(module + ".weight_scale")
    if scale is None or tuple(scale.reshape(rows, -1).shape if scale.numel() == rows * groups else ()) != (rows, groups):
        got = "missing" if scale is None else f"of shape {tuple(scale.shape)}"
        raise CheckpointError(f"{original}.weight_scale is {got}; strategy {w['strategy']} of a ({rows}, {width}) "
                              f"weight needs ({rows}, {groups})")
    scales = np.ascontiguousarray(scale.float().numpy().reshape(rows, groups), np.float32)
    return Weight(stored, scales, bits, "compressed", width)
