"""The docs stay true: README.md and docs/**/*.md link only to files that exist, show only `mtpkit` command lines the
CLI accepts, and docs/manifest.md lists exactly the fields manifest.json is written with.

How docs/manifest.md must list the manifest's fields (test_manifest_reference_lists_every_field):

    | field | type | meaning |
    |---|---|---|
    | `backends.<kind>.graphs.<name>.bytes` | int | size of the graph file in bytes |

- Only tables whose header's first cell reads "field" count; in them each row's first cell holds the field's path
  as one inline code span. Other tables and prose are free.
- A path joins names with dots. A key of a dict of records is a placeholder in angle brackets (any word:
  `backends.<kind>`); an item of a list of records is `[]` (`backends.<kind>.signatures.<name>.inputs[].role`).
- Every field of every dataclass that Manifest.to_dict writes gets a row, containers included (`backends`,
  `backends.<kind>.graphs`), and nothing else, except: keys inside a free-form object (a plain `dict` field of a
  record in runtime/records.py or runtime/manifest.py, e.g. `source`, `backends.<kind>.options.embedding`) may get
  rows of their own (`source.<side>.ref`); no record names them, so they are not checked. A record field's record
  is walked with each kind's record of it (`backends.<kind>.options`: its row's record in roles.BACKENDS).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import shlex
import typing
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
MANIFEST_PAGE = ROOT / "docs" / "manifest.md"


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# --- Markdown: fenced blocks, prose paragraphs, inline code spans

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)


def split_markdown(text: str) -> tuple[list[tuple[int, list[str]]], list[tuple[int, str]]]:
    """(fenced blocks as (first line, lines), prose paragraphs as (first line, text)); lines count from 1."""
    blocks: list[tuple[int, list[str]]] = []
    prose, fence = [], None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is not None:  # inside a fence until a run of the same char, at least as long, alone on its line
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line[m.end():].strip():
                fence = None
            else:
                blocks[-1][1].append(line)
            line = ""
        elif m:
            fence, line = m.group(1), ""
            blocks.append((n + 1, []))
        prose.append(line)  # fenced lines blanked: line numbers stay, and a fence ends a paragraph
    joined = "\n".join(prose)
    return blocks, [(joined.count("\n", 0, m.start()) + 1, m.group(0))
                    for m in re.finditer(r"(?:^[ \t]*\S.*(?:\n|\Z))+", joined, re.M)]


def code_spans(paragraphs: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """(line, content) of every inline code span; a span may wrap onto the next line of its paragraph."""
    return [(start + text.count("\n", 0, m.start()), m.group(2).replace("\n", " ").strip())
            for start, text in paragraphs for m in CODE_SPAN.finditer(text)]


# --- 1. relative links

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^()\s]*(?:\([^()\s]*\)[^()\s]*)*)"
                  r"(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(\S+)", re.M)
HTML_LINK = re.compile(r"\b(?:href|src)\s*=\s*[\"']([^\"']+)[\"']")
EXTERNAL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")  # http:, https:, mailto:, ... and //host


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every link and image outside code: inline, reference definitions, HTML href/src."""
    found = []
    for start, para in split_markdown(text)[1]:
        # code spans blanked (same length, newlines kept) so that `[a](b)` shown as code is not a link
        para = CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), para)
        for pattern in (LINK, REF_DEF, HTML_LINK):
            found += [(start + para.count("\n", 0, m.start()), m.group(1)) for m in pattern.finditer(para)]
    return sorted(found)


