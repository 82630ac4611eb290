"""Chat templates, rendered sandboxed as transformers renders them and within the bounds of
runtime/template_bounds.py.

The template is instrumented before it is compiled: every loop's items, every piece of output, every `~` and every
list, tuple or dict literal pass through the guard's filters; the sandbox checks every call, filter and growing
operator. A template that breaks a bound, the sandbox or Python's rules is a ManifestError naming the file and
line; one that calls raise_exception refuses the conversation, a UsageError.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import sys
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Iterable, Iterator, NoReturn, cast

import jinja2
import jinja2.ext
import jinja2.parser
from jinja2 import nodes
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from mtpkit.errors import ManifestError, UsageError

from .template_bounds import UPPER_BOUNDS, Bound, Guard, check_binop, check_call, materialized

MAX_TEMPLATE_BYTES = 1 << 20  # the file itself (real chat templates are tens of kB)
RECURSION_FRAMES = 400  # Python frames a render may nest below its caller (a macro level takes a handful)
_LOOP, _OUT, _SIZED = "_mtpkit_loop", "_mtpkit_out", "_mtpkit_sized"  # filters the instrumented template calls


class _Refusal(Exception):
    """raise_exception(message) called by the template."""


def render(template: str, path: Path, **variables: Any) -> str:
    """The template rendered with `variables`, within the bounds.

    Raises:
        ManifestError: the template broke a bound, the sandbox or Python's rules (naming `path`).
        UsageError: the template called raise_exception (the conversation does not suit it).
    """
    guard = Guard()
    try:
        env = _environment(guard)
        tree = _Instrument().visit(env.parse(template))
        tree.set_environment(env)
        compiled = env.from_string(tree)
        guard.start()
        with _recursion_budget():
            return compiled.render(**variables)
    except _Refusal as e:
        raise UsageError(f"the chat template {path} refuses this conversation: {_one_line(str(e))}") from e
    except Exception as e:  # anything the template's code raised: the template's fault, not a bug in mtpkit
        raise _failure(e, path) from e


@contextlib.contextmanager
def _recursion_budget(frames: int = RECURSION_FRAMES) -> Iterator[None]:
    """Python's recursion limit just above the caller's depth while a template renders: a template that recurses
    (a macro calling itself) otherwise overflows the C stack, a crash, before the default limit is reached (seen
    inside pytest, whose stack is deep); with the budget it ends in RecursionError, reported in one line."""
    depth, frame = 0, cast("FrameType | None", sys._getframe())
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(min(limit, depth + frames))
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


def _failure(e: Exception, path: Path) -> ManifestError:
    line = _template_line(e)
    where = f" (line {line})" if line else ""
    if isinstance(e, Bound):
        what = str(e)
    else:
        what = f"cannot be rendered: {type(e).__name__}: {_one_line(str(e)).rstrip('.') or 'no message'}"
    return ManifestError(f"the chat template {path}{where} {what}; fix the template, or re-export from a checkpoint "
                         "whose template works")


def _template_line(e: Exception) -> int | None:
    """The template line that raised: jinja rewrites the traceback so that template frames carry template lines."""
    if isinstance(e, jinja2.TemplateSyntaxError):
        return e.lineno
    tb, line = e.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 200 else text[:197] + "..."


class _Sandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox, with every call and the operators that can grow a value checked by the guard."""

    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, guard: Guard, **options: Any) -> None:
        super().__init__(**options)
        self.guard = guard

    # jinja's signature, hence __self (N805): kwargs may be "self"
    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        __self.guard.tick()
        method = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
        owner, name = getattr(method, "__self__", None), getattr(method, "__name__", None)
        if isinstance(owner, str) and name in UPPER_BOUNDS["method"]:
            if name == "join" and args:
                args = (materialized(args[0]), *args[1:])
            check_call(UPPER_BOUNDS["method"][name], owner, args, kwargs)
        return __self.guard.sized(super().call(__context, __obj, *args, **kwargs))

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        self.guard.tick()
        check_binop(operator, left, right)
        return self.guard.sized(super().call_binop(context, operator, left, right))


class _Instrument(NodeTransformer):
    """Routes every loop's items, every piece of output, every `~` and every literal through the guard's filters."""

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)  # transforms node in place (and returns it)
        node.iter = _filtered(cast(nodes.Expr, node.iter), _LOOP)  # jinja types it Node; the parser reads an Expr
        return node

    def visit_Output(self, node: nodes.Output) -> nodes.Output:
        self.generic_visit(node)
        node.nodes = [_filtered(child, _OUT) for child in node.nodes]
        return node

    def visit_Concat(self, node: nodes.Concat | nodes.List | nodes.Dict) -> nodes.Filter:
        self.generic_visit(node)
        return _filtered(node, _SIZED)

    visit_List = visit_Dict = visit_Concat

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Expr:
        self.generic_visit(node)
        return _filtered(node, _SIZED) if node.ctx == "load" else node  # not an assignment target


def _filtered(node: nodes.Expr, name: str) -> nodes.Filter:
    filtered = nodes.Filter(node, name, [], [], None, None)
    filtered.set_lineno(node.lineno or 1)
    return filtered


def _environment(guard: Guard) -> _Sandbox:
    """transformers 5.24's apply_chat_template environment (trim/lstrip blocks, loop controls, the `generation` tag,
    raise_exception, strftime_now, a tojson that does not escape HTML), guarded; no lipsum (it writes unbounded
    text in one call). The guard's own filters take the context, so jinja never folds them into constants."""
    env = _Sandbox(guard, trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters = {name: _guarded_filter(guard, name, f) for name, f in env.filters.items()}

    def loop_items(_context: Context, iterable: Iterable[Any]) -> Iterator[Any]:
        for item in iterable:
            guard.tick()
            yield item

    env.filters[_LOOP] = jinja2.pass_context(loop_items)
    env.filters[_OUT] = jinja2.pass_context(lambda _context, value: guard.wrote(value))
    env.filters[_SIZED] = jinja2.pass_context(lambda _context, value: guard.sized(value))
    env.globals.pop("lipsum", None)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


def _guarded_filter(guard: Guard, name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    skip = 0 if getattr(f, "jinja_pass_arg", None) is None else 1  # a context / eval_ctx / environment comes first
    size = UPPER_BOUNDS["filter"].get(name)

    @functools.wraps(f)  # keeps jinja_pass_arg
    def guarded(*args: Any, **kwargs: Any) -> Any:
        guard.tick()
        if size is not None and len(args) > skip:
            value = materialized(args[skip]) if name == "join" else args[skip]
            args = (*args[:skip], value, *args[skip + 1:])
            check_call(size, value, args[skip + 1:], kwargs)
        return guard.sized(f(*args, **kwargs))

    return guarded


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    if (len(indent) if isinstance(indent, str) else indent or 0) > 16:  # repeated once per nesting level and line
        raise Bound("asks tojson for an indent of more than 16")
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: object) -> NoReturn:
    raise _Refusal(message)


class _Generation(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %} (transformers' assistant-mask tag): rendered as its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()
