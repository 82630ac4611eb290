"""The rooms: the runtime is torch-free (a runtime-only install is numpy + onnxruntime + tokenizers + jinja2) and
never imports the exporter or the package root; tooling that needs both lives in mtpkit/bench/.

The import rule, checked statically on every import statement (inside functions and TYPE_CHECKING blocks too):
a module under runtime/ imports, of mtpkit, only mtpkit.runtime.* and the leaf modules mtpkit.errors and
mtpkit.extras, which import nothing of mtpkit but each other. So not the package root (`import mtpkit`, `from mtpkit
import ...`), mtpkit.api, mtpkit.cli, mtpkit.tiny, mtpkit.export or mtpkit.bench. It imports no private name
(`_x`) of another module either. The exporter and the tiny models never import the CLI dispatcher, the API or
mtpkit.bench (and the exporter not the tiny models).
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"runtime": "mtpkit.runtime", "export": "mtpkit.export", "mtpkit": "mtpkit"}  # folder -> package
LEAVES = ("mtpkit.errors", "mtpkit.extras")

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


def module_name(path: Path) -> str:
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    parts = [PACKAGES[folder], *rest]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, name: str | None = None) -> list[tuple[str, str | None, int]]:
    """(module imported, name taken from it or None, line) of every import in the file (module `name`, default:
    where it lies), relative ones resolved."""
    name = name or module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for a in node.names:
                # `from pkg import sub` takes a submodule when there is one: judge it as that module
                sub = f"{module}.{a.name}"
                found.append((sub, None, node.lineno) if _is_module(sub) else (module, a.name, node.lineno))
    return found


def _is_module(name: str) -> bool:
    if not name.startswith("mtpkit"):
        return False
    parts = name.split(".")
    folder = {"mtpkit.runtime": ROOT / "runtime", "mtpkit.export": ROOT / "export"}.get(".".join(parts[:2]))
    base, rest = (folder, parts[2:]) if folder else (ROOT / "mtpkit", parts[1:])
    path = base.joinpath(*rest)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _mtpkit(module: str) -> bool:
    return module == "mtpkit" or module.startswith("mtpkit.")


def test_runtime_imports_only_the_runtime_and_the_leaf_modules_of_mtpkit():
    bad = [f"{p.relative_to(ROOT)}:{line} imports {module}{'.' + name if name else ''}"
           for p in sources("runtime") for module, name, line in imports(p)
           if _mtpkit(module) and not (module.startswith("mtpkit.runtime") or module in LEAVES)]
    assert not bad, "the runtime must not import the exporter or the package root:\n" + "\n".join(bad)


def test_the_leaf_modules_import_nothing_of_mtpkit_but_each_other():
    for leaf in LEAVES:
        path = ROOT / "mtpkit" / f"{leaf.rpartition('.')[2]}.py"
        assert [m for m, _, _ in imports(path) if _mtpkit(m) and m not in LEAVES] == [], leaf


def test_runtime_imports_no_private_name_of_another_module():
    bad = [f"{p.relative_to(ROOT)}:{line} imports {name} from {module}" for p in sources("runtime")
           for module, name, line in imports(p) if name and name.startswith("_") and module != "__future__"]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("folder", ["export", "mtpkit/tiny"])
def test_the_exporter_and_the_tiny_models_stay_out_of_the_cli_api_and_bench(folder):
    rooms = ("mtpkit.cli", "mtpkit.api", "mtpkit.bench") + (("mtpkit.tiny",) if folder == "export" else ())
    bad = [f"{p.relative_to(ROOT)}:{line} imports {module}" for p in sources(folder)
           for module, _, line in imports(p) if any(module == r or module.startswith(r + ".") for r in rooms)]
    assert not bad, "\n".join(bad)


def test_the_import_check_sees_imports_inside_functions_and_relative_ones(tmp_path):
    """The rule's own check: a function-level `from mtpkit.api import load` and `from ..commands import _x` count."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from mtpkit.api import load\n    from ..commands import _x\n"
                     "    from .. import schema\n")
    assert imports(probe, "mtpkit.runtime.backends.probe") == [
        ("mtpkit.api", "load", 2), ("mtpkit.runtime.commands", "_x", 3), ("mtpkit.runtime.schema", None, 4)]


def test_runtime_backends_keep_no_module_level_state():
    """How a backend opens its graphs is an argument (LoadOptions), never a module-level dict, list or set that
    another package fills, nor a `global` rebound: two engines in one process cannot steer each other."""
    found = []
    for path in sorted((ROOT / "runtime" / "backends").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            value = getattr(node, "value", None) if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)) or (
                    isinstance(value, ast.Call) and getattr(value.func, "id", None) in ("dict", "list", "set")):
                found.append(f"{path.name}:{node.lineno}")
        found += [f"{path.name}:{n.lineno} global" for n in ast.walk(tree) if isinstance(n, ast.Global)]
    assert found == []
