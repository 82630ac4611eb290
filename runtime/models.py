"""Target and drafter over a GraphSession: the only place that knows the graphs' roles.

Target.forward(ids, pos) runs prefill / decode / verify and writes the new K/V into the KVCache.
Drafter.step(token, hidden, pos, view) runs one draft step against a fixed K/V view.
"""

from __future__ import annotations

import numpy as np

from .kv_cache import KVCache
from .manifest import Manifest
from .session import GraphSession


class Embeddings:
    """The target's scaled token embedding, looked up on the host in the table the target graph also uses."""

    def __init__(self, manifest: Manifest):
        e = manifest.embedding
        self.table = np.memmap(manifest.path(e["file"]), dtype=np.dtype(e["dtype"]), mode="r",
                               offset=int(e.get("offset", 0)), shape=tuple(e["shape"]))
        self.scale = np.float32(e["scale"])

    def __call__(self, token: int) -> np.ndarray:
        return (np.asarray(self.table[token], np.float32) * self.scale).reshape(1, 1, -1)


class Target:
    max_draft = None  # dynamic T: any draft length fits in one verify call

    def __init__(self, session: GraphSession, kv: KVCache):
        self.session = session
        self.kv = kv
        self.layers = list(kv.buffers)
        self.calls = 0

    def positions_needed(self, prompt_len: int, max_new_tokens: int) -> int:
        return prompt_len + max_new_tokens

    def forward(self, ids: list[int], pos: int) -> tuple[np.ndarray, np.ndarray]:
        """Run the target on ids at positions pos..; returns logits [T, V] and final-norm hidden [T, H]."""
        self.kv.check_room(pos, len(ids))
        signature = "decode" if len(ids) == 1 else "verify" if pos else "prefill"
        feeds = {("input_ids", None): np.asarray([ids], np.int64), ("input_pos", None): np.asarray([pos], np.int64)}
        for layer in self.layers:
            feeds[("past_key", layer)], feeds[("past_value", layer)] = self.kv.past(layer, pos)
        out = self.session.run(signature, feeds)
        for layer in self.layers:
            self.kv.write(layer, pos, out[("present_key", layer)], out[("present_value", layer)])
        self.kv.last.start, self.kv.last.end = pos, pos + len(ids)
        self.calls += 1
        return out[("logits", None)][0], out[("hidden_states", None)][0]


class Drafter:
    def __init__(self, session: GraphSession, embeddings: Embeddings):
        self.session = session
        self.embed = embeddings
        sig = session.backend.signatures["draft"]
        self.kv_roles = [t.key for t in sig.inputs if t.role.endswith(("_key", "_value"))]
        self.calls = 0

    def step(self, token: int, hidden: np.ndarray, pos: int, view: dict) -> tuple[np.ndarray, np.ndarray]:
        """One draft step; returns logits [V] and the projected activations [H] fed back next step."""
        feeds = {("inputs_embeds", None): self.embed(token), ("activations", None): hidden.reshape(1, 1, -1),
                 ("input_pos", None): np.asarray([pos], np.int64)}
        for role, layer in self.kv_roles:
            layer_type, kind = role.split("_")
            k, v = view[f"{layer_type}_attention"]
            feeds[(role, layer)] = k if kind == "key" else v
        out = self.session.run("draft", feeds)
        self.calls += 1
        return out[("logits", None)][0, -1], out[("projected_activations", None)][0, -1]
