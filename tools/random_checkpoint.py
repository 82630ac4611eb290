"""A random-weight checkpoint pair with the real E2B or E4B configuration (docs: shared gemma4-architecture.md §4),
written tensor by tensor, so a 5.1 B-parameter target never sits in memory (not in CI; for the scale bench).

    python tools/random_checkpoint.py OUT --model e2b|e4b [--dtype bf16] [--seed 0] [--sparse]

Writes OUT/target (gemma4 hub layout: text weights only, bf16 safetensors shards of <= 2 GB with an index) and
OUT/drafter (gemma4_assistant), each with make-tiny's byte-level tokenizer extended to the model's 262144 ids (`<unusedN>`: any
generated id decodes to its own text, so runtimes that return text only, like LiteRT-LM, can be compared token for
token) and a generation config. Weights are N(0, 0.02), norms 1, as transformers initialises them; the drafter's
token_ordering is a random permutation. Parameter names and shapes come from transformers' own modules built on
the meta device.
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


def write_random(model_cls, config: dict, folder: Path, prefix: str, dtype, seed: int, sparse: bool = False) -> int:
    """Build model_cls(config) on the meta device and write random tensors for its state, shard by shard; prefix
    replaces a target's leading "model." (the hub's gemma4 layout), "" keeps the names (the drafter's). sparse:
    valid safetensors headers over holes (zeros that take no disk space) instead of random values."""
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
        tensor = _Hole(meta, dtype) if sparse else _random(name, meta, dtype, gen)
        key = prefix + name.removeprefix("model.") if prefix else name
        if shard_bytes + tensor.nbytes > SHARD_BYTES:
            flush()
        shard[key], shard_bytes, total = tensor, shard_bytes + tensor.nbytes, total + tensor.numel()
    flush()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}, indent=1))
    return total


_SAFETENSORS_DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16", torch.int64: "I64"}


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
        counts[role] = write_random(cls, cfg, folder, prefix, dtype, args.seed, args.sparse)
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
