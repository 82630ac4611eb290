"""LiteRT export: target via litert-torch's export_hf, the MTP drafter by hand, a .litertlm bundle with both.

export_litert() writes into an existing folder and returns a JSON-able description of every signature (tensor
names, shapes, dtypes and roles), so a runtime binds by role and never parses names or shapes. The drafter is
exported in LiteRT-LM's drafter contract (signature 0 "draft": activations, input_pos, mask, the target's store
layer caches by their target names -> logits, projected_activations) plus "draft_masked", which mtpkit's runtime
uses: explicit masks in and, for a centroid head, only the selected tokens' logits and ids out.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from mtpkit.runtime.manifest import Backend, GraphFile, LiteRtOptions, Signature, TensorSpec, sha256_file

from ..litert_patches import import_export_hf, litert_workarounds
from ..phases import MB
from ..scoped import gemma4_layer_types_in_order, insertion_ordered_sets, output_captured, patched, patched_all
from . import ExportJob, ExportMemory, litert_graft
from .litert_describe import (MASK_HIDDEN, cache_indices, describe, draft_signature, draft_windows,
                              drafter_window)

log = logging.getLogger("mtpkit")
from ..models import gemma4_assistant, gemma4_text

# The memory preflight's figures (export/preflight.py; W = the fp32 weights; docs/export-memory.md). The graphs are
# converted without weights and written by streaming: converting the weightless graphs costs about 300 MB whatever
# the size, the weights add only what is in flight.
MEMORY = ExportMemory(
    base=1700 * MB,  # litert-torch and TensorFlow Lite (about 200 MB) and the weightless conversion
    graphs=0.05,
    quantize=lambda recipes: 0.05,  # re-grafted a block of rows at a time, read with pread
    # the float check opens the graphs without XNNPACK (without_weight_packing): no packed copy stays behind
    kept=0.0,
    # (fixed MiB, growth in W) per phase, fitted to two --backend litert --quant int4 exports: e2b-wide (W = 580
    # MiB, held fp32) and the full-size random E2B (W = 17954 MiB, held bf16 as stored); quantize, net of the
    # quantized weights the preflight adds, through e2b-wide and the full-size E4B under the calibrated int4 (W =
    # 28770 MiB, 12.6 GiB anonymous). docs/scale-bench.md, "LiteRT at full size"
    anonymous={"load": (275, 0.017), "litert graphs": (602, 0.057), "reference": (395, 0.217), "check": (249, 0.538),
               "quantize": (504, 0.336), "acceptance": (437, 0.445)},
    anonymous_recipes=frozenset({"int8", "int4", "int4-rtn"}))

# what writes this backend's files (converter, flatbuffers, the .litertlm) or the figures in its entry (the acceptance
# runs on ai-edge-litert), recorded with their versions in manifest.json's `export` entry (export/reproduce.py)
PACKAGES = ("litert-torch", "litert-converter", "ai-edge-litert", "ai-edge-quantizer", "litert-lm-builder",
            "flatbuffers")


class LiteRTDraftStep(nn.Module):
    """Gemma 4 assistant step over the target's LiteRT KV caches (K [1,h,C,d], V transposed [1,h,d,C]).

    Attention is litert-torch's "lrt_transposed_attention": HF's eager repeat_kv attention is mis-compiled by
    the converter (B5). The "clean" hand-off is computed in-graph from input_pos: full layers see j < pos,
    sliding layers pos-(W+1) <= j < pos (HF shows the drafter the last W+1 entries of what it is handed).
    """

    def __init__(self, drafter: nn.Module, cache_index: dict[str, int], window: int, cache_len: int):
        super().__init__()
        self.drafter = drafter
        self.cache_index = cache_index  # layer type -> the target's cache index of its store layer (cache names)
        self.window = window
        self.register_buffer("slots", torch.arange(cache_len, dtype=torch.int32).view(1, 1, 1, -1), persistent=False)

    def clean_masks(self, input_pos):
        pos = input_pos.view(1, 1, 1, 1)
        seen = self.slots < pos
        recent = seen & (self.slots >= pos - (self.window + 1))
        zero, hidden = torch.zeros((), dtype=torch.float32), torch.full((), MASK_HIDDEN, dtype=torch.float32)
        return {"full_attention": torch.where(seen, zero, hidden),
                "sliding_attention": torch.where(recent, zero, hidden)}

    def forward(self, activations, input_pos, **named):
        lite_rt_lm = "mask" in named  # LiteRT-LM's contract: causal mask (j <= pos), vocabulary-wide logits
        if lite_rt_lm:  # intersecting with the clean view keeps the clean view and uses the mask
            masks = {t: torch.minimum(m, named["mask"]) for t, m in self.clean_masks(input_pos).items()}
        else:
            masks = {"full_attention": named["full_mask"], "sliding_attention": named["sliding_mask"]}
        shared = {t: _store(named, n) for t, n in self.cache_index.items()}
        logits, projected = gemma4_assistant.draft_forward(self.drafter, activations, input_pos, shared, masks,
                                                           selected=not lite_rt_lm, k_ts_idx=2, v_ts_idx=3)
        if isinstance(logits, tuple):  # draft_masked of a centroid head: the selected tokens only
            return {"selected_logits": logits[0], "selected_ids": logits[1].to(torch.int32),
                    "projected_activations": projected}
        return {"logits": logits, "projected_activations": projected}


def _store(named: dict, n: int) -> tuple:
    """A store layer's (K, V): draft_masked reads the sliding one through a window of its last W+1 slots and the full
    one through a prefix of the cache (one signature per prefix length, draft_windows)."""
    if f"window_k_{n}" in named:
        return named[f"window_k_{n}"], named[f"window_v_{n}"]
    return named[f"kv_cache_k_{n}"], named[f"kv_cache_v_{n}"]


@contextlib.contextmanager
def _attn_implementation(model: nn.Module, name: str):
    """Switch a loaded HF model's attention function for the export only (the caller's model is restored)."""
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}.values()
    with patched_all(configs, "_attn_implementation", name):
        yield


def drafter_samples(target_config, cache_index: dict[str, int], cache_len: int) -> dict[str, dict]:
    """Sample inputs of both drafter signatures; their keys become the .tflite input names."""
    kv = {}
    owners = gemma4_text.kv_layers(target_config)
    for n in sorted(cache_index.values()):
        d = owners[n]
        kv[f"kv_cache_k_{n}"] = torch.randn(1, d.kv_heads, cache_len, d.head_dim)
        kv[f"kv_cache_v_{n}"] = torch.randn(1, d.kv_heads, d.head_dim, cache_len)
    common = {"activations": torch.randn(1, 1, 2 * target_config.hidden_size),
              "input_pos": torch.tensor([3], dtype=torch.int32)}
    mask = torch.zeros(1, 1, 1, cache_len)
    samples = {"draft": {**common, "mask": mask, **kv}}
    w = drafter_window(target_config, cache_len)
    for slots in draft_windows(cache_len):
        shown = {"sliding_attention": w, "full_attention": slots}
        windows = {}
        for layer_type, n in cache_index.items():
            if shown[layer_type] < cache_len or layer_type == "sliding_attention":
                windows[f"window_k_{n}"] = kv[f"kv_cache_k_{n}"][:, :, :shown[layer_type]].clone()
                windows[f"window_v_{n}"] = kv[f"kv_cache_v_{n}"][..., :shown[layer_type]].clone()
            else:
                windows |= {k: kv[k] for k in (f"kv_cache_k_{n}", f"kv_cache_v_{n}")}
        samples[draft_signature(slots, cache_len)] = {**common, "full_mask": mask[..., :slots].clone(),
                                                      "sliding_mask": mask[..., :w].clone(), **windows}
    return samples


def export_drafter(drafter_model: nn.Module, target_config, path: Path, cache_len: int, scratch: Path) -> None:
    """Convert the drafter to `path` with signatures draft (index 0, LiteRT-LM's contract) and draft_masked:
    converted without its weights, which are grafted in afterwards (litert_graft.py), as for the target."""
    import litert_torch

    import_export_hf()  # registers lrt_transposed_attention
    cache_index = cache_indices(target_config)
    step = LiteRTDraftStep(drafter_model, cache_index, target_config.sliding_window, cache_len).eval()
    state = step.state_dict()
    weights = litert_graft.WeightInputs(buffer_kept=lambda name: name in state)
    converter = litert_torch.Converter()
    with weights.converting():
        for name, sample in drafter_samples(target_config, cache_index, cache_len).items():
            converter.signature(name, step, sample_kwargs=sample)
    skeleton = scratch / "drafter.skeleton.tflite"
    with _attn_implementation(drafter_model, "lrt_transposed_attention"), torch.no_grad():
        converter.convert(strict_export=False).export(str(skeleton))
    litert_graft.graft(skeleton, path, litert_graft.StateSource(state), _float, names=weights.names)


def _float(name: str, shape: tuple, uses: set) -> litert_graft.Encoding:
    return litert_graft.Encoding("float32")


def gemma4_layout_checkpoint(target_dir: Path, dst: Path) -> Path:
    """A gemma4 (Gemma4ForConditionalGeneration) view of a gemma4_text checkpoint's config and tokenizer (no
    weights: export_hf builds the model on the meta device), or target_dir unchanged.

    export_hf only takes the external-embedder path LiteRT-LM's MTP needs (embedder + per_layer_embedder,
    embeddings inputs) for model_type gemma4; Gemma4ForCausalLM checkpoints get token inputs instead.
    """
    from ..checkpoint import HF_SIDE_FILES

    config = json.loads((target_dir / "config.json").read_text())
    if config.get("model_type") != "gemma4_text":
        return target_dir
    dst.mkdir(parents=True)
    top = {k: config[k] for k in ("pad_token_id", "eos_token_id", "bos_token_id") if k in config}
    wrapped = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": config,
               "vision_config": None, "audio_config": None,
               "tie_word_embeddings": config.get("tie_word_embeddings", True), **top}
    (dst / "config.json").write_text(json.dumps(wrapped, indent=2))
    for name in HF_SIDE_FILES:
        if (target_dir / name).is_file():
            shutil.copy2(target_dir / name, dst / name)
    return dst


@contextlib.contextmanager
def _bundle_with_drafter(drafter_path: Path):
    """Make export_hf's package_model also add our drafter as the tf_lite_mtp_drafter section.

    litert-torch 0.10.0 never adds an MTP_DRAFTER section (core/litert_lm_builder.py package_model).
    """
    import litert_lm_builder

    cls = litert_lm_builder.LitertLmFileBuilder
    original = cls.build

    def build(self, stream, *args, **kwargs):
        self.add_tflite_model(str(drafter_path), litert_lm_builder.TfLiteModelType.MTP_DRAFTER)
        return original(self, stream, *args, **kwargs)

    with patched(cls, "build", build):
        yield


@contextlib.contextmanager
def _in_fixed_order():
    """What export_hf would write in the iteration order of a set of strings (which changes from process to
    process) written in a fixed order instead: the bundle's stop tokens, the target graph's per-layer-type ops."""
    from litert_torch.generative.export_hf.core import litert_lm_builder

    with insertion_ordered_sets(litert_lm_builder), gemma4_layer_types_in_order():
        yield


@contextlib.contextmanager
def _grafted_after_packaging(weights: litert_graft.WeightInputs, source):
    """export_hf writes weightless graphs (WeightInputs) and bundles them as they are (a bundle of a few MB);
    then the checkpoint's weights are grafted into each graph in its work folder. The bundle gets the final
    graphs' bytes once they exist (litert_quant.rebuild_bundle), so no float copy of the model is bundled."""
    from litert_torch.generative.export_hf.core import litert_lm_builder

    real = litert_lm_builder.package_model

    def package_model(source_artifacts, export_config, exported):
        packaged = real(source_artifacts, export_config, exported)
        work = Path(export_config.work_dir)
        for name in ("embedder.tflite", "model.tflite", "per_layer_embedder.tflite"):
            if (work / name).is_file():
                litert_graft.graft(work / name, work / name, source, _float, names=weights.names)
        return packaged

    with patched(litert_lm_builder, "package_model", package_model):
        yield


