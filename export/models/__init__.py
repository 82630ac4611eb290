"""One adapter per model family, each with the same names (mlx-lm style): MODEL_TYPES, load, a step module, and
fused_ops(model), the scoped patch under which the step calls export/backends/onnx/fused_ops.py's fusable custom
ops.

Nothing outside this package branches on model_type.
"""

from __future__ import annotations

from types import ModuleType

from ..checkpoint import CheckpointError, Source
from . import gemma4_assistant, gemma4_text

TARGETS: dict[str, ModuleType] = {t: gemma4_text for t in gemma4_text.MODEL_TYPES}
DRAFTERS: dict[str, ModuleType] = {t: gemma4_assistant for t in gemma4_assistant.MODEL_TYPES}


def target_adapter(source: Source) -> ModuleType:
    return _pick(TARGETS, source, "target", "a Gemma 4 target (model_type gemma4 or gemma4_text)")


def drafter_adapter(source: Source) -> ModuleType:
    return _pick(DRAFTERS, source, "drafter", "a Gemma 4 MTP drafter (model_type gemma4_assistant)")


def model_type(source: Source) -> str | None:
    """The checkpoint's config model_type, as the manifest's source entry records it."""
    return source.config.get("model_type")


def _pick(table: dict, source: Source, role: str, wanted: str) -> ModuleType:
    kind = model_type(source)
    if kind not in table:
        raise CheckpointError(f"{role} {source.ref} has model_type {kind!r}; mtpkit needs {wanted}")
    return table[kind]
