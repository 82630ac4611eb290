"""mtpkit: Gemma 4 + MTP drafter -> ONNX / LiteRT, with a lossless draft-verify runtime."""

__version__ = "0.1.0"
