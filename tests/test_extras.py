"""Optional extras: a missing one is named in one line, and the runtime-only install check matches the README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mtpkit import cli, extras

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def without(monkeypatch):
    """without(*modules): make find_spec report these top-level modules as not installed."""
    real = extras.importlib.util.find_spec

    def hide(*modules):
        monkeypatch.setattr(extras.importlib.util, "find_spec",
                            lambda name, *a: None if name in modules else real(name, *a))
    return hide


@pytest.mark.parametrize("argv, extra", [
    (["export", "a", "--drafter", "b", "--out", "c"], "export"),
    (["make-tiny", "x"], "export"),
    (["demo", "x"], "export"),
    (["train-tiny", "--out", "x"], "export"),
])
def test_commands_needing_an_extra_name_it(without, capsys, argv, extra):
    without("torch")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"[{extra}] extra" in err and "torch not installed" in err, err


def test_litert_export_without_the_litert_extra_is_refused_before_loading(without, tmp_path):
    from mtpkit.export.config import ExportConfig

    without("ai_edge_litert")
    with pytest.raises(extras.MissingExtraError, match=r"\[litert\] extra \(ai_edge_litert not installed\)"):
        ExportConfig(target="t", drafter="d", out=tmp_path / "out", backend="onnx,litert")


def test_every_subcommand_help_works_without_extras(without, capsys):
    without("torch", "transformers", "ai_edge_litert", "litert_torch")
    for name in cli.COMMANDS:
        with pytest.raises(SystemExit) as e:
            cli.main([name, "--help"])
        assert e.value.code == 0
        assert "usage: mtpkit " + name in capsys.readouterr().out


def test_readme_runtime_only_line_is_what_ci_runs():
    script = (ROOT / ".ci" / "runtime-only").read_text().splitlines()
    command = script[script.index("# README: runtime-only install") + 1]
    assert f"`{command}`" in (ROOT / "README.md").read_text()
    assert ".ci/runtime-only" in (ROOT / ".ci" / "run").read_text()
    assert re.search(r"pip install .*\.$", command) and "[" not in command  # no extras
