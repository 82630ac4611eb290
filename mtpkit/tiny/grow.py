"""The demo pair with E2B's cost shape, grown from the shipped trained pair instead of trained from scratch.

The real E2B drafter step costs about 1/28 of a target call on the recipe the demo times (LiteRT int8, AVX-512
VNNI; 1/65 on AVX2); the shipped tiny pair's drafter costs about 1/3, so a demo on it shows per-op overhead, not
what users will get. Growing only the target's MLPs (every layer's
intermediate width times `factor`) makes weights dominate a target call while keeping the hidden size, the
attention, the KV cache and every other E2B structural feature exactly as trained, so the shipped drafter
still reads the activations and K/V it was trained on. The new units read the normed residual like the old
ones; their down-projection starts near zero (`down_scale`), so the grown target computes a slightly
perturbed function of the trained one (no distillation: the shipped drafter's acceptance carries over, and
the export's parity check is against transformers on the grown checkpoint itself). Deterministic from `seed`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class GrowSpec:
    # MLP x64: 96 M target parameters, so that on LiteRT int8 (a quarter of fp32's bytes per weight) a drafter step
    # costs about what E2B's does relative to a target call (the demo prints both)
    factor: int = 64
    init_std: float = 0.02  # the training recipe's initializer_range, for the new gate/up rows
    # new down-projection columns (x init_std): computed every call, near-silent; 0.05 at x24, scaled by
    # sqrt(24 / 64) so that the sum over the new units perturbs the trained function as much as it did there
    down_scale: float = 0.03
    seed: int = 0

    def __post_init__(self):
        if self.factor < 1:
            raise ValueError(f"grow factor must be >= 1 (got {self.factor})")


def grow_pair(src: Path, out: Path, spec: GrowSpec = GrowSpec()) -> tuple[Path, Path]:
    """Write OUT/target (grown) and OUT/drafter (copied) from the pair in SRC; returns their folders."""
    from safetensors.numpy import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src / "drafter", out / "drafter", dirs_exist_ok=True)
    shutil.copytree(src / "target", out / "target", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("model.safetensors", "config.json"))
    config = json.loads((src / "target" / "config.json").read_text())
    state = load_file(src / "target" / "model.safetensors")
    rng = np.random.default_rng(spec.seed)
    for name in sorted(state):  # sorted: the random draws do not depend on the file's key order
        if name.split(".")[-2] in MLP:
            state[name] = _widen(state[name], name.split(".")[-2], spec, rng)
    config["intermediate_size"] = config["intermediate_size"] * spec.factor
    (out / "target" / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(state, out / "target" / "model.safetensors", metadata={"format": "pt"})
    record = {"method": "grown from the shipped trained pair (mtpkit.tiny.grow), no training",
              "spec": asdict(spec), "source_pair": str(src.name),
              "source_sha256": _sha256(src / "target" / "model.safetensors"),
              "target_parameters": int(sum(v.size for v in state.values())),
              "target_sha256": _sha256(out / "target" / "model.safetensors")}
    (out / "pair.json").write_text(json.dumps(record, indent=1) + "\n")
    return out / "target", out / "drafter"


def cached_pair(src: Path, cache: Path, spec: GrowSpec = GrowSpec()) -> tuple[Path, Path]:
    """The pair grown from SRC by `spec`, kept in CACHE/<source sha256 + spec> and grown only when missing.

    An export records where its checkpoints are (manifest.json `source`), and `mtpkit bench --peers` and parity
    reload them from there, so the demo's grown pair must outlive the demo. Grown into a temporary folder beside
    it and renamed into place: a run killed mid-growth leaves no half pair to be reused.
    """
    import tempfile

    key = hashlib.sha256(json.dumps([_sha256(src / "target" / "model.safetensors"), asdict(spec)]).encode())
    folder = cache / f"grown-{key.hexdigest()[:16]}"
    if not (folder / "pair.json").is_file():
        shutil.rmtree(folder, ignore_errors=True)  # not ours to trust: pair.json is written last
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".growing-", dir=cache))
        try:
            grow_pair(src, tmp, spec)
            try:
                tmp.rename(folder)
            except OSError:  # another demo grew the same pair meanwhile: theirs is identical (deterministic)
                if not (folder / "pair.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder / "target", folder / "drafter"


def _widen(weight: np.ndarray, kind: str, spec: GrowSpec, rng: np.random.Generator) -> np.ndarray:
    """gate/up [I, H] gain rows; down [H, I] gains columns (the intermediate axis)."""
    axis = 1 if kind == "down_proj" else 0
    extra_shape = list(weight.shape)
    extra_shape[axis] = weight.shape[axis] * (spec.factor - 1)
    std = spec.init_std * (spec.down_scale if kind == "down_proj" else 1.0)
    extra = rng.normal(0.0, std, size=extra_shape).astype(weight.dtype)
    return np.ascontiguousarray(np.concatenate([weight, extra], axis=axis))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
