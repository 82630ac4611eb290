"""The ONNX graph check: the float graphs against PyTorch, session by session, through ONNX Runtime."""

from __future__ import annotations

import numpy as np
import torch

from mtpkit.runtime.manifest import Manifest

from ...mapped import GRAPHS, page_out
from ...verify import GraphCheck, _compare, _draft_reference, _reference, _split, _store_kv
from .. import ExportJob


def check(manifest: Manifest, job: ExportJob, ids: list[int]) -> list:
    """The float graphs against PyTorch, session by session (export/verify.py's comparison)."""
    return check_onnx(manifest, job.target, job.drafter, ids)


def check_onnx(manifest, target, drafter, ids: list[int]) -> list[GraphCheck]:
    """Run prefill / decode / verify / draft through ONNX Runtime and compare with PyTorch."""
    import onnxruntime as ort

    from mtpkit.runtime.backends import LoadOptions
    from mtpkit.runtime.backends.onnx import session_options

    backend = manifest.backend("onnx")
    unpacked = session_options(LoadOptions(pack_weights=False))  # one-off float sessions: no packed weight copy
    sessions = {name: ort.InferenceSession(str(manifest.path(g.file)), unpacked,
                                           providers=["CPUExecutionProvider"])
                for name, g in backend.graphs.items()}
    hf, ref_logits, ref_hidden, noise = _reference(target, ids)
    checks = []
    kv = {d.layer: (np.zeros((1, d.kv_heads, 0, d.head_dim), np.float32),) * 2 for d in manifest.kv_layers}
    for start, end, name in _split(len(ids)):
        sig = backend.signatures[name]
        feeds = _target_feeds(sig, manifest, ids[start:end], start, kv)
        out = dict(zip([o.name for o in sig.outputs], sessions[sig.graph].run(None, feeds)))
        checks.append(_compare(name, out[sig.output("logits").name], ref_logits[start:end], noise=noise[0]))
        checks.append(_compare(name + ".hidden_states", out[sig.output("activations").name], ref_hidden[start:end],
                               logits=False, noise=noise[1]))
        for layer in kv:
            k_new = out[sig.output("new_key", layer).name]
            v_new = out[sig.output("new_value", layer).name]
            kv[layer] = (np.concatenate([kv[layer][0], k_new], 2), np.concatenate([kv[layer][1], v_new], 2))
    page_out(*GRAPHS)
    checks += _check_draft(manifest, sessions, target, drafter, ids, hf)
    return checks


def _target_feeds(sig, manifest, ids, pos, kv) -> dict:
    window = manifest.model.sliding_window - 1
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
    full_k, full_v, sl_k, sl_v = _store_kv(manifest, hf)
    checks = []
    for step, (token, hidden, ref) in enumerate(_draft_reference(manifest, target, drafter, ids, hf)):
        with torch.no_grad():
            embeds = target.get_input_embeddings()(torch.tensor([[token]]))
        feeds = {sig.input("inputs_embeds").name: embeds.numpy(), sig.input("activations").name: hidden.numpy(),
                 sig.input("input_pos").name: np.array([len(ids)], np.int64),
                 sig.input("store_key", "full_attention").name: full_k.numpy(),
                 sig.input("store_value", "full_attention").name: full_v.numpy(),
                 sig.input("store_key", "sliding_attention").name: sl_k.numpy(),
                 sig.input("store_value", "sliding_attention").name: sl_v.numpy()}
        logits, projected = sessions[sig.graph].run([o.name for o in sig.outputs], feeds)
        checks.append(_compare(f"draft[{step}]", logits, ref.logits.numpy()))
        checks.append(_compare(f"draft[{step}].projected", projected, ref.last_hidden_state.numpy(), logits=False))
    return checks
