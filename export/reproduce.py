"""Reproducible exports: what manifest.json records to re-run an export, and `mtpkit export --verify DIR`.

An export's files depend only on its checkpoints, its flags and the versions of the packages that write them: the
.litertlm header's uuid and time included (export/scoped.py litertlm_identity). manifest.json's `export` entry records
the flags as given and those versions; what is measured (times, memory) is kept in `measured`, which a comparison
leaves out. verify() re-runs the recorded export into a temporary folder beside DIR and compares every file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from mtpkit.version import __version__
from mtpkit.errors import UsageError

log = logging.getLogger("mtpkit")

MEASURED = "measured"  # the manifest's section of measured figures, left out of every comparison
# what writes or shapes the files of every export: the loaded model, the reference, its tokenization, the arrays;
# each backend module adds its own (PACKAGES in export/backends/<kind>/)
COMMON_PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "numpy")
UNRECORDED = ("out", "force", "dry_run")  # where an export goes, not what it is; a dry run writes none
PATH_FLAGS = ("target", "drafter", "calibration")
_BLOCK = 1 << 22  # bytes compared at a time


def record(cfg) -> dict:
    """manifest.json's `export` entry for an ExportConfig as given (before its defaults adapt to the model): the
    flags, the versions of the packages that write the files, and the working directory when a path flag is
    relative (where it was resolved from)."""
    flags = {f.name: _plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.name not in UNRECORDED}
    entry = {"flags": flags, "versions": versions(cfg.backend)}
    if any(_relative_path(flags[name]) for name in PATH_FLAGS):
        entry["workdir"] = os.getcwd()
    return entry


def versions(backends) -> dict[str, str | None]:
    """Installed version of mtpkit and of every package that writes files of an export to `backends` (None: not
    installed)."""
    from .backends import backend_module

    names = [*COMMON_PACKAGES, *(p for kind in backends for p in getattr(backend_module(kind), "PACKAGES", ()))]
    return {"mtpkit": __version__, **{name: _installed(name) for name in names}}


def comparable(manifest: dict) -> dict:
    """A manifest as two exports of the same inputs must write it: everything but its measured section."""
    return {k: v for k, v in manifest.items() if k != MEASURED}


def first_difference(folder: Path, other: Path) -> str | None:
    """The first file, in name order, that differs between two export folders, with where it differs; None when
    every file is byte-identical (manifest.json: outside its measured section)."""
    from mtpkit.runtime.manifest import MANIFEST_NAME

    mine, theirs = _files(Path(folder)), _files(Path(other))
    for name in sorted(mine | theirs):
        if name not in theirs:
            return f"{name} (not in the re-export)"
        if name not in mine:
            return f"{name} (only in the re-export)"
        a, b = Path(folder) / name, Path(other) / name
        why = _manifest_difference(a, b) if name == MANIFEST_NAME else _byte_difference(a, b)
        if why:
            return f"{name} ({why})"
    return None


def verify(folder: Path, export: Callable[[Any], Path]) -> str | None:
    """Re-run the export recorded in folder/manifest.json with `export` (export/pipeline.py export_model, given by
    the caller: the pipeline records through this module) into a temporary folder beside it and compare every file;
    the temporary folder is removed whatever happens.

    Returns:
        None when every file matches, else the first difference (first_difference), or the first file whose
        sha256 no longer matches the manifest's (found without re-exporting).
    Raises:
        UsageError: no manifest record, other package versions than recorded, a recorded workdir that is gone.
    """
    from mtpkit.runtime.manifest import load_manifest

    from .config import ExportConfig

    manifest = load_manifest(folder, verify=False)
    entry = recorded(manifest, Path(folder))
    changed = _changed_file(manifest)
    if changed:
        return changed
    here = Path(folder).resolve()  # the export below may run from the recorded working directory
    scratch = Path(tempfile.mkdtemp(prefix=f".{here.name}.verify-", dir=here.parent))
    try:
        cfg = ExportConfig(**_config_fields(entry["flags"], Path(folder)), out=scratch / here.name)
        log.info("re-exporting %s from its manifest's record into %s", folder, scratch)
        with _working_directory(entry.get("workdir"), Path(folder)):
            out = export(cfg)
        return first_difference(here, out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def recorded(manifest, folder: Path) -> dict:
    """The `export` record of folder's manifest, checked against the installed package versions."""
    entry = manifest.export
    if not isinstance(entry.get("flags"), dict) or not isinstance(entry.get("versions"), dict):
        raise UsageError(f"{folder}/manifest.json has no record of the flags it was exported with (an older "
                         "mtpkit's export, or an edited manifest); re-export it with this mtpkit to verify it")
    flags = entry["flags"]
    from .recipes import RECIPES, recipe

    quantized = [g.file for b in manifest.backends.values() for g in b.graphs.values() if recipe(g.recipe).quantized]
    exported = [flags.get("quant"), flags.get("drafter_quant") or flags.get("quant")]
    if not any(name in RECIPES and recipe(name).quantized for name in exported) and quantized:
        raise UsageError(f"{folder} holds quantized graphs ({quantized[0]}, ...) under the record of a float export: "
                         "it was derived from one (mtpkit quant-report, mtpkit demo), not exported; verify the "
                         "float export it came from")
    wrong = [f"{name} {want} (installed: {have or 'none'})" for name, want in entry["versions"].items()
             if (have := __version__ if name == "mtpkit" else _installed(name)) != want]
    if wrong:
        raise UsageError(f"{folder} was exported with {', '.join(wrong)}; a re-export can match only under the "
                         "recorded versions: install them, then verify again")
    return entry


