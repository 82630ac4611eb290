"""The draft-verify loop's signatures are checked: mypy (pinned in the [test] extra, configured in pyproject.toml)
rejects a call that pairs one backend's target with another's drafter, passes something that is not a Sampler, or
passes a drafter where a target goes. CI runs the same checker over the whole runtime (.ci/run)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# lines marked "# error" must be reported, every other line must not
SNIPPET = """\
from runtime.backends import litert, onnx
from runtime.sampling import Sampler, SamplingConfig
from runtime.speculative import DraftSchedule, plain_generate, speculative_generate


def calls(target: onnx.Target, drafter: onnx.Drafter, litert_target: litert.StateTarget,
          litert_drafter: litert.StateDrafter, sampler: Sampler) -> None:
    speculative_generate(target, drafter, [2], sampler, DraftSchedule(), 8, {1})
    speculative_generate(litert_target, litert_drafter, [2], sampler, DraftSchedule(), 8, {1})
    plain_generate(litert_target, [2], sampler, 8, {1})
    speculative_generate(target, litert_drafter, [2], sampler, DraftSchedule(), 8, {1})  # error
    speculative_generate(litert_target, drafter, [2], sampler, DraftSchedule(), 8, {1})  # error
    speculative_generate(target, drafter, [2], SamplingConfig(), DraftSchedule(), 8, {1})  # error
    speculative_generate(target, drafter, [2], sampler, 4, 8, {1})  # error
    plain_generate(drafter, [2], sampler, 8, {1})  # error
"""


def test_mypy_rejects_wrong_types_in_the_draft_verify_loop(tmp_path):
    snippet = tmp_path / "snippet.py"
    snippet.write_text(SNIPPET)
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                             str(snippet)], cwd=ROOT, capture_output=True, text=True)
    reported = {int(m) for m in re.findall(r"snippet\.py:(\d+): error:", result.stdout)}
    expected = {i for i, line in enumerate(SNIPPET.splitlines(), 1) if line.endswith("# error")}
    assert result.returncode == 1 and reported == expected, result.stdout + result.stderr