def export_target(checkpoint: Path, weights_dir: Path, work: Path, drafter_path: Path, *, prefill_len: int,
                  cache_len: int, max_draft: int) -> None:
    """export_hf (float, external embedder, verify T=max_draft+1) into `work`, bundling the drafter.

    The model is built on the meta device and every weight is a signature input while converting; the weights
    are streamed from `weights_dir`'s safetensors into the finished graphs (litert_graft.py), so the model is
    never held in memory.
    """
    from litert_torch.generative.export_hf.core import weights_loader

    hf = import_export_hf()
    source = litert_graft.SafetensorsSource(weights_dir)
    resolve = litert_graft.checkpoint_resolver(source.where)
    source.resolve = resolve

    def kept(name: str) -> bool:  # persistent buffers carry checkpoint values; computed ones stay constants
        try:
            return bool(resolve(name))
        except KeyError:
            return False

    weights = litert_graft.WeightInputs(buffer_kept=kept)
    with _bundle_with_drafter(drafter_path), weights.converting(), _grafted_after_packaging(weights, source), \
            weights_loader.init_params_on_meta():
        hf.export.export(model=str(checkpoint), output_dir=str(work), keep_temporary_files=True,
                         prefill_lengths=[prefill_len], cache_length=cache_len, quantization_recipe="none",
                         externalize_embedder=True, assistant_model="mtpkit-drafter",
                         mtp_verifier_step=max_draft + 1, use_jinja_template=True, bundle_litert_lm=True,
                         export_vision_encoder=False, export_audio_encoder=False,  # text path only
                         use_random_weights=True)  # from_config: no checkpoint read (parameters on meta)


