"""export_model(cfg): load -> each backend's graphs -> reference -> check -> quantize -> acceptance -> manifest.json,
written once -> atomic rename."""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from mtpkit.errors import UsageError
from mtpkit.runtime.backends import LoadOptions
from mtpkit.runtime.manifest import (SCHEMA_VERSION, Generation, KVCache, Manifest, Model, Quantization, Tokens,
                                     sha256_file)
from mtpkit.runtime.speculative import DEFAULT_NUM_ASSISTANT_TOKENS
from mtpkit.version import __version__

from . import calibration, fidelity, lattice
from . import reference as reference_lib
from . import outdir, preflight, reproduce, sizes, verify
from .backends import ExportJob, backend_module
from .mapped import CHECKPOINT, GRAPHS, page_out
from .checkpoint import TOKENIZER_FILES, CheckpointError, Source, resolve, safetensors_files
from .config import ExportConfig
from .models import drafter_adapter, model_type, target_adapter
from .phases import MB, PhaseLog, human_bytes
from .scoped import import_quietly

log = logging.getLogger("mtpkit")


def export_model(cfg: ExportConfig) -> Path:
    """Export target + drafter to cfg.out; nothing is left behind on failure.

    Returns:
        the export folder, holding manifest.json, the graphs, tokenizer, HF config and reference files.
    """
    if cfg.dry_run:
        raise UsageError("a dry run writes nothing: plan it with mtpkit.export.pipeline.plan_export(cfg), or pass "
                         "--dry-run to `mtpkit export`")
    started = time.time()
    import_quietly()
    record = reproduce.record(cfg)  # the flags as given: a re-run adapts the same defaults the same way
    cfg, (target_src, drafter_src), adapters, configs = prepare(cfg)
    estimate = preflight.check(cfg, target_src, drafter_src)  # before any weights load or --out is touched
    low_bit = sizes.fit_size(cfg, (target_src, drafter_src), adapters, configs)
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    lock, tmp = outdir.claim(cfg.out, cfg.force), None  # one writer per folder; removes a killed run's leftovers
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{cfg.out.name}.partial-", dir=cfg.out.parent))
        phases = _export_into(cfg, tmp, (target_src, drafter_src), adapters, estimate, record, low_bit)
    except BaseException as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if (full := outdir.disk_full(e, cfg.out)) is not None:
            raise full from e
        raise
    finally:
        lock.release()
    log.info("export finished in %.1f s, peak RSS %s (estimated %s)", time.time() - started,
             human_bytes(phases.as_dict()["peak_rss_mb"] * MB), human_bytes(estimate.peak_bytes))
    return cfg.out


def prepare(cfg: ExportConfig) -> tuple[ExportConfig, tuple[Source, Source], tuple, tuple]:
    """What an export checks before any weight loads (an export that passes these starts loading): the checkpoints
    resolved, their families' adapters, the drafter matched to the target, the shape defaults fitted, the
    tokenizer, the calibration file and the safetensors headers. Returns (cfg fitted, (target, drafter) sources,
    their adapters, their HF configs)."""
    target_src, drafter_src = resolve(cfg.target, "target", cfg.target_revision), resolve(
        cfg.drafter, "drafter", cfg.drafter_revision)
    adapters = target_adapter(target_src), drafter_adapter(drafter_src)
    configs = adapters[0].hf_config(target_src), adapters[1].hf_config(drafter_src)
    adapters[1].check_compatible(*configs)
    cfg = cfg.fitted(configs[0].max_position_embeddings, _drafter_k(drafter_src))
    _check_tokenizer(target_src)
    lattice.check_recipes(cfg.recipes, {"target": target_src.folder, "drafter": drafter_src.folder})
    if cfg.calibration is not None:  # before any weights load, not at the quantize step
        calibration.check_file(cfg.calibration, target_src.folder / "tokenizer.json", configs[0].sliding_window)
    _check_files(target_src, drafter_src)
    return cfg, (target_src, drafter_src), adapters, configs


