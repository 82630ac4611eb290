"""The hostile-input catalogue (docs/hostile-inputs.md): each row runs one `mtpkit` command in-process on a broken
input and expects exit code 2 and exactly one line on stderr that names the problem, with no traceback.

Rows build their input from copies of the session's tiny checkpoint and tiny export, so no row exports anything.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from mtpkit import cli

pytestmark = pytest.mark.slow

PAIR = "e2b_gemma4_centroid"


@dataclass
class Ctx:
    tmp: Path
    checkpoints: Callable
    exports: Callable
    monkeypatch: pytest.MonkeyPatch

    @property
    def target(self) -> Path:
        return Path(self.checkpoints(PAIR)[0])

    @property
    def drafter(self) -> Path:
        return Path(self.checkpoints(PAIR)[1])

    @property
    def out(self) -> Path:
        return self.tmp / "out"

    def copy(self, src: Path, name: str) -> Path:
        dst = self.tmp / name
        shutil.copytree(src, dst)
        return dst

    def config(self, folder: Path, edit: Callable[[dict], None]) -> Path:
        cfg = json.loads((folder / "config.json").read_text())
        edit(cfg)
        (folder / "config.json").write_text(json.dumps(cfg))
        return folder

    def export(self, *args, target=None, drafter=None) -> list[str]:
        return ["export", str(target or self.target), "--drafter", str(drafter or self.drafter), "--out",
                str(self.out), "--max-cache-len", "64", "--reference-tokens", "4", *map(str, args)]

    def export_copy(self) -> Path:
        return self.copy(Path(self.exports(PAIR)), "export")

    def manifest(self, edit: Callable[[dict], object]) -> Path:
        folder = self.export_copy()
        m = json.loads((folder / "manifest.json").read_text())
        edit(m)
        (folder / "manifest.json").write_text(json.dumps(m))
        return folder

    def run(self, *args, folder=None) -> list[str]:
        folder = folder or Path(self.exports(PAIR))
        args = ("--prompt", "hi", *args) if not any(str(a).startswith("--prompt") for a in args) else args
        return ["run", str(folder), "--max-new-tokens", "4", *map(str, args)]


def _truncate(path: Path, keep: int = 1000) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def _flip(path: Path, at: int = -10) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- export: checkpoints -------------------------------------------------------------------------------------------

def _not_a_folder(c: Ctx):
    (c.tmp / "weights.txt").write_text("x")
    return c.export(target=c.tmp / "weights.txt")


def _empty_folder(c: Ctx):
    (c.tmp / "empty").mkdir()
    return c.export(target=c.tmp / "empty")


def _config_bytes(c: Ctx, content: bytes):
    folder = c.copy(c.target, "target")
    (folder / "config.json").write_bytes(content)
    return c.export(target=folder)


def _llama(c: Ctx):
    folder = c.copy(c.target, "llama")
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    return c.export(target=folder)


def _vision_only_config(c: Ctx):
    folder = c.config(c.copy(c.target, "vision"), lambda cfg: cfg.pop("text_config"))
    return c.export(target=folder)


def _vision_only_weights(c: Ctx):
    import numpy as np
    from safetensors.numpy import save_file

    folder = c.copy(c.target, "vision")
    save_file({"model.vision_tower.patch_embedder.weight": np.zeros((4, 4), np.float32)},
              str(folder / "model.safetensors"))
    return c.export(target=folder)


def _weights_edit(c: Ctx, edit: Callable[[Path], None]):
    folder = c.copy(c.target, "target")
    edit(folder / "model.safetensors")
    return c.export(target=folder)


def _garble_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[:12] = b"\xff" * 12
    path.write_bytes(bytes(data))


def _unreadable(c: Ctx, name: str) -> None:
    """Reading files called `name` fails as it does without read permission (the tests run as root, for whom
    chmod 000 changes nothing)."""
    read_text = Path.read_text

    def denied(self, *args, **kwargs):
        if self.name == name:
            raise PermissionError(13, "Permission denied", str(self))
        return read_text(self, *args, **kwargs)

    c.monkeypatch.setattr(Path, "read_text", denied)


def _unreadable_config(c: Ctx):
    _unreadable(c, "config.json")
    return c.export()


def _unreadable_manifest(c: Ctx):
    folder = Path(c.exports(PAIR))  # exported before reads are denied: the shared export may not exist yet
    _unreadable(c, "manifest.json")
    return c.run(folder=folder)


def _pickle_only(c: Ctx):
    folder = c.copy(c.target, "pickled")
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    return c.export(target=folder)


def _missing_shard(c: Ctx):
    folder = c.copy(c.target, "sharded")
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    return c.export(target=folder)


def _drafter_edit(c: Ctx, edit: Callable[[dict], None]):
    return c.export(drafter=c.config(c.copy(c.drafter, "drafter"), edit))


def _text(key: str, value) -> Callable[[dict], None]:
    return lambda cfg: cfg["text_config"].__setitem__(key, value)


def _tokenizer(c: Ctx, content: bytes | None):
    folder = c.copy(c.target, "target")
    if content is None:
        (folder / "tokenizer.json").unlink()
    else:
        (folder / "tokenizer.json").write_bytes(content)
    return c.export(target=folder)


def _out_exists(c: Ctx):
    c.out.mkdir()
    (c.out / "keep.txt").write_text("mine")
    return c.export()


def _out_is_file(c: Ctx):
    c.out.write_text("a file")
    return c.export("--force")


def _busy(c: Ctx):
    from mtpkit.export.outdir import OutputLock

    c.held = OutputLock(c.out).acquire()  # as another export would hold it; released by the test
    return c.export()


# --- run: export folders and manifests -----------------------------------------------------------------------------

def _no_manifest(c: Ctx):
    (c.tmp / "empty").mkdir()
    return c.run(folder=c.tmp / "empty")


def _manifest_bytes(c: Ctx, content: bytes):
    folder = c.export_copy()
    (folder / "manifest.json").write_bytes(content)
    return c.run(folder=folder)


def _file_edit(c: Ctx, name: str, edit: Callable[[Path], None]):
    folder = c.export_copy()
    edit(folder / name)
    return c.run(folder=folder)


def _resigned_truncated_graph(c: Ctx):
    folder = c.export_copy()
    _truncate(folder / "target.onnx", 5000)

    def resign(m):
        entry = m["backends"]["onnx"]["graphs"]["target"]
        entry["sha256"], entry["bytes"] = _sha(folder / "target.onnx"), 5000

    m = json.loads((folder / "manifest.json").read_text())
    resign(m)
    (folder / "manifest.json").write_text(json.dumps(m))
    return c.run(folder=folder)


def _resigned_nan_graph(c: Ctx):
    """A norm weight of the target set to NaN and the graph re-signed: it loads, and NaN reaches every logit."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    folder = c.export_copy()
    path = folder / "target.onnx"
    model = onnx.load(str(path), load_external_data=False)
    scales = {n.input[1] for n in model.graph.node if n.op_type.endswith("SimplifiedLayerNormalization")}
    norm = next(t for t in model.graph.initializer if t.name in scales)
    norm.CopyFrom(numpy_helper.from_array(np.full(tuple(norm.dims), np.nan, np.float32), norm.name))
    onnx.save(model, str(path))
    m = json.loads((folder / "manifest.json").read_text())
    entry = m["backends"]["onnx"]["graphs"]["target"]
    entry["sha256"], entry["bytes"] = _sha(path), path.stat().st_size
    (folder / "manifest.json").write_text(json.dumps(m))
    return c.run(folder=folder)


