"""export_model(cfg): load -> wrap -> convert -> reference -> manifest -> graph parity -> atomic rename."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from mtpkit import __version__
from mtpkit.runtime.manifest import SCHEMA_VERSION, Backend, GraphFile, Manifest, sha256_file

from . import reference as reference_lib
from . import verify
from .backends import onnx as onnx_backend
from .checkpoint import CheckpointError, Source, resolve
from .config import ExportConfig
from .models import drafter_adapter, target_adapter
from .signatures import onnx_signatures

log = logging.getLogger("mtpkit")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def export_model(cfg: ExportConfig) -> Path:
    """Export target + drafter to cfg.out; nothing is left behind on failure.

    Returns:
        the export folder, holding manifest.json, the graphs, tokenizer and reference files.
    """
    started = time.time()
    target_src, drafter_src = resolve(cfg.target, "target", cfg.target_revision), resolve(
        cfg.drafter, "drafter", cfg.drafter_revision)
    tad, dad = target_adapter(target_src), drafter_adapter(drafter_src)
    dad.check_compatible(tad.hf_config(target_src), dad.hf_config(drafter_src))  # before loading any weights
    _check_tokenizer(target_src)
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{cfg.out.name}.partial-", dir=cfg.out.parent))
    try:
        log.info("[1/5] loading target %s and drafter %s", cfg.target, cfg.drafter)
        target, drafter = tad.load(target_src), dad.load(drafter_src)
        log.info("[2/5] exporting ONNX graphs (the reference backend; also used for the graph check)")
        manifest = _write_onnx(cfg, tmp, target, drafter, tad, dad, target_src, drafter_src)
        if "litert" in cfg.backend:
            log.info("[2/5] exporting LiteRT graphs and the .litertlm bundle")
            manifest = _add_litert(cfg, tmp, manifest, target, drafter, target_src)
        log.info("[3/5] recording the transformers reference (greedy, and assisted with k in %s)",
                 reference_lib.DRAFT_LENGTHS)
        manifest = _write_reference(cfg, tmp, manifest, target, drafter)
        manifest.save(tmp)
        if cfg.check:
            log.info("[4/5] checking every graph against PyTorch")
            checks = verify.check_onnx(manifest, target, drafter,
                                       manifest_prompt(manifest, tmp))
            (tmp / "graph_parity.json").write_text(json.dumps([c.__dict__ | {"ok": c.ok} for c in checks], indent=2))
            for c in checks:
                log.info("  %-24s max|d| %.2e (tol %.1e)  argmax %.0f%%  %s", c.signature, c.max_abs, c.tolerance,
                         100 * c.argmax_agree, "ok" if c.ok else "FAIL")
            verify.raise_on_failure(checks)
        log.info("[5/5] writing %s", cfg.out)
        _replace(tmp, cfg.out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("export finished in %.1f s", time.time() - started)
    return cfg.out


def _replace(tmp: Path, out: Path) -> None:
    tmp.chmod(0o755)  # mkdtemp makes it private
    if out.exists():
        old = out.with_name(f".{out.name}.old-{int(time.time())}")
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)


def _check_tokenizer(src: Source) -> None:
    if not (src.folder / "tokenizer.json").is_file():
        raise CheckpointError(f"target checkpoint {src.folder} has no tokenizer.json; mtpkit needs the fast tokenizer file")


def _write_onnx(cfg, tmp, target, drafter, tad, dad, target_src, drafter_src) -> Manifest:
    tcfg = target.config
    layers = tad.kv_layers(tcfg)
    store_idx = tad.store_layers(tcfg)
    store = {t: next(d for d in layers if d["layer"] == i) for t, i in store_idx.items()}
    hidden, vocab = tcfg.hidden_size, tcfg.vocab_size
    sigs = onnx_signatures(layers, store, hidden, vocab)
    t_path, d_path = tmp / "target.onnx", tmp / "drafter.onnx"
    onnx_backend.export_graph(tad.TargetStep(target), sigs["verify"], _target_sample(layers), t_path)
    onnx_backend.export_graph(dad.DraftStep(drafter), sigs["draft"], _draft_sample(store, hidden), d_path)
    table = target.model.embed_tokens.weight.detach().numpy()
    embedding = onnx_backend.share_embedding(t_path, table)
    embedding["scale"] = float(target.model.embed_tokens.embed_scale.to(target.model.embed_tokens.weight.dtype))
    graphs = {name: _graph_file(tmp, p) for name, p in (("target", t_path), ("drafter", d_path))}
    tokenizer = _copy_tokenizer(target_src.folder, tmp)
    gen_t, gen_d = _json(target_src.folder / "generation_config.json"), _json(drafter_src.folder / "generation_config.json")
    return Manifest(
        schema_version=SCHEMA_VERSION, mtpkit_version=__version__,
        source={"target": _source_entry(target_src), "drafter": _source_entry(drafter_src)},
        model={"vocab_size": vocab, "hidden_size": hidden, "num_layers": tcfg.num_hidden_layers,
               "sliding_window": tcfg.sliding_window, "final_logit_softcapping": tcfg.final_logit_softcapping,
               "drafter_hidden_size": drafter.config.get_text_config().hidden_size,
               "max_position_embeddings": tcfg.max_position_embeddings},
        tokens=_token_ids(tcfg, gen_t),
        tokenizer=tokenizer,
        generation={"num_assistant_tokens": int(gen_d.get("num_assistant_tokens") or 4),
                    "num_assistant_tokens_schedule": gen_d.get("num_assistant_tokens_schedule", "constant")},
        kv_cache={"capacity": cfg.max_cache_len, "dtype": "float32", "layout": "BHSD", "layers": layers,
                  "drafter_layers": store_idx, "sliding_past": tcfg.sliding_window - 1,
                  "drafter_sliding_visible": tcfg.sliding_window + 1},
        embedding=embedding, backends={"onnx": Backend("onnx", "window", graphs, sigs)},
        quantization={"recipe": cfg.quant}, root=tmp)


def _add_litert(cfg, tmp: Path, manifest: Manifest, target, drafter, target_src) -> Manifest:
    from .backends import litert as litert_backend

    num_draft = cfg.num_draft or int(manifest.generation["num_assistant_tokens"])
    info = litert_backend.export_litert(target_src.folder, drafter, target, tmp, prefill_len=cfg.prefill_len,
                                        cache_len=cfg.max_cache_len, num_draft=num_draft)
    log.info("  LiteRT export took %.1f s, peak memory %.0f MB", info["export_seconds"], info["peak_rss_mb"])
    backend = litert_manifest(tmp, info)
    return dataclasses.replace(manifest, backends={**manifest.backends, "litert": backend})


def litert_manifest(folder: Path, info: dict) -> Backend:
    """Map export_litert's description onto the manifest: every signature by role, static lengths, masks."""
    from mtpkit.runtime.manifest import Signature, TensorSpec

    files = info["files"]
    graphs = {k: GraphFile(file=v["file"], sha256=sha256_file(folder / v["file"]), bytes=v["bytes"], backend="litert")
              for k, v in files.items()}
    bundle = info["bundle"]["file"]
    graphs["bundle"] = GraphFile(file=bundle, sha256=sha256_file(folder / bundle),
                                 bytes=(folder / bundle).stat().st_size, backend="litert")
    names = info["signatures"]
    where = {"decode": ("target", names["decode"]), "verify": ("target", names["verify"]),
             "draft": ("drafter", names["draft"]), "draft_masked": ("drafter", names["draft_masked"]),
             "embed_decode": ("embedder", names["embed_decode"])}
    if "per_layer_embed_decode" in names:
        where["per_layer_embed_decode"] = ("per_layer_embedder", names["per_layer_embed_decode"])
    for entry in names["prefill"]:
        where[entry["signature"]] = ("target", entry["signature"])
    sigs = {}
    for key, (graph, name) in where.items():
        d = files[graph]["signatures"][name]
        sigs[key] = Signature(graph, [TensorSpec(**t) for t in d["inputs"]], [TensorSpec(**t) for t in d["outputs"]],
                              d.get("num_tokens"), name)
    options = {k: info[k] for k in ("cache_len", "verify_len", "num_draft", "mask", "kv_cache", "drafter_visibility",
                                    "export_seconds", "peak_rss_mb")}
    options["prefill"] = names["prefill"]
    options["bundle"] = {"file": bundle, "sections": info["bundle"].get("sections")}
    return Backend("litert", "state", graphs, sigs, options)


