"""mtpkit: Gemma 4 + MTP drafter -> ONNX / LiteRT, with a lossless draft-verify runtime.

Python API (mtpkit.api): export_pair(target, drafter, out) -> Path; load(export_dir) -> Model with generate,
stream, chat and stream_chat. Importing mtpkit loads neither the runtime nor torch; each loads when first used.
(`mtpkit.export` is the export subpackage, so the function has its own name.)
"""

from .api import Generation, Model, export_pair, load
from .version import __version__

__all__ = ["Generation", "Model", "__version__", "export_pair", "load"]
