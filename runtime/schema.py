"""The checks manifest.json's fields are read with, and the cross-references between its records.

A missing field or a value of the wrong type is a ManifestError that names the field (`kv_cache.capacity must be
an integer >= 1 (got "abc")`), never a TypeError or KeyError from deep inside a runtime. Each record field names its
check (runtime/records.py); check_links then checks what one field says about another (a signature's graph, a KV
tensor's layer).
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, NoReturn

from mtpkit.errors import ManifestError


Check = Callable[[object, str], None]
INT32_MAX = 2**31 - 1
# tensor element types the exporters write (numpy names; int4 / uint4 for packed blockwise weights)
DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "int4", "uint4",
          "bool")


def _fail(where: str, want: str, value: object) -> NoReturn:
    try:
        shown = json.dumps(value)
    except (TypeError, ValueError):
        shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise ManifestError(f"manifest.json: {where} must be {want} (got {shown}); re-export the model with this mtpkit")


def integer(low: int = 0, high: int = INT32_MAX) -> Check:
    def check(v: object, where: str) -> None:
        if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
            _fail(where, f"an integer >= {low}" if high == INT32_MAX else f"an integer in [{low}, {high}]", v)
    return check


def typed(kind: type | tuple, want: str) -> Check:
    def check(v: object, where: str) -> None:
        if not isinstance(v, kind) or (kind is not bool and isinstance(v, bool)):
            _fail(where, want, v)
    return check


STR, BOOL, DICT = typed(str, "a string"), typed(bool, "true or false"), typed(dict, "an object")
NUMBER = typed((int, float), "a number")


def optional(check: Check) -> Check:
    return lambda v, where: None if v is None else check(v, where)


def one_of(*values: str) -> Check:
    def check(v: object, where: str) -> None:
        if not isinstance(v, str) or v not in values:
            _fail(where, "one of " + ", ".join(values), v)
    return check


def dtype(v: object, where: str) -> None:
    if v not in DTYPES:
        _fail(where, "a dtype name (" + ", ".join(DTYPES) + ")", v)


def items(check: Check, min_len: int = 0) -> Check:
    def run(v: object, where: str) -> None:
        if not isinstance(v, list) or len(v) < min_len:
            _fail(where, f"a list{f' of at least {min_len} items' if min_len else ''}", v)
        for i, x in enumerate(v):
            check(x, f"{where}[{i}]")
    return run


def mapping(check: Check, min_len: int = 0) -> Check:
    def run(v: object, where: str) -> None:
        if not isinstance(v, dict) or len(v) < min_len:
            _fail(where, "an object" + (" with at least one entry" if min_len == 1 else
                                        f" with at least {min_len} entries" if min_len else ""), v)
        for k, x in v.items():
            check(x, f"{where}.{k}")
    return run


def fields(required: dict[str, Check], optional_fields: dict[str, Check] | None = None) -> Check:
    def run(v: Any, where: str) -> None:  # Any: DICT checks that v is a dict
        DICT(v, where)
        for key, check in required.items():
            if key not in v:
                raise ManifestError(f"manifest.json: {where + '.' if where else ''}{key} is missing; re-export the "
                                    "model with this mtpkit")
            check(v[key], f"{where + '.' if where else ''}{key}")
        for key, check in (optional_fields or {}).items():
            if key in v:
                check(v[key], f"{where + '.' if where else ''}{key}")
    return run


def shape_dim(v: object, where: str) -> None:
    if not (isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= INT32_MAX)):
        _fail(where, "a size (an integer >= 0) or a symbolic name", v)


def release(v: object, where: str) -> None:
    if not (isinstance(v, str) and re.fullmatch(r"\d+\.\d+", v)):
        _fail(where, 'a release like "1.20"', v)


KV_ROLES = ("past_key", "past_value", "new_key", "new_value", "kv_key", "kv_value", "store_key", "store_value")


def _check_kv_tensors(tensors: list[dict], layers: set, where: str) -> None:
    """KV tensors name a cached layer, keys and values come in pairs, and a window signature covers every layer."""
    by_role: dict[str, set] = {}
    for t in tensors:
        if t["role"] in KV_ROLES:
            if t.get("layer") not in layers:
                _fail(f"{where} tensor {t['name']} layer", "a layer listed in kv_cache.layers", t.get("layer"))
            by_role.setdefault(t["role"], set()).add(t["layer"])
    for key in ("past_key", "new_key", "kv_key", "store_key"):
        value = key.replace("key", "value")
        if by_role.get(key, set()) != by_role.get(value, set()):
            _fail(where, f"{key} and {value} tensors for the same layers",
                  {key: sorted(by_role.get(key, ())), value: sorted(by_role.get(value, ()))})
    for role in ("past_key", "new_key"):
        if role in by_role and by_role[role] != layers:
            _fail(where, f"{role} tensors for every layer in kv_cache.layers", sorted(by_role[role]))


def _check_hashed(entry: dict, where: str, file_key: str, hash_key: str) -> None:
    """An optional file the entry names comes with its sha256 (the runtime reads only files it can verify)."""
    if entry.get(file_key) is not None and entry.get(hash_key) is None:
        raise ManifestError(f"manifest.json: {where}.{hash_key} is missing; re-export the model with this mtpkit")


def check_links(data: dict) -> None:
    """Raise ManifestError naming the first field of `data` (manifest.json, its records already read) that names
    something the manifest does not have."""
    _check_hashed(data["tokenizer"], "tokenizer", "chat_template_file", "chat_template_sha256")
    if data.get("reference") is not None:
        _check_hashed(data["reference"], "reference", "arrays", "arrays_sha256")
    layers = {d["layer"] for d in data["kv_cache"]["layers"]}
    for layer_type, layer in data["kv_cache"]["drafter_layers"].items():
        if layer not in layers:
            _fail(f"kv_cache.drafter_layers.{layer_type}", "a layer listed in kv_cache.layers", layer)
    for kind, backend in data["backends"].items():
        if backend["kind"] != kind:
            _fail(f"backends.{kind}.kind", repr(kind), backend["kind"])
        for name, sig in backend["signatures"].items():
            where = f"backends.{kind}.signatures.{name}"
            if sig["graph"] not in backend["graphs"]:
                _fail(f"{where}.graph", f"one of {', '.join(backend['graphs'])}", sig["graph"])
            _check_kv_tensors(sig["inputs"] + sig["outputs"], layers, where)
    capacity, limit = data["kv_cache"]["capacity"], data["model"].get("max_position_embeddings")
    if limit is not None and capacity > limit:
        _fail("kv_cache.capacity", f"at most model.max_position_embeddings ({limit})", capacity)
