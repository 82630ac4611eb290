"""The .litertlm bundle: the exported .tflite files as LiteRT-LM's sections, every weight stored once.

A weight two graphs read (the tied embedding table: the embedder's lookup and the target's lm_head) is written by
each .tflite file, since each file must load alone. In the bundle it is stored once: a section whose weight has
the same name and bytes in a later section keeps no copy; the weight's Buffer.offset (LiteRT's large-model layout,
counted from the section's start) points into the later section's bytes, and the earlier section's header range is
widened to end where that section ends. LiteRT-LM maps each section as [begin, end) and bounds-checks buffer
offsets against that range, not against other sections (litert_lm_loader.cc, model_load.cc ReadBuffer), so the
section loads as the same model; rebuild_bundle checks the bytes after writing, and tests/test_litert_quant.py
runs the section and LiteRT-LM on it.

The LlmMetadata section says whether the model calls functions and thinks as its chat template supports them
(capabilities): LiteRT-LM's ModelInfo reads these from its supports_* fields, which litert-torch 0.10.0 never sets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import shutil
import struct
import uuid
from pathlib import Path

from mtpkit.runtime.manifest import sha256_file

from ...scoped import litertlm_identity
from .graft import WEIGHT, _pack, lay_out, read_map

# graph key in the manifest -> the type of its .litertlm section (litert_lm_builder.TfLiteModelType)
BUNDLE_SECTIONS = {"target": "tf_lite_prefill_decode", "embedder": "tf_lite_embedder",
                   "per_layer_embedder": "tf_lite_per_layer_embedder", "drafter": "tf_lite_mtp_drafter"}
_BLOCK = 64 << 20  # bytes copied, compared or hashed at a time
_PLACEHOLDER = 1 << 40  # a shared buffer's offset until the sections' places are known (same width when packed)


@dataclasses.dataclass(frozen=True)
class Layout:
    """What rebuild_bundle wrote: the TFLite sections' types in file order, and for a section that reads weights
    stored in a later one, that section's type -> the weights' names (manifest.json's bundle.shared)."""
    sections: list[str]
    shared: dict[str, dict[str, list[str]]]


def rebuild_bundle(bundle: Path, files: dict[str, Path]) -> Layout:
    """Replace every .tflite section of the .litertlm by the file of its section type, keeping the other sections
    (tokenizer, metadata with its capabilities set: _with_capabilities) and the section order, each weight stored
    once (the module docstring); check the result carries exactly the files' bytes. Sections are copied from the
    files a block at a time, never held in memory. The header's uuid is named by the sections and its time fixed
    (_content_uuid), so the same sections always give the same file."""
    from ai_edge_quantizer.utils import litertlm_utils

    bundle = Path(bundle)
    source = litertlm_utils.LiteRTLMFile(bundle)
    graphs: dict[int, _Graph] = {}
    for i, section in enumerate(source.sections):
        if section.dataType != litertlm_utils.AnySectionDataType.TFLiteModel:
            continue
        section_type = source.get_model_type(i)
        if section_type not in files:
            raise RuntimeError(f"{bundle.name}: section {i} has model_type {section_type!r}, which no exported "
                               f"file provides (have {', '.join(files)})")
        graphs[i] = _Graph(Path(files[section_type]), section_type)
    missing = set(files) - {g.section for g in graphs.values()}
    if missing:
        raise RuntimeError(f"{bundle.name} has no section for {', '.join(sorted(missing))}")
    tmp = bundle.with_name(f".{bundle.name}.rebuilt")
    try:
        overrides, reach = _stored_once(source, graphs, bundle, _with_capabilities(source, bundle))
        with _streamed_output(litertlm_utils.mmap_utils), litertlm_identity(_content_uuid(source, overrides)):
            source.serialize(tmp, overrides)
        rebuilt = litertlm_utils.LiteRTLMFile(tmp).sections
        for i, later in reach.items():
            _widen(tmp, i, max(rebuilt[j].endOffset for j in later.values()))
        _check(tmp, overrides, graphs, reach)
        shutil.copymode(bundle, tmp)
        tmp.replace(bundle)
    finally:
        tmp.unlink(missing_ok=True)
        for g in graphs.values():
            _without_shared(bundle, g.section).unlink(missing_ok=True)
        _metadata_file(bundle).unlink(missing_ok=True)
    shared = {graphs[i].section: _by_section(graphs, later) for i, later in reach.items()}
    return Layout([graphs[i].section for i in sorted(graphs)], shared)


# the tool capabilities gives a chat template: one that supports function calling writes it into the prompt
_PROBE_TOOL = {"type": "function", "function": {
    "name": "mtpkit_probe_tool", "description": "A probe.", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "description": "x"}}, "required": ["x"]}}}