def plan_export(cfg: ExportConfig) -> sizes.SizePlan:
    """`mtpkit export ... --dry-run`: the export's checks before any weight loads (prepare), then the size plan of
    every backend it would write, from the checkpoints' headers (export/sizes.py). Reads no weight, writes nothing."""
    cfg, sources, adapters, configs = prepare(cfg)
    low_bit = sizes.fit_size(cfg, sources, adapters, configs)
    backends = sizes.backend_plans(cfg, sources, adapters, configs, low_bit)
    return sizes.SizePlan(cfg, backends, adapters[0].kv_layers(configs[0]), configs[0].sliding_window, low_bit)


def _export_into(cfg: ExportConfig, tmp: Path, sources: tuple, adapters: tuple, estimate, record: dict,
                 low_bit: tuple[str, ...] = ()) -> PhaseLog:
    """The stages into the temporary folder tmp, each taking and returning the manifest (a frozen record, kept in
    memory): load, each backend's graphs, the transformers reference, the check against PyTorch, quantization and
    fidelity, the drafter's acceptance; then manifest.json is written, once, with `export` (how to re-run it,
    export/reproduce.py) and `measured` (each phase's time and peak RSS, export/phases.py), and tmp is renamed to
    cfg.out."""
    (target_src, drafter_src), (target_adapter, drafter_adapter) = sources, adapters
    quantized = cfg.quantized
    phases = PhaseLog(total=3 + len(cfg.backend) + cfg.check + quantized + 1, resident_cap=estimate.resident_cap)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with phases.phase("load", f"loading target {cfg.target} and drafter {cfg.drafter}"):
        job = dataclasses.replace(_job(cfg, tmp, target_adapter.load(target_src, estimate.dtype),
                                       drafter_adapter.load(drafter_src), adapters, sources), low_bit=low_bit)
    log.info("  target weights held in %s", str(next(job.target.parameters()).dtype).removeprefix("torch."))
    with target_adapter.fp32_compute(job.target):  # PyTorch computes in fp32 whatever the weights are held in
        manifest = _graphs(job, phases, sources)
        manifest = _reference(manifest, job, phases)
        if cfg.check:
            _check(manifest, job, phases)
        if quantized:
            manifest = _quantize(manifest, job, phases)
    with phases.phase("acceptance", "measuring the drafter's acceptance on the final graphs"):
        # float graphs kept: no packed copy of them for this one-off run either
        manifest = _record_acceptance(manifest, LoadOptions(pack_weights=quantized, weight_cache=False))
    with phases.phase("write", f"writing {cfg.out}"):
        measured = {"started": started, **phases.as_dict(), "preflight": estimate.as_dict()}
        dataclasses.replace(manifest, export=record, measured=measured).save(tmp)
        _replace(tmp, cfg.out)
    return phases


def _graphs(job: ExportJob, phases: PhaseLog, sources: tuple) -> Manifest:
    """Every backend's float graphs (onnx first: the others are checked against it), the HF files beside them, and
    the manifest that describes them."""
    backends = {}
    for kind in job.cfg.backend:
        with phases.phase(f"{kind} graphs", f"exporting {kind} graphs"):
            backends[kind] = backend_module(kind).export(job)
    hf_files, tokenizer = _copy_hf_files(sources[0].folder, job.folder)
    return _manifest(job, *sources, backends, tokenizer, hf_files)


def _reference(manifest: Manifest, job: ExportJob, phases: PhaseLog) -> Manifest:
    with phases.phase("reference", "recording the transformers reference (greedy, and assisted with k in "
                                   f"{_draft_lengths(job.cfg)})"):
        return dataclasses.replace(manifest, reference=_write_reference(job, manifest))


