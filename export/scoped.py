"""Scoped changes to other libraries' objects: set for the duration of a `with` block, restored on exit.

Every patch mtpkit applies to transformers, litert-torch, litert-lm-builder or torch goes through here, so
nothing leaks into the caller's process, also when the block raises.
"""

from __future__ import annotations

import contextlib
import logging

from mtpkit.runtime.quiet import output_captured  # noqa: F401  (export's callers import it from here)

_MISSING = object()
# The creation time every .litertlm header gets inside litertlm_identity: a file's bytes must not depend on when it
# was written (when the export ran is in manifest.json's `measured` section).
LITERTLM_TIME = "1970-01-01T00:00:00+00:00"


@contextlib.contextmanager
def patched(owner, name: str, value):
    """owner.name = value inside the block; afterwards the old value, or no attribute of its own again.

    Only the owner's own attribute counts as the old value (an inherited class attribute or a method is not
    copied down onto it); a property is read and written back through its setter.
    """
    old = _own(owner, name)
    setattr(owner, name, value)
    try:
        yield value
    finally:
        if old is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, old)


@contextlib.contextmanager
def patched_all(owners, name: str, value):
    """patched() on several owners at once. Every old value is read before any is set and restored in the same
    order, because setting one can change another (a composite HF config's setter reaches its sub-configs)."""
    owners = list(owners)
    olds = [_own(o, name) for o in owners]
    for o in owners:
        setattr(o, name, value)
    try:
        yield value
    finally:
        for o, old in zip(owners, olds):
            if old is _MISSING:
                delattr(o, name)
            else:
                setattr(o, name, old)


@contextlib.contextmanager
def logger_level(name: str, level: int):
    """Set one logger's level inside the block (e.g. to hide a library's irrelevant warnings)."""
    logger = logging.getLogger(name)
    old = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(old)


def _own(owner, name: str):
    if isinstance(owner, type):
        return owner.__dict__.get(name, _MISSING)
    if name in getattr(owner, "__dict__", {}):
        return owner.__dict__[name]
    return getattr(owner, name) if isinstance(getattr(type(owner), name, None), property) else _MISSING


@contextlib.contextmanager
def root_logging_kept():
    """Undo what a library does to the root logger while imported or run inside the block.

    onnxruntime 1.32's quantization modules call logging.basicConfig(level=INFO) at import, after which every
    library's INFO lines (one per quantized node, matplotlib's font cache) reach the user's terminal.
    """
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def import_quietly() -> None:
    """Import torchao (which transformers' quantizers and litert-torch pull in) with its import-time noise hidden:
    torchao 0.x logs "Failed to load ..._C_mxfp8...so" for CUDA-only kernels on a CPU machine, and torch 2.13's
    _pytree logs an Enum register_constant deprecation for torchao's enums. Both are emitted once, at import."""
    with logger_level("torchao", logging.ERROR), logger_level("torch.utils._pytree", logging.ERROR):
        try:
            import torchao  # noqa: F401
            import torchao.prototype.mx_formats  # noqa: F401 - what transformers' torchao quantizer imports
        except ImportError:  # not installed: transformers will not import it either
            pass


@contextlib.contextmanager
def litertlm_identity(uuid: str, timestamp: str = LITERTLM_TIME):
    """Every .litertlm header written inside the block carries this uuid and creation_timestamp.

    litert-lm-builder 0.18.1's populate_system_metadata (litertlm_builder.py), which LitertLmFileBuilder.build and
    ai-edge-quantizer 0.10.0's LiteRTLMFile.serialize both call through the module, replaces them with uuid4()
    and now(): two bundles of the same sections would differ in those bytes.
    """
    from litert_lm_builder import litertlm_builder as builder

    drawn = builder.populate_system_metadata
    fixed = {"uuid": uuid, "creation_timestamp": timestamp}

    def populate(system_metadata):
        return [builder.Metadata(m.key, fixed[m.key], m.dtype) if m.key in fixed else m
                for m in drawn(system_metadata)]

    with patched(builder, "populate_system_metadata", populate):
        yield


class _InsertionOrdered(dict):
    """A set of hashables that iterates in insertion order (the `set` of a module inside insertion_ordered_sets)."""

    def __init__(self, items=()):
        super().__init__(dict.fromkeys(items))

    def add(self, item) -> None:
        self[item] = None


@contextlib.contextmanager
def insertion_ordered_sets(module):
    """`set()` called by `module`'s own code gives a set that iterates in insertion order inside the block.

    A builtin set of strings iterates in an order that Python's string hashing changes from process to process
    (PYTHONHASHSEED), so a file written in that order differs between two runs of the same export: litert-torch
    0.10.0's core/litert_lm_builder.py writes the bundle's stop tokens from one.
    """
    with patched(module, "set", _InsertionOrdered):
        yield


@contextlib.contextmanager
def gemma4_layer_types_in_order():
    """transformers 5.24's Gemma4TextModel keeps `unique_layer_types = set(config.layer_types)` (modeling_gemma4.py)
    and computes one rotary embedding per type in that set's order, so the ops of a graph traced from it came in
    an order that changed from process to process. Inside the block every model reads the same types in config
    order; what its __init__ assigned stays in the instance and is what it reads after the block."""
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextModel

    in_order = property(lambda self: tuple(dict.fromkeys(self.config.layer_types)),
                        lambda self, value: self.__dict__.__setitem__("unique_layer_types", value))
    with patched(Gemma4TextModel, "unique_layer_types", in_order):
        yield