def capabilities(template: str, bos_token: str = "") -> tuple[bool, bool]:
    """(function calling, thinking) as the chat template supports them: it writes a tool it is given into the
    prompt, and enable_thinking changes the prompt. Rendered as mtpkit's runtime renders (sandboxed and bounded); a
    template that refuses or fails these renders supports neither."""
    from mtpkit.errors import ManifestError, UsageError
    from mtpkit.runtime.chat_template import render

    def rendered(**options) -> str | None:
        try:
            return render(template, Path("the bundle's chat template"), messages=[{"role": "user", "content": "Hi"}],
                          add_generation_prompt=True, bos_token=bos_token, **options)
        except (ManifestError, UsageError):
            return None

    declared = rendered(tools=[_PROBE_TOOL])
    on, off = rendered(tools=None, enable_thinking=True), rendered(tools=None, enable_thinking=False)
    return (declared is not None and _PROBE_TOOL["function"]["name"] in declared,
            on is not None and off is not None and on != off)


def _with_capabilities(source, bundle: Path) -> dict:
    """{index: _FileSection} of the LlmMetadata section with supports_function_calling and supports_thinking as its
    chat template supports them (capabilities; a thought also needs a channel to come back in), or {} where the
    section says so already. LiteRT-LM's ModelInfo reads those fields (schema/model_info/model_info.cc, litert-lm
    0.18.1) and litert-torch 0.10.0 never sets them, so a bundle otherwise reports neither."""
    from ai_edge_quantizer.utils import litertlm_utils
    from litert_lm_builder.runtime.proto import llm_metadata_pb2

    for i, section in enumerate(source.sections):
        if section.dataType != litertlm_utils.AnySectionDataType.LlmMetadataProto:
            continue
        raw = bytes(source.get_section_buffer(i))
        metadata = llm_metadata_pb2.LlmMetadata.FromString(raw)
        tools, thinking = capabilities(metadata.jinja_prompt_template, metadata.start_token.token_str)
        metadata.supports_function_calling = tools
        metadata.supports_thinking = thinking and len(metadata.channels) > 0
        if metadata.SerializeToString() == raw:
            return {}
        _metadata_file(bundle).write_bytes(metadata.SerializeToString())
        return {i: _FileSection(_metadata_file(bundle))}
    return {}


def _metadata_file(bundle: Path) -> Path:
    """The temporary file the LlmMetadata section's new bytes are written to, beside the bundle."""
    return bundle.with_name(f".{bundle.name}.llm_metadata.pb")


def _without_shared(bundle: Path, section: str) -> Path:
    """The temporary file a section's copy without its shared weights is written to, beside the bundle."""
    return bundle.with_name(f".{bundle.name}.{section}.tflite")