def _target_sample(layers) -> tuple:
    t, p = 3, 5  # avoid 0/1 so torch.export keeps T and the past lengths dynamic
    past = [torch.randn(1, d["kv_heads"], p, d["head_dim"]) for d in layers for _ in (0, 1)]
    return (torch.randint(0, 8, (1, t)), torch.tensor([p]), *past)


def _draft_sample(store, hidden) -> tuple:
    full, sliding = store["full_attention"], store["sliding_attention"]
    return (torch.randn(1, 1, hidden), torch.randn(1, 1, hidden), torch.tensor([6]),
            torch.randn(1, full["kv_heads"], 6, full["head_dim"]), torch.randn(1, full["kv_heads"], 6, full["head_dim"]),
            torch.randn(1, sliding["kv_heads"], 5, sliding["head_dim"]),
            torch.randn(1, sliding["kv_heads"], 5, sliding["head_dim"]))


def _graph_file(folder: Path, path: Path) -> GraphFile:
    data = {p.name: sha256_file(p) for p in onnx_backend.data_files(path)}
    size = path.stat().st_size + sum((folder / n).stat().st_size for n in data)
    return GraphFile(file=path.name, sha256=sha256_file(path), bytes=size, backend="onnx", data_files=data)


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _source_entry(src: Source) -> dict:
    return {"ref": src.ref, "revision": src.revision, "model_type": src.config.get("model_type"),
            "architectures": src.config.get("architectures"), "config_sha256": sha256_file(src.folder / "config.json")}