def _litert_file(c: Ctx, name: str):
    """A copy whose manifest also declares a LiteRT graph `name`, which is then truncated: refused by its sha256
    before anything is loaded (so no LiteRT export is needed)."""
    folder = c.export_copy()
    (folder / name).write_bytes(bytes(range(256)) * 64)
    m = json.loads((folder / "manifest.json").read_text())
    m["backends"]["litert"] = {
        "kind": "litert", "kv_io": "state",
        "options": {"max_draft": 3, "mask": {"hidden": -1e9}, "prefill": [{"num_tokens": 8, "signature": "decode"}],
                    "bundle": {"file": name}},
        "graphs": {"target": {"file": name, "sha256": _sha(folder / name), "bytes": 16384, "backend": "litert"}},
        "signatures": {"decode": {"graph": "target", "inputs": [], "outputs": []}}}
    (folder / "manifest.json").write_text(json.dumps(m))
    _truncate(folder / name)
    return c.run(folder=folder)


def _onnx_graph(key: str, value):
    return lambda m: m["backends"]["onnx"]["graphs"]["target"].__setitem__(key, value)


def _tensor_role(m):
    m["backends"]["onnx"]["signatures"]["decode"]["inputs"][0]["role"] = "present_key"


def _tensor_renamed(m):
    m["backends"]["onnx"]["signatures"]["decode"]["inputs"][0]["name"] = "input_idz"


