"""manifest.json: the only contract between the exporter, the runtimes and the Android app.

Everything a runtime needs (graph files, tensor names and roles, KV layout, token ids) is read from here;
nothing is inferred from file names or tensor shapes. Bump SCHEMA_VERSION when a field changes meaning.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from mtpkit.errors import ManifestError

from .records import (Backend, Generation, GraphFile, KVCache, KVLayer, LiteRtOptions, Model,  # noqa: F401
                      OnnxOptions, Options, Quantization, Record, Signature, TensorSpec, Tokens, field)
from .roles import BACKENDS
from .schema import BOOL, DICT, STR, check_links, fields, integer, items, mapping, optional
from .verified import VerifiedFiles, sha256_file  # noqa: F401  (sha256_file: the exporters' import)

# 3: every backend's KV capacity is kv_cache.capacity alone, LiteRT's verify takes options.max_draft + 1 tokens, and
#    each backend's options are a record (its row in runtime/roles.py BACKENDS) checked when read.
SCHEMA_VERSION = 3
MANIFEST_NAME = "manifest.json"

TOKENIZER = fields({"file": STR, "sha256": STR},
                   {"add_bos": BOOL, "chat_template_file": optional(STR), "chat_template_sha256": optional(STR)})
REFERENCE = optional(fields({"file": STR, "sha256": STR, "draft_lengths": items(integer(1))},
                            {"arrays": STR, "arrays_sha256": STR}))


@dataclass(frozen=True, kw_only=True)
class Manifest(Record):
    schema_version: int = field(integer())
    mtpkit_version: str = field(STR)
    source: dict = field(DICT)  # where target and drafter came from (path or hub id, revision)
    model: Model = field(record=Model)
    tokens: Tokens = field(record=Tokens)
    tokenizer: dict = field(TOKENIZER)  # file, sha256, add_bos, chat_template_file, chat_template_sha256
    generation: Generation = field(record=Generation)
    kv_cache: KVCache = field(record=KVCache)
    backends: dict[str, Backend] = field(record=Backend, many="dict")  # onnx and/or litert (roles.py BACKENDS)
    quantization: Quantization = field(record=Quantization)
    reference: dict | None = field(REFERENCE, default=None)  # file, sha256, arrays, arrays_sha256, draft_lengths
    hf_files: dict = field(mapping(STR), factory=dict)  # the target's config.json / generation_config.json, copied
    export: dict = field(DICT, factory=dict)  # how to re-run the export: its flags, the writers' versions
    measured: dict = field(DICT, factory=dict)  # per-phase time and peak memory, the preflight: differs run to run
    root: Path = dataclasses.field(default=Path("."), compare=False)  # the export folder; not written

    @property
    def kv_layers(self) -> list[KVLayer]:
        return self.kv_cache.layers

    def backend(self, kind: str | None = None) -> Backend:
        """The requested backend; when kind is None, the export's first in role-table order (roles.py BACKENDS),
        else its first."""
        if kind is None:
            kind = next((k for k in BACKENDS if k in self.backends), next(iter(self.backends)))
        if kind not in self.backends:
            raise ManifestError(f"this export has no {kind} graphs (it has: {', '.join(self.backends)}); "
                                f"re-export with --backend {kind}")
        return self.backends[kind]

    @property
    def eos_ids(self) -> list[int]:
        return list(self.tokens.eos)

    def path(self, name: str) -> Path:
        """A file the manifest names, refused unless it lies inside the export folder (no absolute paths, no
        `..`, no symlink that leads out): an export copied from elsewhere must not make the runtime read or load
        files it was not given."""
        relative = Path(name.replace("\x00", "/.."))  # a NUL byte cannot name a file: refuse it like ".."
        if relative.is_absolute() or ".." in relative.parts or not relative.parts:
            raise ManifestError(f"manifest.json names {name!r}, which is not a file inside the export folder; "
                                "refusing to read it (re-export, or fix the manifest)")
        path = self.root / relative
        if not path.resolve().is_relative_to(self.root.resolve()):
            raise ManifestError(f"{path} leads outside the export folder (a symlink to {path.resolve()}); "
                                "refusing to read it")
        return path

    def hashed_files(self) -> list[tuple[str, str, str]]:
        """(what, file, sha256) for every file a runtime reads: each backend's graphs and their data files, the
        tokenizer, the chat template and the transformers reference."""
        files = [(f"{kind} {name} graph file", f, digest) for kind, b in self.backends.items()
                 for name, g in b.graphs.items() for f, digest in [(g.file, g.sha256), *g.data_files.items()]]
        t, r = self.tokenizer, self.reference or {}
        files.append(("tokenizer file", t["file"], t["sha256"]))
        if t.get("chat_template_file") is not None:
            files.append(("chat template file", t["chat_template_file"], t["chat_template_sha256"]))
        if r:
            files.append(("reference file", r["file"], r["sha256"]))
        if r.get("arrays") is not None:
            files.append(("reference arrays file", r["arrays"], r["arrays_sha256"]))
        return files

    def save(self, folder: Path) -> Path:
        out = Path(folder) / MANIFEST_NAME
        out.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return out

    @classmethod
    def read(cls, d: object, root: Path = Path(".")) -> "Manifest":
        """Parsed manifest.json as records: its version first (compared exactly), then every field with its
        type, then the references between fields, before any is used."""
        if not isinstance(d, dict):
            raise ManifestError(f"manifest.json must hold a JSON object (got {type(d).__name__}); re-export the model")
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            made_by = f" (written by mtpkit {d['mtpkit_version']})" if d.get("mtpkit_version") else ""
            raise ManifestError(
                f"manifest schema_version {version}{made_by} is not supported: this mtpkit reads version "
                f"{SCHEMA_VERSION}; re-export the model with this mtpkit (`mtpkit export ...`)")
        manifest = cls.from_json(d, "")
        check_links(d)
        return dataclasses.replace(manifest, root=Path(root))


def load_manifest(folder: str | Path, verify: bool = True) -> Manifest:
    """Read DIR/manifest.json; with verify, check every file a runtime reads (Manifest.hashed_files) against its
    sha256.

    Raises:
        ManifestError: missing folder or manifest, unsupported schema, missing or modified files.
    """
    root = Path(folder)
    if not root.is_dir():
        raise ManifestError(f"{root} is not a folder; pass the DIR written by 'mtpkit export'")
    mpath = root / MANIFEST_NAME
    if not mpath.is_file():
        raise ManifestError(f"{root} has no {MANIFEST_NAME}; pass the DIR written by 'mtpkit export'")
    try:
        data = json.loads(mpath.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ManifestError(f"{mpath} is not valid JSON ({e}); re-export the model") from e
    except OSError as e:
        raise ManifestError(f"{mpath} cannot be read ({e.strerror}); check its permissions") from e
    try:
        manifest = Manifest.read(data, root)
    except (TypeError, KeyError) as e:
        raise ManifestError(f"{mpath} is malformed ({e}); re-export the model") from e
    if verify:
        verify_files(manifest)
    return manifest


def verify_files(manifest: Manifest) -> None:
    """Every file a runtime reads against its sha256 (files unchanged since an earlier check are not re-hashed:
    runtime/verified.py)."""
    verified = VerifiedFiles()
    try:
        for what, fname, digest in manifest.hashed_files():
            _verify_file(manifest, verified, what, fname, digest)
    finally:
        verified.save()


def _verify_file(manifest: Manifest, verified: VerifiedFiles, what: str, fname: str, digest: str) -> None:
    p = manifest.path(fname)
    try:
        found = p.is_file() and verified.digest(p)
    except OSError as e:
        raise ManifestError(f"{what} {p} cannot be read ({e.strerror}); re-export the model") from e
    if not found:
        raise ManifestError(f"{what} {p} is missing; re-export the model")
    if found != digest:
        raise ManifestError(
            f"{p} does not match the sha256 in manifest.json (modified or corrupt); re-export the model"
        )
