"""Tiny random Gemma 4 targets and drafters in the real hub layouts, built offline (`mtpkit make-tiny`).

They keep every structural feature of E2B/E4B (PLE, KV-shared layers with store layers, sliding and full
layers with different head dims, proportional partial RoPE, double-wide MLP, logit softcap, a sliding
window small enough that tests cross it) at hidden sizes that are multiples of 32.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from mtpkit.errors import UsageError
from mtpkit.export.checkpoint import write_checkpoint

VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
PAD_ID, EOS_ID, BOS_ID, END_OF_TURN_ID = 0, 1, 2, 6
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
}
SHAPES = ("e2b", "e4b", "e2b-wide")
# e2b-wide: E2B's layer widths (hidden 1536, MLP 6144 / 12288 double-wide, 8 heads, head dims 256 / 512, PLE 256)
# in 3 layers [s, f, f(shared)]: ~0.14 B parameters, so weights rather than per-op overhead decide a call's time.
WIDE = dict(hidden=1536, intermediate=6144, heads=8, head_dim=256, global_head_dim=512, ple=256, pattern=(1, 1))
LAYOUTS = ("gemma4", "gemma4_text")
HEADS = ("centroid", "dense")


@dataclass(frozen=True)
class TinySpec:
    """What make-tiny builds; every combination keeps the structure of the named real model."""

    shape: str = "e2b"  # e2b: (4 sliding + full) x 2, 1 kv head, double-wide MLP; e4b: (5 + 1) x 2, 2 kv heads
    layout: str = "gemma4"  # gemma4: Gemma4ForConditionalGeneration; gemma4_text: Gemma4ForCausalLM
    head: str = "centroid"  # drafter head: centroid (ordered embeddings) or dense
    k_eq_v: bool = False  # attention_k_eq_v on full layers
    sliding_window: int = 8
    max_positions: int = 4096  # max_position_embeddings: a smaller limit shows how export defaults adapt to it
    num_assistant_tokens: int = 4
    seed: int = 0
    init_std: float = 0.06  # larger than HF's 0.02 so logits are not near-ties, small enough for 1e-4 fp32 parity
    drafter_init_std: float = 0.04  # a contractive random drafter: fp32 noise shrinks along the draft chain

    def __post_init__(self):
        for name, value, allowed in [("shape", self.shape, SHAPES), ("layout", self.layout, LAYOUTS),
                                     ("head", self.head, HEADS)]:
            if value not in allowed:
                raise UsageError(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}")


def text_config(*, vocab: int, hidden: int, intermediate: int, window: int, e2b: bool = True, k_eq_v: bool = False,
                init_std: float = 0.02, heads: int = 4, head_dim: int = 32, global_head_dim: int = 64, ple: int = 32,
                pattern: tuple[int, int] | None = None) -> dict:
    """A Gemma 4 text config in the hub's spelling (global_head_dim, explicit layer_types), E2B- or E4B-shaped.

    pattern (sliding layers per block, shared layers): default (4, 5) for E2B and (5, 6) for E4B, two blocks.
    Shared by make-tiny and the trained pair (mtpkit/tiny/training/configs.py)."""
    sliding, shared = pattern or ((4, 5) if e2b else (5, 6))
    block = ["sliding_attention"] * sliding + ["full_attention"]
    # one owning block, then the last `shared` layers of a block (transformers wants a full last layer)
    layer_types = block * 2 if pattern is None else block + block[-shared:]
    return {
        "model_type": "gemma4_text", "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": intermediate,
        "num_hidden_layers": len(layer_types), "num_attention_heads": heads, "num_key_value_heads": 1 if e2b else 2,
        "head_dim": head_dim, "global_head_dim": global_head_dim, "sliding_window": window, "layer_types": layer_types,
        "num_kv_shared_layers": shared, "hidden_size_per_layer_input": ple,
        "vocab_size_per_layer_input": vocab, "use_double_wide_mlp": e2b, "final_logit_softcapping": 30.0,
        "rope_parameters": ROPE, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "attention_k_eq_v": k_eq_v,
        "num_global_key_value_heads": 1 if k_eq_v else None, "initializer_range": init_std,
        "pad_token_id": PAD_ID, "eos_token_id": EOS_ID, "bos_token_id": BOS_ID,
    }


def assistant_config(target_text: dict, *, hidden: int, intermediate: int, heads: int, centroid: bool,
                     num_centroids: int, top_k: int, init_std: float = 0.02) -> dict:
    """A gemma4_assistant config: 4 layers [s,s,s,f] reading the target's store-layer K/V, so head dims, kv heads,
    window and k_eq_v are the target's."""
    text = {
        "model_type": "gemma4_text", "vocab_size": target_text["vocab_size"], "hidden_size": hidden,
        "intermediate_size": intermediate, "num_hidden_layers": 4, "num_attention_heads": heads,
        "num_key_value_heads": target_text["num_key_value_heads"], "head_dim": target_text["head_dim"],
        "global_head_dim": target_text["global_head_dim"], "sliding_window": target_text["sliding_window"],
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"], "num_kv_shared_layers": 4,
        "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0, "use_double_wide_mlp": False,
        "final_logit_softcapping": None, "rope_parameters": ROPE, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
        "attention_k_eq_v": target_text["attention_k_eq_v"],
        "num_global_key_value_heads": target_text["num_global_key_value_heads"], "initializer_range": init_std,
    }
    return {
        "model_type": "gemma4_assistant", "architectures": ["Gemma4AssistantForCausalLM"], "text_config": text,
        "backbone_hidden_size": target_text["hidden_size"], "use_ordered_embeddings": centroid,
        "num_centroids": num_centroids, "centroid_intermediate_top_k": top_k, "tie_word_embeddings": True,
    }


