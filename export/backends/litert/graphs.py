"""The LiteRT target graphs via litert-torch's export_hf (weightless, the checkpoint's weights grafted in), the
drafter's graph (drafter.py) and the .litertlm bundle holding them; their manifest entry."""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from pathlib import Path

from mtpkit.runtime.manifest import Backend, GraphFile, LiteRtOptions, Signature, TensorSpec, sha256_file

from ...scoped import gemma4_layer_types_in_order, insertion_ordered_sets, output_captured, patched
from .. import ExportJob
from . import graft, tables
from .describe import describe
from .drafter import export_drafter
from .patches import import_export_hf, litert_workarounds
from .sources import LatticeSource, SafetensorsSource, checkpoint_resolver

log = logging.getLogger("mtpkit")


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
def _grafted_after_packaging(weights: graft.WeightInputs, source):
    """export_hf writes weightless graphs (WeightInputs) and bundles them as they are (a bundle of a few MB);
    then the checkpoint's weights are grafted into each graph in its work folder. The bundle gets the final
    graphs' bytes once they exist (bundle.rebuild_bundle), so no float copy of the model is bundled."""
    from litert_torch.generative.export_hf.core import litert_lm_builder

    real = litert_lm_builder.package_model

    def package_model(source_artifacts, export_config, exported):
        packaged = real(source_artifacts, export_config, exported)
        work = Path(export_config.work_dir)
        for name in ("embedder.tflite", "model.tflite", "per_layer_embedder.tflite"):
            if (work / name).is_file():
                graft.graft(work / name, work / name, source, graft.unquantized, names=weights.names)
        return packaged

    with patched(litert_lm_builder, "package_model", package_model):
        yield


@contextlib.contextmanager
def _static_rounding(lattice):
    """export_hf builds its own model from the config: the linear layers with static activation scales round their
    input and output as the loaded model's do (export/lattice/srq.py), applied to each module it converts."""
    from litert_torch._convert import interface

    from ...lattice import srq

    real, rounded = interface.Converter.add_signature, []

    def add_signature(converter, name, module, *args, **kwargs):
        rounded.append(srq.apply(module, lattice))
        return real(converter, name, module, *args, **kwargs)

    with patched(interface.Converter, "add_signature", add_signature):
        yield
    if not any(rounded):  # the graphs would silently compute another model than the checkpoint's
        raise RuntimeError("the checkpoint's static activation scales reached no linear layer litert-torch converted")


def export_target(checkpoint: Path, weights_dir: Path, work: Path, drafter_path: Path, *, prefill_len: int,
                  cache_len: int, max_draft: int, lattice=None) -> None:
    """export_hf (float, external embedder, verify T=max_draft+1) into `work`, bundling the drafter.

    The model is built on the meta device and every weight is a signature input while converting; the weights
    are streamed from `weights_dir`'s safetensors into the finished graphs (graft.py), so the model is
    never held in memory.
    """
    from litert_torch.generative.export_hf.core import weights_loader

    from ...lattice import srq

    hf = import_export_hf()
    source = SafetensorsSource(weights_dir)
    if lattice is not None:  # a pre-quantized checkpoint: its packed tensors read as the lattice's values
        source = LatticeSource(source, lattice)
    resolve = checkpoint_resolver(source.where)
    source.resolve = resolve

    def kept(name: str) -> bool:  # persistent buffers carry checkpoint values; computed ones stay constants
        try:
            return bool(resolve(name))
        except KeyError:
            return False

    weights = graft.WeightInputs(buffer_kept=kept)
    rounding = _static_rounding(lattice) if lattice is not None and srq.rounds(lattice) else contextlib.nullcontext()
    packed = tables.packed_tables(lattice) if lattice is not None else contextlib.nullcontext()
    # rounding after weights.converting(): its add_signature then runs first and rounds the model's own linear
    # layers, before they are wrapped with their weights as inputs
    with _bundle_with_drafter(drafter_path), packed, weights.converting(), rounding, \
            _grafted_after_packaging(weights, source), weights_loader.init_params_on_meta():
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
                         bundled=not job.cfg.quantized,
                         target_adapter=job.target_adapter, drafter_adapter=job.drafter_adapter)
    return manifest_entry(job.folder, info)


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
                            bundle={"file": bundle, "sections": info["bundle"].get("sections"),
                                    "shared": info["bundle"].get("shared", {})})
    return Backend("litert", "state", graphs, sigs, options)


def export_litert(target_dir: Path, drafter_model, target_model, out_dir: Path, *, prefill_len: int,
                  cache_len: int, max_draft: int, bundled: bool = True, target_adapter, drafter_adapter) -> dict:
    """Write target.tflite, embedder.tflite, per_layer_embedder.tflite, drafter.tflite and model.litertlm.

    Args:
        target_dir: the target's HF checkpoint folder (gemma4 or gemma4_text layout) with tokenizer files.
        drafter_model: the loaded Gemma4AssistantForCausalLM (fp32; restored unchanged afterwards).
        target_model: the loaded Gemma4ForCausalLM (its config gives KV owners and store layers).
        out_dir: an existing folder; only files inside it are written, temporaries are removed.
        bundled: put the float graphs into model.litertlm; False leaves it holding the weightless graphs for
            quantize() to fill with the quantized ones, so the float model is never written twice.
        target_adapter, drafter_adapter: the export/models modules of the two checkpoints' families, through which
            the target's KV layout, its export_hf checkpoint and the drafter's step are read.
    Returns:
        the description of every file and signature (see describe()); the pipeline's PhaseLog records this
        phase's time and peak RSS (export/phases.py).
    """
    target_dir, out_dir = Path(target_dir), Path(out_dir)
    scratch = Path(tempfile.mkdtemp(prefix=".litert-", dir=out_dir))
    try:
        with output_captured("litert-torch"), litert_workarounds(), _in_fixed_order():
            export_drafter(drafter_model, target_model.config, out_dir / "drafter.tflite", cache_len, scratch,
                           target_adapter=target_adapter, drafter_adapter=drafter_adapter)
            checkpoint = target_adapter.export_hf_checkpoint(target_dir, scratch / "checkpoint")
            work = scratch / "export_hf"
            export_target(checkpoint, target_dir, work, out_dir / "drafter.tflite", prefill_len=prefill_len,
                          cache_len=cache_len, max_draft=max_draft, lattice=getattr(target_model, "lattice", None))
        for src, dst in (("model.tflite", "target.tflite"), ("embedder.tflite", "embedder.tflite"),
                         ("per_layer_embedder.tflite", "per_layer_embedder.tflite"),
                         ("model.litertlm", "model.litertlm")):
            shutil.move(str(work / src), str(out_dir / dst))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    shared = {}
    if bundled:
        from .bundle import BUNDLE_SECTIONS, rebuild_bundle

        shared = rebuild_bundle(out_dir / "model.litertlm", {section: out_dir / f"{name}.tflite"
                                                             for name, section in BUNDLE_SECTIONS.items()}).shared
    info = describe(out_dir, target_adapter, target_model.config, prefill_len=prefill_len, cache_len=cache_len,
                    max_draft=max_draft)
    info["bundle"]["shared"] = shared
    return info
