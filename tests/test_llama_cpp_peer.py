"""The llama.cpp peer of `mtpkit bench --peers` (mtpkit/bench/llama_cpp.py): which GGUF types an export gets, the
conversion cache key, the converter's files taken from the source distribution, the tokenizer relabelling for the
tiny pairs, the one-line skip note without llama-cpp-python and, when it is installed, one end-to-end run.
Speed is never asserted."""

from __future__ import annotations

import importlib.util
import io
import json
import tarfile
from types import SimpleNamespace

import pytest

from mtpkit import cli, extras
from mtpkit.bench import llama_cpp as peer


def _manifest(recipe: str) -> SimpleNamespace:
    graphs = {"target": SimpleNamespace(recipe=recipe), "drafter": SimpleNamespace(recipe="int8")}
    backend = SimpleNamespace(graphs=graphs, signatures={"decode": SimpleNamespace(graph="target")})
    return SimpleNamespace(backend=lambda: backend)


@pytest.mark.parametrize("recipe, types", [("fp32", ("F32",)), ("fp16", ("F16",)), ("int8", ("Q8_0",)),
                                           ("int8-dynamic", ("Q8_0",)), ("int4", ("Q4_0", "Q4_K_M")),
                                           ("int4-rtn", ("Q4_0", "Q4_K_M"))])
def test_gguf_types_follow_the_target_graphs_recipe(recipe, types):
    assert peer.gguf_types(_manifest(recipe)) == types
    assert all(t in peer.CONVERTER_TYPES or t in peer.QUANTIZER_TYPES for t in types)  # each can be made


def test_every_export_recipe_has_a_gguf_type_that_can_be_made():
    from mtpkit.export.recipes import RECIPES

    for r in RECIPES.values():
        assert r.gguf and all(t in peer.CONVERTER_TYPES or t in peer.QUANTIZER_TYPES for t in r.gguf), r.name


def test_the_cache_key_follows_every_file_of_the_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("MTPKIT_CACHE_DIR", str(tmp_path / "cache"))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"weights")
    key = peer.checkpoint_key(ckpt)
    assert len(key) == 16 and peer.checkpoint_key(ckpt) == key  # stable
    copy = tmp_path / "elsewhere"
    copy.mkdir()
    for f in ckpt.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    assert peer.checkpoint_key(copy) == key  # the bytes, not the place
    (copy / "model.safetensors").write_bytes(b"weighty")
    assert peer.checkpoint_key(copy) != key
    (ckpt / "tokenizer.json").write_text("{}")
    assert peer.checkpoint_key(ckpt) != key


def test_a_cached_gguf_is_not_converted_again(tmp_path, monkeypatch):
    monkeypatch.setenv("MTPKIT_CACHE_DIR", str(tmp_path / "cache"))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    cached = tmp_path / "cache" / "llama-cpp" / "0.0.1" / "gguf" / f"{peer.checkpoint_key(ckpt)}-Q4_0.gguf"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"GGUF")
    monkeypatch.setattr(peer, "converter", lambda *a: pytest.fail("converted again"))
    assert peer.gguf_file(ckpt, "Q4_0", "0.0.1") == cached


def _sdist(path, files: dict[str, bytes]):
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_only_the_converter_is_taken_from_the_source_distribution(tmp_path):
    root = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
    _sdist(tmp_path / "s.tar.gz", {root + "convert_hf_to_gguf.py": b"main", root + "conversion/gemma.py": b"g",
                                   root + "gguf-py/gguf/__init__.py": b"i", root + "src/llama.cpp": b"c",
                                   root + "convert_lora_to_gguf.py": b"l", "llama_cpp_python-0.3.36/setup.py": b"s",
                                   root + "conversion/../../../../escape.py": b"x"})
    peer.extract_converter(tmp_path / "s.tar.gz", tmp_path / "out")
    found = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert found == ["conversion/gemma.py", "convert_hf_to_gguf.py", "gguf-py/gguf/__init__.py"]
    assert not (tmp_path / "escape.py").exists()


