"""Calibration for `--quant int4`: the prompts whose activations weight the int4 scale search (export/int4.py).

The built-in set (calibration.txt) is mixed text written for this purpose: code in several languages, prose,
dialogues, lists, arithmetic, eight natural languages. It is not the export's reference prompts
(export/reference.py), on which fidelity is measured, nor the held-out prompts the tiny pair's demo and quant report
measure on; `tests/test_int4.py` checks both, so the built-in set is never refused. A user's `--calibration
FILE.jsonl` holds one `{"text": ...}` or `{"ids": [...]}` per line and is refused when it contains a reference
prompt (check_file, before any weights load)"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np

from mtpkit.errors import UsageError

from .int4 import weight_key
from .recipes import Recipe

log = logging.getLogger("mtpkit")

MAX_TOKENS = 128  # per calibration window: enough context to excite every channel, cheap at full size
BATCH = 8  # windows per forward pass: the weights are read (and upcast from bf16) once per 8; 2.2x faster at E2B
TEXT_FILE = Path(__file__).with_name("calibration.txt")


def _built_in() -> tuple[str, ...]:
    """The documents of calibration.txt: about 5000 tokens on Gemma's tokenizer, more than the widest input that
    int4 compensates at any published shape (E4B's gate / up read 2560 channels), so the default runs GPTQ."""
    documents = TEXT_FILE.read_text(encoding="utf-8").split("\n%%\n")[1:]  # [0]: the file's comment lines
    return tuple(documents[:-1]) + (documents[-1].removesuffix("\n"),)


BUILT_IN = _built_in()
# at most this many built-in tokens: 2.4x E4B's compensated width; a byte-level tokenizer would otherwise run 18k
# tokens through the PyTorch target (minutes at full size) for moments that 6k tokens already give full rank
BUILT_IN_TOKENS = 6144


def load(path: Path | None, encode, bos_id: int) -> tuple[list[list[int]], dict]:
    """(prompts as ids: every text cut into windows of at most MAX_TOKENS, bos first, so that all of it counts;
    a record of where they came from)."""
    if path is None:
        texts = list(BUILT_IN)
        prompts = _spread([windows([bos_id, *encode(t)], bos_id) for t in texts], BUILT_IN_TOKENS)
        source, digest = "built-in", hashlib.sha256("\n".join(texts).encode()).hexdigest()
    else:
        prompts = [w for _, _, p in _rows(Path(path), encode, bos_id) for w in windows(p, bos_id)]
        source, digest = str(path), hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return prompts, {"source": source, "sha256": digest, "prompts": len(prompts),
                     "tokens": sum(len(p) for p in prompts)}


def _spread(documents: list[list[list[int]]], budget: int) -> list[list[int]]:
    """Windows taken round-robin over the documents (every document's first window, then the second ones, ...)
    until budget tokens: a tokenizer with short tokens gets every kind of text, not the first documents only."""
    out, tokens = [], 0
    for rank in range(max(map(len, documents))):
        for w in (d[rank] for d in documents if rank < len(d)):
            if tokens >= budget:
                return out
            out.append(w)
            tokens += len(w)
    return out


def windows(ids: list[int], bos_id: int) -> list[list[int]]:
    """ids in windows of at most MAX_TOKENS; each window after the first starts with bos again when the first did.
    A last window of one token teaches nothing and is dropped."""
    head = ids[:1] if ids[:1] == [bos_id] else []
    body, step = ids[len(head):], MAX_TOKENS - len(head)
    out = [head + body[i:i + step] for i in range(0, len(body), step)]
    return [w for w in out if len(w) > 1 or len(out) == 1]


def _rows(path: Path, encode, bos_id: int) -> list[tuple[int, str | None, list[int]]]:
    """(line number, text or None for an {"ids": ...} line, ids) per prompt of a --calibration file."""
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            text = None if "ids" in row else str(row["text"])
            ids = [int(i) for i in row["ids"]] if text is None else [bos_id, *encode(text)]
        except (ValueError, KeyError, TypeError) as e:
            raise UsageError(f"--calibration {path} line {n}: expected {{\"text\": ...}} or {{\"ids\": [...]}} "
                             f"({e.__class__.__name__}: {e})") from None
        if len(ids) < 2:
            raise UsageError(f"--calibration {path} line {n}: a prompt needs at least 2 tokens")
        rows.append((n, text, ids))
    if not rows:
        raise UsageError(f"--calibration {path} holds no prompt; give one JSON object per line")
    return rows


MIN_CHARS = 16  # a reference text at least this long is refused inside a calibration text; shorter: only equal
MIN_DISTINCT = 8  # ... and a run of reference ids with at least this many distinct ids inside an {"ids"} line


def check_file(path: Path, tokenizer_file: Path, sliding_window: int) -> None:
    """Before any weights load: the file parses, and holds none of the texts of the reference prompts, on which
    the export measures fidelity. Text lines are compared as text; {"ids": ...} lines as ids, leaving out the ids
    that carry no text (unknown, padding, special), so that runs of <unk> never match. The built-in set is not
    checked: it is apart from every evaluation text by construction (tests/test_int4.py)."""
    from tokenizers import Tokenizer

    from .reference import LONG_TEXT, PROMPTS

    tok = Tokenizer.from_file(str(tokenizer_file))
    encode = lambda text: tok.encode(text, add_special_tokens=False).ids  # noqa: E731
    blank = _textless_ids(tok)
    references = {t: [i for i in encode(t) if i not in blank] for t in [*(t for _, t in PROMPTS), LONG_TEXT]}
    for n, text, ids in _rows(Path(path), encode, -1):
        for ref, ref_ids in references.items():
            if (_text_inside(ref, text) if text is not None else
                    _ids_inside(ref_ids, [i for i in ids if i not in blank])):
                raise UsageError(f"--calibration {path} line {n} contains the reference prompt {ref.strip()!r}, "
                                 "on which the export measures fidelity; remove it from the file")


def _text_inside(reference: str, text: str) -> bool:
    ref, text = reference.strip(), text.strip()
    return ref == text or (len(ref) >= MIN_CHARS and ref in text)


def _ids_inside(reference: list[int], ids: list[int]) -> bool:
    if not reference:
        return False
    return reference == ids or (len(set(reference)) >= MIN_DISTINCT and _contains(ids, reference))


def _textless_ids(tok) -> set[int]:
    """The tokenizer's unknown id and its special (added) ids: padding, bos, eos, control tokens."""
    ids = {i for i, added in tok.get_added_tokens_decoder().items() if added.special}
    unk = json.loads(tok.to_str())["model"].get("unk_token")
    if unk is not None and (unk_id := tok.token_to_id(unk)) is not None:
        ids.add(unk_id)
    return ids


def plans(recipes: dict[str, Recipe], target, adapters: dict, encode, bos_id: int, path: Path | None = None,
          ple_bits: int = 8, low_bit: tuple[str, ...] = ()) -> dict:
    """export/int4.Int4Plan per side ("target", "drafter") whose recipe is an int4 one. recipes and adapters: side
    -> recipe / export/models module. int4 on the target runs the calibration prompts (path, checked by check_file
    before the export began, or the built-in set) through the PyTorch target for the scale search's importance.
    The per-layer-embedding path keeps 8 bits unless ple_bits is 4. low_bit: what --max-size lowered on the target
    (export/sizes.fit_size)."""
    from . import int4

    out, importance_of, record = {}, None, None
    for side, recipe in recipes.items():
        if not recipe.int4:
            continue
        if side == "target" and recipe.calibrated:
            prompts, record = load(path, encode, bos_id)
            log.info("  calibrating int4 scales on %d windows (%d tokens, %s)", record["prompts"], record["tokens"],
                     record["source"])
            importance_of = without_thin_moments(
                importance(target, prompts, adapters[side].INT4_COMPENSATE), record["tokens"])
        mine = side == "target"
        out[side] = int4.plan(recipe, kept_8bit(adapters[side], ple_bits, recipe), importance_of if mine else None,
                              record if mine else None, low_bit if mine else ())
    return out


def kept_8bit(adapter, ple_bits: int, recipe: Recipe) -> tuple[str, ...]:
    """What an int4 plan keeps at 8 bits for a model adapter's side: its INT4_KEEP_8BIT (unless the recipe keeps
    no sensitive set: mobile), and its per-layer-embedding path unless ple_bits is 4. Decided by names alone, before
    calibration: the size plan (export/sizes.py) reads it."""
    return (adapter.INT4_KEEP_8BIT if recipe.keeps_sensitive else ()) + \
        (adapter.INT4_PLE_PATH if ple_bits == 8 else ())


def _contains(hay: list[int], needle: list[int]) -> bool:
    n = len(needle)
    return any(hay[i:i + n] == needle for i in range(len(hay) - n + 1))


def importance(model, prompts: list[list[int]], full: tuple[str, ...] = (),
               batch: int = BATCH) -> dict[str, np.ndarray]:
    """Mean square input activation per channel of every nn.Linear inside the decoder layers, keyed by
    export/int4.weight_key, from forward passes over `batch` prompts at a time; for the keys containing a `full`
    substring, the whole mean x x^T [k, k] (float32) instead, which export/int4.encode uses to compensate rounding
    errors. Prompts are right-padded: a causal decoder's real positions never see the padding, whose rows are
    dropped. Only the decoder runs (get_decoder()): the lm_head holds no key."""
    import torch

    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    state: dict = {}

    def moment(x_in, whole: bool):
        if state.get("input") is not x_in:  # q / k / v and gate / up read one input: one moment for each kind
            x = x_in.detach().reshape(-1, x_in.shape[-1])
            state.update(input=x_in, rows=x[state["real"]] if len(x) == len(state["real"]) else x, kinds={})
        if whole not in state["kinds"]:
            x = state["rows"]
            state["kinds"][whole] = (x.float().T @ x.float()).numpy() if whole else \
                x.double().square().sum(0).numpy()
        return state["kinds"][whole], len(state["rows"])

    def hook(key):
        whole = any(f in key for f in full)

        def record(module, args, output):
            m, n = moment(args[0], whole)
            sums[key], counts[key] = sums.get(key, 0) + m, counts.get(key, 0) + n
        return record

    handles = [m.register_forward_hook(hook(key)) for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and (key := weight_key(name))]
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    try:
        with torch.no_grad():
            for start in range(0, len(prompts), batch):
                group = prompts[start:start + batch]
                width = max(map(len, group))
                state.update(input=None, real=torch.tensor([i < len(p) for p in group for i in range(width)]))
                decoder(torch.tensor([p + p[-1:] * (width - len(p)) for p in group]))
    finally:
        state.clear()
        for h in handles:
            h.remove()
    return {key: (sums[key] / counts[key]).astype(np.float32) for key in sums}


def without_thin_moments(importance: dict[str, np.ndarray], tokens: int) -> dict[str, np.ndarray]:
    """A [k, k] moment estimated from fewer than k tokens is rank-deficient and would steer the error compensation
    by noise: such weights fall back to the diagonal (per-channel) search. The log says which way each went, and
    how to get compensation back (the manifest records it per weight: "int4/b32/gptq")."""
    full = {key for key, m in importance.items() if m.ndim == 2}
    thin = {key for key in full if importance[key].shape[0] > tokens}
    if full - thin:
        log.info("  int4 error compensation (GPTQ) on for %d weights", len(full - thin))
    if thin:
        width = max(importance[key].shape[0] for key in thin)
        log.info("  int4 error compensation off for %d weights: the calibration's %d tokens are fewer than their "
                 "%d input channels (pass --calibration with more text)", len(thin), tokens, width)
    return {key: (np.diagonal(m).copy() if key in thin else m) for key, m in importance.items()}
