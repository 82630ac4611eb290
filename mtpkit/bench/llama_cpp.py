"""llama.cpp as a peer of `mtpkit bench --peers` (the [llama-cpp] extra, llama-cpp-python): the export's target
checkpoint converted with llama.cpp's own converter, at the GGUF type closest to the target graph's recipe, decoded
greedily on mtpkit's token ids. Plain decoding only: llama.cpp's C++ tools can draft with a Gemma 4 assistant
(common/speculative.cpp), but llama-cpp-python 0.3.36 binds only the C API under it (LLAMA_CONTEXT_TYPE_MTP), not
that loop, and its own draft_model is prompt lookup.

- The converter. llama-cpp-python's package carries the library, not convert_hf_to_gguf.py; the source
  distribution of the same version does (vendor/llama.cpp). It is fetched once with pip, so pip's index settings
  apply, and its converter files kept in <mtpkit cache>/llama-cpp/<version>/llama.cpp (runtime/verified.py
  cache_dir). The converter runs in a subprocess with this Python; it needs torch and transformers ([export]).
- GGUF files are cached beside it, gguf/<key>-<TYPE>.gguf, key = sha256 over the checkpoint's files: a rerun
  converts nothing. F32, F16 and Q8_0 come from the converter; Q4_0 and Q4_K_M from llama.cpp's quantizer
  (llama_model_quantize) on the F32 file, as llama-quantize makes them.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Callable

from mtpkit.errors import MtpkitError
from mtpkit.extras import require
from mtpkit.runtime.quiet import output_captured
from mtpkit.runtime.verified import VerifiedFiles, cache_dir

from .peer_timing import Peer, PeerOutput, PeerPrompt

CONVERTER_TYPES = {"F32": "f32", "F16": "f16", "Q8_0": "q8_0"}  # convert_hf_to_gguf.py --outtype
QUANTIZER_TYPES = {"Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}  # llama_cpp names
CONVERTER_FILES = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/gguf/")  # under the sdist's vendor/llama.cpp
# bumped whenever what convertible() writes changes, so cached GGUF files made from the old copy are not reused
CONVERSION_COPY = 1
NOTE = "plain decode (no Gemma 4 assistant drafter)"


class LlamaCppError(MtpkitError):
    """The llama.cpp rows cannot be built (converter not fetched, conversion failed); the bench notes it and goes on."""


def llama_cpp_peers(manifest, folder: Path, threads: int, max_new_tokens: int, baseline: str,
                    stack, progress: Callable[[str], None] | None = None) -> list[Peer]:
    """One plain greedy row per GGUF type of gguf_types(manifest), compared with `baseline`, on `threads` threads.

    folder: the target checkpoint the export was made from. The models close when `stack` does.

    Raises:
        MissingExtraError: llama-cpp-python is not installed.
        LlamaCppError: the converter could not be fetched or failed, or llama.cpp refused the file it wrote.
    """
    require("llama-cpp", "the llama.cpp peer")
    import llama_cpp  # type: ignore[import-untyped, import-not-found, unused-ignore]

    version = llama_cpp.__version__
    eos = frozenset(manifest.eos_ids)
    peers = []
    for gguf_type in gguf_types(manifest):
        path = gguf_file(folder, gguf_type, version, progress)
        try:  # verbose=False silences llama.cpp's log; what else its load prints on fd 2 stays out of the table
            with output_captured(f"llama.cpp loading {path.name}"):
                llm = llama_cpp.Llama(model_path=str(path), n_ctx=manifest.kv_cache.capacity, n_threads=threads,
                                      n_threads_batch=threads, verbose=False)
        except ValueError as e:  # what llama-cpp-python raises for a file llama.cpp refuses
            raise LlamaCppError(f"llama.cpp could not open {path}: {e}") from None
        stack.callback(llm.close)
        peers.append(Peer(f"llama.cpp {gguf_type}", _runner(llm, max_new_tokens, eos), threads, baseline,
                          f"GGUF {gguf_type}, {NOTE}, llama-cpp-python {version}"))
    return peers


def gguf_types(manifest) -> tuple[str, ...]:
    """The GGUF types closest to the recipe of the target's decode graph on the export's first backend (the
    recipe's `gguf`, export/recipes.py: same storage width, one scale per block of 32 (Q4_0, Q8_0) and, for int4,
    llama.cpp's usual mixed 4-bit type too (Q4_K_M: some tensors kept at 6 bits))."""
    from mtpkit.export.recipes import RECIPES

    backend = manifest.backend()
    chosen = RECIPES.get(backend.graphs[backend.signatures["decode"].graph].recipe)
    return chosen.gguf if chosen is not None and chosen.gguf else ("F32",)


def _runner(llm, max_new_tokens: int, eos: frozenset) -> Callable[[PeerPrompt], PeerOutput]:
    def run(prompt: PeerPrompt) -> PeerOutput:
        llm.reset()  # forget the last call's tokens: generate() would otherwise reuse a common prefix, no prefill
        out: list[int] = []
        for token in llm.generate(list(prompt.ids), temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(int(token))
            if len(out) == max_new_tokens or token in eos:  # mtpkit's rule: the EOS token is kept
                break
        return PeerOutput(len(out), tuple(out))
    return run


def gguf_file(folder: Path, gguf_type: str, version: str, progress: Callable[[str], None] | None = None) -> Path:
    """The checkpoint in `folder` as a GGUF file of `gguf_type`, converted (and quantized) once, then cached."""
    out = cache_dir() / "llama-cpp" / version / "gguf" / f"{checkpoint_key(folder)}-{gguf_type}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    if gguf_type in CONVERTER_TYPES:
        script = converter(version, progress)
        if progress:
            progress(f"peers: converting {folder.name} to GGUF {gguf_type} with llama.cpp's converter (cached after)")
        _written(out, lambda tmp: _convert(script, folder, CONVERTER_TYPES[gguf_type], tmp))
    elif gguf_type in QUANTIZER_TYPES:
        source = gguf_file(folder, "F32", version, progress)
        if progress:
            progress(f"peers: quantizing to GGUF {gguf_type} with llama.cpp's quantizer (cached after)")
        _written(out, lambda tmp: _quantize(source, tmp, gguf_type))
    else:
        raise ValueError(f"no way to make GGUF {gguf_type}")
    return out


def checkpoint_key(folder: Path) -> str:
    """16 hex digits of sha256 over every file's name and sha256 (remembered per file, runtime/verified.py)."""
    verified = VerifiedFiles()
    files = {p.name: verified.digest(p) for p in sorted(folder.iterdir()) if p.is_file()}
    verified.save()
    text = json.dumps({"files": files, "conversion_copy": CONVERSION_COPY}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _written(out: Path, write: Callable[[Path], None]) -> None:
    """write(tmp) into a scratch name beside `out`, renamed to `out` only when complete."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def _convert(script: Path, folder: Path, outtype: str, out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="mtpkit-gguf-") as scratch:
        source = convertible(folder, Path(scratch))
        done = subprocess.run([sys.executable, str(script), str(source), "--outtype", outtype, "--outfile", str(out)],
                              capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise LlamaCppError(f"llama.cpp's converter ({script}) failed on {folder}: {last}")


def _quantize(source: Path, out: Path, gguf_type: str) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, QUANTIZER_TYPES[gguf_type])
    with output_captured(f"llama.cpp quantizing to {gguf_type}"):  # it logs every tensor on fd 2
        failed = llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), ctypes.byref(params))
    if failed:
        raise LlamaCppError(f"llama.cpp's quantizer could not make GGUF {gguf_type} from {source}")


def convertible(folder: Path, scratch: Path) -> Path:
    """The checkpoint as llama.cpp's Gemma 4 converter reads it: `folder` itself when its tokenizer is Gemma's,
    else a copy in `scratch` (weights linked, not copied) with the tokenizer relabelled; see _relabelled()."""
    tokenizer = folder / "tokenizer.json"
    original = json.loads(tokenizer.read_text(encoding="utf-8")) if tokenizer.is_file() else None
    relabelled = _relabelled(original) if original else None
    if relabelled is None:
        return folder
    copy = scratch / folder.name
    copy.mkdir(parents=True)
    for path in folder.iterdir():
        if path.name != "tokenizer.json":
            (copy / path.name).symlink_to(path.resolve())
    (copy / "tokenizer.json").write_text(json.dumps(relabelled), encoding="utf-8")
    if not relabelled["model"].get("merges"):
        (copy / "merges.txt").write_text(f"{_SPECIALS_MERGE}\n", encoding="utf-8")
    return copy


# One merge of two special tokens: BPE never sees it (special tokens are split off before merging), so it changes
# no tokenization; it only makes the converter write the merges list llama.cpp needs to open a gemma4 vocabulary.
_SPECIALS_MERGE = "<pad> <eos>"


def _relabelled(tokenizer: dict) -> dict | None:
    """tokenizer.json as the converter accepts it, or None when it already does (Gemma's own tokenizer).

    The converter reads a Gemma 4 vocabulary only in Gemma's shape: BPE with byte_fallback and a Sequence decoder
    (gguf-py's LlamaHfVocab). mtpkit's tiny pairs use a byte-level BPE: every byte is in its alphabet, so
    byte_fallback, consulted only for text outside the vocabulary, never applies, and a Sequence of its one
    decoder decodes alike. Ids, merges and weights are unchanged; the peer is given mtpkit's token ids anyway.
    """
    model = tokenizer.get("model") or {}
    decoder = tokenizer.get("decoder") or {}
    if model.get("type") != "BPE" or (model.get("byte_fallback") and decoder.get("type") == "Sequence"):
        return None
    wrapped = decoder if decoder.get("type") == "Sequence" else {"type": "Sequence", "decoders": [decoder]}
    return {**tokenizer, "model": {**model, "byte_fallback": True}, "decoder": wrapped}


def converter(version: str, progress: Callable[[str], None] | None = None) -> Path:
    """convert_hf_to_gguf.py of llama-cpp-python `version`'s llama.cpp, from the cache or fetched once."""
    home = cache_dir() / "llama-cpp" / version
    script = home / "llama.cpp" / "convert_hf_to_gguf.py"
    if script.is_file():
        return script
    if progress:
        progress(f"peers: fetching llama.cpp's converter (llama-cpp-python {version} source, once)")
    home.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=home, prefix=".fetch-") as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
                               ":all:", "--dest", tmp, f"llama-cpp-python=={version}"], capture_output=True, text=True)
        sdists = sorted(Path(tmp).glob("*.tar.gz"))
        if done.returncode != 0 or not sdists:
            last = (done.stderr.strip().splitlines() or ["no source distribution downloaded"])[-1]
            raise LlamaCppError(f"could not fetch llama-cpp-python {version}'s source for llama.cpp's converter: {last}")
        extract_converter(sdists[0], Path(tmp) / "llama.cpp")
        try:
            os.replace(Path(tmp) / "llama.cpp", home / "llama.cpp")
        except OSError:  # another run put it there first
            if not script.is_file():
                raise
    return script


def extract_converter(sdist: Path, dest: Path) -> None:
    """The converter's files (CONVERTER_FILES) from the sdist's vendor/llama.cpp into `dest`; nothing else, and
    nothing outside `dest`."""
    with tarfile.open(sdist) as tar:
        for member in tar:
            parts = Path(member.name).parts
            if not member.isfile() or len(parts) < 4 or parts[1:3] != ("vendor", "llama.cpp") or ".." in parts:
                continue
            relative = "/".join(parts[3:])
            if not any(relative == f or (f.endswith("/") and relative.startswith(f)) for f in CONVERTER_FILES):
                continue
            target = dest / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(target, "wb") as dst:  # type: ignore[union-attr]
                shutil.copyfileobj(src, dst)
