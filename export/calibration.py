"""Calibration for `--quant int4`: the prompts whose activations weight the int4 scale search (export/int4.py).

The built-in set is short, mixed text written for this purpose: code, prose, a dialogue, a list, arithmetic. It is
not the export's reference prompts (export/reference.py), on which fidelity is measured, nor the held-out prompts
the tiny pair's demo and quant report measure on; `tests/test_int4.py` checks both. A user's `--calibration
FILE.jsonl` holds one `{"text": ...}` or `{"ids": [...]}` per line and is refused when it contains a reference prompt.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np

from mtpkit.errors import UsageError

from .int4 import weight_key

log = logging.getLogger("mtpkit")

MAX_TOKENS = 128  # per calibration prompt: enough to excite every channel, cheap at full size
BUILT_IN = (
    "def moving_average(values, window):\n    total, out = 0.0, []\n    for i, v in enumerate(values):\n"
    "        total += v\n        if i >= window:\n            total -= values[i - window]\n"
    "        out.append(total / min(i + 1, window))\n    return out\n",
    "class Inventory:\n    def __init__(self):\n        self.items = {}\n\n    def add(self, name, count=1):\n"
    "        self.items[name] = self.items.get(name, 0) + count\n\n    def remove(self, name):\n"
    "        if self.items.get(name, 0) <= 0:\n            raise KeyError(name)\n        self.items[name] -= 1\n",
    "The river bends twice before it reaches the town. In spring the water rises over the lower fields, and "
    "farmers move their animals to the hills until the floods pass. By midsummer the banks are dry again.",
    "User: Can you suggest a name for a small bakery that sells bread and coffee?\nAssistant: A few ideas: "
    "Morning Crumb, The Warm Loaf, Grain and Bean. A short name that says what you sell is easy to remember.",
    "Steps to repot a plant: 1. Water it a day before. 2. Choose a pot one size larger. 3. Loosen the roots "
    "gently. 4. Add fresh soil around the sides. 5. Keep it out of direct sun for a week.",
    "If a train leaves at 14:20 and the journey takes 2 hours 55 minutes, it arrives at 17:15. Twelve percent "
    "of 250 is 30, and the square root of 144 is 12.",
    "import json\nfrom pathlib import Path\n\nconfig = json.loads(Path('settings.json').read_text())\n"
    "for key, value in sorted(config.items()):\n    print(f'{key:>20}: {value}')\n",
    "Die Bibliothek ist montags geschlossen. La reunión empieza a las nueve. Le musée ouvre à dix heures. "
    "Gli studenti leggono in silenzio.",
)


def load(path: Path | None, encode, bos_id: int) -> tuple[list[list[int]], dict]:
    """(prompts as ids, each at most MAX_TOKENS, bos first; a record of where they came from)."""
    if path is None:
        texts = list(BUILT_IN)
        prompts = [[bos_id, *encode(t)][:MAX_TOKENS] for t in texts]
        source, digest = "built-in", hashlib.sha256("\n".join(texts).encode()).hexdigest()
    else:
        prompts = [p[:MAX_TOKENS] for p in _read_jsonl(Path(path), encode, bos_id)]
        source, digest = str(path), hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return prompts, {"source": source, "sha256": digest, "prompts": len(prompts),
                     "tokens": sum(len(p) for p in prompts)}


def _read_jsonl(path: Path, encode, bos_id: int) -> list[list[int]]:
    prompts = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            ids = [int(i) for i in row["ids"]] if "ids" in row else [bos_id, *encode(str(row["text"]))]
        except (ValueError, KeyError, TypeError) as e:
            raise UsageError(f"--calibration {path} line {n}: expected {{\"text\": ...}} or {{\"ids\": [...]}} "
                             f"({e.__class__.__name__}: {e})") from None
        if len(ids) < 2:
            raise UsageError(f"--calibration {path} line {n}: a prompt needs at least 2 tokens")
        prompts.append(ids)
    if not prompts:
        raise UsageError(f"--calibration {path} holds no prompt; give one JSON object per line")
    return prompts


def check_apart(prompts: list[list[int]], reference: list[list[int]], min_len: int = 8) -> None:
    """Refuse calibration that contains a reference prompt (fidelity would be measured on seen text): a reference
    prompt (bos dropped) identical to a calibration prompt, or of at least min_len ids and found inside one."""
    for ref in (r[1:] for r in reference):
        for i, p in enumerate(prompts):
            if ref in (p, p[1:]) or (len(ref) >= min_len and _contains(p, ref)):
                raise UsageError(f"calibration prompt {i + 1} contains a reference prompt, on which the export "
                                 "measures fidelity; remove it from --calibration")


def check_file(path: Path, tokenizer_file: Path, sliding_window: int) -> None:
    """Before any weights load: the file parses, and holds none of the reference prompts export/reference.py
    will build from this tokenizer."""
    from tokenizers import Tokenizer

    from .reference import reference_prompts

    tok = Tokenizer.from_file(str(tokenizer_file))
    encode = lambda text: tok.encode(text, add_special_tokens=False).ids  # noqa: E731
    reference = [ids for _, ids in reference_prompts(encode, -1, sliding_window, None)]
    check_apart(_read_jsonl(Path(path), encode, -1), reference)


def plans(recipes: dict[str, str], target, adapters: dict, reference: list[list[int]], encode, bos_id: int,
          path: Path | None = None, ple_bits: int = 8) -> dict:
    """export/int4.Int4Plan per side ("target", "drafter") whose recipe is an int4 one. recipes and adapters: side
    -> recipe / export/models module. int4 on the target runs the calibration prompts (path, or the built-in set)
    through the PyTorch target for the scale search's importance; reference: the export's reference prompt ids,
    which the calibration must not contain. The per-layer-embedding path keeps 8 bits unless ple_bits is 4."""
    from . import int4

    out, importance_of, record = {}, None, None
    for side, recipe in recipes.items():
        if recipe not in int4.INT4_RECIPES:
            continue
        if side == "target" and recipe == "int4":
            prompts, record = load(path, encode, bos_id)
            check_apart(prompts, reference)
            log.info("  calibrating int4 scales on %d prompts (%d tokens, %s)", record["prompts"], record["tokens"],
                     record["source"])
            importance_of = without_thin_moments(
                importance(target, prompts, adapters[side].INT4_COMPENSATE), record["tokens"])
        mine = side == "target"
        keep = adapters[side].INT4_KEEP_8BIT + (adapters[side].INT4_PLE_PATH if ple_bits == 8 else ())
        out[side] = int4.plan(recipe, keep, importance_of if mine else None, record if mine else None)
    return out


def _contains(hay: list[int], needle: list[int]) -> bool:
    n = len(needle)
    return any(hay[i:i + n] == needle for i in range(len(hay) - n + 1))


def importance(model, prompts: list[list[int]], full: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Mean square input activation per channel of every nn.Linear inside the decoder layers, keyed by
    export/int4.weight_key, from one forward pass per prompt; for the keys containing a `full` substring, the whole
    mean x x^T [k, k] (float32) instead, which export/int4.encode uses to compensate rounding errors."""
    import torch

    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}

    def hook(key):
        whole = any(f in key for f in full)

        def record(module, args, output):
            x = args[0].detach().reshape(-1, args[0].shape[-1])
            moment = (x.float().T @ x.float()).numpy() if whole else x.double().square().sum(0).numpy()
            sums[key] = sums.get(key, 0) + moment
            counts[key] = counts.get(key, 0) + x.shape[0]
        return record

    handles = [m.register_forward_hook(hook(key)) for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and (key := weight_key(name))]
    try:
        with torch.no_grad():
            for ids in prompts:
                model(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return {key: (sums[key] / counts[key]).astype(np.float32) for key in sums}


def without_thin_moments(importance: dict[str, np.ndarray], tokens: int) -> dict[str, np.ndarray]:
    """A [k, k] moment estimated from fewer than k tokens is rank-deficient and would steer the error compensation
    by noise: such weights fall back to the diagonal (per-channel) search, and the log says how to get it back."""
    thin = {key for key, m in importance.items() if m.ndim == 2 and m.shape[0] > tokens}
    if thin:
        width = max(importance[key].shape[0] for key in thin)
        log.info("  int4 error compensation off for %d weights: the calibration's %d tokens are fewer than their "
                 "%d input channels (pass --calibration with more text)", len(thin), tokens, width)
    return {key: (np.diagonal(m).copy() if key in thin else m) for key, m in importance.items()}
