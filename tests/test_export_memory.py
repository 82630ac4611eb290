"""The export's memory preflight (export/preflight.py) and its per-phase time / peak RSS (export/phases.py)."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from types import SimpleNamespace

import pytest

from mtpkit import cli
from mtpkit.errors import MemoryBudgetError
from mtpkit.export import preflight
from mtpkit.export.checkpoint import resolve
from mtpkit.export.config import ExportConfig
from mtpkit.export.phases import PhaseLog

E2B = "e2b_gemma4_centroid"  # `mtpkit make-tiny --shape e2b`: E2B's structure at hidden 64, vocab 512


def _sources(tiny_checkpoints, name=E2B):
    target, drafter = tiny_checkpoints(name)
    return resolve(str(target), "target"), resolve(str(drafter), "drafter")


def _cfg(tmp_path, tiny_checkpoints, **options) -> ExportConfig:
    target, drafter = tiny_checkpoints(E2B)
    return ExportConfig(target=str(target), drafter=str(drafter), out=tmp_path / "out", **options)


def _no_weights(monkeypatch):
    """Any weight read fails the test: the preflight must decide from config.json and headers alone."""
    import safetensors

    def refuse(*args, **kwargs):
        raise AssertionError("weights were read before the preflight decided")

    monkeypatch.setattr(safetensors, "safe_open", refuse)


def test_too_small_a_budget_is_refused_in_one_line_before_loading(tmp_path, tiny_checkpoints, capsys, monkeypatch):
    target, drafter = tiny_checkpoints(E2B)
    out = tmp_path / "out"
    _no_weights(monkeypatch)
    rc = cli.main(["-q", "export", str(target), "--drafter", str(drafter), "--out", str(out), "--memory-budget",
                   "0.05", "--backend", "onnx"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0].startswith("mtpkit export: error: this export needs an estimated "), lines[0]
    assert "more than the 51 MB available (--memory-budget)" in lines[0] and "Traceback" not in lines[0]
    assert list(tmp_path.iterdir()) == []  # no --out, no lock, no partial folder


def test_memavailable_is_the_default_budget(tmp_path, tiny_checkpoints, monkeypatch):
    monkeypatch.setattr(preflight, "available_bytes", lambda: 64 << 20)
    with pytest.raises(MemoryBudgetError, match=r"more than the 64 MB available \(MemAvailable\)"):
        preflight.check(_cfg(tmp_path, tiny_checkpoints), *_sources(tiny_checkpoints))
    monkeypatch.setattr(preflight, "available_bytes", lambda: None)  # no /proc/meminfo: estimate, never refuse
    assert preflight.check(_cfg(tmp_path, tiny_checkpoints), *_sources(tiny_checkpoints)).budget_source == "unknown"


def test_a_large_budget_passes_and_the_export_goes_on_to_load(tmp_path, tiny_checkpoints, monkeypatch):
    from mtpkit.export import pipeline
    from mtpkit.export.models import gemma4_text

    estimate = preflight.check(_cfg(tmp_path, tiny_checkpoints, memory_budget=1000), *_sources(tiny_checkpoints))
    assert estimate.budget == 1000 << 30 and estimate.budget_source == "--memory-budget"
    assert 0 < estimate.peak_bytes < estimate.budget and estimate.as_dict()["estimated_peak_mb"] > 0

    class Loading(Exception):
        pass

    def load(source, dtype):
        assert dtype == "fp32"  # auto: fp32 fits the budget
        raise Loading  # stop where the weights would load; nothing may be left behind
    monkeypatch.setattr(gemma4_text, "load", load)
    with pytest.raises(Loading):
        pipeline.export_model(_cfg(tmp_path, tiny_checkpoints, memory_budget=1000))
    assert [p.name for p in tmp_path.iterdir()] == []


def test_header_counts_equal_the_loaded_models(tiny_checkpoints):
    from mtpkit.export.models import drafter_adapter, target_adapter

    target, drafter = _sources(tiny_checkpoints)
    w = preflight.read_weights(target, drafter)
    loaded_t, loaded_d = target_adapter(target).load(target), drafter_adapter(drafter).load(drafter)
    count = lambda model: sum(t.numel() for t in model.state_dict().values())  # noqa: E731
    assert w.target == count(loaded_t) - loaded_t.lm_head.weight.numel()  # tied: stored once
    assert w.drafter == count(loaded_d) - loaded_d.lm_head.weight.numel()
    assert w.ple == loaded_t.model.embed_tokens_per_layer.weight.numel() and w.converted < w.fp32
    widths = [m.in_features for name, m in loaded_t.named_modules() if name.endswith(("gate_proj", "up_proj"))]
    assert widths and w.moments == sum(4 * k * k for k in widths)  # int4's calibration moments (INT4_COMPENSATE)


def _weights(scale: int = 1, stored_bf16: bool = False) -> preflight.Weights:
    """E2B's published parameter counts (docs: text target 4628.6 M, PLE 2348.8 M; drafter 77.7 M) / scale."""
    target, drafter = 4_628_600_000 // scale, 77_730_000 // scale
    return preflight.Weights(target=target, drafter=drafter, ple=2_348_800_000 // scale,
                             converted=2 * (target + drafter) if stored_bf16 else 0,
                             stored="bf16" if stored_bf16 else "fp32")