def _check(manifest: Manifest, job: ExportJob, phases: PhaseLog) -> None:
    """Every backend's float graphs against PyTorch, each by its own export module's check(manifest, job, ids)."""
    with phases.phase("check", "checking every graph against PyTorch"):
        ids = manifest_prompt(manifest, job.folder)
        checks = [c for kind in manifest.backends for c in backend_module(kind).check(manifest, job, ids)]
        (job.folder / "graph_parity.json").write_text(json.dumps([c.__dict__ | {"ok": c.ok} for c in checks],
                                                                 indent=2))
        for c in checks:
            ties = f" ({c.near_ties} near-ties)" if c.near_ties else ""
            noise = (f"  PyTorch vs itself {c.reference_noise:.1e}"
                     if c.reference_noise > verify.ATOL / verify.NOISE_FACTOR else "")
            log.info("  %-6s %-24s max|d| %.2e (tol %.1e)  argmax %.0f%%%s  %s%s", c.backend, c.signature, c.max_abs,
                     c.tolerance, 100 * c.argmax_agree, ties, "ok" if c.ok else "FAIL", noise)
        verify.raise_on_failure(checks)


def _job(cfg: ExportConfig, tmp: Path, target, drafter, adapters: tuple, sources: tuple) -> ExportJob:
    target_adapter, drafter_adapter = adapters
    return ExportJob(cfg=cfg, folder=tmp, target=target, drafter=drafter, target_adapter=target_adapter,
                     drafter_adapter=drafter_adapter, target_folder=sources[0].folder,
                     kv_layers=target_adapter.kv_layers(target.config), store=target_adapter.store_layers(target.config),
                     max_draft=cfg.max_draft)


def _quantize(manifest: Manifest, job: ExportJob, phases: PhaseLog) -> Manifest:
    """Quantize each backend's float graphs (checked above) in place, then measure and gate the result."""
    cfg = job.cfg
    with phases.phase("quantize", f"quantizing (target {cfg.quant}, drafter {cfg.drafter_quant}) and measuring "
                                  "fidelity against the float model"):
        reference = json.loads(manifest.path(manifest.reference["file"]).read_text())
        unpacked = LoadOptions(pack_weights=False)  # one-off float runs: no packed copy of the weights
        with lattice.released(job.target):  # the float graphs run without the PyTorch weights beside them
            float_figures = {kind: fidelity.runtime_figures(manifest, reference, backend=kind, options=unpacked)
                             for kind in manifest.backends}
        page_out(*GRAPHS)  # the float graphs' pages: rewritten next, not read again
        recipes = cfg.recipes
        plans = calibration.plans(recipes, job.target, {"target": job.target_adapter, "drafter": job.drafter_adapter},
                                  _encoder(job.folder), manifest.tokens.bos, cfg.calibration, cfg.ple_bits,
                                  job.low_bit)
        plans.update(lattice.plans(recipes, {"target": job.target, "drafter": job.drafter}))
        page_out(*CHECKPOINT)  # calibration read the model: the graphs are read next
        with lattice.released(job.target):  # the graft reads the codes: the floats made from them wait
            backends = {kind: backend_module(kind).quantize(job.folder, backend, recipes, cfg.block_size,
                                                             cfg.accuracy_level, ple_bits=cfg.ple_bits, plans=plans)
                        for kind, backend in manifest.backends.items()}
        manifest = dataclasses.replace(manifest, backends=backends)
        fidelity.check(manifest, job.target, float_figures, cfg.quality_gate)
    return manifest