def export(job: ExportJob) -> Backend:
    """The LiteRT graphs and .litertlm bundle into job.folder; their manifest entry."""
    info = export_litert(job.target_folder, job.drafter, job.target, job.folder, prefill_len=job.cfg.prefill_len,
                         cache_len=job.cfg.max_cache_len, max_draft=job.max_draft,
                         bundled={job.cfg.quant, job.cfg.drafter_quant} == {"fp32"})
    return manifest_entry(job.folder, info)


def check(manifest, job: ExportJob, ids: list[int]) -> list:
    """The float graphs against PyTorch, driven by mtpkit's LiteRT runtime (export/verify.py check_runtime)."""
    from ..verify import check_runtime

    return check_runtime(manifest, "litert", job.target, job.drafter, ids)


def manifest_entry(folder: Path, info: dict) -> Backend:
    """Map export_litert's description onto the manifest: every signature by role, static lengths, masks."""
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
    for entry in names.get("draft_windows", []):
        where[entry["signature"]] = ("drafter", entry["signature"])
    sigs = {}
    for key, (graph, name) in where.items():
        d = files[graph]["signatures"][name]
        sigs[key] = Signature(graph, [TensorSpec(**t) for t in d["inputs"]], [TensorSpec(**t) for t in d["outputs"]],
                              d.get("num_tokens"), name)
    options = LiteRtOptions(max_draft=info["max_draft"], mask=info["mask"], kv_cache=info["kv_cache"],
                            drafter_visibility=info["drafter_visibility"], prefill=names["prefill"],
                            draft_windows=names.get("draft_windows"),
                            bundle={"file": bundle, "sections": info["bundle"].get("sections")})
    return Backend("litert", "state", graphs, sigs, options)


