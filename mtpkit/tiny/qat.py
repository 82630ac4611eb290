"""Quantization-aware-trained checkpoints of the tiny models, in each published format, written the way the
format's own tools write them (transformers' `gemma` layout, the `compressed-tensors` package's pack-quantized
packing, bf16 on a Q4_0 lattice). Google's QAT weights cannot be downloaded here: these snap a float checkpoint's
weights to a lattice at Google's mobile widths, with static activation scales measured on random text, so tests
can hold an export to transformers on the same checkpoint.

Widths (`mobile_bits`): 2-bit MLPs in the KV-shared layers, 4-bit attention and earlier MLPs, 8-bit per-layer
projections, a 4-bit per-layer-embedding table; per output channel. The tied embedding table stays float, as
transformers 5.24's gemma quantizer leaves a tied table unconverted.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch

FORMATS = ("gemma", "compressed-tensors", "q4_0")
TRAINED_SCALES = "activation_scales.json"  # written by mtpkit/tiny/qat_train.py


def mobile_bits(config: dict) -> dict[str, int]:
    """module regex -> bits, the first match wins (transformers' module_quant_configs order)."""
    text = config.get("text_config", config)
    shared = [i for i in range(text["num_hidden_layers"]) if i >= text["num_hidden_layers"] - text["num_kv_shared_layers"]]
    return {rf"layers\.({'|'.join(map(str, shared))})\.mlp\.": 2, r"per_layer_(projection|input_gate|model_projection)": 8,
            r"embed_tokens_per_layer": 4}


def snap(w: torch.Tensor, bits: int, groups: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes, float32 scales [rows, groups]): symmetric, absmax / (2^(bits-1) - 1) per group."""
    hi = (1 << (bits - 1)) - 1
    blocks = w.float().reshape(w.shape[0], groups, -1)
    scale = (blocks.abs().amax(-1) / hi).clamp_min(1e-8)
    codes = torch.clamp(torch.round(blocks / scale[..., None]), -hi - 1, hi).to(torch.int8)
    return codes.reshape(w.shape), scale.float()


def _pack_uint8(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """transformers' gemma packing: code + 2^(bits-1), 8 / bits per uint8, the first value in the lowest bits."""
    if bits == 8:
        return codes.to(torch.int8)
    per = 8 // bits
    u = (codes.to(torch.int16) + (1 << (bits - 1))).to(torch.uint8)
    u = torch.nn.functional.pad(u, (0, (-u.shape[1]) % per)).reshape(u.shape[0], -1, per)
    out = torch.zeros(u.shape[:2], dtype=torch.uint8)
    for i in range(per):
        out |= u[..., i] << (bits * i)
    return out


def _bits(widths: dict[str, int], name: str, default: int = 4) -> int:
    return next((b for p, b in widths.items() if re.search(p, name)), default)


def _static_scales(folder: Path, state: dict, seed: int) -> dict[str, tuple[float, float]]:
    """The scales a quantization-aware training fixed (mtpkit/tiny/qat_train.py, beside its checkpoint), else
    measured on random text."""
    trained = folder / TRAINED_SCALES
    if trained.exists():
        return {n: (float(a), float(b)) for n, (a, b) in json.loads(trained.read_text())["scales"].items()}
    return _activation_scales(folder, state, seed)


def linears(model: torch.nn.Module) -> dict[str, torch.nn.Linear]:
    """The linear layers qat.write gives static activation scales: the decoder's and the per-layer projection."""
    return {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
            and (".layers." in n or n.endswith("per_layer_model_projection"))}


def calibrate(model: torch.nn.Module, chunks: list[torch.Tensor]) -> dict[str, tuple[float, float]]:
    """module -> (input, output) absmax / 127 over the chunks, as qat.write stores them."""
    seen: dict[str, list[float]] = {}

    def hook(name):
        def record(module, args, out):
            pair = seen.setdefault(name, [0.0, 0.0])
            pair[0], pair[1] = max(pair[0], float(args[0].abs().max())), max(pair[1], float(out.abs().max()))
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in linears(model).items()]
    with torch.no_grad():
        for chunk in chunks:
            model(input_ids=chunk, use_cache=False)
    for h in handles:
        h.remove()
    return {n: (a / 127, b / 127) for n, (a, b) in seen.items()}


