"""The manifest's records: one name per idea for the draft length across the source tree, a manifest of another
schema version refused in one line, and every backend's options checked when the manifest is read."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mtpkit.errors import ManifestError
from mtpkit.runtime.manifest import SCHEMA_VERSION, Manifest, load_manifest
from mtpkit.runtime.records import KVCache, KVLayer, LiteRtOptions

ROOT = Path(__file__).resolve().parents[1]
SEARCHED = ("export", "runtime", "mtpkit", "tools", "tests", "android_demo", "docs", "README.md")
SUFFIXES = {".py", ".md", ".kt", ".kts", ".sh", ".json", ".toml"}
# the draft length per round is num_assistant_tokens and its bound max_draft; these spell the same ideas again
BANNED = re.compile(r"\b(" + "|".join(["max" + "_k", "k" + "_max", "draft" + "_cap", "verify" + "_len"]) + r")\b")


def _files() -> list[Path]:
    found = []
    for name in SEARCHED:
        path = ROOT / name
        found += [path] if path.is_file() else [p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file()
                                                and not {"build", ".tools", "node_modules"} & set(p.parts)]
    return found


def test_the_draft_length_has_two_names_everywhere():
    bad = [f"{p.relative_to(ROOT)}:{n}" for p in _files()
           for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
           if BANNED.search(line)]
    assert not bad, "use num_assistant_tokens (drafts per round) or max_draft (their bound):\n" + "\n".join(bad)


def test_a_manifest_of_the_previous_schema_is_refused_in_one_line(tmp_path):
    old = {"schema_version": SCHEMA_VERSION - 1, "mtpkit_version": "0.1.0",
           "backends": {"litert": {"options": {"cache_len": 256, "verify" + "_len": 4, "max_draft": 3}}}}
    (tmp_path / "manifest.json").write_text(json.dumps(old))
    with pytest.raises(ManifestError) as refused:
        load_manifest(tmp_path)
    message = str(refused.value)
    assert "\n" not in message and f"schema_version {SCHEMA_VERSION - 1}" in message and "re-export" in message


def test_litert_options_are_checked_when_read():
    options = {"max_draft": 3, "mask": {"hidden": -1e9}, "prefill": [{"num_tokens": 8, "signature": "prefill_8"}],
               "bundle": {"file": "model.litertlm"}}
    assert LiteRtOptions.from_json(options, "backends.litert.options").max_draft == 3
    with pytest.raises(ManifestError, match=r"backends.litert.options.max_draft is missing"):
        LiteRtOptions.from_json({k: v for k, v in options.items() if k != "max_draft"}, "backends.litert.options")
    with pytest.raises(ManifestError, match=r"backends.litert.options.prefill\[0\].num_tokens must be"):
        LiteRtOptions.from_json({**options, "prefill": [{"num_tokens": "8", "signature": "p"}]},
                                "backends.litert.options")


def test_records_write_their_keys_in_the_order_read():
    kv = KVCache(capacity=64, layers=[KVLayer(0, "full_attention", 1, 4)], sliding_past=3, drafter_sliding_visible=5,
                 drafter_layers={"sliding_attention": 0, "full_attention": 0})
    written = kv.to_json()
    assert list(written) == ["capacity", "dtype", "layout", "layers", "drafter_layers", "sliding_past",
                             "drafter_sliding_visible"]
    assert KVCache.from_json(written, "kv_cache") == kv
    with pytest.raises(ManifestError, match=r"kv_cache.capacity must be an integer >= 1"):
        KVCache.from_json({**written, "capacity": "64"}, "kv_cache")
    assert Manifest.read  # the reader every runtime uses (load_manifest)