def check_links(path: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for line, target in links(path.read_text(encoding="utf-8")):
        target = target.strip("<>")
        if not target or target.startswith("#") or EXTERNAL.match(target):
            continue
        local = unquote(re.split(r"[#?]", target, maxsplit=1)[0])
        # a leading / is the repository root, as GitHub renders it
        resolved = root / local.lstrip("/") if local.startswith("/") else path.parent / local
        if not resolved.exists():
            problems.append(f"{_rel(path)}:{line}: link {target!r}: no such file or folder {_rel(resolved)}")
    return problems


# --- 2. `mtpkit ...` command lines against the argparse parser

PROMPT = re.compile(r"^\s*(?:\([^)]*\)\s*)?(?:[\w@.:~/-]*\$|%)\s+")
SEPARATORS = {"|", "||", "&&", ";", "&", "(", ")", "{", "}"}
WRAPPERS = {"time", "env", "nohup", "exec", "command", "sudo"}
REDIRECT = re.compile(r"^\d*(?:>>?|<)(?:&\d*)?$|^\d*>")
PYTHON = re.compile(r"^(?:.*/)?python(?:\d+(?:\.\d+)?)?$")


def cli_options(parser: argparse.ArgumentParser | None = None) -> dict[str | None, dict[str, argparse.Action]]:
    """option string -> action, for the root parser (key None) and each subcommand: the CLI's own truth."""
    if parser is None:
        from mtpkit.cli import build_parser
        parser = build_parser()
    options: dict[str | None, dict[str, argparse.Action]] = {None: dict(parser._option_string_actions)}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            options.update({name: dict(sub._option_string_actions) for name, sub in action.choices.items()})
    return options


def _tokens(line: str) -> list[str]:
    line = PROMPT.sub("", line, count=1)
    lexer = shlex.shlex(line, posix=True)
    lexer.whitespace_split = True  # words as the shell splits them, quotes removed; '#' begins a comment
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote (prose in a code block): split on blanks, drop the comment
        return re.split(r"(?:^|\s)#", line, maxsplit=1)[0].split()


def mtpkit_invocations(line: str) -> list[list[str]]:
    """The arguments of every mtpkit invocation on a shell line; only the command word of each pipeline or list
    part counts, so `pip install mtpkit` or `grep mtpkit` are not invocations."""
    tokens = _tokens(line)
    if len(tokens) > 1 and tokens[0] == "mtpkit" and tokens[1].endswith(":"):  # mtpkit's output: `mtpkit run: error:`
        return []
    parts: list[list[str]] = [[]]
    for token in tokens:
        if token in SEPARATORS:
            parts.append([])
        elif token.endswith(";") and token != ";":
            parts[-1].append(token[:-1])
            parts.append([])
        else:
            parts[-1].append(token)
    found = []
    for words in parts:
        while words and (words[0] in WRAPPERS or re.match(r"^[A-Za-z_]\w*=", words[0])):
            words = words[1:]
        if words and (words[0] == "mtpkit" or words[0].endswith("/mtpkit")):
            args = words[1:]
        elif len(words) >= 3 and PYTHON.match(words[0]) and words[1:3] == ["-m", "mtpkit"]:
            args = words[3:]
        else:
            continue
        cut = next((i for i, a in enumerate(args) if REDIRECT.match(a) and not _placeholder(a)), len(args))
        found.append(args[:cut])
    return found


def _placeholder(word: str) -> bool:
    return bool(re.fullmatch(r"<[^<>]*>|\.\.\.|…|[A-Z][A-Z0-9_]*|\{.*\}", word)) or "..." in word or "…" in word


def _check_flag(word: str, known: dict[str, argparse.Action], where: str) -> str | None:
    flag = word.split("=", 1)[0]
    if flag in known or (not flag.startswith("--") and flag[:2] in known):  # -k4: a short flag and its value
        return None
    longer = [o for o in known if o.startswith(flag) and flag.startswith("--")]
    if len(longer) == 1:  # argparse would accept the abbreviation; the docs should spell the flag out
        return f"{flag} abbreviates {longer[0]} of {where}; write it out"
    close = difflib.get_close_matches(flag, list(known), n=1)
    return f"unknown flag {flag} for {where}" + (f" (did you mean {close[0]}?)" if close else "")


def check_args(args: list[str], options: dict[str | None, dict[str, argparse.Action]]) -> list[tuple[str, str]]:
    """(offending word, problem) for one invocation's arguments: an unknown subcommand, or a flag that it (or the
    root) lacks."""
    i, command = 0, None
    while i < len(args) and command is None:
        word = args[i].strip("[]")
        if word.startswith("-"):  # root flags before the subcommand
            problem = _check_flag(word, options[None], "mtpkit")
            if problem:
                return [(word, problem)]
            action = options[None].get(word.split("=", 1)[0])
            i += 2 if action is not None and action.nargs is None and "=" not in word else 1
            continue
        if _placeholder(word) or word.endswith(":"):  # `mtpkit COMMAND ...`, or an output line `mtpkit run: ...`
            return []
        if word not in options:
            close = difflib.get_close_matches(word, [k for k in options if k], n=1)
            return [(word, f"unknown subcommand {word!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))]
        command = word
    problems = []
    known = options.get(command, {})
    for j in range(i + 1, len(args)):
        word = args[j].strip("[]")
        if word == "--":
            break
        if word.startswith("-") and len(word) > 1 and not re.match(r"^-\d", word) and not _placeholder(word):
            problem = _check_flag(word, known, f"`mtpkit {command}`")
            problems += [(word, problem)] if problem else []
    return problems


def command_lines(text: str) -> list[tuple[int, str]]:
    """(line, shell line) from fenced blocks, a line ending in \\ joined with the next, and from inline code spans."""
    blocks, paragraphs = split_markdown(text)
    lines = []
    for start, block in ((n, "\n".join(b)) for n, b in blocks):
        lines += [(start + block.count("\n", 0, m.start()), m.group(0).replace("\\\n", " "))
                  for m in re.finditer(r"(?:[^\n]*\\\n)*[^\n]*", block) if m.group(0)]
    # `\|` is a literal | inside a table cell's code span
    lines += [(n, span.replace("\\|", "|")) for n, span in code_spans(paragraphs)]
    return sorted(lines)


def check_commands(path: Path, options: dict[str | None, dict[str, argparse.Action]] | None = None) -> list[str]:
    options = options if options is not None else cli_options()
    text = path.read_text(encoding="utf-8")
    doc_lines = text.splitlines()
    problems = []
    for line, shell in command_lines(text):
        shown = " ".join(shell.split())
        for args in mtpkit_invocations(shell):
            problems += [f"{_rel(path)}:{line}: `{shown}`: {p}" for word, p in check_args(args, options)
                         if not _shown_as_bad_input(word, doc_lines[line - 1])]
    return problems


def _shown_as_bad_input(word: str, doc_line: str) -> bool:
    """A catalogue of bad inputs (docs/hostile-inputs.md) shows a wrong command beside the error mtpkit gives for
    it; an error on the same line that names the offending word marks the command as wrong on purpose."""
    word = word.split("=", 1)[0]
    return any(word in m.group(0) for m in re.finditer(r"mtpkit[\w-]*(?: [\w-]+)?: error: [^`]*", doc_line))


# --- 3. the manifest reference page

def _walk(cls: type, prefix: str, paths: dict[str, bool]) -> None:
    """paths[dotted path] = whether the field is a free-form object (a plain dict the schema does not describe)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path, hint = prefix + f.name, hints[f.name]
        paths[path] = False
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        origin = typing.get_origin(hint)
        if origin is dict and len(args) == 2 and dataclasses.is_dataclass(args[1]):
            key = "<" + f.name.removesuffix("s") + ">"  # backends.<backend>: the page may use any word
            _walk(args[1], f"{path}.{key}.", paths)
        elif origin is list and args and dataclasses.is_dataclass(args[0]):
            _walk(args[0], f"{path}[].", paths)
        elif dataclasses.is_dataclass(hint):  # a record, and each kind's record of it (backend options)
            for record in (hint, *hint.__subclasses__()):
                _walk(record, f"{path}.", paths)
        elif hint is dict or (args and args[0] is dict):  # dict or dict | None
            paths[path] = True


def manifest_fields() -> dict[str, bool]:
    """Every field path manifest.json is written with -> whether it is free-form; from the dataclasses in
    runtime/manifest.py, keeping only the top-level fields that Manifest.to_dict actually writes."""
    from mtpkit.runtime.manifest import Manifest

    paths: dict[str, bool] = {}
    _walk(Manifest, "", paths)
    required = {f.name: None for f in dataclasses.fields(Manifest)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    written = set(Manifest(**required).to_json())  # to_json drops fields that are not written (root)
    return {p: free for p, free in paths.items() if re.split(r"[.\[]", p, maxsplit=1)[0] in written}


def _normal(path: str) -> str:
    """Placeholder and list-index spellings compare equal: `<kind>` == `<name>`, `[i]` == `[]`."""
    return re.sub(r"\[[^\]]*\]", "[]", re.sub(r"<[^<>]*>", "<>", path.strip()))


def listed_fields(text: str) -> list[tuple[int, str | None]]:
    """(line, path) of each row of the page's field tables; path None where the first cell has no code span."""
    rows, in_table = [], False
    for n, line in enumerate(text.splitlines(), 1):
        cells = re.split(r"(?<!\\)\|", line.strip().strip("|")) if line.lstrip().startswith("|") else []
        if not cells:
            in_table = False
        elif not in_table:
            in_table = cells[0].strip().lower() == "field"
        elif not re.fullmatch(r"\s*:?-+:?\s*", cells[0]):  # not the separator row
            m = CODE_SPAN.search(cells[0])
            rows.append((n, m.group(2).strip() if m else None))
    return rows


def check_manifest_page(page: Path, fields: dict[str, bool]) -> list[str]:
    if not page.is_file():
        return [f"{_rel(page)}, the manifest reference page, is missing: write it (format in the docstring of "
                "tests/test_docs.py) with one table row per field manifest.json is written with:\n"
                "| field | type | meaning |\n|---|---|---|\n" + "\n".join(f"| `{p}` | | |" for p in fields)]
    wanted = {_normal(p): p for p in fields}
    free = [_normal(p) for p, is_free in fields.items() if is_free]
    problems, seen = [], {}
    for line, path in listed_fields(page.read_text(encoding="utf-8")):
        if path is None:
            problems.append(f"{_rel(page)}:{line}: a field-table row needs the field's `path` in its first cell")
            continue
        key = _normal(path)
        if key in seen:
            problems.append(f"{_rel(page)}:{line}: `{path}` is listed twice (first on line {seen[key]})")
        seen.setdefault(key, line)
        if key not in wanted and not any(key.startswith(f + ".") or key.startswith(f + "[") for f in free):
            problems.append(f"{_rel(page)}:{line}: `{path}` is not a field runtime/manifest.py writes")
    problems += [f"{_rel(page)}: `{p}` is missing (runtime/manifest.py writes it)"
                 for key, p in wanted.items() if key not in seen]
    return problems


# --- the tests on the real docs

@pytest.mark.parametrize("path", doc_files(), ids=_rel)
def test_relative_links_resolve(path):
    problems = check_links(path)
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def options():
    return cli_options()


@pytest.mark.parametrize("path", doc_files(), ids=_rel)
def test_command_lines_match_the_cli(path, options):
    problems = check_commands(path, options)
    assert not problems, "\n".join(problems)


def unindexed_pages(root: Path = ROOT) -> list[str]:
    """Pages under docs/ that docs/README.md (the index) does not link to."""
    index = root / "docs" / "README.md"
    linked = {(index.parent / target.split("#")[0]).resolve() for _, target in links(index.read_text())}
    return [_rel(p) for p in sorted((root / "docs").rglob("*.md")) if p != index and p.resolve() not in linked]


README_WIDTH = 160  # the product page reads in a terminal and a diff: a headline cell is one figure and a link


def long_lines(path: Path, width: int = README_WIDTH) -> list[str]:
    return [f"{_rel(path)}:{n}: {len(line)} characters (at most {width})"
            for n, line in enumerate(path.read_text().splitlines(), 1) if len(line) > width]


def test_readme_lines_are_at_most_160_characters(tmp_path):
    assert not long_lines(ROOT / "README.md"), "\n".join(long_lines(ROOT / "README.md"))
    wide = tmp_path / "README.md"
    wide.write_text("ok\n| a | " + "x" * 160 + " |\n")
    assert long_lines(wide) == [f"{wide}:2: 168 characters (at most 160)"]


README_LINES = 220  # the product page stays one read: detail goes to a page under docs/, linked from it
# words by which a page would narrate its own making instead of stating facts with their commands; "session" alone
# is an ONNX Runtime or chat session
NARRATION = re.compile(r"\b((this|that|another|last|previous|earlier|next) session|this round|last round|we tried)\b",
                       re.IGNORECASE)


def narration(path: Path) -> list[str]:
    return [f"{_rel(path)}:{n}: {m.group(0)!r}" for n, line in enumerate(path.read_text().splitlines(), 1)
            for m in NARRATION.finditer(line)]


def test_readme_is_at_most_220_lines():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_LINES, f"README.md has {lines} lines (at most {README_LINES}): move detail into docs/"


def test_no_page_narrates_its_own_making(tmp_path):
    found = [hit for path in doc_files() for hit in narration(path)]
    assert not found, "\n".join(found)
    page = tmp_path / "page.md"
    page.write_text("An ONNX Runtime session opens per graph; the chat session goes on.\n"
                    "The other run this Session peaked at 2 GB; the last round's export took 1 h.\n")
    assert narration(page) == [f"{page}:2: 'this Session'", f"{page}:2: 'last round'"]


def test_the_docs_index_lists_every_page():
    assert not unindexed_pages(), f"docs/README.md does not link to: {unindexed_pages()}"


def test_manifest_reference_lists_every_field():
    problems = check_manifest_page(MANIFEST_PAGE, manifest_fields())
    assert not problems, "\n".join(problems)


# --- the checkers fail when they should: doctored pages in tmp_path

def _page(tmp_path: Path, text: str, name: str = "page.md") -> Path:
    page = tmp_path / name
    page.write_text(text, encoding="utf-8")
    return page


def test_check_links_reports_a_broken_link(tmp_path):
    (tmp_path / "there.md").write_text("x")
    (tmp_path / "sub").mkdir()
    page = _page(tmp_path, "See [ok](there.md#part), [dir](sub/), [web](https://example.com/x), [top](#top),\n"
                           "`[code](nowhere.md)`, ![img](missing.png \"title\") and\n\n[ref]: gone/file.md\n"
                           "```\n[in a fence](nowhere.md)\n```\n<a href=\"absent.html\">x</a>\n")
    problems = check_links(page, root=tmp_path)
    assert [p.split(": link ")[1].split(":")[0] for p in problems] == ["'missing.png'", "'gone/file.md'",
                                                                       "'absent.html'"], problems
    assert ":2:" in problems[0] and ":4:" in problems[1] and ":8:" in problems[2], problems


def _doctored(options) -> tuple[str, str]:
    """A real subcommand and one of its long flags, taken from the parser so this test follows the CLI."""
    command = next(k for k in options if k)
    flag = next(o for o in options[command] if o.startswith("--") and o != "--help")
    return command, flag


def test_check_commands_accepts_what_the_cli_accepts(tmp_path, options):
    command, flag = _doctored(options)
    page = _page(tmp_path, f"```sh\n$ mtpkit -q {command} <PATH> \\\n    {flag}=x  # {flag}-not-checked\n"
                           f"(.venv) $ .venv/bin/mtpkit {command} ... | grep --no-such-grep-flag && ls -la\n"
                           f"python -m mtpkit {command} [{flag} N] > out.txt\nmtpkit --help\nmtpkit -h\n"
                           f"mtpkit {command}: error: --made-up output\npip install mtpkit --no-such-pip-flag\n```\n"
                           f"Inline: `mtpkit {command} DIR\n[{flag} a\\|b]`, `mtpkit COMMAND --x`.\n\n"
                           f"| `mtpkit {command}x --bad` | `mtpkit: error: invalid choice: '{command}x'` |\n")
    assert check_commands(page, options) == []


def test_check_commands_reports_an_unknown_flag(tmp_path, options):
    command, flag = _doctored(options)
    # argparse takes a unique prefix of a long flag; the docs should spell it out
    abbreviation = next(flag[:n] for n in range(3, len(flag))
                        if [o for o in options[command] if o.startswith(flag[:n])] == [flag])
    page = _page(tmp_path, f"```\nmtpkit {command} DIR \\\n  --no-such-flag 3 {flag}\n```\n"
                           f"then `.venv/bin/mtpkit {command} DIR --also-made-up=4` and `mtpkit --nope {command}`\n"
                           f"and `mtpkit {command} {abbreviation} 1`\n")
    problems = check_commands(page, options)
    assert len(problems) == 4, problems
    assert "page.md:2:" in problems[0] and f"unknown flag --no-such-flag for `mtpkit {command}`" in problems[0]
    assert "page.md:5:" in problems[1] and "--also-made-up" in problems[1], problems
    assert "unknown flag --nope for mtpkit" in problems[2], problems
    assert "page.md:6:" in problems[3] and f"{abbreviation} abbreviates {flag}" in problems[3], problems


def test_check_commands_reports_an_unknown_subcommand(tmp_path, options):
    command, _ = _doctored(options)
    page = _page(tmp_path, f"Run `python -m mtpkit {command}x DIR`.\n\n```\ncd out; mtpkit no-such-command\n```\n")
    problems = check_commands(page, options)
    assert len(problems) == 2, problems
    assert f"unknown subcommand '{command}x' (did you mean '{command}'?)" in problems[0], problems
    assert "page.md:4:" in problems[1] and "'no-such-command'" in problems[1], problems


def test_manifest_fields_follow_the_dataclasses():
    fields = manifest_fields()
    normal = {_normal(p): free for p, free in fields.items()}
    assert "root" not in fields  # Manifest.to_json drops it
    assert normal["backends.<>.graphs.<>.bytes"] is False and normal["source"] is True, fields
    assert normal["model.vocab_size"] is False and normal["kv_cache.capacity"] is False, fields  # records, not dicts
    assert normal["backends.<>.options.max_draft"] is False and normal["backends.<>.options.embedding"] is True, fields
    assert "backends.<>.signatures.<>.inputs[].role" in normal, fields


def _manifest_page(tmp_path: Path, fields: dict[str, bool], drop: int | None = None, extra: str = "") -> Path:
    rows = [f"| `{p.replace('<backend>', '<kind>')}` | x |" for i, p in enumerate(fields) if i != drop]
    return _page(tmp_path, "# manifest.json\n\n| field | meaning |\n|---|---|\n" + "\n".join(rows) + extra + "\n"
                 "\n| role | meaning |\n|---|---|\n| `input_ids` | not a field table |\n", "manifest.md")


def test_check_manifest_page_reports_a_missing_page(tmp_path):
    fields = manifest_fields()
    problems = check_manifest_page(tmp_path / "manifest.md", fields)
    assert len(problems) == 1 and "the manifest reference page, is missing" in problems[0], problems
    assert all(f"| `{p}` |" in problems[0] for p in fields), problems


def test_check_manifest_page_reports_a_missing_or_extra_field(tmp_path):
    fields = manifest_fields()
    free_key = "\n| `source.target.ref` | a key inside a free-form object: allowed |"
    assert check_manifest_page(_manifest_page(tmp_path, fields, extra=free_key), fields) == []
    problems = check_manifest_page(_manifest_page(tmp_path, fields, drop=3), fields)
    assert len(problems) == 1 and problems[0].endswith(f"`{list(fields)[3]}` is missing (runtime/manifest.py "
                                                        "writes it)"), problems
    problems = check_manifest_page(_manifest_page(tmp_path, fields, extra="\n| `backends.<kind>.size` | x |"), fields)
    assert len(problems) == 1 and "`backends.<kind>.size` is not a field" in problems[0], problems