def _record_acceptance(manifest: Manifest, options: LoadOptions, max_draft: int = 8) -> Manifest:
    """Each backend's acceptance of draft i given drafts 1..i-1 were accepted, on its exported (final) graphs:
    the runtime, greedy, clean hand-off, constant k = max_draft (or the backend's static verify length) on the
    reference prompts that fit the KV capacity, recorded as `backends.<kind>.options.acceptance_by_position`. The
    prior of `--num-assistant-tokens auto`; a position never reached is 0 (auto still probes it); nothing is
    recorded when no prompt fits (auto then starts from its built-in prior)."""
    backends = dict(manifest.backends)
    for kind in manifest.backends:
        acceptance = _acceptance(manifest, kind, max_draft, options)
        if acceptance:
            log.info("  %s drafter acceptance by position (greedy, k=%d, reference prompts): %s", kind,
                     len(acceptance), " ".join(f"{a:.2f}" for a in acceptance))
            recorded = dataclasses.replace(backends[kind].options, acceptance_by_position=acceptance)
            backends[kind] = dataclasses.replace(backends[kind], options=recorded)
    return dataclasses.replace(manifest, backends=backends)


def _acceptance(manifest: Manifest, kind: str, max_draft: int, options: LoadOptions) -> list[float]:
    from mtpkit.runtime.engine import Engine, GenConfig
    from mtpkit.runtime.stats import conditional_acceptance

    engine = Engine(manifest, threads=1, backend=kind, options=options)
    k = engine.resolve(GenConfig(num_assistant_tokens=max_draft, schedule="constant"), adapt=True).num_assistant_tokens
    assert isinstance(k, int)  # a constant schedule's k
    reference = json.loads(manifest.path(manifest.reference["file"]).read_text())
    runs = []
    for p in reference["prompts"]:
        cfg = GenConfig(max_new_tokens=len(p["greedy_ids"]), num_assistant_tokens=k, schedule="constant")
        if engine.target.positions_needed(len(p["prompt_ids"]), cfg.max_new_tokens) <= engine.kv.capacity:
            runs.append(engine.run(p["prompt_ids"], cfg))
    return [round(a or 0.0, 4) for a in conditional_acceptance(runs, k)] if runs else []


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
    from tokenizers import Tokenizer

    path = src.folder / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"target checkpoint {src.folder} has no tokenizer.json; mtpkit needs the fast tokenizer file")
    try:
        Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for a file it cannot parse
        raise CheckpointError(f"{path} is not a valid tokenizer.json ({(str(e).splitlines() or ['?'])[0][:200]}); "
                              "re-download the checkpoint") from e


def _check_files(target_src: Source, drafter_src: Source) -> None:
    """Damaged weight files are refused before the output folder is touched."""
    for src in (target_src, drafter_src):
        safetensors_files(src.folder)  # also checks each file's header and length


def _drafter_k(src: Source) -> int:
    """The drafter's own draft length (its generation_config's num_assistant_tokens)."""
    return int(_json(src.folder / "generation_config.json").get("num_assistant_tokens") or DEFAULT_NUM_ASSISTANT_TOKENS)


def _manifest(job: ExportJob, target_src: Source, drafter_src: Source, backends: dict, tokenizer: dict,
              hf_files: dict) -> Manifest:
    """The whole manifest, in one place; only the reference entry is added once it is recorded."""
    tcfg, cfg = job.target.config, job.cfg
    gen_t, gen_d = _json(target_src.folder / "generation_config.json"), _json(drafter_src.folder / "generation_config.json")
    return Manifest(
        schema_version=SCHEMA_VERSION, mtpkit_version=__version__,
        source={"target": _source_entry(target_src), "drafter": _source_entry(drafter_src)},
        model=Model(vocab_size=job.vocab, hidden_size=job.hidden, num_layers=tcfg.num_hidden_layers,
                    sliding_window=tcfg.sliding_window, final_logit_softcapping=tcfg.final_logit_softcapping,
                    drafter_hidden_size=job.drafter.config.get_text_config().hidden_size,
                    max_position_embeddings=tcfg.max_position_embeddings),
        tokens=_token_ids(tcfg, gen_t), tokenizer=tokenizer,
        generation=Generation(num_assistant_tokens=_drafter_k(drafter_src),
                              num_assistant_tokens_schedule=gen_d.get("num_assistant_tokens_schedule", "constant")),
        kv_cache=KVCache(capacity=cfg.max_cache_len, layers=list(job.kv_layers), drafter_layers=job.store,
                         sliding_past=tcfg.sliding_window - 1, drafter_sliding_visible=tcfg.sliding_window + 1),
        backends=backends, hf_files=hf_files, root=job.folder,
        quantization=Quantization(recipe=cfg.quant, drafter_recipe=cfg.drafter_quant, ple_recipe=cfg.ple_quant,
                                  block_size=cfg.block_size, accuracy_level=cfg.accuracy_level, kv_cache="float32"))


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _source_entry(src: Source) -> dict:
    # folder: where the weights were read (absolute), so `bench --peers` finds them from any working directory
    return {"ref": src.ref, "revision": src.revision, "folder": str(src.folder.resolve()),
            "model_type": model_type(src),
            "architectures": src.config.get("architectures"), "config_sha256": sha256_file(src.folder / "config.json")}