def _plan(backend=("onnx",), quant="fp32", ple_quant="int8", check=True):
    """What phases() reads of an ExportConfig, without the extras a LiteRT ExportConfig requires."""
    from mtpkit.export.recipes import recipe

    return SimpleNamespace(backend=backend, quant=quant, drafter_quant=quant, ple_quant=ple_quant, check=check,
                           block_size=32, recipes={"target": recipe(quant), "drafter": recipe(quant)},
                           quantized=recipe(quant).quantized)


def test_int4_counts_its_calibration_moments_in_the_quantize_phase(tmp_path, tiny_checkpoints):
    target, drafter = _sources(tiny_checkpoints)
    w = preflight.read_weights(target, drafter)
    rtn, int4 = (preflight.anonymous(_cfg(tmp_path, tiny_checkpoints, quant=q), w) for q in ("int4-rtn", "int4"))
    assert w.moments > 0 and int4["quantize"] - rtn["quantize"] == w.moments
    assert preflight.phases(_cfg(tmp_path, tiny_checkpoints, quant="int4"), w)["quantize"] - \
        preflight.phases(_cfg(tmp_path, tiny_checkpoints, quant="int4-rtn"), w)["quantize"] == w.moments


def test_estimate_grows_with_parameters():
    small, large = preflight.phases(_plan(), _weights(64)), preflight.phases(_plan(), _weights(1))
    assert all(large[k] > small[k] for k in small)
    assert max(large.values()) > 20 << 30  # E2B in fp32 does not fit this machine's 24 GB (see docs/export-memory.md)
    bf16 = preflight.phases(_plan(), _weights(1, stored_bf16=True))
    assert bf16["load"] > large["load"] and bf16["onnx graphs"] == large["onnx graphs"]
    held = preflight.phases(_plan(), _weights(1, stored_bf16=True), "bf16")  # --dtype bf16: no fp32 copy held
    assert all(held[k] < bf16[k] for k in held) and held["load"] < large["load"]


def test_auto_dtype_holds_fp32_when_it_fits_else_the_stored_dtype():
    w, cfg = _weights(1, stored_bf16=True), SimpleNamespace(**vars(_plan()), dtype="auto")
    fp32_peak = max(preflight.phases(cfg, w, "fp32").values())
    assert preflight.held_dtype(cfg, w, fp32_peak) == "fp32" and preflight.held_dtype(cfg, w, None) == "fp32"
    assert preflight.held_dtype(cfg, w, fp32_peak - 1) == "bf16"
    assert preflight.held_dtype(SimpleNamespace(**vars(_plan()), dtype="fp16"), w, None) == "fp16"  # asked: kept
    fp32_file = _weights(1)
    assert preflight.held_dtype(cfg, fp32_file, 1) == "fp32"  # never a lossy rounding the user did not ask for


def test_estimate_shrinks_with_smaller_recipes_and_backends():
    w = _weights(64)
    quantize = [preflight.phases(_plan(quant=q), w)["quantize"] for q in ("fp16", "int8", "int4")]
    assert quantize[0] > quantize[1] > quantize[2]
    assert preflight.phases(_plan(quant="int4", ple_quant="int4"), w)["quantize"] < quantize[2]
    # quantized graphs are derived from the float export, so no recipe lowers the peak below fp32's
    for backend in (("onnx",), ("onnx", "litert")):
        peaks = [max(preflight.phases(_plan(backend, q), w).values()) for q in ("fp32", "fp16", "int8", "int4")]
        assert peaks[1:] == sorted(peaks[1:], reverse=True) and peaks[-1] >= peaks[0]
    assert max(preflight.phases(_plan(("onnx", "litert")), w).values()) > max(preflight.phases(_plan(), w).values())
    assert "check" not in preflight.phases(_plan(check=False), w)