def _by_section(graphs: dict, later: dict[str, int]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, j in sorted(later.items()):
        out.setdefault(graphs[j].section, []).append(name.removeprefix(WEIGHT))
    return out


class _Graph:
    """One exported .tflite: its flatbuffer, and its weights stored after it (offset buffers) by tensor name."""

    def __init__(self, path: Path, section: str):
        from ai_edge_litert import schema_py_generated as schema

        self.path, self.section, self.raw = path, section, read_map(path)
        self.model = schema.ModelT.InitFromPackedBuf(self.raw, 0)
        self.named: dict[str, int] = {}  # tensor name -> buffer index
        self.spans: dict[str, tuple[int, int]] = {}  # tensor name -> (offset, size) in this file
        self.digests: dict[str, str] = {}
        for sg in self.model.subgraphs:
            for t in sg.tensors:
                buf = self.model.buffers[t.buffer] if t.buffer else None
                if buf is not None and buf.offset > 1:
                    self.named.setdefault(t.name.decode(), t.buffer)
                    self.spans.setdefault(t.name.decode(), (int(buf.offset), int(buf.size)))

    def span(self, name: str) -> tuple[int, int]:
        """Where the weight lies in this graph's file."""
        return self.spans[name]

    def offset(self, name: str) -> int:
        """Where the weight lies in this graph's section (moved where a copy without shared weights replaced it)."""
        return int(self.model.buffers[self.named[name]].offset)

    def digest(self, name: str) -> str:
        if name not in self.digests:
            offset, size = self.span(name)
            self.digests[name] = _digest(memoryview(self.raw)[offset:offset + size])
        return self.digests[name]

    def same(self, name: str, other: _Graph) -> bool:
        """Whether this graph holds `name` with the bytes `other` holds it with."""
        return name in self.spans and self.spans[name][1] == other.spans[name][1] and \
            self.digest(name) == other.digest(name)


def _digest(view) -> str:
    h = hashlib.sha256()
    for start in range(0, len(view), _BLOCK):
        h.update(view[start:start + _BLOCK])
    return h.hexdigest()


def _stored_once(source, graphs: dict[int, _Graph], bundle: Path,
                 others: dict) -> tuple[dict, dict[int, dict[str, int]]]:
    """The section overrides (`others`, then a _FileSection per TFLite section) and, per section, its weights found
    with the same name and bytes in a later section: name -> that section's index. A section with such weights gets
    a copy without them, its offsets pointing where the later section's copy will lie."""
    order = sorted(graphs)
    reach: dict[int, dict[str, int]] = {}
    for k, i in enumerate(order):  # the last section holding it: that one keeps its copy, so nothing chains
        for name in graphs[i].named:
            j = next((j for j in reversed(order[k + 1:]) if graphs[j].same(name, graphs[i])), None)
            if j is not None:
                reach.setdefault(i, {})[name] = j
    overrides = {**others, **{i: _FileSection(g.path) for i, g in graphs.items()}}
    stripped = {i: _Stripped(graphs[i], set(names), _without_shared(bundle, graphs[i].section))
                for i, names in reach.items()}
    for i, s in stripped.items():
        overrides[i] = _FileSection(s.path)
    begins = _begins(source, overrides)
    for i, s in stripped.items():
        s.point({name: begins[j] - begins[i] + graphs[j].offset(name) for name, j in reach[i].items()})
        overrides[i] = _FileSection(s.path)
    return overrides, reach


def _begins(source, overrides: dict) -> list[int]:
    """Where each section will begin: serialize's layout (in order, each at a 16 KiB boundary)."""
    from litert_lm_builder import litertlm_core

    block = litertlm_core.BLOCK_SIZE
    begins = [min(s.beginOffset for s in source.sections)]
    for i, s in enumerate(source.sections):
        size = len(overrides[i]) if i in overrides else s.endOffset - s.beginOffset
        begins.append((begins[-1] + size + block - 1) // block * block)
    return begins


class _Stripped:
    """A graph's copy without the named weights: its other weights laid out again after the flatbuffer as graft.py
    lays them (graft.lay_out, in their order), the named ones' offsets left to point()."""

    def __init__(self, graph: _Graph, names: set[str], path: Path):
        self.graph, self.path = graph, path
        model, gone = graph.model, {graph.named[n] for n in names}
        kept = sorted((int(b.offset), k) for k, b in enumerate(model.buffers) if b.offset > 1 and k not in gone)
        for k in gone:
            model.buffers[k].offset = _PLACEHOLDER
        end = lay_out(model, [(k, int(model.buffers[k].size)) for _, k in kept])
        with open(path, "wb") as f:
            f.write(_pack(model))
            for old, k in kept:
                f.seek(model.buffers[k].offset)
                view = memoryview(graph.raw)[old:old + int(model.buffers[k].size)]
                for start in range(0, len(view), _BLOCK):
                    f.write(view[start:start + _BLOCK])
            f.truncate(end)

    def point(self, offsets: dict[str, int]) -> None:
        """Set the named weights' offsets (from this section's start) and write the flatbuffer again."""
        model = self.graph.model
        head = _pack(model)
        for name, offset in offsets.items():
            model.buffers[self.graph.named[name]].offset = offset
        final = _pack(model)
        if len(final) != len(head):
            raise RuntimeError(f"{self.path.name}: the flatbuffer changed length when packed again")
        with open(self.path, "r+b") as f:
            f.write(final)


def _widen(path: Path, section: int, end: int) -> None:
    """Set a section's end offset in the bundle's header (the header's flatbuffer keeps its length)."""
    import flatbuffers
    from litert_lm_builder import litertlm_core
    from litert_lm_builder import litertlm_header_schema_py_generated as schema

    first = litertlm_core.HEADER_BEGIN_BYTE_OFFSET
    with open(path, "r+b") as f:
        f.seek(litertlm_core.HEADER_END_LOCATION_BYTE_OFFSET)
        header_end = struct.unpack("<Q", f.read(8))[0]
        f.seek(first)
        meta = schema.LiteRTLMMetaDataT.InitFromPackedBuf(f.read(header_end - first))
        meta.sectionMetadata.objects[section].endOffset = end
        builder = flatbuffers.Builder(1024)
        builder.Finish(meta.Pack(builder))
        packed = bytes(builder.Output())
        if len(packed) != header_end - first:
            raise RuntimeError(f"{path.name}: the header changed length when a section's end was set")
        f.seek(first)
        f.write(packed)


def _check(path: Path, overrides: dict, graphs: dict[int, _Graph], reach: dict[int, dict[str, int]]) -> None:
    """Each TFLite section begins with its file's bytes, and a weight stored in a later section lies where the
    section's flatbuffer says, with the bytes its own file holds."""
    from ai_edge_quantizer.utils import litertlm_utils

    sections = litertlm_utils.LiteRTLMFile(path).sections
    raw = read_map(path)
    for i, section in overrides.items():
        begin = sections[i].beginOffset
        if not _same_bytes(section.path, path, begin, begin + section.size):
            name = graphs[i].section if i in graphs else "metadata"
            raise RuntimeError(f"{path.name}: rebuilt section {i} ({name}) differs from its file")
        placed = _Graph(section.path, graphs[i].section) if i in reach else None
        for name in reach.get(i, {}):
            offset, size = placed.span(name)
            if begin + offset + size > sections[i].endOffset or \
                    _digest(memoryview(raw)[begin + offset:begin + offset + size]) != graphs[i].digest(name):
                raise RuntimeError(f"{path.name}: section {i} ({graphs[i].section}) does not find {name} in place")


def _content_uuid(source, overrides: dict) -> str:
    """The bundle's uuid, named by its sections (each one's metadata and sha256, in order): the same sections give
    the same uuid, and any changed section a new one, as a drawn uuid4 would (export/scoped.py litertlm_identity)."""
    digest = hashlib.sha256()
    for i in range(len(source.sections)):
        data = sha256_file(overrides[i].path) if i in overrides else hashlib.sha256(
            source.get_section_buffer(i)).hexdigest()
        items = json.dumps(source.get_section_metadata(i), sort_keys=True, default=str)
        digest.update(f"{i} {source.sections[i].dataType} {items} {data}\n".encode())
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"sha256:{digest.hexdigest()}"))


