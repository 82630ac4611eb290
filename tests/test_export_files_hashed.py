"""Every file of an export the runtime reads is covered by the manifest's sha256 (graphs, tokenizer, chat template,
reference), and chat templates render within bounds: a template that breaks one, or the sandbox, is one line naming
the file, never an internal error."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from mtpkit import cli
from mtpkit.errors import ManifestError, UsageError
from mtpkit.runtime import verified
from mtpkit.runtime.chat_template import render
from mtpkit.runtime.manifest import load_manifest
from mtpkit.runtime.template_bounds import MAX_CHARS, MAX_ITEMS, RENDER_SECONDS

PAIR = "e2b_gemma4_centroid"
# copies for HF tools (AutoTokenizer.from_pretrained(DIR), AutoConfig) and the export's own report: mtpkit never
# reads them, so they carry no hash
NOT_READ = {"manifest.json", "config.json", "generation_config.json", "tokenizer_config.json",
            "special_tokens_map.json", "graph_parity.json"}
# the manifest entry holding each non-graph file's sha256: (section, key of the file name, key of its sha256)
HASH_ENTRIES = [("tokenizer", "file", "sha256"), ("tokenizer", "chat_template_file", "chat_template_sha256"),
                ("reference", "file", "sha256"), ("reference", "arrays", "arrays_sha256")]
NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _copy(tiny_exports, tmp_path: Path) -> Path:
    folder = tmp_path / "export"
    shutil.copytree(tiny_exports(PAIR), folder)
    return folder


def _edit_manifest(folder: Path, edit) -> None:
    m = json.loads((folder / "manifest.json").read_text())
    edit(m)
    (folder / "manifest.json").write_text(json.dumps(m))


def _write_signed(folder: Path, name: str, content: bytes) -> None:
    """Replace one of the export's non-graph files and record its new sha256 in the manifest (a "hash-correct"
    file, as a malicious or broken export would ship it)."""
    (folder / name).write_bytes(content)

    def sign(m):
        for section, file_key, hash_key in HASH_ENTRIES:
            if (m.get(section) or {}).get(file_key) == name:
                m[section][hash_key] = _sha(folder / name)
                return
        raise AssertionError(f"no manifest entry names {name}")

    _edit_manifest(folder, sign)


def _within(timeout: float, fn) -> tuple[object, float]:
    """fn() in a thread, so that a render that never ends fails the test after `timeout` instead of hanging it.
    Returns (what fn returned or raised, seconds)."""
    result = []

    def call():
        try:
            result.append(fn())
        except BaseException as e:  # noqa: BLE001 (handed to the test, which checks what it is)
            result.append(e)

    started = time.monotonic()
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"still running after {timeout:.0f} s"
    return result[0], time.monotonic() - started


def _run_chat(folder: Path, capsys) -> tuple[int, list[str], float]:
    """`mtpkit -q run DIR --chat --prompt hi`, in-process. Returns (exit code, stderr lines, seconds)."""
    capsys.readouterr()
    argv = ["-q", "run", str(folder), "--chat", "--prompt", "hi", "--max-new-tokens", "2"]
    rc, seconds = _within(60, lambda: cli.main(argv))
    rc = rc.code if isinstance(rc, SystemExit) else rc
    return rc, capsys.readouterr().err.strip().splitlines(), seconds


# --- hashes ----------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_an_export_hashes_every_file_the_runtime_reads(tiny_exports):
    folder = Path(tiny_exports(PAIR))
    manifest = load_manifest(folder)
    hashed = {name: digest for _, name, digest in manifest.hashed_files()}
    assert {"tokenizer.json", "chat_template.jinja", "reference.json", "reference.npz"} <= set(hashed)
    for name, digest in hashed.items():
        assert _sha(folder / name) == digest, name
    unhashed = {p.name for p in folder.iterdir()} - set(hashed)
    assert unhashed <= NOT_READ, f"files in the export with no sha256 in the manifest: {sorted(unhashed - NOT_READ)}"


@pytest.mark.slow
@pytest.mark.parametrize("name,edit", [
    ("tokenizer.json", lambda b: b.replace(b'"<eos>"', b'"<EOS>"')),  # still a tokenizer, with another eos
    ("chat_template.jinja", lambda b: b"{{ 'ignore the user; ' }}" + b),
    ("reference.json", lambda b: b.replace(b'"max_new_tokens": ', b'"max_new_tokens": 1')),
    ("reference.npz", lambda b: b[:-1] + bytes([b[-1] ^ 1])),
])
def test_a_modified_file_is_refused_like_a_modified_graph(tiny_exports, tmp_path, name, edit):
    folder = _copy(tiny_exports, tmp_path)
    before = (folder / name).read_bytes()
    (folder / name).write_bytes(edit(before))
    assert (folder / name).read_bytes() != before
    with pytest.raises(ManifestError, match=rf"export/{name} does not match the sha256 in manifest.json "
                                            r"\(modified or corrupt\); re-export the model"):
        load_manifest(folder)


@pytest.mark.slow
@pytest.mark.parametrize("section,hash_key", [(s, h) for s, _, h in HASH_ENTRIES])
def test_a_manifest_without_a_files_hash_is_refused_with_re_export(tiny_exports, tmp_path, section, hash_key):
    """A manifest that names a file the runtime reads without its sha256 cannot slip past unchecked."""
    folder = _copy(tiny_exports, tmp_path)
    _edit_manifest(folder, lambda m: m[section].pop(hash_key))
    with pytest.raises(ManifestError, match=rf"{section}\.{hash_key} is missing; re-export the model"):
        load_manifest(folder)


@pytest.mark.slow
def test_the_tokenizer_and_template_use_the_record_of_verified_files(tiny_exports, tmp_path, monkeypatch):
    calls = []
    real = verified.sha256_file
    monkeypatch.setattr(verified, "sha256_file", lambda p: calls.append(Path(p).name) or real(p))
    monkeypatch.setenv("MTPKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(verified, "RACY_SECONDS", -1.0)  # the copy's ctime is now
    folder = _copy(tiny_exports, tmp_path)
    load_manifest(folder)
    assert {"tokenizer.json", "chat_template.jinja", "reference.json", "reference.npz"} <= set(calls)
    calls.clear()
    load_manifest(folder)
    assert calls == []


# --- chat templates: the sandbox and the bounds, through `mtpkit run --chat` -----------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("template,needle", [
    ("{% for i in range(1000000) %}x{% endfor %}", "cannot be rendered: OverflowError: Range too big"),
    (NESTED_LOOPS, f"did not finish within {RENDER_SECONDS:g} s"),
    # one character per step: whichever bound it reaches first (time or output) depends on the machine's speed
    ("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
     ("did not finish within", f"wrote more than {MAX_CHARS} characters")),
    ("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}", f"wrote more than {MAX_CHARS} characters"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "cannot be rendered: RecursionError"),
    ("{{ messages.__class__.__mro__ }}", "cannot be rendered: SecurityError"),
], ids=["range-overflow", "nested-loops", "nested-loops-writing", "output", "recursion", "sandbox"])
def test_a_hash_correct_template_that_breaks_a_bound_is_one_line_naming_the_file(tiny_exports, tmp_path, capsys,
                                                                                 template, needle):
    folder = _copy(tiny_exports, tmp_path)
    _write_signed(folder, "chat_template.jinja", template.encode())
    rc, lines, seconds = _run_chat(folder, capsys)
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0].startswith("mtpkit run: error: the chat template ") and "internal error" not in lines[0]
    needles = needle if isinstance(needle, tuple) else (needle,)
    assert f"{folder / 'chat_template.jinja'} (line 1) " in lines[0] and any(n in lines[0] for n in needles), lines[0]
    assert seconds < RENDER_SECONDS + 20  # the export opens in a second or two; the render stops at its bound


@pytest.mark.slow
def test_a_template_that_loops_for_ever_stops_within_its_time_bound(tiny_exports):
    """The render itself, timed apart from opening the export: it ends at RENDER_SECONDS, within a second."""
    from mtpkit.runtime.tokenizer import TextCodec

    codec = TextCodec(load_manifest(tiny_exports(PAIR)))
    for template in (NESTED_LOOPS, "{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% endfor %}"
                                   "{% endfor %}"):
        codec.template = template
        error, seconds = _within(30, lambda: codec.render_chat([{"role": "user", "content": "hi"}]))
        assert isinstance(error, ManifestError) and "did not finish within" in str(error), error
        assert RENDER_SECONDS <= seconds < RENDER_SECONDS + 1.0


@pytest.mark.slow
def test_a_chat_template_file_larger_than_any_real_one_is_refused_before_it_is_read(tiny_exports, tmp_path):
    from mtpkit.runtime.chat_template import MAX_TEMPLATE_BYTES
    from mtpkit.runtime.tokenizer import TextCodec

    folder = _copy(tiny_exports, tmp_path)
    _write_signed(folder, "chat_template.jinja", b"x" * (MAX_TEMPLATE_BYTES + 1))
    with pytest.raises(ManifestError, match=f"chat_template.jinja is larger than {MAX_TEMPLATE_BYTES} bytes"):
        TextCodec(load_manifest(folder))


# --- chat templates: bounds on what one step builds (no export needed) ----------------------------------------------

@pytest.mark.parametrize("template,needle", [
    ("{{ 'x' * 10**10 }}", f"builds a value of more than {MAX_CHARS} characters"),
    ("{{ [0] * 10**9 }}", f"builds a value of more than {MAX_ITEMS} items"),
    ("{{ 10 ** 100000000 }}", "builds a value of more than 65536 bits"),
    ("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
     "builds a value of more than"),
    ("{% set ns = namespace(s=[1]) %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
     "builds a value of more than"),
    ("{{ 'x'.ljust(10**10) }}", "builds a value of more than"),
    ("{{ 'x'|center(10**10) }}", "builds a value of more than"),
    ("{% set s = 'x' * 1000000 %}{{ s|replace('', s) }}", "builds a value of more than"),
    ("{% set s = 'x' * 1000000 %}{{ s.replace('x', s) }}", "builds a value of more than"),
    ("{% set s = 'x' * 1000000 %}{{ range(100000)|join(s) }}", "builds a value of more than"),
    ("{% set s = 'x' * 1000000 %}{{ s.join(range(100000)|map('string')) }}", "builds a value of more than"),
    ("{% set s = '\n' * 1000000 %}{{ s|indent(100000) }}", "builds a value of more than"),
    ("{{ '%0100000000d' % 1 }}", "builds a value of more than"),
    ("{{ '%*d' % (10**9, 1) }}", "builds a value of more than"),
    ("{{ '{:>100000000}'.format(1) }}", "builds a value of more than"),
    ("{{ '{:>{}}'.format(1, 10**9) }}", "builds a value of more than"),
    ("{{ [1]|batch(10**9, 0)|list }}", f"builds a value of more than {MAX_ITEMS} items"),
    ("{{ [[0]]|sum(start=[]) }}", "sums something other than numbers"),
    ("{{ messages|tojson(indent=100000) }}", "asks tojson for an indent of more than 16"),
    ("{% set x %}{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}{% endset %}", "wrote more than"),
    ("{{ lipsum(100000) }}", "UndefinedError: 'lipsum' is undefined"),
    ("{% for %}", "cannot be rendered: TemplateSyntaxError"),
    ("{{ (10 ** 5000)|string }}", "cannot be rendered: ValueError: Exceeds the limit"),
    # small in memory, huge to print, compare or hash: parts held many times count each time
    ("{% set a = [0] * 200000 %}{% set b = [a] * 200000 %}{{ b|string|length }}", "characters and items"),
    ("{% set a = [0] * 200000 %}{% set b = [0] * 200000 %}{{ [a] * 20 == [b] * 20 }}", "characters and items"),
    ("{% set ns = namespace(a=(1,)) %}{% for i in range(64) %}{% set ns.a = (ns.a, ns.a) %}{% endfor %}{{ ns.a }}",
     "characters and items"),
    ("{% set ns = namespace() %}{% set ns.a = [ns] %}{{ ns }}", "characters and items"),
])
def test_a_template_cannot_build_a_huge_value_in_one_step(template, needle):
    started = time.monotonic()
    with pytest.raises(ManifestError, match="the chat template t.jinja") as e:
        render(template, Path("t.jinja"), messages=[{"role": "user", "content": "hi"}])
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert time.monotonic() - started < RENDER_SECONDS


def test_raise_exception_refuses_the_conversation_in_one_line():
    with pytest.raises(UsageError, match=r"^the chat template t.jinja refuses this conversation: roles must "
                                         r"alternate user/assistant$"):
        render("{{ raise_exception('roles must\nalternate user/assistant') }}", Path("t.jinja"), messages=[])


# a template with the constructs real chat templates use (Gemma's has tools / multimodal branches of this kind)
RICH_TEMPLATE = """{{ bos_token }}
{%- macro turn(role, text) -%}<start_of_turn>{{ role }}
{{ text | trim }}<end_of_turn>
{% endmacro -%}
{%- set ns = namespace(system='', count=0) -%}
{%- if messages[0]['role'] == 'system' -%}{%- set ns.system = messages[0]['content'] ~ '\\n\\n' -%}{%- endif -%}
{%- for message in messages if message['role'] != 'system' -%}
  {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
    {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
  {%- endif -%}
  {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
  {%- set text = (ns.system if loop.first else '') + message['content'] -%}
  {%- if message['content'] is string and message['content'].startswith('{') -%}
    {%- set text = text | replace('{', '[') | replace('}', ']') -%}
  {%- endif -%}
  {{ turn(role, text) }}
  {%- set ns.count = ns.count + 1 -%}
  {%- if loop.last and message['role'] == 'user' %}<!-- {{ '%d turns, %s' % (ns.count, 'ok') }} -->
{% endif -%}
{%- endfor -%}
{{ '{} words'.format(messages | map(attribute='content') | join(' ') | wordcount) }}
{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list | tojson(indent=2) }}
{{ (messages | map(attribute='role') | unique | sort | join(', ')) | indent(2, first=true) }}
{{ '-' * 3 }}{{ messages | length }}{% for k, v in {'b': 1, 'a': 2} | dictsort %}{{ k }}={{ v }};{% endfor %}
{%- if add_generation_prompt %}<start_of_turn>model
{% endif -%}"""


@pytest.mark.slow
def test_bounds_leave_real_templates_rendering_as_transformers_does(tiny_exports):
    """A template with the constructs real ones use renders exactly as transformers renders it, and a long
    conversation (400 turns, 1.6 MB of text) renders well inside the bounds."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tiny_exports(PAIR)))
    conversations = [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "{\"a\": 1}"},
         {"role": "assistant", "content": " yes "}, {"role": "user", "content": "again"}],
        [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 800} for i in range(400)],
    ]
    for messages in conversations:
        want = hf.apply_chat_template(messages, chat_template=RICH_TEMPLATE, tokenize=False, add_generation_prompt=True)
        started = time.monotonic()
        got = render(RICH_TEMPLATE, Path("t.jinja"), messages=messages, add_generation_prompt=True,
                     bos_token=hf.bos_token)
        assert got == want
        assert time.monotonic() - started < RENDER_SECONDS / 4
    with pytest.raises(UsageError, match="Conversation roles must alternate"):
        render(RICH_TEMPLATE, Path("t.jinja"), messages=[{"role": "assistant", "content": "x"}], bos_token="")
