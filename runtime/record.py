"""The base of the records manifest.json is made of: each field's JSON key, type check and place in the key order.

Readers build a record with `Record.from_json` (a missing field or a value of the wrong type is a one-line
ManifestError naming the field), writers construct it and `to_json` emits the keys in field order. A field whose
metadata says `omit` is left out of the JSON while None. Keys a record does not list are ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from mtpkit.errors import ManifestError

from .schema import DICT, Check, items, mapping

R = TypeVar("R", bound="Record")


def field(check: Check | None = None, *, record: type | None = None, many: str = "", default: Any = dataclasses.MISSING,
          omit: bool = False, factory: Any = dataclasses.MISSING) -> Any:
    """A record field: `check` for a plain JSON value, or `record` (one, or many="list" / many="dict" of them)."""
    meta = {"check": check, "record": record, "many": many, "omit": omit}
    return dataclasses.field(default=default, default_factory=factory, metadata=meta)


class Record:
    """Base of the manifest's records (frozen dataclasses)."""

    @classmethod
    def from_json(cls: type[R], data: object, where: str) -> R:
        DICT(data, where)
        assert isinstance(data, dict)
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]  # every Record is a dataclass
            if "check" not in f.metadata:
                continue  # not a JSON field (Manifest.root)
            at = f"{where}.{f.name}" if where else f.name
            if f.name not in data:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise ManifestError(f"manifest.json: {at} is missing; re-export the model with this mtpkit")
                continue
            values[f.name] = _read(f.metadata, data[f.name], at)
        return cls(**values)

    def to_json(self) -> dict:
        return {f.name: _write(getattr(self, f.name)) for f in dataclasses.fields(self)  # type: ignore[arg-type]
                if "check" in f.metadata and not (f.metadata["omit"] and getattr(self, f.name) is None)}


def _read(meta: Any, value: object, where: str) -> Any:
    record, many = meta.get("record"), meta.get("many")
    if record is None:
        if meta.get("check"):
            meta["check"](value, where)
        return value
    if many == "list":
        items(_any)(value, where)
        assert isinstance(value, list)
        return [record.from_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if many == "dict":
        mapping(_any, 1)(value, where)
        assert isinstance(value, dict)
        return {k: record.from_json(v, f"{where}.{k}") for k, v in value.items()}
    return record.from_json(value, where)


def _any(value: object, where: str) -> None:
    """Each item's own record checks it."""


def _write(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, list):
        return [_write(v) for v in value]
    if isinstance(value, dict):
        return {k: _write(v) for k, v in value.items()}
    return value
