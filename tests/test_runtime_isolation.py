"""The runtime is torch-free: a runtime-only install is numpy + onnxruntime + tokenizers + jinja2."""

import subprocess
import sys

CODE = """
import sys, pkgutil, importlib
import mtpkit.runtime as rt
for m in pkgutil.walk_packages(rt.__path__, 'mtpkit.runtime.'):
    importlib.import_module(m.name)
import mtpkit, mtpkit.api
import mtpkit.cli
mtpkit.cli.build_parser()  # --help of every runtime subcommand must not pull torch either
bad = sorted(n for n in sys.modules if n.split('.')[0] in ('torch', 'transformers', 'onnx', 'safetensors'))
print(bad)
sys.exit(1 if bad else 0)
"""


def test_runtime_imports_no_torch_or_transformers():
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True)
    assert result.returncode == 0, f"runtime imported export-side modules: {result.stdout} {result.stderr}"