def _activation_scales(folder: Path, state: dict, seed: int) -> dict[str, tuple[float, float]]:
    """module -> (input, output) absmax / 127 of every Linear in the decoder over random text (no clipping)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    g = torch.Generator().manual_seed(seed)
    return calibrate(model, [torch.randint(3, model.config.get_text_config().vocab_size, (4, 48), generator=g)])


def write(source: Path, out: Path, fmt: str, seed: int = 0, off_lattice_blocks: int = 0, srq: bool = True) -> Path:
    """Copy the float checkpoint `source` to `out` as a QAT checkpoint in `fmt` (FORMATS). off_lattice_blocks
    (q4_0): that many blocks of the first MLP weight are left off the lattice, as a checkpoint may hold. srq: static
    activation scales (gemma, compressed-tensors); without them every scale is 0 ("none"), a weight-only lattice."""
    from safetensors.torch import load_file, save_file

    if fmt not in FORMATS:
        raise ValueError(f"unknown QAT format {fmt!r}; choose from {', '.join(FORMATS)}")
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(source, out, ignore=shutil.ignore_patterns(TRAINED_SCALES))
    config = json.loads((source / "config.json").read_text())
    state = load_file(str(source / "model.safetensors"))
    widths = mobile_bits(config)
    if fmt == "q4_0":
        save_file(_q4_0(state, off_lattice_blocks), str(out / "model.safetensors"), metadata={"format": "pt"})
        return out
    snapped, lattice = {}, {}
    for name, w in state.items():
        quantized = w.dim() == 2 and name.endswith(".weight") and (
            "embed_tokens." not in name and ("embed" not in name or fmt == "gemma"))
        if quantized:
            bits = _bits(widths, name)
            codes, scale = snap(w, bits)
            lattice[name] = (codes, scale, bits)
            snapped[name] = (codes.float() * scale.repeat_interleave(w.shape[1] // scale.shape[1], 1)).to(w.dtype)
        else:
            snapped[name] = w
    scales = _static_scales(source, snapped, seed) if srq else {}
    tensors, qc = (_gemma if fmt == "gemma" else _compressed)(state, lattice, scales, widths)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config["quantization_config"] = qc
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def _snapped(state: dict, lattice: dict):
    """(float tensors the lattice leaves as they are, [(module, weight, codes, scales, bits)] of the rest)."""
    kept = {name: w for name, w in state.items() if name not in lattice}
    return kept, [(name.removesuffix(".weight"), state[name], *lattice[name]) for name in state if name in lattice]


def _gemma(state: dict, lattice: dict, srq: dict, widths: dict) -> tuple[dict, dict]:
    tensors, snapped = _snapped(state, lattice)
    for module, _, codes, scale, bits in snapped:
        if "embed" in module:
            tensors[module + ".embedding_quantized"] = _pack_uint8(codes, bits)
            tensors[module + ".embedding_scale"] = scale
            continue
        tensors[module + ".weight"], tensors[module + ".weight_scale"] = _pack_uint8(codes, bits), scale
        found = srq.get(module, (0.0, 0.0))
        tensors[module + ".input_activation_scale"] = torch.tensor(found[0], dtype=torch.float32)
        tensors[module + ".output_activation_scale"] = torch.tensor(found[1], dtype=torch.float32)
    qc = {"quant_method": "gemma", "num_bits": 4, "quantize_embeddings": True,
          "module_quant_configs": {p: {"num_bits": b} for p, b in widths.items()}}
    return tensors, qc


def _compressed(state: dict, lattice: dict, srq: dict, widths: dict) -> tuple[dict, dict]:
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    tensors, snapped = _snapped(state, lattice)
    for module, w, codes, scale, bits in snapped:
        tensors[module + ".weight_packed"] = pack_to_int32(codes, bits)
        tensors[module + ".weight_scale"] = scale
        tensors[module + ".weight_shape"] = torch.tensor(list(w.shape), dtype=torch.int32)
        found = srq.get(module, (0.0, 0.0))
        tensors[module + ".input_scale"] = torch.tensor([found[0]], dtype=torch.float32)
        tensors[module + ".output_scale"] = torch.tensor([found[1]], dtype=torch.float32)
    act = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "tensor", "dynamic": False}
    groups = {f"group_{b}": {"targets": [f"re:.*{p}.*" for p, pb in widths.items() if pb == b] if b != 4 else ["Linear"],
                             "weights": {"num_bits": b, "type": "int", "symmetric": True, "strategy": "channel"},
                             "input_activations": act, "output_activations": act}
              for b in sorted(set(widths.values()) | {4})}
    qc = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": groups,
          "ignore": ["lm_head"]}
    return tensors, qc


def _q4_0(state: dict, off_lattice_blocks: int) -> dict:
    """bf16 linear weights snapped to Q4_0 blocks of 32, each scale with 4 significant bits so code x scale is
    exact in bf16 and float32 (the lattice is then recoverable exactly)."""
    out, left = {}, off_lattice_blocks
    for name, w in state.items():
        if w.dim() != 2 or not name.endswith(".weight") or "embed" in name or w.shape[1] % 32:
            out[name] = w
            continue
        blocks = w.float().reshape(w.shape[0], -1, 32)
        scale = blocks.abs().amax(-1) / 8
        e = torch.floor(torch.log2(scale.clamp_min(1e-12)))
        scale = torch.round(scale / 2 ** e * 8) / 8 * 2 ** e  # 4 significant bits
        codes = torch.clamp(torch.round(blocks / scale[..., None]), -8, 7)
        snapped = codes * scale[..., None]
        if left and "mlp.gate_proj" in name:
            n = min(left, snapped.shape[1])
            snapped[0, :n] = blocks[0, :n]  # the float values: off the lattice
            left -= n
        out[name] = snapped.reshape(w.shape).to(torch.bfloat16)
    return out


def write_pair(source_target: Path, source_drafter: Path, out: Path, fmt: str,
               drafter_fmt: str | None = None, srq: bool = True) -> tuple[Path, Path]:
    """A QAT pair: the target in `fmt`, the drafter in `drafter_fmt` (default: q4_0 beside a q4_0 target, as Google
    ships its QAT assistants only on that lattice; else a float copy), next to each other under `out`."""
    target = write(source_target, out / "target", fmt, off_lattice_blocks=3 if fmt == "q4_0" else 0, srq=srq)
    drafter_fmt = drafter_fmt or ("q4_0" if fmt == "q4_0" else None)
    if drafter_fmt:
        drafter = write(source_drafter, out / "drafter", drafter_fmt)
    else:
        drafter = out / "drafter"
        shutil.rmtree(drafter, ignore_errors=True)
        shutil.copytree(source_drafter, drafter)
    return target, drafter
