"""The rooms: the runtime is torch-free (a runtime-only install is numpy + onnxruntime + tokenizers + jinja2) and
never imports the exporter or the package root; measuring it (the bench, its peers, read bandwidth) lives in
mtpkit/bench/, which may import both.

The import rule, checked statically on every import statement (inside functions and TYPE_CHECKING blocks too):
a module under runtime/ imports, of mtpkit, only mtpkit.runtime.* and the leaf modules mtpkit.errors and
mtpkit.extras, which import nothing of mtpkit but each other. So not the package root (`import mtpkit`, `from mtpkit
import ...`), mtpkit.api, mtpkit.cli, mtpkit.tiny, mtpkit.export or mtpkit.bench. It imports no private name
(`_x`) of another module either. The exporter never imports the CLI dispatcher, the API, mtpkit.bench or the tiny
models; the tiny models (the demo times with mtpkit.bench) not the CLI dispatcher or the API, and mtpkit.bench not
the tiny models. No module under runtime/ is named for, defines or imports bench, peer or bandwidth code.
"""

import ast
import re
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


@pytest.mark.parametrize("folder,rooms", [
    ("export", ("mtpkit.cli", "mtpkit.api", "mtpkit.bench", "mtpkit.tiny")),
    ("mtpkit/tiny", ("mtpkit.cli", "mtpkit.api")),
    ("mtpkit/bench", ("mtpkit.cli", "mtpkit.api", "mtpkit.tiny")),
])
def test_the_exporter_the_tiny_models_and_the_bench_import_only_their_rooms(folder, rooms):
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


BENCH_WORDS = {"bench", "peer", "peers", "bandwidth"}


def _words(name: str) -> set[str]:
    """The words of a snake_case or CamelCase name, lower-cased: `PeerPrompt` -> {peer, prompt}."""
    return {w.lower() for part in name.split("_") for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", part)}


def bench_names(path: Path, name: str | None = None) -> list[str]:
    """`line: name` of every class, function or variable the file defines, and every module or name it imports,
    that is named for bench, peer or bandwidth code (or is the LiteRT-LM API, a peer)."""
    found = [(module.rpartition(".")[2], line) for module, _, line in imports(path, name)]
    found += [(n, line) for _, n, line in imports(path, name) if n]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append((node.name, node.lineno))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.append((node.id, node.lineno))
    return [f"{line}: {n}" for n, line in found if _words(n) & BENCH_WORDS or n == "litert_lm"]


def test_the_runtime_holds_no_bench_peer_or_bandwidth_code():
    named = [str(p.relative_to(ROOT)) for p in sources("runtime")
             if _words(p.stem) & BENCH_WORDS or "litert_lm" in p.stem]
    assert not named, f"bench, peer and bandwidth code belongs in mtpkit/bench/, not in the runtime: {named}"
    bad = [f"{p.relative_to(ROOT)}:{hit}" for p in sources("runtime") for hit in bench_names(p)]
    assert not bad, "the runtime defines or imports bench, peer or bandwidth code:\n" + "\n".join(bad)


def test_the_bench_code_check_sees_definitions_and_imports(tmp_path):
    """The rule's own check: a backend's `peers` hook, a `Peer` import, a `PEERS` name and a LiteRT-LM import count;
    words that merely contain the letters (TypeError) do not."""
    probe = tmp_path / "probe.py"
    probe.write_text("from ..peer_timing import Peer\nPEERS = 'x'\n\ndef peers(stack):\n    import litert_lm\n"
                     "    read_bandwidth = 1\n\nclass TypeError2(TypeError):\n    pass\n")
    assert sorted(bench_names(probe, "mtpkit.runtime.backends.probe")) == [
        "1: Peer", "1: peer_timing", "2: PEERS", "4: peers", "5: litert_lm", "6: read_bandwidth"]


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
    found = circles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in found)


def test_the_circle_check_finds_a_lazy_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert circles({"a": {"b"}, "b": set()}) == []