def _changed_file(manifest) -> str | None:
    """The first file the manifest hashes whose sha256 differs (a re-export could not match it)."""
    from mtpkit.runtime.verified import sha256_file

    for _, name, digest in manifest.hashed_files():
        path = manifest.path(name)
        if not path.is_file():
            return f"{name} (missing; the manifest lists it)"
        if sha256_file(path) != digest:
            return f"{name} (its sha256 is not the one in manifest.json; not re-exported)"
    return None


def _config_fields(flags: dict, folder: Path) -> dict:
    from .config import ExportConfig

    known = {f.name for f in dataclasses.fields(ExportConfig)} - set(UNRECORDED)
    unknown = sorted(set(flags) - known)
    if unknown:
        raise UsageError(f"{folder}/manifest.json records flags this mtpkit does not know ({', '.join(unknown)}); "
                         "verify it with the mtpkit that wrote it")
    fields = dict(flags)
    if fields.get("calibration") is not None:
        fields["calibration"] = Path(fields["calibration"])
    return fields


@contextlib.contextmanager
def _working_directory(path: str | None, folder: Path):
    """Relative path flags resolve as they did at export time: from the recorded working directory."""
    if path is None:
        yield
        return
    old = os.getcwd()
    try:
        os.chdir(path)
    except OSError as e:
        raise UsageError(f"{folder} was exported from {path} with relative paths, and that folder cannot be "
                         f"entered ({e.strerror}); re-export it with absolute paths to verify it elsewhere") from e
    try:
        yield
    finally:
        os.chdir(old)


# written beside an export by the runtimes that read it, not by the export: LiteRT-LM's packed weights
# (model.litertlm_<id>.<section>.xnnpack_cache, its default cache_dir is the bundle's folder)
RUNTIME_CACHES = (".xnnpack_cache",)


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if p.is_file() and not p.name.endswith(RUNTIME_CACHES)}


def _manifest_difference(a: Path, b: Path) -> str | None:
    mine, theirs = (comparable(json.loads(p.read_text(encoding="utf-8"))) for p in (a, b))
    key = _first_key(mine, theirs, "")
    return None if key is None else f"`{key or '(top level)'}` differs"


def _first_key(a, b, path: str) -> str | None:
    """The dotted path of the first value that differs between two parsed JSON documents."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            if key not in a or key not in b:
                return f"{path}{key}"
            found = _first_key(a[key], b[key], f"{path}{key}.")
            if found is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return next((k for i, (x, y) in enumerate(zip(a, b)) if (k := _first_key(x, y, f"{path}{i}.")) is not None),
                    None)
    return None if a == b else path.rstrip(".")


def _byte_difference(a: Path, b: Path) -> str | None:
    size, other = a.stat().st_size, b.stat().st_size
    if size != other:
        return f"{size} bytes, the re-export's {other}"
    with open(a, "rb") as x, open(b, "rb") as y:
        offset = 0
        while chunk := x.read(_BLOCK):
            theirs = y.read(len(chunk))
            if chunk != theirs:
                at = next(i for i, (p, q) in enumerate(zip(chunk, theirs)) if p != q)
                return f"first difference at byte {offset + at}"
            offset += len(chunk)
    return None


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _plain(value):
    """A config value as JSON: paths as strings, tuples as lists."""
    if isinstance(value, Path):
        return str(value)
    return list(value) if isinstance(value, tuple) else value


def _relative_path(value) -> bool:
    # a local path as checkpoint.resolve() takes it (a hub id names no local file)
    return isinstance(value, str) and not Path(value).expanduser().is_absolute() and Path(value).expanduser().exists()
