"""mtpkit's version: a leaf module, so the exporter records it without importing the package root (and the API)."""

__version__ = "0.1.0"
