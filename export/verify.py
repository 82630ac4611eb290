"""Graph-level parity at export time: every exported graph against the PyTorch models it came from.

prefill, decode and verify logits (and the final-norm hidden states the drafter reads) are compared with one
transformers forward over the whole sequence; draft logits and projected activations with the HF drafter fed
the same store-layer K/V. Logits: 1e-4 max abs in fp32, or NOISE_FACTOR times PyTorch's own sensitivity to rounding
(the same forward with every Linear output moved by up to one fp32 ulp, seeded) when that is larger; every argmax
agrees, or the reference's two candidates lie within that tolerance (a near-tie).

Why the noise floor: a deep model with random weights amplifies fp32 rounding, so on the full-size random E2B a
fixed 1e-4 can only fail (ONNX Runtime vs PyTorch: 0.32 on 600-token prefill logits, docs/scale-bench.md), while
on the tiny and trained models the floor is far below 1e-4 and 1e-4 stays the bar. The noise is measured by
jitter, not by re-running PyTorch at another thread count, which moves the sums only when MKL happens to block
them differently.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mtpkit.errors import MtpkitError

from .lattice import srq
from .mapped import CHECKPOINT, GRAPHS, page_out
from .scoped import patched

ATOL = 1e-4
# ONNX Runtime vs PyTorch may differ this many times PyTorch vs its jittered self (random full-size E2B, 600
# tokens: 1.6x on logits and on final hidden states; docs/scale-bench.md, "Full-size exports")
NOISE_FACTOR = 4
JITTER = 2.0 ** -23  # relative: one fp32 ulp, what a different summation order costs a Linear's output
# before a static int8 rounding (export/lattice/srq.py): enough to move a few values across a rounding boundary, as
# another kernel's summation order does (the trained tiny pair snapped to a lattice: 2^-19 moves none, 2^-17 some)
ROUNDING_JITTER = 2.0 ** -17


@dataclass(frozen=True)
class GraphCheck:
    signature: str
    max_abs: float
    argmax_agree: float
    tolerance: float
    flips: int = 0  # positions whose argmax differs from the reference's
    near_ties: int = 0  # of those, where the reference's two candidates are within tolerance of each other
    reference_noise: float = 0.0  # PyTorch vs itself under one ulp of jitter (0: not measured)
    backend: str = "onnx"  # whose graph this was

    @property
    def ok(self) -> bool:
        return self.max_abs <= self.tolerance and self.near_ties == self.flips


class GraphParityError(MtpkitError, RuntimeError):
    """An exported graph does not match PyTorch; the export is refused and removed."""


def _compare(name: str, got: np.ndarray, want: np.ndarray, logits: bool = True, noise: float = 0.0,
             backend: str = "onnx") -> GraphCheck:
    """Logits: ATOL absolute (or NOISE_FACTOR x the reference's own noise) and argmax agreement up to near-ties.
    Hidden states: the same relative to their largest magnitude, because fp32 itself is about ATOL from fp64 on
    activations of magnitude ~4 (measured on tiny models)."""
    got, want = got.reshape(-1, got.shape[-1]), want.reshape(-1, want.shape[-1])
    max_abs = float(np.abs(got - want).max())
    if not logits:
        scale = max(1.0, float(np.abs(want).max()))
        return GraphCheck(name, max_abs, 1.0, max(ATOL * scale, NOISE_FACTOR * noise), reference_noise=noise,
                          backend=backend)
    tolerance = max(ATOL, NOISE_FACTOR * noise)
    chosen, best = got.argmax(-1), want.argmax(-1)
    rows = np.flatnonzero(chosen != best)
    gap = want[rows, best[rows]] - want[rows, chosen[rows]]  # how far the graph's pick is below the reference's
    return GraphCheck(name, max_abs, float((chosen == best).mean()), tolerance, flips=len(rows),
                      near_ties=int((gap <= tolerance).sum()), reference_noise=noise, backend=backend)


def check_runtime(manifest, kind: str, target, drafter, ids: list[int]) -> list[GraphCheck]:
    """A backend's graphs as mtpkit's runtime drives them (the Target / Drafter Protocols), against PyTorch with
    the same splits and tolerances as check_onnx. A backend whose prefill returns only its last row (LiteRT's
    chunked static prefill) is compared on the rows it returns; its prefill graphs are also checked through the
    KV cache they write, which every later call reads."""
    from mtpkit.runtime.backends import LoadOptions, open_backend

    # one-off float runs: no packed copy of the weights
    graph_target, graph_drafter = open_backend(manifest, kind, threads=1, options=LoadOptions(pack_weights=False))
    hf, ref_logits, ref_hidden, noise = _reference(target, ids)
    checks = []
    for start, end, name in _split(len(ids)):
        logits, hidden = graph_target.forward(ids[start:end], start)
        rows = slice(end - len(logits), end)
        checks.append(_compare(name, logits, ref_logits[rows], noise=noise[0], backend=kind))
        checks.append(_compare(name + ".hidden_states", hidden, ref_hidden[rows], logits=False, noise=noise[1],
                               backend=kind))
    page_out(*GRAPHS)
    for layer_type, layer in manifest.kv_cache.drafter_layers.items():  # the drafter reads PyTorch's K/V, as
        # check_onnx feeds it: the target graph's own differ by its rounding noise, amplified at full size
        graph_target.kv.write(layer, *(t.numpy() for t in hf.shared_kv_states[layer_type]))
    view = graph_target.kv.drafter_view(len(ids), "clean")
    for step, (token, hidden, ref) in enumerate(_draft_reference(manifest, target, drafter, ids, hf)):
        logits, projected = graph_drafter.step(token, hidden.numpy().reshape(-1), len(ids), view)
        checks.append(_compare(f"draft[{step}]", logits[None], ref.logits.numpy(), backend=kind))
        checks.append(_compare(f"draft[{step}].projected", projected[None], ref.last_hidden_state.numpy(),
                               logits=False, backend=kind))
    return checks


def _split(n: int) -> list[tuple[int, int, str]]:
    """Prefill all but the last 5 tokens, then verify 4 of them, then decode the last one."""
    return [(0, n - 5, "prefill"), (n - 5, n - 1, "verify"), (n - 1, n, "decode")]


def _reference(target, ids: list[int]):
    """PyTorch's forward over the whole sequence: (output, logits, final hidden states, reference noise)."""
    with torch.no_grad():
        hf = target(torch.tensor([ids]), output_hidden_states=True, return_shared_kv_states=True, use_cache=False)
    ref_logits, ref_hidden = hf.logits[0].numpy(), hf.hidden_states[-1][0].numpy()
    noise = _reference_noise(target, ids, ref_logits, ref_hidden)
    page_out(*CHECKPOINT)  # the model's pages leave the resident set before the graph's come in (export/mapped.py)
    return hf, ref_logits, ref_hidden, noise


def _reference_noise(target, ids: list[int], logits: np.ndarray, hidden: np.ndarray) -> tuple[float, float]:
    """(logits, hidden states): how far PyTorch's own forward moves when every Linear output, and every value a
    checkpoint's static activation scale rounds (export/lattice/srq.py) before it rounds, is scaled by
    1 + u * JITTER (ROUNDING_JITTER), u uniform in [-1, 1) from a fixed seed: the model's amplification of
    rounding-sized error. Whether static roundings are all in the graphs is checked by tests, not by this bound."""
    generator = torch.Generator().manual_seed(0)

    def jitter(module, args, out):
        return out * (1 + JITTER * (2 * torch.rand(out.shape, generator=generator) - 1))

    def jittered_rounding(x, scale):  # a static int8 rounding sees its input's error before it rounds
        return rounded(x * (1 + ROUNDING_JITTER * (2 * torch.rand(x.shape, generator=generator) - 1)), scale)

    rounded = srq.rounded
    hooks = [m.register_forward_hook(jitter) for m in target.modules() if isinstance(m, torch.nn.Linear)]
    try:
        with torch.no_grad(), patched(srq, "rounded", jittered_rounding):
            again = target(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return (float(np.abs(again.logits[0].numpy() - logits).max()),
            float(np.abs(again.hidden_states[-1][0].numpy() - hidden).max()))


def _store_kv(manifest, hf) -> tuple:
    """The store layers' K/V the drafter sees: all full-attention entries, the last W+1 sliding ones (as HF)."""
    shared = hf.shared_kv_states
    sliding_visible = manifest.model.sliding_window + 1
    full_k, full_v = shared["full_attention"]
    sl_k, sl_v = (t[:, :, -sliding_visible:] for t in shared["sliding_attention"])
    return full_k, full_v, sl_k, sl_v


def _draft_reference(manifest, target, drafter, ids, hf, steps: int = 2):
    """(token, activations, HF drafter output) per chained draft step at position len(ids); each step is fed the
    previous reference step's token and projected activations."""
    full_k, full_v, sl_k, sl_v = _store_kv(manifest, hf)
    token, hidden, pos = int(hf.logits[0, -1].argmax()), hf.hidden_states[-1][:, -1:], torch.tensor([[len(ids)]])
    for _ in range(steps):
        with torch.no_grad():
            embeds = target.get_input_embeddings()(torch.tensor([[token]]))
            ref = drafter(inputs_embeds=torch.cat([embeds, hidden], -1), position_ids=pos,
                          shared_kv_states={"full_attention": (full_k, full_v), "sliding_attention": (sl_k, sl_v)})
        yield token, hidden, ref
        token, hidden = int(ref.logits[0, -1].argmax()), ref.last_hidden_state


def raise_on_failure(checks: list[GraphCheck]) -> None:
    bad = [c for c in checks if not c.ok]
    if bad:
        detail = "; ".join(f"{c.backend} {c.signature}: max|d|={c.max_abs:.2e} (tolerance {c.tolerance:.1e}), argmax "
                           f"{c.argmax_agree:.0%}, {c.flips - c.near_ties} flip(s) beyond a near-tie" for c in bad)
        raise GraphParityError(f"exported graphs do not match PyTorch: {detail}")
