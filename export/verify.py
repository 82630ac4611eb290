"""Graph-level parity at export time: every exported graph against the PyTorch models it came from.

prefill, decode and verify logits (and the final-norm hidden states the drafter reads) are compared with one
transformers forward over the whole sequence; draft logits and projected activations with the HF drafter fed
the same store-layer K/V. Logits: 1e-4 max abs in fp32 and 100% argmax agreement.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mtpkit.errors import MtpkitError

ATOL = 1e-4


@dataclass(frozen=True)
class GraphCheck:
    signature: str
    max_abs: float
    argmax_agree: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_abs <= self.tolerance and self.argmax_agree == 1.0


class GraphParityError(MtpkitError, RuntimeError):
    """An exported graph does not match PyTorch; the export is refused and removed."""


def _compare(name: str, got: np.ndarray, want: np.ndarray, logits: bool = True) -> GraphCheck:
    """Logits: ATOL absolute and argmax agreement. Hidden states: ATOL relative to their largest magnitude,
    because fp32 itself is about that far from fp64 on activations of magnitude ~4 (measured on tiny models)."""
    got, want = got.reshape(-1, got.shape[-1]), want.reshape(-1, want.shape[-1])
    if logits:
        return GraphCheck(name, float(np.abs(got - want).max()), float((got.argmax(-1) == want.argmax(-1)).mean()), ATOL)
    return GraphCheck(name, float(np.abs(got - want).max()), 1.0, ATOL * max(1.0, float(np.abs(want).max())))


def check_onnx(manifest, target, drafter, ids: list[int]) -> list[GraphCheck]:
    """Run prefill / decode / verify / draft through ONNX Runtime and compare with PyTorch."""
    import onnxruntime as ort

    backend = manifest.backend("onnx")
    sessions = {name: ort.InferenceSession(str(manifest.path(g.file)), providers=["CPUExecutionProvider"])
                for name, g in backend.graphs.items()}
    n = len(ids)
    with torch.no_grad():
        hf = target(torch.tensor([ids]), output_hidden_states=True, return_shared_kv_states=True, use_cache=False)
    ref_logits, ref_hidden = hf.logits[0].numpy(), hf.hidden_states[-1][0].numpy()
    checks = []
    # prefill all but the last 5 tokens, then verify 4 of them, then decode the last one
    split = [(0, n - 5, "prefill"), (n - 5, n - 1, "verify"), (n - 1, n, "decode")]
    kv = {d.layer: (np.zeros((1, d.kv_heads, 0, d.head_dim), np.float32),) * 2 for d in manifest.kv_layers}
    for start, end, name in split:
        sig = backend.signatures[name]
        feeds = _target_feeds(sig, manifest, ids[start:end], start, kv)
        out = dict(zip([o.name for o in sig.outputs], sessions[sig.graph].run(None, feeds)))
        checks.append(_compare(name, out[sig.output("logits").name], ref_logits[start:end]))
        checks.append(_compare(name + ".hidden_states", out[sig.output("activations").name], ref_hidden[start:end], logits=False))
        for layer in kv:
            k_new = out[sig.output("new_key", layer).name]
            v_new = out[sig.output("new_value", layer).name]
            kv[layer] = (np.concatenate([kv[layer][0], k_new], 2), np.concatenate([kv[layer][1], v_new], 2))
    checks += _check_draft(manifest, sessions, target, drafter, ids, hf)
    return checks


def _target_feeds(sig, manifest, ids, pos, kv) -> dict:
    window = manifest.model["sliding_window"] - 1
    types = {d.layer: d.type for d in manifest.kv_layers}
    feeds = {sig.input("input_ids").name: np.array([ids], np.int64), sig.input("input_pos").name: np.array([pos], np.int64)}
    for layer, (k, v) in kv.items():
        keep = k.shape[2] if types[layer] == "full_attention" else min(k.shape[2], window)
        feeds[sig.input("past_key", layer).name] = np.ascontiguousarray(k[:, :, k.shape[2] - keep:])
        feeds[sig.input("past_value", layer).name] = np.ascontiguousarray(v[:, :, v.shape[2] - keep:])
    return feeds


def _check_draft(manifest, sessions, target, drafter, ids, hf) -> list[GraphCheck]:
    """Two chained draft steps from the last prompt position, as transformers' candidate generator runs them."""
    sig = manifest.backend("onnx").signatures["draft"]
    shared = hf.shared_kv_states
    sliding_visible = manifest.model["sliding_window"] + 1  # HF's drafter sees the last W+1 sliding entries
    full_k, full_v = shared["full_attention"]
    sl_k, sl_v = (t[:, :, -sliding_visible:] for t in shared["sliding_attention"])
    token = int(hf.logits[0, -1].argmax())
    hidden = hf.hidden_states[-1][:, -1:]
    pos = torch.tensor([[len(ids)]])
    checks = []
    for step in range(2):
        with torch.no_grad():
            embeds = target.get_input_embeddings()(torch.tensor([[token]]))
            ref = drafter(inputs_embeds=torch.cat([embeds, hidden], -1), position_ids=pos,
                          shared_kv_states={"full_attention": (full_k, full_v), "sliding_attention": (sl_k, sl_v)})
        feeds = {sig.input("inputs_embeds").name: embeds.numpy(), sig.input("activations").name: hidden.numpy(),
                 sig.input("input_pos").name: np.array([len(ids)], np.int64),
                 sig.input("store_key", "full_attention").name: full_k.numpy(),
                 sig.input("store_value", "full_attention").name: full_v.numpy(),
                 sig.input("store_key", "sliding_attention").name: sl_k.numpy(),
                 sig.input("store_value", "sliding_attention").name: sl_v.numpy()}
        logits, projected = sessions[sig.graph].run([o.name for o in sig.outputs], feeds)
        checks.append(_compare(f"draft[{step}]", logits, ref.logits.numpy()))
        checks.append(_compare(f"draft[{step}].projected", projected, ref.last_hidden_state.numpy(), logits=False))
        token, hidden = int(ref.logits[0, -1].argmax()), ref.last_hidden_state
    return checks


def raise_on_failure(checks: list[GraphCheck]) -> None:
    bad = [c for c in checks if not c.ok]
    if bad:
        detail = "; ".join(f"{c.signature}: max|d|={c.max_abs:.2e}, argmax {c.argmax_agree:.0%}" for c in bad)
        raise GraphParityError(f"exported graphs do not match PyTorch (tolerance {ATOL}): {detail}")