class _FileSection:
    """A section override that serialize sizes by len() and _StreamedFile copies from its file."""

    def __init__(self, path: Path):
        self.path, self.size = path, path.stat().st_size

    def __len__(self) -> int:
        return self.size


class _StreamedFile:
    """serialize's output file: bytes are written as given, a _FileSection is copied in from its file."""

    def __init__(self, path):
        self.f = open(path, "wb")

    def write(self, data) -> int:
        if not isinstance(data, _FileSection):
            return self.f.write(data)
        with open(data.path, "rb") as src:
            shutil.copyfileobj(src, self.f, _BLOCK)
        return data.size

    def close(self) -> None:
        self.f.close()


@contextlib.contextmanager
def _streamed_output(mmap_utils):
    """ai-edge-quantizer 0.10.0's LiteRTLMFile.serialize writes into a memory map of the whole output and takes
    every section as an in-memory buffer; give it a plain file that streams _FileSection overrides instead."""
    from ...scoped import patched

    with patched(mmap_utils, "get_mapped_buffer_or_none", lambda path, size: _StreamedFile(path)):
        yield


def _same_bytes(path: Path, other: Path, begin: int, end: int) -> bool:
    if path.stat().st_size != end - begin:
        return False
    with open(path, "rb") as a, open(other, "rb") as b:
        b.seek(begin)
        while chunk := a.read(_BLOCK):
            if b.read(len(chunk)) != chunk:
                return False
    return True
