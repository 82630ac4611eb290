"""The records manifest.json is made of, described once: each field's JSON key, type check and place in the key order.

Readers build them with `Record.from_json` (a missing field or a value of the wrong type is a one-line ManifestError
naming the field), writers construct them and `to_json` emits the keys in field order, so what is written, what is
read and what is checked cannot drift apart. A field whose metadata says `omit` is left out of the JSON while None.
Keys a record does not list are ignored. Backend options are one record per kind, named by its row in
runtime/roles.py BACKENDS beside the rest of what a backend declares.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mtpkit.errors import ManifestError

from .record import Record, field
from .roles import BACKENDS, ROLES, LiteRtOptions, OnnxOptions, Options  # noqa: F401  (the options records' home)
from .schema import DICT, NUMBER, STR, dtype, fields, integer, items, mapping, one_of, optional, shape_dim

LAYER_TYPES = ("sliding_attention", "full_attention")


@dataclass(frozen=True)
class TensorSpec(Record):
    name: str = field(STR)
    role: str = field(one_of(*ROLES))  # what the runtime binds: input_ids, input_pos, past_key, logits, ...
    shape: list = field(items(shape_dim))  # ints, or strings for dynamic dims ("T", "past")
    dtype: str = field(dtype)  # numpy dtype name
    layer: int | None = field(optional(integer()), default=None)  # target layer index, for KV tensors
    seq_axis: int | None = field(optional(integer()), default=None)  # a state tensor's sequence axis (LiteRT: V's is 3)
    layer_type: str | None = field(optional(STR), default=None)  # sliding_attention | full_attention (drafter K/V, masks)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ManifestError(f"tensor {self.name!r} has role {self.role!r}, which this mtpkit does not know "
                                "(an export from a newer mtpkit?); upgrade mtpkit or re-export with this version")

    @property
    def key(self) -> tuple[str, int | str | None]:
        """How runtimes address the tensor: (role, layer or layer type)."""
        return self.role, self.layer if self.layer is not None else self.layer_type


@dataclass(frozen=True)
class Signature(Record):
    graph: str = field(STR)  # key into Backend.graphs
    inputs: list[TensorSpec] = field(record=TensorSpec, many="list")
    outputs: list[TensorSpec] = field(record=TensorSpec, many="list")
    num_tokens: int | None = field(optional(integer(1)), default=None)  # static token count, None when dynamic
    backend_name: str | None = field(optional(STR), default=None)  # the graph's own signature name (LiteRT)

    def input(self, role: str, layer: int | str | None = None) -> TensorSpec:  # layer: an index or a layer type
        return _find(self.inputs, role, layer)

    def output(self, role: str, layer: int | str | None = None) -> TensorSpec:
        return _find(self.outputs, role, layer)


def _find(specs: list[TensorSpec], role: str, layer: int | str | None) -> TensorSpec:
    for t in specs:
        if t.role == role and (layer is None or t.layer == layer or t.layer_type == layer):
            return t
    raise ManifestError(f"manifest has no tensor with role {role!r}" + (f" for layer {layer}" if layer is not None else ""))


@dataclass(frozen=True)
class GraphFile(Record):
    file: str = field(STR)
    sha256: str = field(STR)
    bytes: int = field(integer(0, 2**63 - 1))
    backend: str = field(STR)  # onnx | litert
    data_files: dict = field(mapping(STR), factory=dict)  # external data file -> sha256
    recipe: str = field(STR, default="fp32")  # quantization recipe of this graph's weights (export/config.py)


@dataclass(frozen=True)
class Backend(Record):
    """One graph format in the export folder: its files, signatures and how its KV cache is exchanged."""

    kind: str = field(STR)  # onnx | litert
    kv_io: str = field(one_of("window", "state"))  # window: past in, new entries out (ONNX); state: whole cache (LiteRT)
    graphs: dict[str, GraphFile] = field(record=GraphFile, many="dict")
    signatures: dict[str, Signature] = field(record=Signature, many="dict")
    options: Options = field(record=Options, factory=Options)  # the kind's own record (roles.BACKENDS .options)

    @classmethod
    def from_json(cls, data: object, where: str) -> "Backend":
        DICT(data, where)
        assert isinstance(data, dict)
        entry = super().from_json({k: v for k, v in data.items() if k != "options"}, where)
        record = BACKENDS[entry.kind].options if entry.kind in BACKENDS else Options
        options = record.from_json(data.get("options", {}), f"{where}.options")
        return dataclasses.replace(entry, options=options)


@dataclass(frozen=True)
class KVLayer(Record):
    layer: int = field(integer())
    type: str = field(one_of(*LAYER_TYPES))  # sliding_attention | full_attention
    kv_heads: int = field(integer(1))
    head_dim: int = field(integer(1))


@dataclass(frozen=True, kw_only=True)
class KVCache(Record):
    """The target's KV cache as the host keeps it; `capacity` is every backend's cache length."""

    capacity: int = field(integer(1))  # positions the cache holds (--max-cache-len)
    dtype: str = field(STR, default="float32")
    layout: str = field(STR, default="BHSD")
    layers: list[KVLayer] = field(record=KVLayer, many="list")
    drafter_layers: dict = field(fields({t: integer() for t in LAYER_TYPES}))  # layer type -> store layer
    sliding_past: int = field(integer())  # W - 1: what a sliding layer reads of the past
    drafter_sliding_visible: int = field(integer())  # W + 1: what the drafter's sliding layer sees


@dataclass(frozen=True, kw_only=True)
class Model(Record):
    vocab_size: int = field(integer(1))
    hidden_size: int = field(integer(1))
    num_layers: int | None = field(optional(integer(1)), default=None, omit=True)
    sliding_window: int = field(integer(1))
    final_logit_softcapping: float | None = field(optional(NUMBER), default=None)
    drafter_hidden_size: int | None = field(optional(integer(1)), default=None, omit=True)
    max_position_embeddings: int | None = field(integer(1), default=None, omit=True)


@dataclass(frozen=True, kw_only=True)
class Tokens(Record):
    bos: int | None = field(optional(integer()), default=None)
    pad: int | None = field(optional(integer()), default=None)
    eos: list[int] = field(items(integer()))  # generation stops at any of these


@dataclass(frozen=True)
class Generation(Record):
    """Drafting defaults, from the drafter's generation_config.json."""

    num_assistant_tokens: int = field(integer(1))  # drafts per round
    num_assistant_tokens_schedule: str = field(STR, default="constant")


@dataclass(frozen=True)
class Quantization(Record):
    """The recipes asked for at export; each graph records its own (GraphFile.recipe)."""

    recipe: str | None = field(optional(STR), default=None, omit=True)
    drafter_recipe: str | None = field(optional(STR), default=None, omit=True)
    ple_recipe: str | None = field(optional(STR), default=None, omit=True)
    block_size: int | None = field(optional(integer(1)), default=None, omit=True)
    accuracy_level: int | None = field(optional(integer()), default=None, omit=True)
    kv_cache: str | None = field(optional(STR), default=None, omit=True)
