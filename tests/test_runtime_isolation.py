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


# Import circles outside runtime/ that are known and owned elsewhere: each a set of modules that import each other.
# The package root re-exports the API, which runs the export pipeline, which reads mtpkit.__version__.
KNOWN_CIRCLES: list[set[str]] = [{"mtpkit", "mtpkit.api", "mtpkit.export.pipeline", "mtpkit.export.reproduce"}]


def import_graph() -> dict[str, set[str]]:
    """mtpkit module -> the mtpkit modules it imports anywhere in its file (inside functions too)."""
    files = {module_name(p): p for folder in PACKAGES for p in sources(folder)}
    return {name: {m for m, _, _ in imports(path) if m in files and m != name} for name, path in files.items()}


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_no_import_circle_among_mtpkit_modules():
    """An import circle makes what a module sees depend on which module was imported first; lazy imports inside
    functions count too (they only hide the circle until the function runs)."""
    assert not any(m.startswith("mtpkit.runtime") for c in KNOWN_CIRCLES for m in c)  # none is excused in runtime/
    found = [c for c in circles(import_graph()) if c not in KNOWN_CIRCLES]
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in found)


def test_the_circle_check_finds_a_lazy_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert circles({"a": {"b"}, "b": set()}) == []