def target_text_config(spec: TinySpec) -> dict:
    if spec.shape == "e2b-wide":
        text = text_config(vocab=VOCAB_SIZE, window=spec.sliding_window, k_eq_v=spec.k_eq_v, init_std=0.02, **WIDE)
    else:
        text = text_config(vocab=VOCAB_SIZE, hidden=64, intermediate=128, window=spec.sliding_window,
                           e2b=spec.shape == "e2b", k_eq_v=spec.k_eq_v, init_std=spec.init_std)
    return {**text, "max_position_embeddings": spec.max_positions}


def drafter_config(spec: TinySpec, target_text: dict) -> dict:
    return assistant_config(target_text, hidden=32, intermediate=64, heads=2, centroid=spec.head == "centroid",
                            num_centroids=16, top_k=4, init_std=spec.drafter_init_std)


def target_config(spec: TinySpec) -> dict:
    text = target_text_config(spec)
    if spec.layout == "gemma4_text":
        return {**text, "architectures": ["Gemma4ForCausalLM"]}
    # Vision and audio towers are left out: mtpkit exports the text path only and skips their weights.
    return {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": text,
            "vision_config": None, "audio_config": None, "tie_word_embeddings": True,
            "pad_token_id": PAD_ID, "eos_token_id": [EOS_ID, END_OF_TURN_ID], "bos_token_id": BOS_ID}


def build_tokenizer(vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE with no merges: deterministic, offline, every string encodable. Ids past the bytes are
    `<unusedN>`, up to vocab_size, so every id a model of that vocabulary emits decodes to its own text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    while len(vocab) < vocab_size:
        vocab[f"<unused{len(vocab)}>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


def write_tokenizer(folder: Path, tokenizer, chat_template: str = CHAT_TEMPLATE) -> None:
    tokenizer.save(str(folder / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
        "pad_token": "<pad>", "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False,
        "model_max_length": 4096, "chat_template": chat_template,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}, indent=2) + "\n")


def make_tiny(out: str | Path, spec: TinySpec = TinySpec()) -> tuple[Path, Path]:
    """Write OUT/target and OUT/drafter as HF checkpoints (config, safetensors, tokenizer, generation config).

    Returns:
        (target_dir, drafter_dir)
    """
    import torch

    from mtpkit.export.scoped import import_quietly

    import_quietly()
    from transformers import AutoConfig, Gemma4AssistantForCausalLM, Gemma4ForCausalLM

    out = Path(out)
    tdir, ddir = out / "target", out / "drafter"
    torch.manual_seed(spec.seed)
    tcfg_dict = target_config(spec)
    text = target_text_config(spec)
    target = Gemma4ForCausalLM(AutoConfig.for_model(**text)).eval()
    _randomize_extras(target)
    dcfg_dict = drafter_config(spec, text)
    drafter = Gemma4AssistantForCausalLM(AutoConfig.for_model(**dcfg_dict)).eval()
    if drafter.masked_embedding is not None:  # HF zero-fills token_ordering; a permutation is what real ones hold
        drafter.masked_embedding.token_ordering.copy_(torch.randperm(VOCAB_SIZE))
    with torch.no_grad():  # a random drafter feeding back its own activations is chaotic: fp32 noise grew 10x per
        drafter.post_projection.weight.mul_(0.05)  # draft step; a weak feedback keeps k=8 chains comparable with HF
    prefix = "model.language_model." if spec.layout == "gemma4" else "model."
    target_gen = {"bos_token_id": BOS_ID, "pad_token_id": PAD_ID, "eos_token_id": [EOS_ID, END_OF_TURN_ID]}
    drafter_gen = {"num_assistant_tokens": spec.num_assistant_tokens, "num_assistant_tokens_schedule": "constant"}
    write_checkpoint(tdir, tcfg_dict, _text_state(target, prefix), target_gen)
    write_checkpoint(ddir, dcfg_dict, dict(drafter.state_dict()), drafter_gen)
    tokenizer = build_tokenizer()
    for folder in (tdir, ddir):
        write_tokenizer(folder, tokenizer)
    return tdir, ddir


def _randomize_extras(target) -> None:
    """Give buffers that HF initialises to constants non-trivial values, so an export that drops them fails."""
    import torch

    with torch.no_grad():
        for layer in target.model.layers:
            layer.layer_scalar.uniform_(0.5, 1.5)


def _text_state(target, prefix: str) -> dict:
    state = {}
    for name, tensor in target.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied to the embedding, as in the hub files
        state[prefix + name.removeprefix("model.")] = tensor
    return state


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    """`mtpkit make-tiny` flags."""
    p.add_argument("out", type=Path, help="folder to create; receives target/ and drafter/")
    p.add_argument("--layout", choices=LAYOUTS, default="gemma4", help="target hub layout (default gemma4)")
    p.add_argument("--shape", choices=SHAPES, default="e2b", help="structure to mimic (default e2b)")
    p.add_argument("--head", choices=HEADS, default="centroid", help="drafter LM head (default centroid)")
    p.add_argument("--k-eq-v", action="store_true", help="attention_k_eq_v on full-attention layers")
    p.add_argument("--sliding-window", type=int, default=8, help="sliding window W (default 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="replace an existing folder")


def run(args) -> int:
    spec = TinySpec(shape=args.shape, layout=args.layout, head=args.head, k_eq_v=args.k_eq_v,
                    sliding_window=args.sliding_window, seed=args.seed)
    if args.out.exists():
        if not args.force:
            raise UsageError(f"{args.out} already exists; pass --force to replace it")
        shutil.rmtree(args.out)
    target, drafter = make_tiny(args.out, spec)
    print(f"target:  {target}\ndrafter: {drafter}", file=sys.stdout)
    return 0
