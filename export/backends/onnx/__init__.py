"""ONNX backend: torch.export (dynamo) of the step modules, then the embedding table moved to a shared file.

One dynamic-T target graph serves prefill, decode and verify (window KV I/O: past window in, the T new entries
out, named new.{i}.key/value so they cannot be mistaken for optimum's past+new `present.*`); the drafter graph
serves draft.

The target graph's tied embedding/lm_head table is written once, as ONNX external data in `embeddings.bin`;
the runtime memory-maps the same file to look up the drafter's token embeddings, so the 262k-row table is
stored once. The other weights are external data in `<graph>.onnx.data`, written tensor by tensor from the
loaded model without an fp32 copy of it (stream.py).
"""

from __future__ import annotations

from .graphs import export
from .memory import MEMORY
from .parity import check
from .quantization import quantize
from .sizes import plan_files

# what writes this backend's files or the figures in its entry (the acceptance runs on ONNX Runtime), recorded with
# their versions in manifest.json's `export` entry (export/reproduce.py)
PACKAGES = ("onnx", "onnxscript", "onnx-ir", "onnxruntime", "protobuf")

__all__ = ["MEMORY", "PACKAGES", "check", "export", "plan_files", "quantize"]
