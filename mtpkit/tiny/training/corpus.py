"""The training corpus (Python standard library sources, PSF licence) and its byte-level BPE tokenizer.

The stdlib is on every machine with Python and may be redistributed, so the recipe needs no download. The
module list is fixed and sorted so runs are deterministic; files differ slightly between Python versions,
which is why the version and a sha256 of every file are recorded with the trained pair.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Modules present in 3.10-3.13 (no PEP 594 removals), pure Python, mostly code with real docstrings.
TRAIN_MODULES = sorted([
    "_collections_abc", "_pydecimal", "_pyio", "_strptime", "argparse", "ast", "base64", "bdb", "calendar",
    "cmd", "codecs", "compileall", "configparser", "contextlib", "copy", "dataclasses", "datetime", "difflib",
    "dis", "doctest", "enum", "filecmp", "fileinput", "fnmatch", "ftplib", "functools", "gettext", "glob",
    "gzip", "heapq", "imaplib", "inspect", "ipaddress", "locale", "mailbox", "mimetypes", "modulefinder",
    "ntpath", "operator", "optparse", "os", "pathlib", "pdb", "pickle", "pickletools", "pkgutil", "platform",
    "plistlib", "poplib", "posixpath", "pprint", "profile", "pstats", "queue", "random", "reprlib", "sched",
    "selectors", "shlex", "shutil", "smtplib", "socket", "socketserver", "statistics", "string", "subprocess",
    "tarfile", "tempfile", "threading", "timeit", "tokenize", "trace", "traceback", "tracemalloc", "types",
    "typing", "uuid", "warnings", "wave", "weakref", "webbrowser", "zipfile", "zipimport",
])
# Held out by file, so evaluation prompts come from text the models never saw.
HELDOUT_MODULES = sorted(["csv", "fractions", "textwrap", "bisect", "numbers", "colorsys", "graphlib", "stat"])


@dataclass(frozen=True)
class Corpus:
    train: list[str]  # one string per file, in TRAIN_MODULES order
    heldout: list[str]
    files: dict  # "name.py" -> sha256, for both splits
    python_version: str
    sha256: str  # over the concatenated (name, sha256) list: one number that says "same corpus"
    train_names: tuple = tuple(TRAIN_MODULES)  # fewer in smoke runs (max_train_files)

    def describe(self) -> dict:
        return {"source": "Python standard library (Lib/*.py), PSF License Agreement",
                "python_version": self.python_version, "sha256": self.sha256,
                "train_files": [f"{m}.py" for m in self.train_names],
                "heldout_files": [f"{m}.py" for m in HELDOUT_MODULES],
                "train_bytes": sum(len(t.encode()) for t in self.train),
                "heldout_bytes": sum(len(t.encode()) for t in self.heldout), "file_sha256": self.files}


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def load_corpus(max_train_files: int | None = None) -> Corpus:
    """Read the fixed module list; a missing file is an error because it would silently change the corpus."""
    import sys

    root = stdlib_dir()
    names = TRAIN_MODULES[:max_train_files] if max_train_files else TRAIN_MODULES
    files, texts = {}, {}
    for name in names + HELDOUT_MODULES:
        path = root / f"{name}.py"
        if not path.is_file():
            raise FileNotFoundError(f"stdlib module {path} is missing; the corpus needs a full CPython install")
        data = path.read_bytes()
        files[path.name] = hashlib.sha256(data).hexdigest()
        texts[name] = data.decode("utf-8")
    digest = hashlib.sha256("".join(f"{k}:{v}\n" for k, v in files.items()).encode()).hexdigest()
    version = ".".join(map(str, sys.version_info[:3]))
    return Corpus([texts[n] for n in names], [texts[n] for n in HELDOUT_MODULES], files, version, digest, tuple(names))


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE with the Gemma-style special tokens at ids 0..6, exactly as mtpkit/tiny/make.py lays them out."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from ..make import SPECIAL_TOKENS

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    for i, name in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(name) != i:
            raise RuntimeError(f"special token {name} got id {tok.token_to_id(name)}, expected {i}")
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, expected {vocab_size}; enlarge the corpus")
    return tok


def encode(tok, texts: list[str]):
    """One long int64 tensor of token ids; files are joined by <eos> as the documents' separator."""
    import torch

    from ..make import EOS_ID

    ids = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(EOS_ID)
    return torch.tensor(ids, dtype=torch.long)
