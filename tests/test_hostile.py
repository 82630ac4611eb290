"""Hostile inputs: a manifest cannot make the runtime read outside its folder, its graph
signatures are checked against the graphs before any call, and chat templates render sandboxed, as transformers
renders them."""

from __future__ import annotations

import json
import shutil

import pytest

from mtpkit.runtime.manifest import ManifestError, load_manifest

pytestmark = pytest.mark.slow


def _with_target_file(src, dst, name: str):
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["backends"]["onnx"]["graphs"]["target"]["file"] = name
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


@pytest.mark.parametrize("name", ["../outside/target.onnx", "/tmp/target.onnx", "."])
def test_a_manifest_naming_a_file_outside_its_folder_is_refused(tiny_exports, tmp_path, name):
    export = _with_target_file(tiny_exports("e2b_gemma4_centroid"), tmp_path / "export", name)
    (tmp_path / "outside").mkdir()
    shutil.copy(export / "target.onnx", tmp_path / "outside" / "target.onnx")  # same bytes, same sha256
    with pytest.raises(ManifestError, match="not a file inside the export folder"):
        load_manifest(export)


def test_a_symlink_leading_out_of_the_export_is_refused(tiny_exports, tmp_path):
    export = tmp_path / "export"
    shutil.copytree(tiny_exports("e2b_gemma4_centroid"), export)
    (tmp_path / "elsewhere.onnx").write_bytes((export / "target.onnx").read_bytes())
    (export / "target.onnx").unlink()
    (export / "target.onnx").symlink_to(tmp_path / "elsewhere.onnx")
    with pytest.raises(ManifestError, match="leads outside the export folder"):
        load_manifest(export)


def _onnx_signature_edit(m: dict, signature: str, io: str, index: int, field: str, value) -> None:
    m["backends"]["onnx"]["signatures"][signature][io][index][field] = value


@pytest.mark.parametrize("edit,line", [
    (("decode", "inputs", 0, "name", "input_idz"),
     "manifest.json: backends.onnx.signatures.decode declares input 'input_idz', which graph target (target.onnx) "
     "does not have; re-export the model"),
    (("draft", "outputs", 1, "name", "projected"),
     "manifest.json: backends.onnx.signatures.draft declares output 'projected', which graph drafter (drafter.onnx) "
     "does not have; re-export the model"),
    (("verify", "inputs", 2, "shape", [1, 1, "past_sliding"]),
     "manifest.json: backends.onnx.signatures.verify declares input 'past_window.0.key' with rank 3, but graph "
     "target (target.onnx) has it with rank 4; re-export the model"),
    (("prefill", "inputs", 3, "name", "past_window.0.key"),  # a duplicate: past_window.0.value is left undeclared
     "manifest.json: backends.onnx.signatures.prefill does not declare input 'past_window.0.value' of graph target "
     "(target.onnx); re-export the model"),
], ids=["input-renamed", "output-renamed", "rank-changed", "input-undeclared"])
def test_a_signature_that_does_not_match_its_graph_is_refused_before_any_call(tiny_exports, tmp_path, edit, line):
    """The manifest itself carries no sha256, so an edited signature passes the loader: the backend compares it
    with the graph when it opens the graph, and names both in one line."""
    import mtpkit

    export = tmp_path / "export"
    shutil.copytree(tiny_exports("e2b_gemma4_centroid"), export)
    manifest = json.loads((export / "manifest.json").read_text())
    _onnx_signature_edit(manifest, *edit)
    (export / "manifest.json").write_text(json.dumps(manifest))
    load_manifest(export)  # the loader alone cannot tell
    with pytest.raises(ManifestError) as refused:
        mtpkit.load(export, threads=1)
    assert str(refused.value) == line


def test_chat_templates_render_sandboxed_and_like_transformers(tiny_exports):
    from transformers import AutoTokenizer

    from mtpkit.errors import UsageError

    from mtpkit.runtime.tokenizer import TextCodec

    export = tiny_exports("e2b_gemma4_centroid")
    codec = TextCodec(load_manifest(export))
    hf = AutoTokenizer.from_pretrained(str(export))
    for messages in ([{"role": "user", "content": "hi"}],
                     [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " yes "},
                      {"role": "user", "content": "again"}]):
        assert codec.render_chat(messages) == hf.apply_chat_template(messages, tokenize=False,
                                                                     add_generation_prompt=True)
    codec = TextCodec(load_manifest(export))
    codec.template = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(ManifestError, match="chat_template.jinja .line 1. cannot be rendered: SecurityError"):
        codec.render_chat([{"role": "user", "content": "x"}])
    codec.template = "{{ raise_exception('no system role') }}"
    with pytest.raises(UsageError, match="chat_template.jinja refuses this conversation: no system role"):
        codec.render_chat([{"role": "user", "content": "x"}])
