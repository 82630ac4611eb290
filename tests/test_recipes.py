"""Recipes as data (export/recipes.py): every table the exporter reads about a recipe is a Recipe field, so nothing
else compares a recipe's name; a recipe registered there alone exports, passes the lossless check and is reported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mtpkit.export import recipes

ROOT = Path(__file__).resolve().parents[1]
# attributes that hold an encoding's or a dtype's name (the same words as some recipes: "int8", "fp16"), not a recipe
ENCODINGS = ("kind", "litert", "onnx")
DTYPE_WORDS = ("dtype", "stored")


def _strings(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(set(), *(_strings(e) for e in node.elts))
    return set()


def _about_an_encoding_or_dtype(operands: list[ast.AST]) -> bool:
    return any((isinstance(n, ast.Attribute) and n.attr in ENCODINGS)
               or any(word in ast.unparse(n) for word in DTYPE_WORDS) for n in operands)


def recipe_names_compared(source: str, where: str) -> list[str]:
    """Lines where a module compares a recipe name as a string, or keys a table by one (a dict literal whose keys
    are recipe names), outside encodings' and dtypes' own names."""
    names, found = set(recipes.RECIPES) | set(recipes.ALIASES), []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if set().union(*map(_strings, operands)) & names and not _about_an_encoding_or_dtype(operands):
                found.append((node.lineno, f"{where}:{node.lineno} {ast.unparse(node)[:80]}"))
        elif isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            if keys & names and not keys & {"float32", "bf16"}:  # encodings' and dtypes' own tables
                found.append((node.lineno, f"{where}:{node.lineno} {ast.unparse(node)[:80]}"))
    return [text for _, text in sorted(found)]


def test_no_module_but_the_recipe_table_compares_a_recipe_name():
    modules = [p for folder in ("export", "mtpkit", "runtime") for p in sorted((ROOT / folder).rglob("*.py"))
               if p != ROOT / "export" / "recipes.py"]
    assert len(modules) > 50
    assert [hit for p in modules for hit in recipe_names_compared(p.read_text(), str(p.relative_to(ROOT)))] == []


def test_the_check_finds_a_recipe_name_compared():
    source = ('def f(recipe, enc, dtype):\n    return recipe == "int4" or recipe in ("fp16",) or enc.kind == "int4" '
              'or dtype == "fp32"\nTABLE = {"int8": 1}\n')
    assert [hit.split(" ")[0] for hit in recipe_names_compared(source, "probe.py")] == ["probe.py:2"] * 2 + [
        "probe.py:3"]


def test_every_recipe_names_a_wider_recipe_and_an_encoding_for_each_backend():
    for r in recipes.RECIPES.values():
        assert r.wider is None or r.wider in recipes.RECIPES, r.name
        assert r.onnx in ("float", "streamed", "fp16", "dynamic"), r.name
        assert r.quantized == (r.litert is not None), r.name
        assert r.litert_as is None or recipes.recipe(r.litert_as).litert == r.litert, r.name
    assert [r.name for r in recipes.RECIPES.values() if not r.quantized] == ["fp32"]


def test_every_int_recipe_gives_the_drafters_centroid_table_4_bits():
    """The E2B / E4B drafter's 262144 x 256 centroid-head table is 67 M of its 78 M weights: at 8 bits it alone
    would be 67 MB, so every recipe below fp16 stores it at 4; the float recipes keep it float."""
    # (checkpoint writes what a pre-quantized checkpoint holds, its tables included: not a choice of the recipe)
    below_fp16 = [r for r in recipes.RECIPES.values() if r.bits is not None and not r.lattice]
    assert len(below_fp16) == 5 and {r.draft_table_bits for r in below_fp16} == {4}
    assert {r.draft_table_bits for r in recipes.RECIPES.values() if r.bits is None} == {None}


def test_every_int_recipes_default_drafter_is_4_bit_and_an_explicit_one_is_kept():
    """The drafters of E2B / E4B hold 78.0 / 78.8 M weights: at 4 bits with a float16 scale per 32 weights they are
    at most 44.3 MB, within the 50 MB every recipe below fp16 keeps to (an 8-bit drafter plans 53.7 / 54.6 MB), so
    --drafter-quant defaults to a 4-bit recipe under every int recipe; the float recipes keep their own."""
    from mtpkit.export.config import ExportConfig

    for r in recipes.RECIPES.values():
        default = recipes.recipe(recipes.drafter_default(r))
        assert default.bits == (4 if r.bits is not None else None), r.name
        assert default.float_bits == r.float_bits, r.name
        assert ExportConfig(target="t", drafter="d", out="/nonexistent/x", quant=r.name).drafter_quant == default.name
    assert 78.8e6 * (4 + 16 / 32) / 8 < 44.4e6
    assert ExportConfig(target="t", drafter="d", out="/nonexistent/x", quant="int8",
                        drafter_quant="int8").drafter_quant == "int8"


@pytest.mark.slow
def test_a_recipe_registered_in_the_table_alone_exports_runs_losslessly_and_is_reported(
        tiny_checkpoints, tmp_path, monkeypatch, capsys):
    """An int8 variant with its own name and gate, added to RECIPES and nowhere else: `mtpkit export --quant` takes
    it, the manifest and the fidelity file carry it, speculative greedy equals plain greedy on it (up to near-ties,
    as every int8 graph), and `quant-report` measures it beside fp32."""
    import json

    from test_quantize import assert_equal_but_near_ties

    from mtpkit import cli
    from mtpkit.export.quant_report import quant_report
    from mtpkit.runtime.engine import Engine, GenConfig

    lenient = recipes.Recipe("int8-lenient", bits=8, table_bits=8, gate=0.5, wider="int8", bytes_per_weight=1,
                             blockwise=True, onnx="streamed", litert="int8")
    monkeypatch.setitem(recipes.RECIPES, lenient.name, lenient)
    target, drafter = tiny_checkpoints("e2b_gemma4_centroid")
    out = tmp_path / "lenient"
    assert cli.main(["-q", "export", str(target), "--drafter", str(drafter), "--out", str(out), "--quant",
                     lenient.name, "--no-check", "--reference-tokens", "8", "--max-cache-len", "128"]) == 0
    capsys.readouterr()
    manifest = json.loads((out / "manifest.json").read_text())
    assert {g["recipe"] for g in manifest["backends"]["onnx"]["graphs"].values()} == {lenient.name}
    assert json.loads((out / "quant_fidelity.json").read_text())["onnx"]["gate"]["top1_agreement_min"] == 0.5
    engine, reference = Engine(out, threads=1), json.loads((out / "reference.json").read_text())
    for p in reference["prompts"]:
        ids, n = p["prompt_ids"], len(p["greedy_ids"])
        plain = [t for t, _ in engine.generate(ids, GenConfig(max_new_tokens=n, mtp=False))]
        spec = [t for t, _ in engine.generate(ids, GenConfig(max_new_tokens=n, num_assistant_tokens=3))]
        assert_equal_but_near_ties(engine, ids, spec, plain)
    report = quant_report(str(target), str(drafter), tmp_path / "report", [lenient.name], [lenient.name],
                          max_cache_len=128, max_new_tokens=4, repeats=1)
    rows = {(r["target_recipe"], r["drafter_recipe"]): r for r in report["rows"]}
    assert set(rows) == {("fp32", "fp32"), (lenient.name, lenient.name)}
    assert 0 < rows[(lenient.name, lenient.name)]["teacher_forced"]["top1_agreement"] <= 1
    assert f"| onnx | {lenient.name} | {lenient.name} |" in (tmp_path / "report" / "report.md").read_text()