def _has_litert() -> bool:
    import importlib.util

    return importlib.util.find_spec("litert_torch") is not None


def test_refusal_names_the_options_that_fit(tmp_path, tiny_checkpoints):
    if not _has_litert():
        pytest.skip("needs the [litert] extra to build a LiteRT config")
    w = _weights(64)
    cfg = _cfg(tmp_path, tiny_checkpoints, backend="onnx,litert", quant="int4")
    onnx_only = max(preflight.phases(dataclasses.replace(cfg, backend=("onnx",)), w).values())
    both = max(preflight.phases(cfg, w).values())
    estimate = preflight.Estimate(preflight.phases(cfg, w), (onnx_only + both) // 2, "--memory-budget")
    message = preflight._refusal(cfg, w, estimate)
    assert "options that fit: --backend onnx (" in message and "\n" not in message
    nothing = preflight.Estimate(estimate.phases, 1 << 20, "MemAvailable")
    assert "no --backend / --quant / --dtype choice fits" in preflight._refusal(cfg, w, nothing)


def test_phase_log_times_and_measures_each_phase(caplog):
    phases = PhaseLog(total=5, phases=[{"phase": "load", "seconds": 1.0, "peak_rss_mb": 1.0}])
    with caplog.at_level(logging.INFO, logger="mtpkit"):
        with phases.phase("onnx graphs", "exporting onnx graphs"):
            block = bytearray(64 << 20)
            block[::4096] = b"\x01" * len(block[::4096])  # touch every page
            del block
    line = next(r.getMessage() for r in caplog.records if "onnx graphs:" in r.getMessage())
    assert line.startswith("  [2/5] onnx graphs: ") and ", peak RSS " in line
    assert "[2/5] exporting onnx graphs" in caplog.messages  # numbered by the log's own counter
    _, entry = phases.as_dict()["phases"]
    assert entry["phase"] == "onnx graphs" and entry["seconds"] > 0 and entry["peak_rss_mb"] >= 64
    assert entry["peak_anon_mb"] >= 64 and ", peak RSS " in line and " anonymous)" in line


def test_phase_log_keeps_mapped_file_pages_out_of_the_anonymous_peak(tmp_path):
    """A memory-mapped file read end to end is resident (RSS) but reclaimable: not anonymous memory."""
    import mmap

    path = tmp_path / "weights.bin"
    path.write_bytes(b"\x01" * (96 << 20))
    phases = PhaseLog()
    with phases.phase("check", "checking"), path.open("rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        assert sum(mapped[i] for i in range(0, len(mapped), 4096)) == len(mapped) // 4096  # touch every page
        mapped.close()
    (entry,) = phases.as_dict()["phases"]
    assert entry["peak_rss_mb"] - entry["peak_anon_mb"] >= 90


def test_manifest_records_phase_stats_and_the_preflight(tiny_exports):
    from mtpkit.runtime.manifest import load_manifest

    folder = tiny_exports(E2B)
    stats = json.loads((folder / "manifest.json").read_text())["measured"]
    assert load_manifest(folder).measured == stats  # the schema and the dataclass accept it
    names = [p["phase"] for p in stats["phases"]]
    assert names == ["load", "onnx graphs", "reference", "check", "acceptance"]
    assert all(p["seconds"] > 0 and p["peak_rss_mb"] > 0 for p in stats["phases"])
    assert stats["peak_rss_mb"] == max(p["peak_rss_mb"] for p in stats["phases"]) and stats["seconds"] > 0
    assert stats["preflight"]["estimated_peak_mb"] > 0 and stats["preflight"]["budget_source"] == "MemAvailable"


def test_session_phases_do_not_count_the_mapped_ple_table():
    """ONNX Runtime maps a Gather-only table instead of copying it (E2B's acceptance phase: 14.4 GB measured)."""
    from dataclasses import replace

    w = _weights(1, stored_bf16=True)
    mapped, copied = preflight.phases(_plan(), w, "bf16"), preflight.phases(_plan(), replace(w, ple=0), "bf16")
    assert mapped["check"] < copied["check"] and mapped["acceptance"] < copied["acceptance"]
    assert mapped["onnx graphs"] == copied["onnx graphs"]  # the export itself still writes the table


def test_export_sessions_skip_prepacking_only_when_asked_and_compute_the_same(tiny_exports):
    """Export's one-off float sessions keep MatMul weights mapped (an fp32 E4B's packed copy is ~18.6 GB); the
    runtime's own sessions (default LoadOptions) still prepack, and both give the same verify outputs."""
    import numpy as np

    from mtpkit.export.backends.onnx.bench import _feeds
    from mtpkit.runtime.backends import LoadOptions
    from mtpkit.runtime.backends.onnx import OrtSession, session_options
    from mtpkit.runtime.manifest import load_manifest

    manifest = load_manifest(tiny_exports(E2B))
    backend = manifest.backend("onnx")

    def entry(opts):
        try:
            return opts.get_session_config_entry("session.disable_prepacking")
        except RuntimeError:  # not set
            return None

    unpacked = OrtSession.open(manifest, backend, 1, LoadOptions(pack_weights=False))
    assert entry(session_options(LoadOptions(pack_weights=False))) == "1"
    packed = OrtSession.open(manifest, backend, 1)
    assert all(entry(s.get_session_options()) == "1" for s in unpacked._sessions.values())
    assert not any(entry(s.get_session_options()) == "1" for s in packed._sessions.values())
    assert entry(session_options()) != "1"
    feeds = _feeds(manifest, "verify", 40, 5)
    got, want = unpacked.run("verify", feeds), packed.run("verify", feeds)
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-5)


def test_acceptance_of_quantized_graphs_grows_with_their_weights_not_fp32s():
    """The acceptance phase runs the final graphs: int4 ones hold ~1/6 of fp32's bytes (E2B measured 8.9 GB)."""
    w = _weights(1, stored_bf16=True)
    fp32, int4 = preflight.phases(_plan(), w, "bf16"), preflight.phases(_plan(quant="int4"), w, "bf16")
    held = preflight.memory("onnx").base + w.held("bf16")
    assert int4["acceptance"] - held < (fp32["acceptance"] - held) / 3
    assert int4["acceptance"] - held >= preflight.final_bytes(_plan(quant="int4"), w)
    assert preflight.final_bytes(_plan(quant="int4"), w) < preflight.quantized_bytes(_plan(quant="int4"), w)


def test_budget_holds_against_anonymous_memory_and_mapped_pages_only_log(tmp_path, tiny_checkpoints, caplog):
    """An E2B-shaped int4 ONNX export held in bf16 keeps the checkpoint and the float graphs' data mapped: the
    kernel may drop those pages, so they count in the resident estimate but not against the budget."""
    w, plan = _weights(1, stored_bf16=True), _plan(quant="int4")
    rss, anon = preflight.phases(plan, w, "bf16"), preflight.anonymous(plan, w, "bf16")
    assert rss.keys() == anon.keys() and all(anon[k] <= rss[k] for k in rss)
    measured_mb = {"load": 583, "onnx graphs": 918, "reference": 2935, "check": 4084, "quantize": 6398,
                   "acceptance": 4139}  # the full-size E2B, 2026-12-02 (docs/export-memory.md)
    assert all(measured_mb[k] <= anon[k] / 2**20 <= 1.3 * measured_mb[k] for k in measured_mb), anon
    assert max(rss.values()) > 20 << 30  # resident with its mapped files it would have been refused on 24 GB
    held = preflight.anonymous(plan, w, "fp32")  # converted to fp32: the held copy is anonymous
    assert held["reference"] - anon["reference"] >= 2 * w.target
    litert = _plan(("onnx", "litert"), quant="int4")
    assert preflight.anonymous(litert, w, "bf16") == preflight.phases(litert, w, "bf16")  # no mapping measured
    whole = _plan(quant="fp16")  # fp16 loads the float graph whole: no credit
    assert preflight.anonymous(whole, w, "bf16") == preflight.phases(whole, w, "bf16")


def test_an_export_whose_mapped_pages_exceed_the_budget_runs_and_says_so(tmp_path, tiny_checkpoints, caplog,
                                                                          monkeypatch):
    cfg = _cfg(tmp_path, tiny_checkpoints, quant="int4")  # an fp32 export's acceptance prepacks: no mapped credit
    w = preflight.read_weights(*_sources(tiny_checkpoints))
    rss, anon = preflight.phases(cfg, w), preflight.anonymous(cfg, w)
    budget = (max(rss.values()) + max(anon.values())) // 2
    assert max(anon.values()) < budget < max(rss.values())
    monkeypatch.setattr(preflight, "available_bytes", lambda: budget)
    with caplog.at_level(logging.INFO, logger="mtpkit"):
        estimate = preflight.check(cfg, *_sources(tiny_checkpoints))
    assert estimate.anon_bytes == max(anon.values()) and estimate.peak_bytes == max(rss.values())
    assert any("memory-mapped file pages" in r.getMessage() for r in caplog.records)
    assert estimate.as_dict()["estimated_anon_peak_mb"] < estimate.as_dict()["estimated_peak_mb"]
    monkeypatch.setattr(preflight, "available_bytes", lambda: max(anon.values()) - 1)
    with pytest.raises(MemoryBudgetError, match=r"resident with mapped files\), more than"):
        preflight.check(cfg, *_sources(tiny_checkpoints))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_PAGEOUT and /proc are Linux's")
def test_page_out_drops_a_mapped_file_from_the_resident_set_and_keeps_its_data(tmp_path):
    """The full-size check pages the checkpoint out before the graphs are read (export/mapped.py): the file's
    pages leave VmRSS, a private copy written into the mapping survives, and the data reads back intact."""
    import numpy as np

    from mtpkit.export.mapped import page_out

    def file_kb() -> int:
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("RssFile"))

    data = np.random.default_rng(0).integers(0, 255, 64 << 20, dtype=np.uint8)
    data.tofile(tmp_path / "w.safetensors")
    mapped = np.memmap(tmp_path / "w.safetensors", mode="c")  # private and writable, as safetensors maps
    total = int(mapped.sum())
    mapped[0] = data[0] ^ 1
    before = file_kb()
    if page_out(".safetensors") == 0:
        pytest.skip("this kernel has no MADV_PAGEOUT")
    assert before - file_kb() > 48 << 10  # most of the 64 MiB left the resident set
    assert mapped[0] == data[0] ^ 1 and int(mapped[1:].sum()) == total - int(data[0])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RssAnon is Linux's")