def quantize(folder: Path, backend: Backend, recipes: dict[str, str], block_size: int = 32,
             accuracy_level: int = 4, ple_bits: int = 8, plans: dict | None = None) -> Backend:
    """Quantized weights re-grafted into the float .tflite files, the bundle rebuilt (litert_quant.py)."""
    from .litert_quant import quantize as quantize_litert

    return quantize_litert(folder, backend, recipes, block_size, accuracy_level, ple_bits, plans)


def export_litert(target_dir: Path, drafter_model, target_model, out_dir: Path, *, prefill_len: int,
                  cache_len: int, max_draft: int, bundled: bool = True) -> dict:
    """Write target.tflite, embedder.tflite, per_layer_embedder.tflite, drafter.tflite and model.litertlm.

    Args:
        target_dir: the target's HF checkpoint folder (gemma4 or gemma4_text layout) with tokenizer files.
        drafter_model: the loaded Gemma4AssistantForCausalLM (fp32; restored unchanged afterwards).
        target_model: the loaded Gemma4ForCausalLM (its config gives KV owners and store layers).
        out_dir: an existing folder; only files inside it are written, temporaries are removed.
        bundled: put the float graphs into model.litertlm; False leaves it holding the weightless graphs for
            quantize() to fill with the quantized ones, so the float model is never written twice.
    Returns:
        the description of every file and signature (see describe()); the pipeline's PhaseLog records this
        phase's time and peak RSS (export/phases.py).
    """
    target_dir, out_dir = Path(target_dir), Path(out_dir)
    scratch = Path(tempfile.mkdtemp(prefix=".litert-", dir=out_dir))
    try:
        with output_captured("litert-torch"), litert_workarounds(), _in_fixed_order():
            export_drafter(drafter_model, target_model.config, out_dir / "drafter.tflite", cache_len, scratch)
            checkpoint = gemma4_layout_checkpoint(target_dir, scratch / "checkpoint")
            work = scratch / "export_hf"
            export_target(checkpoint, target_dir, work, out_dir / "drafter.tflite", prefill_len=prefill_len,
                          cache_len=cache_len, max_draft=max_draft)
        for src, dst in (("model.tflite", "target.tflite"), ("embedder.tflite", "embedder.tflite"),
                         ("per_layer_embedder.tflite", "per_layer_embedder.tflite"),
                         ("model.litertlm", "model.litertlm")):
            shutil.move(str(work / src), str(out_dir / dst))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if bundled:
        from .litert_quant import BUNDLE_SECTIONS, rebuild_bundle

        rebuild_bundle(out_dir / "model.litertlm", {section: out_dir / f"{name}.tflite"
                                                    for name, section in BUNDLE_SECTIONS.items()})
    info = describe(out_dir, target_model.config, prefill_len=prefill_len, cache_len=cache_len,
                    max_draft=max_draft)
    return info
