"""LiteRT export: target via litert-torch's export_hf, the MTP drafter by hand, a .litertlm bundle with both.

export_litert() writes into an existing folder and returns a JSON-able description of every signature (tensor
names, shapes, dtypes and roles), so a runtime binds by role and never parses names or shapes. The drafter is
exported in LiteRT-LM's drafter contract (signature 0 "draft": activations, input_pos, mask, the target's store
layer caches by their target names -> logits, projected_activations) plus "draft_masked", which mtpkit's runtime
uses: explicit masks in and, for a centroid head, only the selected tokens' logits and ids out.
"""

from __future__ import annotations

from .graphs import export
from .memory import MEMORY
from .parity import check
from .quantization import quantize
from .sizes import plan_files

# what writes this backend's files (converter, flatbuffers, the .litertlm) or the figures in its entry (the acceptance
# runs on ai-edge-litert), recorded with their versions in manifest.json's `export` entry (export/reproduce.py)
PACKAGES = ("litert-torch", "litert-converter", "ai-edge-litert", "ai-edge-quantizer", "litert-lm-builder",
            "flatbuffers")

__all__ = ["MEMORY", "PACKAGES", "check", "export", "plan_files", "quantize"]
