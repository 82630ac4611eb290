"""Reading and writing HF checkpoint folders: safetensors only, never pickle, never remote code."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mtpkit.errors import CheckpointError

# what a hub download fetches: never code (*.py) nor pickles (*.bin, *.pt), even by accident of a wildcard
CHECKPOINT_FILES = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model"]
# Files next to the weights that travel with an export (and with the gemma4-layout copy made for LiteRT).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
HF_SIDE_FILES = (*TOKENIZER_FILES, "generation_config.json")


@dataclass(frozen=True)
class Source:
    """A resolved checkpoint: where its files are and where they came from."""

    folder: Path
    ref: str  # what the user passed: a path or a hub id
    revision: str | None  # hub commit, when downloaded
    config: dict


def resolve(ref: str, role: str, revision: str | None = None) -> Source:
    """Turn a local folder or a hub id into a Source with its config.json read."""
    path = Path(ref).expanduser()
    if path.exists():
        folder, rev = path, None
    elif _looks_like_hub_id(ref):
        folder, rev = _download(ref, role, revision)
    else:
        raise CheckpointError(f"{role} checkpoint {ref!r} does not exist; pass a local HF checkpoint folder or a hub id")
    if not folder.is_dir():
        raise CheckpointError(f"{role} checkpoint {folder} is not a folder; pass the folder that holds config.json")
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{role} checkpoint {folder} has no config.json; pass an HF checkpoint folder")
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise CheckpointError(f"{cfg_path} is not valid JSON: {e}") from e
    except OSError as e:
        raise CheckpointError(f"{cfg_path} cannot be read ({e.strerror}); check its permissions") from e
    if not isinstance(config, dict):
        raise CheckpointError(f"{cfg_path} holds a JSON {type(config).__name__}, not an HF config object")
    return Source(folder=folder, ref=ref, revision=rev, config=config)


def _looks_like_hub_id(ref: str) -> bool:
    parts = ref.split("/")
    return len(parts) == 2 and all(parts) and not ref.startswith((".", "/", "~"))


def _download(repo_id: str, role: str, revision: str | None) -> tuple[Path, str | None]:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:
        raise CheckpointError(f"{role} {repo_id!r} looks like a hub id but huggingface_hub is not installed") from e
    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=CHECKPOINT_FILES)
    except Exception as e:  # network, auth and missing-repo errors all end here
        raise CheckpointError(
            f"could not download {role} {repo_id!r} ({type(e).__name__}); download it elsewhere and pass the local folder"
        ) from e
    folder = Path(folder)
    return folder, folder.name  # snapshot folders are named by commit hash


def safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{index} is damaged (no readable weight_map); re-download the checkpoint") from e
        if not all(isinstance(n, str) and n and "/" not in n and "\\" not in n and n != ".." for n in names):
            raise CheckpointError(f"{index} names a weight file outside {folder}; re-download the checkpoint")
        files = [folder / n for n in names]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickles = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
        hint = f" (found {', '.join(pickles)}: pickle checkpoints are refused, convert them to safetensors)" if pickles else ""
        raise CheckpointError(f"{folder} has no .safetensors weights{hint}")
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise CheckpointError(f"{folder} is missing weight shard {missing[0].name}; re-download the checkpoint")
    for f in files:
        check_safetensors(f)
    return files


def tensor_headers(folder: Path) -> dict[str, dict]:
    """Every tensor's {"dtype", "shape", "data_offsets"} from the folder's safetensors headers; reads no weights."""
    headers = {}
    for f in safetensors_files(folder):
        headers.update({k: v for k, v in check_safetensors(f).items() if k != "__metadata__"})
    return headers


def check_safetensors(path: Path) -> dict:
    """Refuse a truncated or garbled .safetensors file by name, from its header alone (8-byte length, JSON
    header, data offsets that must end exactly at the end of the file), before torch or safetensors reads it.

    Returns:
        the parsed header: tensor name -> {"dtype", "shape", "data_offsets"} (and "__metadata__")."""
    size = path.stat().st_size
    damaged = f"{path} is damaged or truncated ({size} bytes"
    with open(path, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 2 <= length <= size - 8:
            raise CheckpointError(f"{damaged}, no valid safetensors header); re-download the checkpoint")
        try:
            header = json.loads(f.read(length))
            end = max([t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"], default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError):
            raise CheckpointError(f"{damaged}, unreadable safetensors header); re-download the checkpoint") from None
    if not isinstance(end, int) or isinstance(end, bool) or 8 + length + end != size:
        described = f"its header describes {8 + length + end} bytes" if isinstance(end, int) else "bad data offsets"
        raise CheckpointError(f"{damaged}, {described}); re-download the checkpoint")
    return header


def load_tensors(folder: Path, prefix: str, strip: str) -> dict:
    """Load every tensor whose key starts with prefix, renaming prefix to strip."""
    from safetensors import safe_open

    from safetensors import SafetensorError

    state = {}
    for f in safetensors_files(folder):
        try:
            with safe_open(str(f), framework="pt") as sf:
                for key in sf.keys():
                    if key.startswith(prefix):
                        state[strip + key[len(prefix):]] = sf.get_tensor(key)
        except SafetensorError as e:  # what the header check above cannot see, e.g. overlapping offsets
            raise CheckpointError(f"{f} is damaged ({e}); re-download the checkpoint") from e
    return state


def assign_state(model, state: dict, role: str, folder: Path) -> None:
    """Load `state` into a meta-built model, refusing missing weights and shape mismatches by name."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state and k != "lm_head.weight"]
    if missing:
        raise CheckpointError(f"{role} checkpoint {folder} lacks {len(missing)} weights, e.g. {missing[0]}")
    for k, v in state.items():
        if k in expected and tuple(v.shape) != tuple(expected[k].shape):
            raise CheckpointError(f"{role} weight {k} has shape {tuple(v.shape)}, config expects {tuple(expected[k].shape)}")
    model.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False, assign=True)
    model.tie_weights()


def write_checkpoint(folder: Path, config: dict, state: dict, generation: dict) -> None:
    """Write an HF checkpoint folder: config.json, model.safetensors, generation_config.json."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    import transformers

    config = {**config, "dtype": "float32", "transformers_version": transformers.__version__}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    state = {k: v.contiguous() for k, v in state.items() if not _is_tied_head(k, state)}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    gen = {**generation, "transformers_version": transformers.__version__}
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def _is_tied_head(key: str, state: dict) -> bool:
    return key == "lm_head.weight" and "model.embed_tokens.weight" in state and (
        state[key].data_ptr() == state["model.embed_tokens.weight"].data_ptr())
