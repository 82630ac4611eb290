"""Scoped changes to other libraries' objects: set for the duration of a `with` block, restored on exit.

Every patch mtpkit applies to transformers, litert-torch, litert-lm-builder or torch goes through here, so
nothing leaks into the caller's process, also when the block raises.
"""

from __future__ import annotations

import contextlib
import logging

_MISSING = object()


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
