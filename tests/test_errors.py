"""One family for user-facing failures (mtpkit.errors.MtpkitError): the CLI prints those as one line with exit
code 2; anything else is a bug in mtpkit and keeps its traceback, with a line asking for a report."""

from __future__ import annotations

import numpy as np
import pytest

from mtpkit import cli, errors


def test_every_user_facing_error_class_is_in_the_family_and_keeps_its_old_base():
    from mtpkit.export.checkpoint import CheckpointError
    from mtpkit.export.fidelity import QualityGateError
    from mtpkit.export.verify import GraphParityError
    from mtpkit.extras import MissingExtraError
    from mtpkit.runtime.handoff import CacheFullError
    from mtpkit.runtime.manifest import ManifestError

    for cls, old in [(CheckpointError, ValueError), (ManifestError, ValueError), (errors.UsageError, ValueError),
                     (QualityGateError, ValueError), (CacheFullError, ValueError), (GraphParityError, RuntimeError),
                     (MissingExtraError, ImportError), (errors.DiskFullError, OSError),
                     (errors.OutputBusyError, Exception), (cli.CommandError, Exception)]:
        assert issubclass(cls, errors.MtpkitError) and issubclass(cls, old), cls


def test_an_internal_error_keeps_its_traceback_and_asks_for_a_report(monkeypatch, tmp_path, capsys):
    from mtpkit.runtime import commands

    def broken(args):  # what a bug looks like: a numpy error, not the user's input
        raise ValueError("operands could not be broadcast together with shapes (1,3) (4,)")

    monkeypatch.setattr(commands, "run", broken)
    rc = cli.main(["run", str(tmp_path), "--prompt", "hi"])
    err = capsys.readouterr().err
    assert rc == cli.BUG_EXIT == 70
    assert "Traceback (most recent call last)" in err and "ValueError: operands could not be broadcast" in err
    assert err.strip().splitlines()[-1].startswith("mtpkit run: internal error: this is a bug in mtpkit")
    assert "please report it with the traceback above" in err


@pytest.mark.parametrize("message", ["no space\nleft", ""])
def test_one_line_messages(message):
    line = cli.one_line(errors.UsageError(message))
    assert "\n" not in line and line


def test_train_tiny_into_the_shipped_pair_is_one_line_not_a_traceback(capsys):
    rc = cli.main(["train-tiny"])  # default --out is the shipped pair: refused without --force, before any work
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "already holds a trained pair; pass --force" in err, err


def test_a_graph_parity_failure_in_demo_is_one_line(monkeypatch, tmp_path, capsys):
    from mtpkit.export import pipeline
    from mtpkit.export.verify import GraphParityError

    def fails(cfg):
        raise GraphParityError("exported graphs do not match PyTorch (tolerance 0.0001): decode max|d| 1e-2")

    monkeypatch.setattr(pipeline, "export_model", fails)
    rc = cli.main(["-q", "demo", str(tmp_path / "out"), "--pair", "small"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "do not match PyTorch" in err and "Traceback" not in err, err


def test_validators_name_the_flag_and_echo_the_value():
    with pytest.raises(errors.UsageError, match=r"--threads must be >= 1 \(got 0\)"):
        errors.check_int("--threads", 0, 1)
    with pytest.raises(errors.UsageError, match=r"must be an integer >= 1 \(got 2.5\)"):
        errors.check_int("--threads", 2.5, 1)
    with pytest.raises(errors.UsageError, match=r"top_p must be in \(0, 1\] \(got nan\)"):
        errors.check_number("top_p", float("nan"), 0, 1, low_open=True)
    assert errors.check_int("k", np.int64(3), 1) == 3  # numpy integers are integers; bools are not
    with pytest.raises(errors.UsageError, match="must be an integer"):
        errors.check_int("k", True, 1)
