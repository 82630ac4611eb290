"""A random-weight checkpoint pair with the real E2B or E4B configuration (docs: shared gemma4-architecture.md §4),
written tensor by tensor, so a 5.1 B-parameter target never sits in memory (not in CI; for the scale bench).

    python tools/random_checkpoint.py OUT --model e2b|e4b [--dtype bf16] [--seed 0] [--sparse] [--qat mobile]

Writes OUT/target (gemma4 hub layout: text weights only, bf16 safetensors shards of <= 2 GB with an index) and
OUT/drafter (gemma4_assistant), each with make-tiny's byte-level tokenizer extended to the model's 262144 ids (`<unusedN>`: any
generated id decodes to its own text, so runtimes that return text only, like LiteRT-LM, can be compared token for
token) and a generation config. Weights are N(0, 0.02), norms 1, as transformers initialises them; the drafter's
token_ordering is a random permutation. Parameter names and shapes come from transformers' own modules built on
the meta device. --qat mobile writes the target as a quantization-aware-trained checkpoint in transformers' `gemma`
layout at the widths published for Google's E2B mobile file (qat_mobile): packed random codes, a float32 scale per
output channel (per row block for the per-layer table), static activation scales.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from mtpkit.tiny import make

SHARD_BYTES = 2 << 30
TEXT = {  # published text configs (hidden, layers pattern, MLP, kv heads, shared layers, double-wide MLP)
    "e2b": dict(hidden=1536, intermediate=6144, heads=8, head_dim=256, global_head_dim=512, ple=256,
                kv_heads=1, sliding=4, blocks=7, shared=20, double_wide=True),
    "e4b": dict(hidden=2560, intermediate=10240, heads=8, head_dim=256, global_head_dim=512, ple=256,
                kv_heads=2, sliding=5, blocks=7, shared=18, double_wide=False),
}
VOCAB = 262144
# module regex -> bits (transformers' module_quant_configs, the first match wins), over 4 bits: the MLPs of the
# KV-shared layers (E2B: 15-34) and the tied table at 2 bits, the per-layer projections at 8, the per-layer table at 4


def qat_mobile(text: dict) -> dict[str, int]:
    layers, shared = text["num_hidden_layers"], text["num_kv_shared_layers"]
    kv_shared = "|".join(str(i) for i in range(layers - shared, layers))
    return {rf"layers\.({kv_shared})\.mlp\.": 2, r"per_layer_(projection|input_gate|model_projection)": 8,
            r"embed_tokens_per_layer": 4, r"embed_tokens": 2}
PLE_BLOCK = 256  # the per-layer table's scale block: one per layer's slice of a row


def text_config(model: str) -> dict:
    c = TEXT[model]
    base = make.text_config(vocab=VOCAB, hidden=c["hidden"], intermediate=c["intermediate"], window=512,
                            heads=c["heads"], head_dim=c["head_dim"], global_head_dim=c["global_head_dim"],
                            ple=c["ple"], init_std=0.02)
    layer_types = (["sliding_attention"] * c["sliding"] + ["full_attention"]) * c["blocks"]
    return {**base, "num_hidden_layers": len(layer_types), "layer_types": layer_types,
            "num_kv_shared_layers": c["shared"], "num_key_value_heads": c["kv_heads"],
            "use_double_wide_mlp": c["double_wide"], "vocab_size_per_layer_input": VOCAB,
            "max_position_embeddings": 131072}


def drafter_config(text: dict) -> dict:
    config = make.assistant_config(text, hidden=256, intermediate=2048, heads=4, centroid=True, num_centroids=2048,
                                   top_k=32, init_std=0.02)
    config["text_config"]["max_position_embeddings"] = 131072
    return config


def write_random(model_cls, config: dict, folder: Path, prefix: str, dtype, seed: int, sparse: bool = False,
                 qat: dict | None = None) -> int:
    """Build model_cls(config) on the meta device and write random tensors for its state, shard by shard; prefix
    replaces a target's leading "model." (the hub's gemma4 layout), "" keeps the names (the drafter's). sparse:
    valid safetensors headers over holes (zeros that take no disk space) instead of random values. qat: module
    regex -> bits, every 2-D weight written packed in the gemma layout (_qat)."""
    from safetensors.torch import save_file
    from transformers import AutoConfig

    if sparse:
        save_file = _save_sparse  # noqa: F811

    with torch.device("meta"):
        module = model_cls(AutoConfig.for_model(**config))
    gen, shard, shard_bytes, index, total = torch.Generator().manual_seed(seed), {}, 0, {}, 0
    folder.mkdir(parents=True, exist_ok=True)
    names = [(n, t) for n, t in module.state_dict().items() if n != "lm_head.weight"]  # tied to the embedding

    def flush():
        nonlocal shard, shard_bytes
        if shard:
            name = f"model-{len(set(index.values())) + 1:05d}.safetensors"
            save_file(shard, str(folder / name), metadata={"format": "pt"})
            index.update(dict.fromkeys(shard, name))
            shard, shard_bytes = {}, 0

    for name, meta in names:
        key = prefix + name.removeprefix("model.") if prefix else name
        parts = _qat(key, meta, qat, sparse, gen) if qat and meta.dim() == 2 else \
            {key: _Hole(meta, dtype) if sparse else _random(name, meta, dtype, gen)}
        if shard_bytes + sum(t.nbytes for t in parts.values()) > SHARD_BYTES:
            flush()
        for k, tensor in parts.items():
            shard[k], shard_bytes = tensor, shard_bytes + tensor.nbytes
        total += meta.numel()
    flush()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}, indent=1))
    return total


_SAFETENSORS_DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16", torch.int64: "I64",
                       torch.uint8: "U8", torch.int8: "I8"}


class _Hole:
    """A tensor of a sparse shard: its dtype and shape, no values (the meta tensor's dtype if not floating)."""

    def __init__(self, meta: torch.Tensor, dtype):
        self.dtype, self.shape = dtype if meta.is_floating_point() else meta.dtype, tuple(meta.shape)
        self.nbytes = self.numel() * torch.empty((), dtype=self.dtype).element_size()

    def numel(self) -> int:
        return math.prod(self.shape)


def _save_sparse(shard: dict, path: str, metadata: dict) -> None:
    """A safetensors file of `shard`'s headers whose data is a hole: the size and offsets are those of the real
    file (mtpkit's header checks pass), the bytes read as zeros and take no disk space."""
    header, offset = {"__metadata__": metadata}, 0
    for key, hole in shard.items():
        header[key] = {"dtype": _SAFETENSORS_DTYPES[hole.dtype], "shape": list(hole.shape),
                       "data_offsets": [offset, offset + hole.nbytes]}
        offset += hole.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + offset)


def _qat(key: str, meta: torch.Tensor, widths: dict, sparse: bool, gen) -> dict:
    """A 2-D weight in transformers' gemma layout: codes packed 8 / bits per uint8 (int8 at 8 bits), a float32 scale
    per row (per PLE_BLOCK of a per-layer-table row), static activation scales beside a linear layer's."""
    import re

    module = key.removesuffix(".weight")
    bits = next((b for p, b in widths.items() if re.search(p, module)), 4)
    rows, width = meta.shape
    table = "embed_tokens" in module
    groups = width // PLE_BLOCK if "per_layer" in module and table else 1
    device = "meta" if sparse else "cpu"  # a sparse file's tensors are holes: nothing allocated
    codes = torch.empty((rows, width if bits == 8 else width * bits // 8),
                        dtype=torch.int8 if bits == 8 else torch.uint8, device=device)
    scale = torch.empty((rows, groups), dtype=torch.float32, device=device)
    out = {module + (".embedding_quantized" if table else ".weight"): codes,
           module + (".embedding_scale" if table else ".weight_scale"): scale}
    if not table:
        out.update({module + ".input_activation_scale": torch.empty((), dtype=torch.float32, device=device),
                    module + ".output_activation_scale": torch.empty((), dtype=torch.float32, device=device)})
    if sparse:
        return {k: _Hole(v, v.dtype) for k, v in out.items()}
    for start in range(0, rows, 1 << 14):
        codes[start:start + (1 << 14)] = torch.randint(-128, 128, codes[start:start + (1 << 14)].shape,
                                                       generator=gen).to(codes.dtype)
    scale.fill_(0.02 / (1 << (bits - 1)))
    for k in out:
        if k.endswith("activation_scale"):
            out[k].fill_(0.05)
    return out


def _random(name: str, meta: torch.Tensor, dtype, gen) -> torch.Tensor:
    if not meta.is_floating_point():  # the drafter's token_ordering: a permutation, as the hub's
        return torch.randperm(meta.numel(), generator=gen).to(meta.dtype).view(meta.shape)
    if name.endswith("norm.weight") or name.endswith("layer_scalar"):
        return torch.ones(meta.shape, dtype=dtype)
    out = torch.empty(meta.shape, dtype=dtype)
    if out.dim() == 0:
        return out.fill_(0.0)
    rows = max(1, (64 << 20) // max(1, out[0].numel() * 4))  # 64 MB of fp32 at a time: the PLE table is 9.4 GB
    for start in range(0, out.shape[0], rows):
        slab = torch.empty(out[start:start + rows].shape, dtype=torch.float32)
        out[start:start + rows] = slab.normal_(0.0, 0.02, generator=gen).to(dtype)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--model", choices=sorted(TEXT), default="e2b")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--qat", choices=("mobile",),
                   help="write the target as a QAT checkpoint in transformers' gemma layout at the published E2B "
                        "mobile widths (qat_mobile)")
    p.add_argument("--sparse", action="store_true",
                   help="write the safetensors headers over holes (zeros taking no disk space) instead of random "
                        "weights: seconds, enough for `mtpkit export ... --dry-run`, useless to export")
    args = p.parse_args()
    from mtpkit.export.scoped import import_quietly

    import_quietly()
    from transformers import Gemma4AssistantForCausalLM, Gemma4ForCausalLM

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    hf_dtype = str(dtype).removeprefix("torch.")  # config.json's spelling
    started, text = time.time(), text_config(args.model)
    target_cfg = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": text,
                  "vision_config": None, "audio_config": None, "tie_word_embeddings": True,
                  "pad_token_id": make.PAD_ID, "eos_token_id": [make.EOS_ID, make.END_OF_TURN_ID],
                  "bos_token_id": make.BOS_ID, "dtype": hf_dtype}
    drafter_cfg = {**drafter_config(text), "dtype": hf_dtype}
    counts = {}
    for role, cls, cfg, prefix in (("target", Gemma4ForCausalLM, text, "model.language_model."),
                                   ("drafter", Gemma4AssistantForCausalLM, drafter_cfg, "")):
        folder = args.out / role
        qat = qat_mobile(text) if args.qat and role == "target" else None
        counts[role] = write_random(cls, cfg, folder, prefix, dtype, args.seed, args.sparse, qat)
        if qat:
            target_cfg["quantization_config"] = {"quant_method": "gemma", "num_bits": 4, "quantize_embeddings": True,
                                                 "module_quant_configs": {p: {"num_bits": b} for p, b in qat.items()}}
        (folder / "config.json").write_text(json.dumps(target_cfg if role == "target" else drafter_cfg, indent=2))
        gen = ({"bos_token_id": make.BOS_ID, "pad_token_id": make.PAD_ID,
                "eos_token_id": [make.EOS_ID, make.END_OF_TURN_ID]} if role == "target" else
               {"num_assistant_tokens": 4, "num_assistant_tokens_schedule": "constant"})
        (folder / "generation_config.json").write_text(json.dumps(gen, indent=2))
        make.write_tokenizer(folder, make.build_tokenizer(VOCAB))
    print(f"{args.model}: target {counts['target'] / 1e9:.3f} B, drafter {counts['drafter'] / 1e6:.1f} M parameters "
          f"({args.dtype}) in {time.time() - started:.0f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
