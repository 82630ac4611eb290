"""Training loops: the target (next-token LM on the corpus) and the drafter (distillation from the target).

Everything runs on CPU in float32 with a seeded generator per loop, so a rerun with the same config and the
same Python stdlib reproduces the same weights (up to BLAS summation order).
"""

from __future__ import annotations

import logging
import math
import time

import torch
import torch.nn.functional as F

from ..make import BOS_ID

log = logging.getLogger("mtpkit")


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warmup then cosine decay to 10% of the peak: the usual recipe, robust for short runs."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def sample_chunks(ids: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """Random windows of the token stream; half start with <bos> so prompts with and without it are in domain."""
    starts = torch.randint(0, len(ids) - length, (batch,), generator=gen)
    chunks = torch.stack([ids[s:s + length] for s in starts.tolist()])
    with_bos = torch.rand(batch, generator=gen) < 0.5
    chunks[with_bos, 0] = BOS_ID
    return chunks


def _step(opt, params, loss, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()


def lm_loss(model, chunks: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=chunks[:, :-1], use_cache=False).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunks[:, 1:].reshape(-1))


def train_target(model, train_ids, heldout_ids, cfg) -> dict:
    """Next-token cross-entropy on random corpus windows; returns the loss curve and held-out loss."""
    gen = torch.Generator().manual_seed(cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.target_lr, betas=(0.9, 0.95), weight_decay=0.01)
    model.train()
    curve, start = [], time.time()
    for step in range(cfg.target_steps):
        loss = lm_loss(model, sample_chunks(train_ids, cfg.batch, cfg.seq_len + 1, gen))
        _step(opt, params, loss, lr_at(step, cfg.target_steps, cfg.target_lr, cfg.warmup))
        if step % cfg.log_every == 0 or step == cfg.target_steps - 1:
            curve.append([step, round(loss.item(), 4)])
            log.info("target step %d/%d loss %.3f (%.0f s)", step, cfg.target_steps, loss.item(), time.time() - start)
    model.eval()
    return {"loss_curve": curve, "heldout_loss": heldout_loss(model, heldout_ids, cfg.seq_len),
            "seconds": round(time.time() - start, 1)}


@torch.no_grad()
def heldout_loss(model, ids: torch.Tensor, length: int) -> float:
    n = (len(ids) - 1) // length
    chunks = ids[: n * length + 1]
    xs = torch.stack([chunks[i * length: i * length + length + 1] for i in range(n)])
    return round(sum(lm_loss(model, xs[i:i + 16]).item() * len(xs[i:i + 16]) for i in range(0, n, 16)) / n, 4)


@torch.no_grad()
def greedy_continue(model, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """The target's own greedy continuation: the text the drafter has to predict at inference time."""
    out = model(input_ids=prompts, use_cache=True)
    cache, seq = out.past_key_values, [prompts, out.logits[:, -1:].argmax(-1)]
    for _ in range(new_tokens - 1):
        out = model(input_ids=seq[-1], past_key_values=cache, use_cache=True)
        seq.append(out.logits[:, -1:].argmax(-1))
    return torch.cat(seq, dim=1)


@torch.no_grad()
def teacher_pass(target, seqs: torch.Tensor):
    """Final-norm hidden states and store-layer K/V of a full teacher-forced target run."""
    out = target(input_ids=seqs, use_cache=False, output_hidden_states=True, return_shared_kv_states=True)
    kv = {k: (v[0].detach(), v[1].detach()) for k, v in out.shared_kv_states.items()}
    return out.hidden_states[-1].detach(), kv


def draft_masks(positions: torch.Tensor, seq_len: int, window: int, batch: int) -> dict:
    """What the drafter sees at inference for a round whose newest token is at p ("clean" hand-over):
    full layer: target K/V of all positions < p; sliding layer: the last W+1 positions < p."""
    kv = torch.arange(seq_len)[None, :]
    p = positions[:, None]
    full = kv < p
    sliding = full & (kv >= p - (window + 1))
    expand = lambda m: m[None, None].expand(batch, 1, *m.shape)  # noqa: E731 - [B, 1, Q, S] boolean, True = attend
    return {"full_attention": expand(full), "sliding_attention": expand(sliding)}


def drafter_unroll(drafter, embed, seqs, hidden, kv, positions, k: int, window: int, cluster_of):
    """Run the drafter K steps exactly as HF's get_candidates does, for many rounds at once.

    Round at p: step 1 input = (scaled target embedding of seqs[p], target hidden at p-1), constant
    position id p; step i+1 feeds back the drafter's projected state and the target's greedy token seqs[p+i].
    Returns per-step (token CE, centroid CE, top-1 accuracy).
    """
    batch, seq_len = seqs.shape
    masks = draft_masks(positions, seq_len, window, batch)
    pos_ids = positions[None].expand(batch, -1)
    tok, h, stats = seqs[:, positions], hidden[:, positions - 1], []
    for i in range(k):
        x = drafter.pre_projection(torch.cat([embed(tok), h], dim=-1))
        out = drafter.model(inputs_embeds=x, position_ids=pos_ids, attention_mask=masks, shared_kv_states=kv,
                            use_cache=False, logits_to_keep=None)  # None: HF's int-only query slicing would drop rows
        h_n = out.last_hidden_state
        label = seqs[:, positions + i + 1]
        logits = drafter.lm_head(h_n)
        ce = F.cross_entropy(logits.flatten(0, 1), label.flatten())
        cent = F.cross_entropy(drafter.masked_embedding.centroids(h_n).flatten(0, 1), cluster_of[label].flatten())
        stats.append((ce, cent, (logits.argmax(-1) == label).float().mean()))
        h, tok = drafter.post_projection(h_n), label
    return stats


def train_drafter(drafter, target, train_ids, cluster_of, cfg) -> dict:
    """Distil the target's greedy continuations into the drafter, unrolled over K draft steps."""
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.drafter_lr, betas=(0.9, 0.95), weight_decay=0.01)
    embed, window, k = target.get_input_embeddings(), target.config.sliding_window, cfg.num_assistant_tokens
    positions = torch.arange(cfg.prompt_len - 1, cfg.seq_len - k)
    drafter.train()
    curve, start = [], time.time()
    for step in range(cfg.drafter_steps):
        prompts = sample_chunks(train_ids, cfg.drafter_batch, cfg.prompt_len, gen)
        seqs = greedy_continue(target, prompts, cfg.seq_len - cfg.prompt_len)
        hidden, kv = teacher_pass(target, seqs)
        stats = drafter_unroll(drafter, embed, seqs, hidden, kv, positions, k, window, cluster_of)
        loss = sum(ce + cfg.centroid_weight * cent for ce, cent, _ in stats) / k
        _step(opt, params, loss, lr_at(step, cfg.drafter_steps, cfg.drafter_lr, cfg.warmup))
        if step % cfg.log_every == 0 or step == cfg.drafter_steps - 1:
            acc = [round(a.item(), 3) for _, _, a in stats]
            curve.append([step, round(loss.item(), 4), acc])
            log.info("drafter step %d/%d loss %.3f acc@1..%d %s (%.0f s)", step, cfg.drafter_steps, loss.item(), k,
                     acc, time.time() - start)
    drafter.eval()
    return {"loss_curve": curve, "seconds": round(time.time() - start, 1)}
