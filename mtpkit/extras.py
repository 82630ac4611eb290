"""Optional extras: which installed modules each needs, and a one-line error naming the extra to install.

Checked with importlib.util.find_spec, which looks for a module without importing it, so the check is cheap,
never pulls torch, and does not depend on what other packages happened to import first.
"""

from __future__ import annotations

import importlib.util

from .errors import MtpkitError

# extra -> top-level modules it provides (as in pyproject.toml's [project.optional-dependencies]). A backend's
# extra is not listed here: its row in runtime/roles.py BACKENDS names the modules, passed to require().
EXTRAS = {
    "export": ("torch", "transformers", "onnx", "onnxscript", "safetensors"),
    "llama-cpp": ("llama_cpp",),  # the llama.cpp peer of `mtpkit bench --peers`
}


class MissingExtraError(MtpkitError, ImportError):
    """A feature needs an optional extra that is not installed; the message says which one to install."""


def missing_modules(modules: tuple[str, ...]) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def require(extra: str, feature: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise MissingExtraError unless every module of `extra` (or just `modules`) is installed; an extra not in
    EXTRAS needs its modules given."""
    missing = missing_modules(modules if modules is not None else EXTRAS[extra])
    if missing:
        raise MissingExtraError(f"{feature} needs the [{extra}] extra ({', '.join(missing)} not installed); "
                                f"install it with: pip install 'mtpkit[{extra}]' (from a source checkout: "
                                f"pip install '.[{extra}]')")