def _export_tokenizer(c: Ctx, content: bytes | None):
    """tokenizer.json deleted, or replaced by `content` with its sha256 re-signed in the manifest (so the file
    reaches the tokenizer's parser)."""
    folder = c.export_copy()
    if content is None:
        (folder / "tokenizer.json").unlink()
    else:
        _signed(folder, "tokenizer.json", content)
    return c.run(folder=folder)


def _signed(folder: Path, name: str, content: bytes) -> None:
    """Replace tokenizer.json or chat_template.jinja and record the new file's sha256 in the manifest."""
    (folder / name).write_bytes(content)
    m = json.loads((folder / "manifest.json").read_text())
    m["tokenizer"]["sha256" if name == "tokenizer.json" else "chat_template_sha256"] = _sha(folder / name)
    (folder / "manifest.json").write_text(json.dumps(m))


def _modified(name: str, edit: Callable[[bytes], bytes]):
    def build(c: Ctx):
        folder = c.export_copy()
        (folder / name).write_bytes(edit((folder / name).read_bytes()))
        return c.run("--chat", folder=folder)
    return build


def _chat_template(template: str):
    """A chat template re-signed in the manifest (hash-correct, as a hostile export would ship it), run with --chat."""
    def build(c: Ctx):
        folder = c.export_copy()
        _signed(folder, "chat_template.jinja", template.encode())
        return c.run("--chat", folder=folder)
    return build


def _prompt_file(c: Ctx, content: bytes):
    (c.tmp / "prompt.txt").write_bytes(content)
    return c.run("--prompt-file", c.tmp / "prompt.txt")


def _no_template(c: Ctx):
    return c.run("--chat", folder=c.manifest(lambda m: m["tokenizer"].__setitem__("chat_template_file", None)))


def _parity_without_reference(c: Ctx):
    return ["parity", str(c.manifest(lambda m: m.__setitem__("reference", None)))]