def test_trim_heap_returns_what_a_phase_freed():
    """A phase's small freed allocations stay in glibc's heap (anonymous memory the next phase would stand on)
    until trim_heap(), which PhaseLog runs when each phase ends."""
    import numpy as np

    from mtpkit.export.phases import trim_heap

    def anon_kb() -> int:
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("RssAnon"))

    blocks = [np.ones(1000) for _ in range(40000)]  # 8 KB each: from the heap, not separate mappings
    kept = blocks[::50]  # fragments the heap, so it cannot simply shrink from the top
    del blocks
    before = anon_kb()
    trim_heap()
    assert before - anon_kb() > 150 << 10  # most of the 320 MB freed
    assert len(kept) == 800


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmRSS and MADV_PAGEOUT are Linux's")
def test_a_phase_holds_its_resident_set_near_the_cap_by_handing_back_mapped_pages(tmp_path):
    """PhaseLog(resident_cap): reading a mapped graph file past the cap hands its pages back while the phase runs
    (the full-size float check reads a 16 GB float decoder), the data reads back intact, and the phase records it."""
    import numpy as np

    from mtpkit.export.phases import PhaseLog, _status_kb

    data = np.random.default_rng(1).integers(0, 255, 96 << 20, dtype=np.uint8)
    data.tofile(tmp_path / "g.tflite")
    cap = (_status_kb("VmRSS") << 10) + (32 << 20)  # 32 MiB above what the process holds now
    log = PhaseLog(resident_cap=cap)
    with log.phase("capped", "reading a mapped file"):
        mapped = np.memmap(tmp_path / "g.tflite", mode="r")
        total = 0
        for start in range(0, len(mapped), 4 << 20):  # read slowly enough for the 20 ms sampler to see it
            total += int(mapped[start:start + (4 << 20)].sum())
            time.sleep(0.03)
    entry = log.phases[-1]
    if not entry.get("paged_out"):
        pytest.skip("this kernel has no MADV_PAGEOUT")
    assert total == int(data.sum())
    assert entry["peak_rss_mb"] * (1 << 20) < cap + (48 << 20)  # 96 MiB read, the resident set stayed near the cap


def test_a_pre_quantized_targets_dequantized_weights_and_codes_count_as_anonymous():
    """Held as stored, a float checkpoint's weights stay mapped; a pre-quantized one's are dequantized copies, and
    its codes stay beside them: both count in every phase's anonymous peak, and nothing more while loading."""
    plain = _weights(1, stored_bf16=True)
    packed = dataclasses.replace(plain, packed=2 << 30)
    assert packed.anonymous_held("bf16") == packed.held("bf16") + (2 << 30) and plain.anonymous_held("bf16") == 0
    assert packed.load_extra("bf16") == packed.load_extra("fp32") == 0
    resident = (preflight.phases(_plan(), w, "bf16") for w in (plain, packed))
    assert all(b - a == 2 << 30 for a, b in zip(*(r.values() for r in resident)))
