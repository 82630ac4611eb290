"""Function calling and thinking in the .litertlm bundle: LiteRT-LM's ModelInfo reports them as the chat template
supports them (export/backends/litert/bundle.py capabilities), and LiteRT-LM's Conversation with a litert_lm.Tool
returns the call mtpkit's API returns on the same export.

The Gemma 4-templated export is the tiny LiteRT export re-bundled with tests/data/gemma4_tools.jinja in its
metadata, as litert-torch ships a checkpoint's template. The tiny model writes random ids, so the pair is made to
call: the greedy answer's first id the prompt does not use is renamed, in the tokenizer of both, to a whole Gemma 4
call; the prompt encodes as before, and both runtimes must render the same prompt and pick the same ids to return it.
"""

from __future__ import annotations

import json
import re
import shutil
import zlib
from pathlib import Path

import pytest

from mtpkit.export.backends.litert.bundle import capabilities
from mtpkit.tiny.make import CHAT_TEMPLATE

TEMPLATE = Path(__file__).with_name("data") / "gemma4_tools.jinja"
CALL = '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>'
PAIR = "e4b_text_dense_kv_eq"  # KV capacity 512: a prompt that declares a tool is ~260 byte-level tokens


def get_weather(city: str, days: int) -> str:
    """The weather in a city

    Args:
        city: City name
        days: Days
    """
    return "sunny"


def test_capabilities_follow_what_the_template_renders():
    assert capabilities(TEMPLATE.read_text(), "<bos>") == (True, True)
    assert capabilities(CHAT_TEMPLATE, "<bos>") == (False, False)
    refuses = "{% if tools %}{{ raise_exception('no tools') }}{% endif %}{# enable_thinking #}{{ messages[0].content }}"
    assert capabilities(refuses) == (False, False)  # named, not supported


def _rebundled(folder: Path, template: str | None = None, tokenizer: bool = False) -> None:
    """The export's model.litertlm with `template` in its metadata (as litert-torch ships it: build_llm_metadata
    drops generation tags and turns .get('k') into ['k']) and/or folder's tokenizer.json, rebuilt by the export's
    own rebuild_bundle; the manifest signed again."""
    from ai_edge_quantizer.utils import litertlm_utils
    from litert_lm_builder.runtime.proto import llm_metadata_pb2

    from mtpkit.export.backends.litert.bundle import BUNDLE_SECTIONS, rebuild_bundle
    from mtpkit.runtime.manifest import sha256_file

    bundle, kinds = folder / "model.litertlm", litertlm_utils.AnySectionDataType
    source, replaced = litertlm_utils.LiteRTLMFile(bundle), {}
    for i, section in enumerate(source.sections):
        if section.dataType == kinds.LlmMetadataProto and template is not None:
            metadata = llm_metadata_pb2.LlmMetadata.FromString(bytes(source.get_section_buffer(i)))
            shipped = re.sub(r"\{%-?\s*(?:end)?generation\s*-?%\}", "", template)
            metadata.jinja_prompt_template = re.sub(r"\.get\(\s*(['\"][^'\"]+['\"])\s*\)", r"[\1]", shipped)
            replaced[i] = metadata.SerializeToString()
        elif section.dataType == kinds.HF_Tokenizer_Zlib and tokenizer:
            data = (folder / "tokenizer.json").read_bytes()
            replaced[i] = len(data).to_bytes(8, "little") + zlib.compress(data)
    source.serialize(folder / "replaced.litertlm", replaced)  # its graph sections are put back just below
    (folder / "replaced.litertlm").replace(bundle)
    rebuild_bundle(bundle, {section: folder / f"{name}.tflite" for name, section in BUNDLE_SECTIONS.items()})
    manifest = json.loads((folder / "manifest.json").read_text())
    if template is not None:
        (folder / "chat_template.jinja").write_text(template)
        manifest["tokenizer"]["chat_template_sha256"] = sha256_file(folder / "chat_template.jinja")
    manifest["tokenizer"]["sha256"] = sha256_file(folder / "tokenizer.json")
    graph = manifest["backends"]["litert"]["graphs"]["bundle"]
    graph["sha256"], graph["bytes"] = sha256_file(bundle), bundle.stat().st_size
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))


@pytest.mark.slow
@pytest.mark.litert
def test_litert_lm_reports_tools_and_thinking_and_returns_mtpkits_call(litert_exports, tmp_path):
    litert_lm = pytest.importorskip("litert_lm")
    import mtpkit

    folder = Path(shutil.copytree(litert_exports(PAIR), tmp_path / "export",
                                  ignore=shutil.ignore_patterns("*.xnnpack_cache")))
    info = litert_lm.ModelInfo(str(folder / "model.litertlm")).llm  # the tiny template: no tools, no thinking
    assert (info.supports_function_calling(), info.supports_thinking()) == (False, False)
    _rebundled(folder, TEMPLATE.read_text())
    info = litert_lm.ModelInfo(str(folder / "model.litertlm")).llm
    assert (info.supports_function_calling(), info.supports_thinking()) == (True, True)
    assert info.has_speculative_decoding_support()

    tool = litert_lm.tool_from_function(get_weather)
    tools, user = [tool.get_tool_description()], [{"role": "user", "content": "Weather in Paris?"}]
    answer = mtpkit.load(folder, threads=1, backend="litert").chat(user, tools=tools, mtp=False, max_new_tokens=8)
    ids, prompt = list(answer.token_ids), set(answer.prompt_ids)
    k = next(k for k, t in enumerate(ids) if t not in prompt and t not in ids[:k] and t > 6)  # 0..6: specials
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    del vocab[next(name for name, i in vocab.items() if i == ids[k])]
    vocab[CALL] = ids[k]  # decodes (byte-level, all printable ASCII) to the call's text
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    _rebundled(folder, tokenizer=True)

    reply = mtpkit.load(folder, threads=1, backend="litert").chat(user, tools=tools, mtp=False, max_new_tokens=k + 1)
    call = {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}
    assert (reply.tool_calls, reply.tool_call_error) == ([call], None)
    engine = litert_lm.Engine(str(folder / "model.litertlm"), backend=litert_lm.Backend.CPU())
    try:
        conversation = engine.create_conversation(tools=[tool], automatic_tool_calling=False,
                                                  sampler_config=litert_lm.SamplerConfig(top_k=1))
        message = conversation.send_message(user[0]["content"], max_output_tokens=k + 1)
        conversation.close()
    finally:
        engine.close()
    assert [{"name": c.name, "arguments": c.arguments} for c in message.tool_calls] == reply.tool_calls
