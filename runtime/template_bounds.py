"""The bounds a chat template renders within (runtime/chat_template.py applies them): a template comes with the
checkpoint and runs inside the runtime's process, so one that loops for ever or builds gigabytes must stop early.

- time: RENDER_SECONDS, checked at every loop iteration, call, filter, intercepted operator and piece of output
  (Guard.tick);
- size: MAX_CHARS characters written in all (output, `{% set %}` blocks, macro bodies); and every value the
  template builds (literal, call, filter or operator result) holds at most MAX_CHARS characters and items
  counted through every level, a part it holds twice counted twice (what printing, comparing or hashing it
  costs), at most MAX_ITEMS at its top level; integers have at most MAX_INT_BITS bits (Guard.sized);
- one step: a call or operator whose result can be far larger than its arguments (repetition `*`, `**`, widths,
  replace, join, indent, `%` and format specs, ...) is refused before it runs when its result would break the
  size bound (UPPER_BOUNDS), so no single step allocates past it either.
Generous for real templates: they render in milliseconds and write the prompt once.
"""

from __future__ import annotations

import re
import string
import time
from types import MappingProxyType
from typing import Any, Callable, Collection, ItemsView, Iterable, Iterator, Sequence, TypeGuard, TypeVar

from jinja2.utils import Namespace

RENDER_SECONDS = 2.0
MAX_CHARS = 1 << 22
MAX_ITEMS = 1 << 18
MAX_INT_BITS = 1 << 16
# what can hold other values (concrete types: isinstance against the abc classes is ten times slower)
_ITEMS: type[ItemsView[Any, Any]] = type({}.items())
_MAPPINGS = (dict, MappingProxyType)
_HOLDERS: tuple[type[Collection[Any]] | type[Namespace], ...] = (
    list, tuple, set, frozenset, *_MAPPINGS, type({}.keys()), type({}.values()), _ITEMS, Namespace)

_T = TypeVar("_T")


class Bound(Exception):
    """A bound broken; the message says which, as the end of "the chat template FILE ..."."""


