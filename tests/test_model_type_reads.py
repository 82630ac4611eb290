"""Only the model adapters (export/models/) read a checkpoint config's model_type: every other module under export/,
runtime/ and mtpkit/ reads layers, caches and steps through an adapter. Checked on the syntax tree: `.get("model_type")`,
`["model_type"]` and `.model_type` read it; a dict literal that writes a config with a "model_type" key (mtpkit/tiny)
does not, nor does an upstream method whose name merely contains it (litert_lm_builder's `get_model_type(i)`).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEY = "model_type"


def reads(tree: ast.AST) -> list[int]:
    """Lines that read a model_type: a .get / getattr of it, a subscript loading it, an attribute loading it."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and any(isinstance(a, ast.Constant) and a.value == KEY for a in node.args[:2]):
            func = node.func
            if (isinstance(func, ast.Attribute) and func.attr == "get") or \
                    (isinstance(func, ast.Name) and func.id in ("getattr", "hasattr")):
                found.append(node.lineno)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and \
                isinstance(node.slice, ast.Constant) and node.slice.value == KEY:
            found.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr == KEY and isinstance(node.ctx, ast.Load):
            found.append(node.lineno)
    return found


def test_nothing_outside_the_model_adapters_reads_model_type():
    models = ROOT / "export" / "models"
    files = [p for folder in ("export", "runtime", "mtpkit") for p in sorted((ROOT / folder).rglob("*.py"))
             if models not in p.parents]
    bad = [f"{p.relative_to(ROOT)}:{line}" for p in files for line in reads(ast.parse(p.read_text(), str(p)))]
    assert not bad, "model_type read outside export/models/:\n" + "\n".join(bad)


def test_the_check_tells_reads_from_writes_and_api_calls():
    probe = ast.parse('a = cfg.get("model_type")\nb = cfg["model_type"]\nc = config.model_type\n'
                      'd = getattr(config, "model_type", None)\n'
                      'cfg = {"model_type": "gemma4"}\ncfg["model_type"] = "gemma4_text"\n'
                      't = bundle.get_model_type(0)\n')
    assert reads(probe) == [1, 2, 3, 4]