def _token_ids(tcfg, gen: dict) -> Tokens:
    eos = gen.get("eos_token_id", tcfg.eos_token_id)
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    return Tokens(bos=gen.get("bos_token_id", tcfg.bos_token_id), pad=gen.get("pad_token_id", tcfg.pad_token_id),
                  eos=eos)


def _copy_hf_files(src: Path, dst: Path) -> tuple[dict, dict]:
    """Copy the tokenizer files and the target's config.json / generation_config.json (as HF users expect).

    Returns:
        (the manifest's hf_files entry, its tokenizer entry: the files the runtime reads, with their sha256; the
        other copies are for HF tools and never read by mtpkit)
    """
    for name in (*TOKENIZER_FILES, "config.json", "generation_config.json"):
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    hf_files = {key: name for key, name in (("config", "config.json"), ("generation_config", "generation_config.json"))
                if (dst / name).is_file()}
    tokenizer_config = _json(src / "tokenizer_config.json")
    template = tokenizer_config.get("chat_template")
    if not (dst / "chat_template.jinja").is_file() and isinstance(template, str):
        (dst / "chat_template.jinja").write_text(template)
    entry = {"file": "tokenizer.json", "sha256": sha256_file(dst / "tokenizer.json"),
             "add_bos": bool(tokenizer_config.get("add_bos_token", True)), "chat_template_file": None}
    if (dst / "chat_template.jinja").is_file():
        entry.update(chat_template_file="chat_template.jinja",
                     chat_template_sha256=sha256_file(dst / "chat_template.jinja"))
    return hf_files, entry


def _encoder(folder: Path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def _draft_lengths(cfg: ExportConfig) -> tuple[int, ...]:
    return reference_lib.draft_lengths(cfg.max_draft if cfg.static_verify else None)


def _write_reference(job: ExportJob, manifest: Manifest) -> dict:
    encode = _encoder(job.folder)
    prompts = reference_lib.reference_prompts(encode, manifest.tokens.bos, manifest.model.sliding_window, None)
    lengths = _draft_lengths(job.cfg)
    ref, arrays = reference_lib.record(job.target, job.drafter, prompts, job.cfg.reference_tokens, manifest.eos_ids,
                                       lengths)
    (job.folder / "reference.json").write_text(json.dumps(ref) + "\n")
    np.savez(job.folder / "reference.npz", **arrays)
    return {"file": "reference.json", "sha256": sha256_file(job.folder / "reference.json"), "arrays": "reference.npz",
            "arrays_sha256": sha256_file(job.folder / "reference.npz"),
            "draft_lengths": list(lengths)}


def manifest_prompt(manifest: Manifest, root: Path) -> list[int]:
    """The longest reference prompt: it crosses the sliding window, so every mask path is checked."""
    ref = json.loads((root / manifest.reference["file"]).read_text())
    return max((p["prompt_ids"] for p in ref["prompts"]), key=len)