def test_a_byte_level_tokenizer_is_relabelled_in_a_linked_copy(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    tok = {"model": {"type": "BPE", "byte_fallback": False, "vocab": {"<pad>": 0, "<eos>": 1}, "merges": []},
           "decoder": {"type": "ByteLevel"}, "added_tokens": []}
    (ckpt / "tokenizer.json").write_text(json.dumps(tok))
    (ckpt / "model.safetensors").write_bytes(b"weights")
    copy = peer.convertible(ckpt, tmp_path / "scratch")
    assert copy != ckpt and (copy / "model.safetensors").resolve() == (ckpt / "model.safetensors").resolve()
    new = json.loads((copy / "tokenizer.json").read_text())
    assert new["model"]["byte_fallback"] and new["decoder"] == {"type": "Sequence", "decoders": [{"type": "ByteLevel"}]}
    assert new["model"]["vocab"] == tok["model"]["vocab"]  # ids unchanged
    assert (copy / "merges.txt").read_text() == "<pad> <eos>\n"  # no merges: one that never applies
    gemma = {**tok, "model": {**tok["model"], "byte_fallback": True, "merges": ["a b"]},
             "decoder": {"type": "Sequence", "decoders": []}}
    (ckpt / "tokenizer.json").write_text(json.dumps(gemma))
    assert peer.convertible(ckpt, tmp_path / "scratch2") == ckpt  # Gemma's own tokenizer: read as it is


def test_without_llama_cpp_the_peers_note_it_in_one_line(monkeypatch, tmp_path):
    from contextlib import ExitStack

    from mtpkit.bench import peers

    monkeypatch.setattr(peers, "resolve_sources", lambda manifest: (SimpleNamespace(folder=tmp_path),) * 2)
    real = extras.importlib.util.find_spec
    monkeypatch.setattr(extras.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    notes: list[str] = []
    with ExitStack() as stack:
        assert peers._llama_cpp_peers(SimpleNamespace(), 1, 4, "onnx", stack, notes, None) == []
    assert notes == ["llama.cpp rows skipped: the llama.cpp peer needs the [llama-cpp] extra (llama_cpp not "
                     "installed); install it with: pip install 'mtpkit[llama-cpp]' (from a source checkout: "
                     "pip install '.[llama-cpp]')"]


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs the [llama-cpp] extra")
def test_a_file_llama_cpp_refuses_is_a_note_not_a_crash(tmp_path, monkeypatch):
    from contextlib import ExitStack

    monkeypatch.setenv("MTPKIT_CACHE_DIR", str(tmp_path / "cache"))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    import llama_cpp

    bad = peer.cache_dir() / "llama-cpp" / llama_cpp.__version__ / "gguf" / f"{peer.checkpoint_key(ckpt)}-F32.gguf"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"GGUF but not really")
    manifest = SimpleNamespace(**vars(_manifest("fp32")), eos_ids=[1], kv_cache={"capacity": 64})
    with ExitStack() as stack, pytest.raises(peer.LlamaCppError, match="llama.cpp could not open .*-F32.gguf"):
        peer.llama_cpp_peers(manifest, ckpt, 1, 4, "mtpkit onnx plain", stack)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs the [llama-cpp] extra")
def test_bench_peers_lists_llama_cpp_on_a_tiny_onnx_export(tiny_exports, tmp_path, capfd):
    """Converts into the user's mtpkit cache (fetching llama.cpp's converter there once), so a rerun is quick.
    Skipped before the export fixture is built when llama-cpp-python is not installed (CI: building it from
    source takes about 13 minutes on 2 cores)."""
    folder = tiny_exports("e2b_gemma4_centroid")
    capfd.readouterr()
    argv = ["bench", str(folder), "--peers", "--prompt", "def f(x):", "--repeats", "1", "--max-draft", "1",
            "--max-new-tokens", "4", "--threads", "1", "--json", str(tmp_path / "bench.json")]
    assert cli.main(argv) == 0
    out, err = capfd.readouterr()
    assert "than llama.cpp F32" in out and err == ""  # llama.cpp's C++ logging kept out of the terminal
    sec = json.loads((tmp_path / "bench.json").read_text())["peers"]
    rows = {r["name"]: r for r in sec["rows"]}
    assert list(rows)[:3] == ["mtpkit onnx plain", "transformers plain", "llama.cpp F32"]  # beside its baseline
    row = rows["llama.cpp F32"]
    assert row["baseline"] == "mtpkit onnx plain" and row["threads"] == 1 and row["ratio"] > 0
    assert row["per_prompt"][0]["new_tokens"] == 4 and "no Gemma 4 assistant drafter" in row["note"]
    assert row["compared"] == 1  # whether its tokens agree is reported, not asserted