class Guard:
    """One render's clock and write count."""

    def __init__(self) -> None:
        self.deadline: float | None = None
        self.written = 0

    def start(self) -> None:
        self.deadline = time.monotonic() + RENDER_SECONDS

    def tick(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise Bound(f"did not finish within {RENDER_SECONDS:g} s (it loops for ever, or far too long)")

    def wrote(self, value: _T) -> _T:
        self.tick()
        self.written += len(value) if isinstance(value, str) else len(str(self.sized(value)))
        if self.written > MAX_CHARS:
            raise Bound(f"wrote more than {MAX_CHARS} characters")
        return value

    def sized(self, value: _T) -> _T:
        """value, unless it is larger than a template may build."""
        if isinstance(value, str):
            limit(len(value), MAX_CHARS, "characters")
        elif is_int(value):
            limit(value.bit_length(), MAX_INT_BITS, "bits")
        elif isinstance(value, _HOLDERS):
            if not isinstance(value, Namespace):  # the cheap check first: walking a long list takes a while
                limit(len(value), MAX_ITEMS, "items")
            self._weigh(value)
        return value

    def _weigh(self, value: object) -> None:
        """Refuse value if it holds more than MAX_CHARS characters and items through every level. A part held
        twice counts twice (printing, comparing or hashing the value costs that), but is weighed once."""
        known: dict[int, int] = {}  # id -> weight; everything weighed is held by value, so ids stay theirs

        def weight(x: Any) -> int:
            if id(x) in known:
                return known[id(x)]
            known[id(x)] = MAX_CHARS + 1  # met again while being weighed: a namespace that holds itself
            total = 1 if isinstance(x, Namespace) else len(x)
            for part in _parts(x):
                total += len(part) if isinstance(part, str) else weight(part) if isinstance(part, _HOLDERS) else 1
                if total > MAX_CHARS:
                    raise Bound(f"builds a value of more than {MAX_CHARS} characters and items")
            self.tick()
            known[id(x)] = total
            return total

        weight(value)


def _parts(x: Any) -> Iterator[Any]:
    """What x holds (a mapping: its keys and values)."""
    if isinstance(x, Namespace):
        yield object.__getattribute__(x, "_Namespace__attrs")
    elif isinstance(x, (*_MAPPINGS, _ITEMS)):
        for key, value in x.items() if isinstance(x, _MAPPINGS) else x:
            yield key
            yield value
    else:
        yield from x


def limit(size: int, bound: int, unit: str) -> None:
    if size > bound:
        raise Bound(f"builds a value of more than {bound} {unit}")


def is_int(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def check_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse `left operator right` before it runs if its result would break a bound."""
    if operator == "*" and is_int(left) and is_int(right):
        limit(left.bit_length() + right.bit_length(), MAX_INT_BITS, "bits")
    elif operator == "*":
        seq, n = (left, right) if is_int(right) else (right, left)
        if is_int(n) and isinstance(seq, str):
            limit(len(seq) * n, MAX_CHARS, "characters")
        elif is_int(n) and isinstance(seq, (list, tuple)):
            limit(len(seq) * n, MAX_ITEMS, "items")
    elif operator == "**" and is_int(left) and is_int(right) and right > 0 and abs(left) > 1:
        limit(left.bit_length() * right, MAX_INT_BITS, "bits")
    elif operator == "%" and isinstance(left, str):
        limit(_percent_size(left, right if isinstance(right, (tuple, dict)) else (right,)), MAX_CHARS, "characters")


def check_call(size: Callable[..., int], value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a call whose result `size` (an entry of UPPER_BOUNDS) says would break the size bound."""
    try:
        estimate = size(value, *args, **kwargs)
    except (TypeError, ValueError, AttributeError):  # arguments the call itself refuses: it raises the error
        return
    limit(estimate, MAX_CHARS, "characters")


def materialized(items: Iterable[Any]) -> Sequence[Any]:
    """A lazy sequence (map, select, a generator) as a list, so that a size can be computed from it; one item at a
    time, so that the bound holds early."""
    if isinstance(items, (list, tuple, str)):
        return items
    out: list[Any] = []
    for item in items:
        out.append(item)
        limit(len(out), MAX_ITEMS, "items")
    return out


# Upper bounds of a call's result in characters, for the calls whose result can be far larger than their
# arguments; value is the string a method is called on, or a filter's first argument.

def _width_size(value: object, width: object = 0, *_args: object, **_kwargs: object) -> int:
    return max(len(str(value)), width if is_int(width) else 0)


def _replace_size(value: object, old: object, new: object, count: object = None) -> int:
    s, old, new = str(value), str(old), str(new)
    hits = len(s) + 1 if not old else s.count(old)
    if is_int(count) and count >= 0:
        hits = min(hits, count)
    return len(s) + hits * max(0, len(new) - len(old))


def _join_size(sep: str, items: Sequence[Any]) -> int:
    return sum(len(str(x)) for x in items) + len(sep) * max(0, len(items) - 1)


def _join_filter_size(value: Sequence[Any], d: object = "", attribute: object = None) -> int:
    return _join_size(str(d), value)


def _indent_size(value: object, width: object = 4, *_args: object, **_kwargs: object) -> int:
    s = str(value)
    return len(s) + (s.count("\n") + 1) * (width if is_int(width) else len(str(width)))


def _expandtabs_size(value: str, tabsize: int = 8) -> int:
    return len(value) + value.count("\t") * max(tabsize, 0)


def _translate_size(value: str, table: object) -> int:
    longest = max((len(v) for v in table.values() if isinstance(v, str)), default=1) if isinstance(table, dict) else 1
    return len(value) * max(longest, 1)


def _wordwrap_size(value: object, width: object = 79, break_long_words: object = True, wrapstring: object = None,
                   *_args: object, **_kwargs: object) -> int:
    return len(str(value)) * (1 + len(str(wrapstring or "\n")))


def _urlize_size(value: object, trim_url_limit: object = None, nofollow: object = False, target: object = None,
                 rel: object = None, *_args: object, **_kwargs: object) -> int:
    s = str(value)
    return 3 * len(s) + len(s.split()) * (64 + len(str(target or "")) + len(str(rel or "")))


def _brace_size(value: str, *args: object, **kwargs: object) -> int:
    """str.format / format_map: the template plus every width written in it (nested widths come from args)."""
    size = len(value)
    for _, _, spec, _ in string.Formatter().parse(value):
        size += sum(int(n) for n in re.findall(r"\d+", spec or ""))
        if spec and "{" in spec:
            size += sum(abs(v) for v in (*args, *kwargs.values()) if is_int(v))
    return size


def _format_map_size(value: str, mapping: object) -> int:
    return _brace_size(value, **mapping) if isinstance(mapping, dict) else len(value)


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?")


def _percent_size(fmt: str, values: tuple[object, ...] | dict[str, object]) -> int:
    """`fmt % values`: the format plus every width and precision in it (a `*` takes one from values)."""
    operands = values.values() if isinstance(values, dict) else values
    size = len(fmt)
    for width, precision in _PERCENT_SPEC.findall(fmt):
        size += sum(int(n) for n in (width, precision) if n.isdigit())
        if "*" in (width, precision):
            size += sum(abs(v) for v in operands if is_int(v))
    return size


def _format_filter_size(value: object, *args: object, **kwargs: object) -> int:
    return _percent_size(str(value), kwargs or args)


def _batch_size(_value: object, linecount: int, fill_with: object = None) -> int:
    if fill_with is not None:  # the last batch is padded to linecount with fill_with
        limit(linecount, MAX_ITEMS, "items")
    return 0


def _slice_size(_value: object, slices: int, fill_with: object = None) -> int:  # always `slices` lists
    limit(slices, MAX_ITEMS, "items")
    return 0


def _sum_size(_value: object, attribute: object = None, start: object = 0) -> int:
    if not isinstance(start, (int, float)):  # a sum of lists copies the growing list once per item (quadratic)
        raise Bound("sums something other than numbers (use a loop)")
    return 0


UPPER_BOUNDS: dict[str, dict[str, Callable[..., int]]] = {
    "method": {"ljust": _width_size, "rjust": _width_size, "center": _width_size, "zfill": _width_size,
               "replace": _replace_size, "join": _join_size, "expandtabs": _expandtabs_size,
               "translate": _translate_size, "format": _brace_size, "format_map": _format_map_size},
    "filter": {"center": _width_size, "indent": _indent_size, "replace": _replace_size, "join": _join_filter_size,
               "wordwrap": _wordwrap_size, "urlize": _urlize_size, "format": _format_filter_size,
               "batch": _batch_size, "slice": _slice_size, "sum": _sum_size},
}