def _token_ids(tcfg, gen: dict) -> dict:
    eos = gen.get("eos_token_id", tcfg.eos_token_id)
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    return {"bos": gen.get("bos_token_id", tcfg.bos_token_id), "pad": gen.get("pad_token_id", tcfg.pad_token_id),
            "eos": eos}


def _copy_tokenizer(src: Path, dst: Path) -> dict:
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    template = None
    if (src / "chat_template.jinja").is_file():
        template = (src / "chat_template.jinja").read_text()
    else:
        template = _json(src / "tokenizer_config.json").get("chat_template")
    entry = {"file": "tokenizer.json", "chat_template_file": None,
             "add_bos": bool(_json(src / "tokenizer_config.json").get("add_bos_token", True))}
    if isinstance(template, str):
        (dst / "chat_template.jinja").write_text(template)
        entry["chat_template_file"] = "chat_template.jinja"
    return entry


def _write_reference(cfg, tmp: Path, manifest: Manifest, target, drafter) -> Manifest:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tmp / "tokenizer.json"))
    encode = lambda text: tok.encode(text, add_special_tokens=False).ids  # noqa: E731
    prompts = reference_lib.reference_prompts(encode, manifest.tokens["bos"], manifest.model["sliding_window"], None)
    ref, arrays = reference_lib.record(target, drafter, prompts, cfg.reference_tokens, manifest.eos_ids)
    (tmp / "reference.json").write_text(json.dumps(ref) + "\n")
    np.savez(tmp / "reference.npz", **arrays)
    entry = {"file": "reference.json", "sha256": sha256_file(tmp / "reference.json"), "arrays": "reference.npz",
             "draft_lengths": list(reference_lib.DRAFT_LENGTHS)}
    return dataclasses.replace(manifest, reference=entry)


def manifest_prompt(manifest: Manifest, root: Path) -> list[int]:
    """The longest reference prompt: it crosses the sliding window, so every mask path is checked."""
    ref = json.loads((root / manifest.reference["file"]).read_text())
    return max((p["prompt_ids"] for p in ref["prompts"]), key=len)
