"""`mtpkit train-tiny`: train the small Gemma 4 target + MTP drafter pair shipped in mtpkit/tiny/assets/tiny_pair.

Offline and CPU-only: the corpus is the Python standard library's own source (PSF licence), the tokenizer a
byte-level BPE trained on it, the target a 10-layer Gemma 4 text model with every E2B structural feature, and
the drafter a Gemma4AssistantForCausalLM distilled from the target's greedy continuations. The result is
measured with transformers' own assisted generate and recorded, with sha256 of every file, in pair.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from mtpkit.errors import UsageError

log = logging.getLogger("mtpkit")

ASSETS = Path(__file__).resolve().parent / "assets" / "tiny_pair"
EPILOG = """Reproduces the shipped pair (about an hour on one CPU thread):
  mtpkit train-tiny --force
Quick smoke run into a scratch folder:
  mtpkit train-tiny --out /tmp/pair --target-steps 3 --drafter-steps 3 --max-train-files 4 --eval-prompts 1
"""
LICENSE_NOTE = """The weights and tokenizer in this folder were trained by `mtpkit train-tiny` on source files of the
Python standard library (listed with their sha256 in pair.json), which are distributed under the
Python Software Foundation License Agreement (https://docs.python.org/3/license.html).
Copyright (c) 2001 Python Software Foundation; All Rights Reserved. The trained files are
derived works provided under mtpkit's Apache-2.0 licence, with the PSF notice above retained.
"""


@dataclass(frozen=True)
class TrainConfig:
    out: Path = ASSETS
    vocab_size: int = 2048
    hidden: int = 128
    intermediate: int = 256  # doubled on the KV-shared layers (use_double_wide_mlp)
    sliding_window: int = 32  # far below seq_len so training and eval contexts cross it
    drafter_hidden: int = 128
    drafter_intermediate: int = 256
    num_centroids: int = 32
    centroid_top_k: int = 4  # clusters scanned per draft: top_k * vocab / num_centroids candidate tokens
    num_assistant_tokens: int = 4
    seq_len: int = 128
    prompt_len: int = 48  # drafter data: corpus prompt, then the target's greedy continuation to seq_len
    batch: int = 16
    drafter_batch: int = 16  # prompts per drafter step, each continued greedily by the target
    target_steps: int = 1600
    drafter_steps: int = 1500  # acceptance still rose at 700 steps (59.4% at position 1)
    target_lr: float = 2e-3
    drafter_lr: float = 1e-3
    warmup: int = 50
    centroid_weight: float = 0.5
    seed: int = 0
    threads: int = 1  # leave the other cores free; also keeps BLAS reductions reproducible
    max_train_files: int | None = None  # smoke runs only: fewer corpus files
    eval_prompts: int = 6  # per category
    eval_new_tokens: int = 64
    log_every: int = 50
    force: bool = False

    def __post_init__(self):
        object.__setattr__(self, "out", Path(self.out))
        for name in ("hidden", "intermediate", "drafter_hidden", "drafter_intermediate", "vocab_size"):
            if getattr(self, name) <= 0 or getattr(self, name) % 32:
                raise UsageError(f"{name} must be a positive multiple of 32, got {getattr(self, name)}")
        if self.vocab_size % self.num_centroids:
            raise UsageError(f"vocab_size {self.vocab_size} must be divisible by num_centroids {self.num_centroids}")
        if not 1 <= self.centroid_top_k <= self.num_centroids:
            raise UsageError(f"centroid_top_k must be in 1..{self.num_centroids}, got {self.centroid_top_k}")
        if not 2 <= self.prompt_len < self.seq_len - self.num_assistant_tokens:
            raise UsageError(f"need 2 <= prompt_len < seq_len - num_assistant_tokens, "
                             f"got {self.prompt_len}, {self.seq_len}")
        for name in ("target_steps", "drafter_steps", "batch", "drafter_batch", "threads", "eval_prompts",
                     "eval_new_tokens", "num_assistant_tokens", "sliding_window", "warmup", "log_every"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_train_files is not None and self.max_train_files < 1:
            raise UsageError(f"max_train_files must be >= 1, got {self.max_train_files}")

    def recorded(self) -> dict:
        """The config as pair.json records it: everything that changes the weights, not where they went."""
        return {k: v for k, v in asdict(self).items() if k not in ("out", "force")}


def train_tiny(cfg: TrainConfig) -> Path:
    """Train, write out/target and out/drafter (HF checkpoints), measure, write out/pair.json; return out."""
    import torch

    from mtpkit.export.scoped import import_quietly

    _prepare_out(cfg)
    import_quietly()
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _train_measure_write(cfg)
    finally:
        torch.set_num_threads(threads)  # a library call must not leave the caller's process single-threaded


def _train_measure_write(cfg: TrainConfig) -> Path:
    import torch

    from .training import corpus as corpus_mod

    torch.manual_seed(cfg.seed)
    start = time.time()
    corpus = corpus_mod.load_corpus(cfg.max_train_files)
    tokenizer = corpus_mod.train_tokenizer(corpus.train, cfg.vocab_size)
    train_ids, heldout_ids = corpus_mod.encode(tokenizer, corpus.train), corpus_mod.encode(tokenizer, corpus.heldout)
    log.info("corpus: %d train / %d held-out tokens (Python %s)", len(train_ids), len(heldout_ids),
             corpus.python_version)
    target, drafter, stats = _train_pair(cfg, train_ids, heldout_ids)
    tdir, ddir = _write_pair(cfg, target, drafter, tokenizer, stats["target_config"], stats["drafter_config"])
    figures = _measure(cfg, tdir, ddir, tokenizer, corpus.heldout)
    stats["params"] = {"target": _count(target), "drafter": _count(drafter)}
    stats["wall_seconds"] = round(time.time() - start, 1)
    _write_pair_json(cfg, corpus, stats, figures)
    return cfg.out


def _prepare_out(cfg: TrainConfig) -> None:
    parts = [cfg.out / "target", cfg.out / "drafter", cfg.out / "pair.json"]
    if any(p.exists() for p in parts) and not cfg.force:
        raise FileExistsError(f"{cfg.out} already holds a trained pair; pass --force to replace it")
    for p in parts:
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    cfg.out.mkdir(parents=True, exist_ok=True)


def _train_pair(cfg: TrainConfig, train_ids, heldout_ids):
    import torch
    from transformers import AutoConfig, Gemma4AssistantForCausalLM, Gemma4ForCausalLM

    from .training import configs, loops

    tcfg = configs.target_config(cfg.vocab_size, cfg.hidden, cfg.intermediate, cfg.sliding_window)
    target = Gemma4ForCausalLM(AutoConfig.for_model(**_no_arch(tcfg)))
    target.config._attn_implementation = "sdpa"
    target_stats = loops.train_target(target, train_ids, heldout_ids, cfg)
    for p in target.parameters():
        p.requires_grad_(False)
    # Clusters come from the target's embeddings: tokens the target treats alike share a centroid.
    ordering, cluster_of = configs.balanced_clusters(target.model.embed_tokens.weight, cfg.num_centroids, seed=cfg.seed)
    dcfg = configs.drafter_config(tcfg, cfg.drafter_hidden, cfg.drafter_intermediate, cfg.num_centroids,
                                  cfg.centroid_top_k)
    drafter = Gemma4AssistantForCausalLM(AutoConfig.for_model(**dcfg))
    drafter.config._attn_implementation = drafter.model.config._attn_implementation = "sdpa"
    with torch.no_grad():
        drafter.masked_embedding.token_ordering.copy_(ordering)
        if cfg.drafter_hidden == cfg.hidden:  # warm start: the target's output embedding is the best guess
            drafter.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
    drafter_stats = loops.train_drafter(drafter, target, train_ids, cluster_of, cfg)
    return target, drafter, {"target": target_stats, "drafter": drafter_stats, "target_config": tcfg,
                             "drafter_config": dcfg}


def _no_arch(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k != "architectures"}


def _write_pair(cfg: TrainConfig, target, drafter, tokenizer, tcfg: dict, dcfg: dict) -> tuple[Path, Path]:
    from mtpkit.export.checkpoint import write_checkpoint
    from .make import BOS_ID, END_OF_TURN_ID, EOS_ID, PAD_ID, _text_state, write_tokenizer

    tdir, ddir = cfg.out / "target", cfg.out / "drafter"
    target_gen = {"bos_token_id": BOS_ID, "pad_token_id": PAD_ID, "eos_token_id": [EOS_ID, END_OF_TURN_ID]}
    drafter_gen = {"num_assistant_tokens": cfg.num_assistant_tokens, "num_assistant_tokens_schedule": "constant"}
    write_checkpoint(tdir, tcfg, _text_state(target, "model."), target_gen)
    write_checkpoint(ddir, dcfg, dict(drafter.state_dict()), drafter_gen)
    for folder in (tdir, ddir):
        write_tokenizer(folder, tokenizer)
    (cfg.out / "LICENSE-DATA.txt").write_text(LICENSE_NOTE)
    return tdir, ddir


def _measure(cfg: TrainConfig, tdir: Path, ddir: Path, tokenizer, heldout: list[str]) -> dict:
    """Reload from disk with plain from_pretrained, so the figures are those of the shipped files."""
    from transformers import Gemma4AssistantForCausalLM, Gemma4ForCausalLM

    from .training.measure import eval_prompts, measure_pair

    target = Gemma4ForCausalLM.from_pretrained(tdir).eval()
    drafter = Gemma4AssistantForCausalLM.from_pretrained(ddir).eval()
    figures = measure_pair(target, drafter, tokenizer, eval_prompts(heldout, cfg.eval_prompts), cfg.eval_new_tokens)
    for cat, f in figures.items():
        if isinstance(f, dict):
            log.info("%s: acceptance@1 %.1f%%, %.2f tokens/target call, lossless %d/%d", cat,
                     100 * f["acceptance_pos1"], f["tokens_per_target_call"], f["lossless_prompts"], f["prompts"])
    return figures


def _count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def file_hashes(out: Path) -> dict:
    """sha256 of every shipped file except pair.json itself, keyed by path relative to out."""
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file() and p.name != "pair.json"}


def _write_pair_json(cfg: TrainConfig, corpus, stats: dict, figures: dict) -> None:
    import torch
    import transformers

    pair = {
        "description": "tiny Gemma 4 target + MTP drafter trained by `mtpkit train-tiny` on Python stdlib source",
        "command": "mtpkit train-tiny --force", "config": cfg.recorded(), "corpus": corpus.describe(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "params": stats.pop("params"), "wall_seconds": stats.pop("wall_seconds"), "training": stats,
        "figures": figures, "files": file_hashes(cfg.out),
    }
    (cfg.out / "pair.json").write_text(json.dumps(pair, indent=1) + "\n")


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.epilog = EPILOG
    p.add_argument("--out", type=Path, default=ASSETS, help=f"folder to write (default: the shipped {ASSETS})")
    p.add_argument("--force", action="store_true", help="replace a pair already in --out")
    skip = {"out", "force"}
    for f in fields(TrainConfig):
        if f.name in skip:
            continue
        kind = int if f.name == "max_train_files" else type(f.default)
        p.add_argument("--" + f.name.replace("_", "-"), type=kind, default=f.default,
                       help=f"(default {f.default})")


def run(args: argparse.Namespace) -> int:
    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    out = train_tiny(cfg)
    pair = json.loads((out / "pair.json").read_text())
    print(json.dumps({"out": str(out), "params": pair["params"], "wall_seconds": pair["wall_seconds"],
                      "figures": pair["figures"]}, indent=1))
    return 0
