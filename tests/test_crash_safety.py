"""Crash safety of `mtpkit export`: a run killed at any stage leaves no output or the previous complete one, a rerun
succeeds and removes what the killed run left, two exports into one folder cannot interleave, and a full disk is
one clear line with nothing left behind."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mtpkit import cli
from mtpkit.errors import OutputBusyError
from mtpkit.export import outdir
from mtpkit.runtime.manifest import Manifest, load_manifest

pytestmark = pytest.mark.slow

PAIR = "e2b_gemma4_centroid"
FLAGS = ["--max-cache-len", "64", "--reference-tokens", "4"]


def _start(target, drafter, out: Path, *extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mtpkit", "export", str(target), "--drafter", str(drafter),
                             "--out", str(out), *FLAGS, *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for(proc: subprocess.Popen, marker: str, timeout: float = 300) -> str:
    """Read proc's log until a line contains `marker` (the pipeline's stage lines); returns the log so far."""
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    log = []
    try:
        for line in proc.stderr:
            log.append(line)
            if marker in line:
                return "".join(log)
    finally:
        watchdog.cancel()
    raise AssertionError(f"export ended before {marker!r}:\n{''.join(log)}")


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)  # no cleanup code runs: the worst case for what is left on disk
    proc.wait()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def test_a_second_export_into_the_same_folder_is_refused_and_a_killed_one_leaves_no_output(
        tmp_path, tiny_checkpoints, capsys):
    target, drafter = tiny_checkpoints(PAIR)
    out = tmp_path / "out"
    proc = _start(target, drafter, out)
    try:
        _wait_for(proc, "[1/6]")  # the lock is taken before the first stage
        capsys.readouterr()
        rc = cli.main(["-q", "export", str(target), "--drafter", str(drafter), "--out", str(out), *FLAGS])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1, err
        assert f"{out} is being written by another mtpkit export (pid {proc.pid} on" in err
    finally:
        _kill(proc)
    assert not out.exists()
    assert any(name.startswith(".out.partial-") for name in _leftovers(out))  # what SIGKILL leaves; cleaned below


def test_a_killed_export_keeps_the_previous_one_and_a_rerun_cleans_up(tmp_path, tiny_checkpoints, tiny_exports,
                                                                     monkeypatch):
    """The rerun also writes manifest.json once: the stages pass it along in memory."""
    from mtpkit.export.config import ExportConfig
    from mtpkit.export.pipeline import export_model

    target, drafter = tiny_checkpoints(PAIR)
    out = tmp_path / "out"
    shutil.copytree(tiny_exports(PAIR), out)  # the previous, complete export
    previous = (out / "manifest.json").read_bytes()
    proc = _start(target, drafter, out, "--force")
    try:
        _wait_for(proc, "[3/6]")  # graphs written to the partial folder, reference being recorded
    finally:
        _kill(proc)
    assert (out / "manifest.json").read_bytes() == previous
    load_manifest(out)  # still complete: every file matches its sha256
    assert any(name.startswith(".out.partial-") for name in _leftovers(out))

    saved = []
    save = Manifest.save
    monkeypatch.setattr(Manifest, "save", lambda self, folder: saved.append(Path(folder)) or save(self, folder))
    export_model(ExportConfig(target=str(target), drafter=str(drafter), out=out, force=True, max_cache_len=64,
                              reference_tokens=4))
    assert len(saved) == 1 and saved[0].name.startswith(".out.partial-")  # once, at the end, before the rename
    assert load_manifest(out).kv_cache.capacity == 64  # the new export replaced the old one
    assert _leftovers(out) == []  # the killed run's partial folder and the lock file are gone


def test_a_terminated_export_removes_its_partial_folder_and_lock(tmp_path, tiny_checkpoints):
    target, drafter = tiny_checkpoints(PAIR)
    out = tmp_path / "out"
    proc = _start(target, drafter, out)
    try:
        _wait_for(proc, "[3/6]")  # graphs written to the partial folder, reference being recorded
        proc.send_signal(signal.SIGTERM)  # what `kill`, systemd and container runtimes send first
        err = proc.communicate(timeout=120)[1]
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and err.strip().endswith("mtpkit: terminated"), err
    assert not out.exists() and _leftovers(out) == []


def test_a_kill_between_the_two_renames_of_a_replacement_restores_the_previous_export(tmp_path):
    out = tmp_path / "out"
    old = tmp_path / ".out.old-1700000000"  # what _replace leaves if killed after out -> old, before tmp -> out
    old.mkdir()
    (old / "manifest.json").write_text("{}")
    (tmp_path / ".out.partial-abcd1234").mkdir()
    (tmp_path / ".outer.partial-abcd1234").mkdir()  # another folder's: not ours to touch
    outdir.claim(out, force=True).release()
    assert (out / "manifest.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".outer.partial-abcd1234", "out"]


def test_the_lock_is_released_when_the_export_fails_and_names_its_holder(tmp_path):
    out = tmp_path / "out"
    lock = outdir.OutputLock(out).acquire()
    with pytest.raises(OutputBusyError, match=rf"pid {os.getpid()} on .*choose another --out"):
        outdir.claim(out, force=False)
    lock.release()
    assert _leftovers(out) == []
    outdir.claim(out, force=False).release()  # free again


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, tiny_checkpoints, monkeypatch, capsys):
    from mtpkit.export.backends import onnx

    def fill_the_disk(job):
        (job.folder / "target.onnx").write_bytes(b"\0" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device", str(job.folder / "target.onnx"))

    monkeypatch.setattr(onnx, "export", fill_the_disk)
    target, drafter = tiny_checkpoints(PAIR)
    out = tmp_path / "out"
    capsys.readouterr()
    rc = cli.main(["-q", "export", str(target), "--drafter", str(drafter), "--out", str(out), *FLAGS])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"no space left on device while writing {out}" in err and "partial export was removed" in err
    assert not out.exists() and _leftovers(out) == []