ROWS = [
    # (id, argv builder, text the one error line must contain)
    ("export-missing-folder", lambda c: c.export(target=c.tmp / "nope"), "does not exist"),
    ("export-target-is-a-file", _not_a_folder, "is not a folder"),
    ("export-empty-folder", _empty_folder, "has no config.json"),
    ("export-config-not-json", lambda c: _config_bytes(c, b"{\"model_type\": "), "config.json is not valid JSON"),
    ("export-config-bad-utf8", lambda c: _config_bytes(c, b"{\"a\": \"\xff\xfe\"}"), "config.json is not valid JSON"),
    ("export-config-unreadable", _unreadable_config, "config.json cannot be read (Permission denied)"),
    ("export-config-not-an-object", lambda c: _config_bytes(c, b"[1, 2]"), "not an HF config object"),
    ("export-non-gemma4-checkpoint", _llama, "model_type 'llama'; mtpkit needs a Gemma 4 target"),
    ("export-vision-only-config", _vision_only_config, "a gemma4 config without a text_config"),
    ("export-vision-only-weights", _vision_only_weights, "lacks"),
    ("export-drafter-as-target", lambda c: c.export(target=c.drafter), "model_type 'gemma4_assistant'"),
    ("export-target-as-drafter", lambda c: c.export(drafter=c.target), "mtpkit needs a Gemma 4 MTP drafter"),
    ("export-truncated-safetensors", lambda c: _weights_edit(c, _truncate),
     "model.safetensors is damaged or truncated (1000 bytes"),
    ("export-garbled-safetensors", lambda c: _weights_edit(c, _garble_header), "no valid safetensors header"),
    ("export-pickle-only-checkpoint", _pickle_only, "pickle checkpoints are refused"),
    ("export-missing-shard", _missing_shard, "missing weight shard model-00001-of-00002.safetensors"),
    ("export-mismatch-backbone-size", lambda c: _drafter_edit(c, lambda d: d.__setitem__("backbone_hidden_size", 96)),
     "backbone_hidden_size 96 != target hidden_size 64"),
    ("export-mismatch-vocab", lambda c: _drafter_edit(c, _text("vocab_size", 1024)), "vocab_size 1024 != target"),
    ("export-mismatch-head-dim", lambda c: _drafter_edit(c, _text("head_dim", 16)), "head_dim 16 != target"),
    ("export-mismatch-window", lambda c: _drafter_edit(c, _text("sliding_window", 16)),
     "sliding_window 16 != target 8"),
    ("export-mismatch-kv-heads", lambda c: _drafter_edit(c, _text("num_key_value_heads", 2)),
     "num_key_value_heads 2 != target 1"),
    ("export-unknown-backend", lambda c: c.export("--backend", "onx"), "unknown backend 'onx' (did you mean 'onnx'?)"),
    ("export-unknown-recipe", lambda c: c.export("--quant", "int44"),
     "invalid choice: 'int44' (did you mean 'int4'?)"),
    ("export-unknown-drafter-recipe", lambda c: c.export("--drafter-quant", "fp61"), "(did you mean 'fp16'?)"),
    ("export-bad-block-size", lambda c: c.export("--block-size", "48"), "argument --block-size: invalid choice: 48"),
    ("export-non-integer-flag", lambda c: c.export("--max-cache-len", "lots"), "invalid int value: 'lots'"),
    ("export-cache-too-short", lambda c: c.export("--max-cache-len", "8"), "--max-cache-len must be at least 16"),
    ("export-cache-too-long", lambda c: c.export("--max-cache-len", "1000000000"),
     "exceeds the target's max_position_embeddings (4096)"),
    ("export-prefill-beyond-cache", lambda c: c.export("--prefill-len", "65"),
     "--prefill-len 65 exceeds the KV capacity (64); choose at most 64"),
    ("export-max-draft-beyond-cache", lambda c: c.export("--max-draft", "64"),
     "--max-draft 64 exceeds the KV capacity (64) less the verified token; choose at most 63"),
    ("export-zero-reference-tokens", lambda c: c.export("--reference-tokens", "0"),
     "--reference-tokens must be at least 1"),
    ("export-tokenizer-missing", lambda c: _tokenizer(c, None), "has no tokenizer.json"),
    ("export-tokenizer-broken", lambda c: _tokenizer(c, b"{\"version\": \"1.0\", \"model\": 5}"),
     "is not a valid tokenizer.json"),
    ("export-out-exists", _out_exists, "already exists; pass --force"),
    ("export-out-is-a-file", _out_is_file, "exists and is not a folder"),
    ("export-out-busy", _busy, "is being written by another mtpkit export (pid"),
    ("export-memory-budget-too-small", lambda c: c.export("--memory-budget", "0.05"),
     "more than the 51 MB available (--memory-budget); no --backend / --quant / --dtype choice fits"),
    ("export-memory-budget-not-positive", lambda c: c.export("--memory-budget", "0"),
     "--memory-budget must be in (0, inf] and finite (got 0.0)"),
    ("export-max-size-unreachable", lambda c: c.export("--quant", "mobile", "--max-size", "0.001"),
     "--max-size 0.001 GB: onnx files plans"),
    ("export-max-size-not-positive", lambda c: c.export("--max-size", "0"), "--max-size must be in (0, inf]"),
    ("export-unknown-dtype", lambda c: c.export("--dtype", "bf61"), "invalid choice: 'bf61' (did you mean 'bf16'?)"),
    ("cli-misspelt-command", lambda c: ["exprot", "x"], "invalid choice: 'exprot' (did you mean 'export'?)"),
    ("run-missing-folder", lambda c: c.run(folder=c.tmp / "nope"), "is not a folder"),
    ("run-no-manifest", _no_manifest, "has no manifest.json"),
    ("run-manifest-unreadable", _unreadable_manifest, "manifest.json cannot be read (Permission denied)"),
    ("run-manifest-not-json", lambda c: _manifest_bytes(c, b"{\"schema_version\": 2,"), "is not valid JSON"),
    ("run-manifest-bad-utf8", lambda c: _manifest_bytes(c, b"{\"x\": \"\xc3\x28\"}"), "is not valid JSON"),
    ("run-manifest-not-an-object", lambda c: _manifest_bytes(c, b"[]"), "must hold a JSON object (got list)"),
    ("run-manifest-unknown-schema", lambda c: c.run(folder=c.manifest(lambda m: m.__setitem__("schema_version", 99))),
     "schema_version 99"),
    ("run-manifest-missing-field", lambda c: c.run(folder=c.manifest(lambda m: m.pop("kv_cache"))),
     "kv_cache is missing"),
    ("run-manifest-wrong-type",
     lambda c: c.run(folder=c.manifest(lambda m: m["kv_cache"].__setitem__("capacity", "64"))),
     'kv_cache.capacity must be an integer >= 1 (got "64")'),
    ("run-manifest-wrong-container", lambda c: c.run(folder=c.manifest(lambda m: m.__setitem__("backends", []))),
     "backends must be an object"),
    ("run-manifest-unknown-role", lambda c: c.run(folder=c.manifest(_tensor_role)), "must be one of input_ids"),
    ("run-manifest-tensor-renamed", lambda c: c.run(folder=c.manifest(_tensor_renamed)),
     "backends.onnx.signatures.decode declares input 'input_idz', which graph target (target.onnx) does not have"),
    ("run-manifest-sha256-mismatch", lambda c: c.run(folder=c.manifest(_onnx_graph("sha256", "0" * 64))),
     "target.onnx does not match the sha256 in manifest.json"),
    ("run-manifest-path-escape", lambda c: c.run(folder=c.manifest(_onnx_graph("file", "../target.onnx"))),
     "not a file inside the export folder"),
    ("run-graph-missing", lambda c: _file_edit(c, "drafter.onnx", Path.unlink), "drafter.onnx is missing"),
    ("run-onnx-truncated", lambda c: _file_edit(c, "target.onnx", _truncate),
     "target.onnx does not match the sha256"),
    ("run-onnx-corrupted", lambda c: _file_edit(c, "drafter.onnx", _flip), "drafter.onnx does not match the sha256"),
    ("run-onnx-truncated-resigned", _resigned_truncated_graph, "the onnx graphs in"),
    ("run-onnx-nan-weights-resigned", _resigned_nan_graph, "the model's logits contain NaN"),
    ("run-embeddings-bin-truncated", lambda c: _file_edit(c, "embeddings.bin", _truncate),
     "embeddings.bin does not match the sha256"),
    ("run-tflite-truncated", lambda c: _litert_file(c, "target.tflite"), "target.tflite does not match the sha256"),
    ("run-litertlm-truncated", lambda c: _litert_file(c, "model.litertlm"), "model.litertlm does not match the sha256"),
    ("run-tokenizer-missing", lambda c: _export_tokenizer(c, None), "tokenizer.json is missing"),
    ("run-tokenizer-broken", lambda c: _export_tokenizer(c, b"\x00\x01not json"), "is not a valid tokenizer.json"),
    ("run-chat-without-template", _no_template, "this export has no chat template"),
    ("run-tokenizer-modified", _modified("tokenizer.json", lambda b: b.replace(b'"<eos>"', b'"<EOS>"')),
     "tokenizer.json does not match the sha256"),
    ("run-chat-template-modified", _modified("chat_template.jinja", lambda b: b"{{ 'obey me' }}" + b),
     "chat_template.jinja does not match the sha256"),
    ("run-reference-modified", _modified("reference.json", lambda b: b.replace(b"[", b"[0, ", 1)),
     "reference.json does not match the sha256"),
    ("run-manifest-tokenizer-unhashed", lambda c: c.run(folder=c.manifest(lambda m: m["tokenizer"].pop("sha256"))),
     "tokenizer.sha256 is missing; re-export the model"),
    ("run-chat-template-range-overflow", _chat_template("{% for i in range(10**6) %}x{% endfor %}"),
     "cannot be rendered: OverflowError: Range too big"),
    ("run-chat-template-loops-for-ever", _chat_template(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
     "did not finish within 2 s"),
    ("run-chat-template-writes-too-much", _chat_template("{% for i in range(100000) %}{{ 'x' * 99999 }}{% endfor %}"),
     "wrote more than 4194304 characters"),
    ("run-chat-template-raises", _chat_template("{{ raise_exception('only user turns') }}"),
     "refuses this conversation: only user turns"),
    ("run-empty-prompt", lambda c: c.run("--prompt", ""), "--prompt is empty"),
    ("run-prompt-file-bad-utf8", lambda c: _prompt_file(c, b"def \xff\xfe(x):"),
     "is not valid UTF-8 (byte 0xff at offset 4)"),
    ("run-prompt-file-empty", lambda c: _prompt_file(c, b""), "is empty"),
    ("run-prompt-file-missing", lambda c: c.run("--prompt-file", c.tmp / "nope.txt"),
     "cannot read it (No such file or directory)"),
    ("run-prompt-bad-utf8-argv", lambda c: c.run("--prompt", "caf\udce9"), "the prompt is not valid UTF-8"),
    ("run-prompt-longer-than-cache", lambda c: c.run("--prompt", "x" * 400), "exceeds the export's KV capacity of 256"),
    ("run-max-new-tokens-absurd", lambda c: c.run("--max-new-tokens", str(10**12)), "exceeds the export's KV capacity"),
    ("run-max-new-tokens-zero", lambda c: c.run("--max-new-tokens", "0"), "--max-new-tokens must be >= 1 (got 0)"),
    ("run-k-zero", lambda c: c.run("-k", "0"), "--num-assistant-tokens must be >= 1"),
    ("run-k-negative", lambda c: c.run("-k", "-3"), "--num-assistant-tokens must be >= 1"),
    ("run-k-not-a-number", lambda c: c.run("-k", "many"), "must be a positive integer or 'auto'"),
    ("run-temperature-negative", lambda c: c.run("--temperature", "-1"), "temperature must be >= 0"),
    ("run-temperature-nan", lambda c: c.run("--temperature", "nan"), "temperature must be >= 0 and finite (got nan)"),
    ("run-temperature-inf", lambda c: c.run("--temperature", "inf"), "temperature must be >= 0 and finite (got inf)"),
    ("run-top-p-zero", lambda c: c.run("--top-p", "0"), "top_p must be in (0, 1]"),
    ("run-top-p-above-one", lambda c: c.run("--top-p", "1.5"), "top_p must be in (0, 1]"),
    ("run-top-k-negative", lambda c: c.run("--top-k", "-1"), "top_k must be >= 0"),
    ("run-seed-negative", lambda c: c.run("--seed", "-1", "--temperature", "0.5"), "seed must be >= 0"),
    ("run-threads-zero", lambda c: c.run("--threads", "0"), "--threads must be >= 1"),
    ("run-unknown-schedule", lambda c: c.run("--schedule", "fast"), "unknown schedule 'fast'"),
    ("run-unknown-backend", lambda c: c.run("--backend", "onxx"), "unknown backend 'onxx' (did you mean 'onnx'?)"),
    ("run-backend-not-exported", lambda c: c.run("--backend", "litert"), "this export has no litert graphs"),
    ("run-unknown-kv-handoff", lambda c: c.run("--kv-handoff", "x"), "unknown --kv-handoff 'x'"),
    ("parity-without-reference", _parity_without_reference, "has no transformers reference"),
    ("bench-zero-repeats", lambda c: ["bench", str(c.exports(PAIR)), "--repeats", "0"], "--repeats must be >= 1"),
    ("export-verify-without-record", lambda c: ["export", "--verify", str(c.manifest(lambda m: m.pop("export")))],
     "has no record of the flags it was exported with"),
    ("export-verify-other-versions", lambda c: ["export", "--verify", str(c.manifest(
        lambda m: m["export"]["versions"].update(torch="1.0.0")))], "was exported with torch 1.0.0 (installed: "),
    ("export-verify-with-flags", lambda c: ["export", "--verify", str(c.export_copy()), "--quant", "int4"],
     "re-runs the export with the flags DIR/manifest.json records; drop --quant"),
    ("export-verify-derived", lambda c: ["export", "--verify", str(c.manifest(
        lambda m: m["backends"]["onnx"]["graphs"]["drafter"].update(recipe="int8")))],
     "holds quantized graphs (drafter.onnx, ...) under the record of a float export"),
]


def main_rc(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as e:  # argparse errors exit from inside parse_args
        return e.code


@pytest.mark.parametrize("build,needle", [pytest.param(b, n, id=i) for i, b, n in ROWS])
def test_catalogue(build, needle, tmp_path, tiny_checkpoints, tiny_exports, capsys, monkeypatch):
    ctx = Ctx(tmp_path, tiny_checkpoints, tiny_exports, monkeypatch)
    argv = build(ctx)
    capsys.readouterr()
    try:
        rc = main_rc(["-q", *argv])
    finally:
        if getattr(ctx, "held", None):
            ctx.held.release()
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("mtpkit") and ": error: " in lines[0] and needle in lines[0], lines[0]
    if argv[0] == "export":  # nothing half-written next to --out
        leftovers = [p.name for p in ctx.out.parent.iterdir() if p.name.startswith(f".{ctx.out.name}.")]
        assert leftovers == [], leftovers


def test_catalogue_is_documented():
    """Every row is in docs/hostile-inputs.md with its test id, and the document names no row that is gone."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "hostile-inputs.md").read_text()
    ids = {i for i, _, _ in ROWS}
    documented = set(re.findall(r"test_catalogue\[([^\]]+)\]", doc))
    assert ids == documented, (sorted(ids - documented), sorted(documented - ids))
