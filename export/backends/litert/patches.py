"""Scoped workarounds for defects of litert-torch 0.10.0 (with transformers 5.24) that the LiteRT export hits.

Each patch is a context manager that restores what it replaced on exit, so importing mtpkit never changes
litert-torch globally. tests/test_litert_export.py checks, per patch, that the upstream defect still exists
(so a fixed upstream release makes a test fail and the patch can be dropped) and that the patch is undone.
The patches are numbered B1-B9; docs/design.md says what each is for.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import sys
import types

from ...scoped import patched

# The modules litert-torch 0.10.0 imports from tensorflow without declaring the dependency (B1).
_TF_SCHEMA = "tensorflow.lite.python.schema_py_generated"
_TF_PACKAGES = ("tensorflow", "tensorflow.lite", "tensorflow.lite.python")


def _tensorflow_installed() -> bool:
    if "tensorflow" in sys.modules:
        return getattr(sys.modules["tensorflow"], "__mtpkit_alias__", False) is False
    return importlib.util.find_spec("tensorflow") is not None


@contextlib.contextmanager
def tensorflow_schema_alias():
    """B1 (litert-torch 0.10.0): `import litert_torch.generative.export_hf.export` fails: No module named tensorflow.

    model_ext/bonsai_flux2/bonsai_flux2.py:41 and generative/layers/lora.py:32 import tensorflow's tflite schema
    module, which ai-edge-litert ships as ai_edge_litert.schema_py_generated. We alias it for the import only.
    The package stubs need a ModuleSpec: torch._dynamo.trace_rules raises "tensorflow.__spec__ is None" otherwise.
    """
    if _tensorflow_installed():
        yield
        return
    from ai_edge_litert import schema_py_generated

    added = []
    for name in _TF_PACKAGES:
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            stub.__path__ = []
            stub.__mtpkit_alias__ = True
            sys.modules[name] = stub
            added.append(name)
    if _TF_SCHEMA not in sys.modules:
        sys.modules[_TF_SCHEMA] = schema_py_generated
        added.append(_TF_SCHEMA)
    try:
        yield
    finally:
        for name in added:
            sys.modules.pop(name, None)


def import_export_hf():
    """Import litert-torch's HF exporter (needs B1). Modules stay cached in sys.modules afterwards."""
    with tensorflow_schema_alias():
        from litert_torch.generative.export_hf import export as export_mod
        from litert_torch.generative.export_hf.core import attention  # noqa: F401  registers lrt_transposed_attention
        from litert_torch.generative.export_hf.core import exportable_module
        from litert_torch.generative.export_hf.model_ext.gemma4 import exportable_module as gemma4_exportable
        from litert_torch.generative.export_hf.model_ext.gemma4 import patch as gemma4_patch
    return types.SimpleNamespace(export=export_mod, exportable_module=exportable_module,
                                 gemma4_exportable=gemma4_exportable, gemma4_patch=gemma4_patch)


@contextlib.contextmanager
def experts_flag():
    """B2 (litert-torch 0.10.0 + transformers 5.24): loading any Gemma 4 under litert-torch's patch raises
    "ValueError: LiteRTGemma4TextModel does not support setting experts implementation".

    transformers decides by grepping the class's module source for '@use_experts_implementation'
    (modeling_utils.py _can_set_experts_implementation); litert-torch's subclass lives in a module without it.
    Gemma4TextModel itself supports it, so we state the cached answer for the subclass.
    """
    cls = import_export_hf().gemma4_patch.LiteRTGemma4TextModel
    with patched(cls, "_can_set_experts_implementation_cached_value", True):
        yield


@contextlib.contextmanager
def verify_mask_dtype():
    """B3 (litert-torch 0.10.0): the `verify` signature's mask is traced as torch.bool
    (core/exportable_module.py, LiteRTExportableModuleForDecoderOnlyLMGenerate.get_sample_inputs) while the CPU
    attention adds the mask to the logits: verify logits were off by 3.7. We give verify the decode mask's dtype.
    """
    cls = import_export_hf().exportable_module.LiteRTExportableModuleForDecoderOnlyLMGenerate
    original = cls.get_sample_inputs

    def get_sample_inputs(self, model_config, *args, **kwargs):
        graphs = original(self, model_config, *args, **kwargs)
        if "verify" in graphs and "decode" in graphs:
            inputs, shapes = graphs["verify"]
            dtype = graphs["decode"][0]["mask"].dtype
            graphs["verify"] = ({**inputs, "mask": inputs["mask"].to(dtype)}, shapes)
        return graphs

    with patched(cls, "get_sample_inputs", get_sample_inputs):
        yield


def _external_embedder_decode_forward(self, embeddings, per_layer_embeddings, input_pos, kv_cache, mask, **kwargs):
    """litert-torch 0.10.0's external-embedder decode forward plus `activations` (B4) and the soft-cap (B9)."""
    import torch

    kwargs.update(self.composite_flags())
    inputs = self.adapt_inputs(None, embeddings, per_layer_embeddings, input_pos, kv_cache, mask,
                               use_bool_mask=self.export_config.extra_kwargs.get("use_bool_mask", False), **kwargs)
    text_config = self.model.config.text_config
    inputs["past_key_values"] = inputs["past_key_values"].insert_dummy_cache_layers(text_config)
    inputs |= self.attention_kwargs()
    output = self.model.model.language_model(**inputs)
    hidden = output.last_hidden_state  # post final norm: what HF hands the drafter as hidden_states[-1]
    logits = self.model.lm_head(hidden)
    cap = getattr(text_config, "final_logit_softcapping", None)
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    kv_cache = output.past_key_values.remove_dummy_cache_layers(text_config)
    out = {"kv_cache": kv_cache, "logits": logits}
    if self.export_verifier:
        out["activations"] = hidden
    return out


@contextlib.contextmanager
def external_embedder_decode_outputs():
    """B4 + B9 (litert-torch 0.10.0), model_ext/gemma4/exportable_module.py
    LiteRTExportableModuleForDecoderOnlyLMGenerateExternalEmbedder.forward (the Gemma 4 per-layer-embedding path):
    B4: it never returns `activations`, so decode/verify lack the drafter input and LiteRT-LM cannot run MTP.
    B9: it applies lm_head without Gemma 4's final_logit_softcapping (HF's Gemma4ForConditionalGeneration.forward
    applies tanh(x/cap)*cap), so its logits differ from transformers'.
    """
    cls = import_export_hf().gemma4_exportable.LiteRTExportableModuleForDecoderOnlyLMGenerateExternalEmbedder
    with patched(cls, "forward", _external_embedder_decode_forward):
        yield


@contextlib.contextmanager
def litert_workarounds():
    """All workarounds mtpkit needs to export Gemma 4 with litert-torch 0.10.0, undone on exit."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(tensorflow_schema_alias())
        import_export_hf()
        stack.enter_context(experts_flag())
        stack.enter_context(verify_mask_dtype())
        stack.enter_context(external_embedder_decode_outputs())
        yield
