"""The single IO table: every graph tensor's name, role, shape and dtype is generated here and nowhere else.

The same table names the exported graph's inputs/outputs and fills manifest.json, so the runtime binds by
role and never formats a tensor name itself.
"""

from __future__ import annotations

from mtpkit.runtime.manifest import Signature, TensorSpec

# ONNX names follow the Optimum / ORT-GenAI convention.
ONNX_PAST = "past_key_values.{layer}.{kind}"
ONNX_PRESENT = "present.{layer}.{kind}"


def _past_dim(layer_type: str) -> str:
    return "past_sliding" if layer_type == "sliding_attention" else "past_full"


def target_io(kv_layers: list[dict], hidden: int, vocab: int) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Target step: (input_ids [1,T], input_pos [1], past windows) -> logits, hidden_states, new K/V."""
    inputs = [TensorSpec("input_ids", "input_ids", [1, "T"], "int64"),
              TensorSpec("input_pos", "input_pos", [1], "int64")]
    outputs = [TensorSpec("logits", "logits", [1, "T", vocab], "float32"),
               TensorSpec("hidden_states", "hidden_states", [1, "T", hidden], "float32")]
    for d in kv_layers:
        for kind in ("key", "value"):
            shape = [1, d["kv_heads"], _past_dim(d["type"]), d["head_dim"]]
            inputs.append(TensorSpec(ONNX_PAST.format(layer=d["layer"], kind=kind), f"past_{kind}", shape,
                                     "float32", d["layer"]))
            outputs.append(TensorSpec(ONNX_PRESENT.format(layer=d["layer"], kind=kind), f"present_{kind}",
                                      [1, d["kv_heads"], "T", d["head_dim"]], "float32", d["layer"]))
    return inputs, outputs


def drafter_io(store: dict[str, dict], hidden: int, vocab: int) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Drafter step: store-layer K/V are read-only inputs named after the target layer they come from."""
    inputs = [TensorSpec("inputs_embeds", "inputs_embeds", [1, 1, hidden], "float32"),
              TensorSpec("activations", "activations", [1, 1, hidden], "float32"),
              TensorSpec("input_pos", "input_pos", [1], "int64")]
    for layer_type in ("full_attention", "sliding_attention"):
        d = store[layer_type]
        short = layer_type.split("_")[0]
        for kind in ("key", "value"):
            inputs.append(TensorSpec(f"{short}_{kind}", f"{short}_{kind}",
                                     [1, d["kv_heads"], f"{short}_len", d["head_dim"]], "float32", d["layer"]))
    outputs = [TensorSpec("logits", "logits", [1, 1, vocab], "float32"),
               TensorSpec("projected_activations", "projected_activations", [1, 1, hidden], "float32")]
    return inputs, outputs


def onnx_signatures(kv_layers: list[dict], store: dict[str, dict], hidden: int, vocab: int) -> dict[str, Signature]:
    """One dynamic-T target graph serves prefill, decode and verify; the drafter graph serves draft."""
    t_in, t_out = target_io(kv_layers, hidden, vocab)
    d_in, d_out = drafter_io(store, hidden, vocab)
    return {
        "prefill": Signature("target", t_in, t_out, None),
        "decode": Signature("target", t_in, t_out, 1),
        "verify": Signature("target", t_in, t_out, None),
        "draft": Signature("drafter", d_in, d_out, 1),
    }
