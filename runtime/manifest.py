"""manifest.json: the only contract between the exporter, the runtimes and the Android app.

Everything a runtime needs (graph files, tensor names and roles, KV layout, token ids) is read from here;
nothing is inferred from file names or tensor shapes. Bump SCHEMA_VERSION when a field changes meaning.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mtpkit.errors import ManifestError

from .roles import BACKENDS, ROLES
from .schema import check_manifest
from .verified import VerifiedFiles, sha256_file  # noqa: F401  (sha256_file: the exporters' import)

# 2: ONNX KV outputs named new.{i}.key/value (role new_key/new_value; they hold only the T new entries, unlike
#    optimum's present.*), drafter store inputs tagged store_key/store_value with layer_type, target hidden
#    states tagged activations, the shared embedding in backends.onnx.options, hf_files.
SCHEMA_VERSION = 2
MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    role: str  # what the runtime binds: input_ids, input_pos, past_key, logits, ...
    shape: list  # ints, or strings for dynamic dims ("T", "past")
    dtype: str  # numpy dtype name
    layer: int | None = None  # target layer index, for KV tensors
    seq_axis: int | None = None  # sequence axis of a KV state tensor (LiteRT stores V transposed)
    layer_type: str | None = None  # sliding_attention | full_attention, for per-type tensors (drafter K/V, masks)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ManifestError(f"tensor {self.name!r} has role {self.role!r}, which this mtpkit does not know "
                                "(an export from a newer mtpkit?); upgrade mtpkit or re-export with this version")

    @property
    def key(self) -> tuple[str, int | str | None]:
        """How runtimes address the tensor: (role, layer or layer type)."""
        return self.role, self.layer if self.layer is not None else self.layer_type


@dataclass(frozen=True)
class Signature:
    graph: str  # key into Manifest.graphs
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    num_tokens: int | None = None  # static token count, None when dynamic
    backend_name: str | None = None  # the graph's own signature name (LiteRT); None for ONNX

    def input(self, role: str, layer: int | str | None = None) -> TensorSpec:  # layer: an index or a layer type
        return _find(self.inputs, role, layer)

    def output(self, role: str, layer: int | str | None = None) -> TensorSpec:
        return _find(self.outputs, role, layer)


@dataclass(frozen=True)
class KVLayer:
    layer: int
    type: str  # sliding_attention | full_attention
    kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class GraphFile:
    file: str
    sha256: str
    bytes: int
    backend: str  # onnx | litert
    data_files: dict = field(default_factory=dict)  # external data file -> sha256
    recipe: str = "fp32"  # quantization recipe of this graph's weights (export/config.py QUANT_RECIPES)


@dataclass(frozen=True)
class Backend:
    """One graph format in the export folder: its files, signatures and how its KV cache is exchanged."""

    kind: str  # onnx | litert
    kv_io: str  # window: past window in, new entries out (ONNX); state: whole cache in and out (LiteRT)
    graphs: dict[str, GraphFile]
    signatures: dict[str, Signature]
    options: dict = field(default_factory=dict)  # backend specifics: static lengths, mask values, bundle

    @classmethod
    def from_dict(cls, d: dict) -> "Backend":
        d = dict(d)
        d["graphs"] = {k: GraphFile(**v) for k, v in d["graphs"].items()}
        d["signatures"] = {k: _signature(v) for k, v in d["signatures"].items()}
        return cls(**d)


@dataclass(frozen=True)
class Manifest:
    schema_version: int
    mtpkit_version: str
    source: dict  # where target and drafter came from (path or hub id, revision)
    model: dict  # vocab_size, hidden_size, sliding_window, num_layers, drafter_hidden_size, ...
    tokens: dict  # bos, pad, eos (list)
    tokenizer: dict  # file, sha256, add_bos, chat_template_file, chat_template_sha256
    generation: dict  # num_assistant_tokens, max_cache_len
    kv_cache: dict  # capacity, dtype, layers [KVLayer], drafter_layers {type: layer}
    backends: dict[str, Backend]  # onnx and/or litert (runtime/roles.py BACKENDS)
    quantization: dict
    reference: dict | None = None  # file, sha256, arrays, arrays_sha256, draft_lengths
    hf_files: dict = field(default_factory=dict)  # the target's config.json / generation_config.json, copied
    export: dict = field(default_factory=dict)  # how to re-run the export: its flags, the writers' versions
    measured: dict = field(default_factory=dict)  # per-phase time and peak memory, the preflight: differs run to run
    root: Path = field(default=Path("."), compare=False)

    @property
    def kv_layers(self) -> list[KVLayer]:
        return [KVLayer(**d) for d in self.kv_cache["layers"]]

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
        return list(self.tokens["eos"])

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

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("root")
        return d

    def save(self, folder: Path) -> Path:
        out = Path(folder) / MANIFEST_NAME
        out.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return out

    @classmethod
    def from_dict(cls, d: dict, root: Path = Path(".")) -> "Manifest":
        if not isinstance(d, dict):
            raise ManifestError(f"manifest.json must hold a JSON object (got {type(d).__name__}); re-export the model")
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            made_by = f" (written by mtpkit {d['mtpkit_version']})" if d.get("mtpkit_version") else ""
            raise ManifestError(
                f"manifest schema_version {version}{made_by} is not supported: this mtpkit reads version "
                f"{SCHEMA_VERSION}; re-export the model with this mtpkit (`mtpkit export ...`)")
        check_manifest(d)  # every field a runtime reads, with its type, before any is used
        d = dict(d)
        d["backends"] = {k: Backend.from_dict(v) for k, v in d["backends"].items()}
        return cls(**d, root=Path(root))


def _signature(d: dict) -> Signature:
    d = dict(d)
    d["inputs"] = [TensorSpec(**t) for t in d["inputs"]]
    d["outputs"] = [TensorSpec(**t) for t in d["outputs"]]
    return Signature(**d)


def _find(specs: list[TensorSpec], role: str, layer: int | str | None) -> TensorSpec:
    for t in specs:
        if t.role == role and (layer is None or t.layer == layer or t.layer_type == layer):
            return t
    raise ManifestError(f"manifest has no tensor with role {role!r}" + (f" for layer {layer}" if layer is not None else ""))


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
        manifest = Manifest.from_dict(data, root)
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
