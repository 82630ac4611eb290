"""A chat answer split into its channels as Gemma 4 writes them: the thought (`<|channel>thought\\n ...
<channel|>`), tool calls (`<|tool_call>call:NAME{key:value,...}<tool_call|>`, strings in `<|"|>`) and the text.

The splitter reads the answer's text decoded with its special tokens (Gemma 4's markers are special tokens, which
a plain decode drops) and works on a stream: it holds back only what may still become a marker, so the text
streamed holds no markup and the pieces, joined per channel, equal the whole answer split at once. Special tokens
that are not markers are dropped from the text, as a plain decode drops them. A call that does not parse goes to
the text as written, and the split says why it did not parse: generation never raises for what the model wrote.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator

THOUGHT_OPEN, THOUGHT_CLOSE = "<|channel>", "<channel|>"
CALL_OPEN, CALL_CLOSE = "<|tool_call>", "<tool_call|>"
CHANNEL_NAME = "thought\n"  # what follows <|channel> in Gemma 4's thought channel
QUOTE = '<|"|>'  # Gemma 4's string delimiter in calls
MARKERS = (THOUGHT_OPEN, THOUGHT_CLOSE, CALL_OPEN, CALL_CLOSE)
_NAME = re.compile(r"call:([A-Za-z_][\w.-]*)\{")
_BARE = re.compile(r"[^,:{}\[\]]+")


class Piece(str):
    """A streamed piece of an answer: its text, and the channel it belongs to ("text" or "thought"); a piece of
    kind "tool_call" is empty text with the parsed call in `call`."""

    kind: str
    call: dict | None

    def __new__(cls, text: str, kind: str = "text", call: dict | None = None) -> Piece:
        piece = super().__new__(cls, text)
        piece.kind, piece.call = kind, call
        return piece


@dataclass
class Split:
    """An answer split into channels (what Splitter.feed/finish streamed, gathered)."""

    text: str = ""
    thought: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    tool_call_error: str | None = None  # why a call did not parse (its markup is then in text)
    marked: bool = False  # the answer held a marker: its ids are not just its text

    def add(self, piece: Piece) -> None:
        if piece.kind == "tool_call":
            self.tool_calls.append(piece.call or {})
        elif piece.kind == "thought":
            self.thought += piece
        else:
            self.text += piece


class Splitter:
    """Feed it the answer's text (special tokens included) as it grows; it yields Pieces."""

    def __init__(self, specials: Iterable[str] = ()):
        self.markers = marker_set(tuple(specials))
        self.state, self.buffer, self.held = "text", "", ""
        self.named = False  # in a thought: past its channel name line
        self.split = Split()

    def feed(self, delta: str) -> Iterator[Piece]:
        self.held += delta
        while True:
            hit = self.markers.first(self.held)
            if hit is None:
                break
            at, marker = hit
            yield from self._emit(self.held[:at])
            self.held = self.held[at + len(marker):]
            yield from self._marker(marker)
        safe = len(self.held) - self.markers.partial(self.held)
        yield from self._emit(self.held[:safe])
        self.held = self.held[safe:]

    def finish(self) -> Iterator[Piece]:
        """The rest: held text as it is, and an open thought or call closed by the end of the answer."""
        yield from self._emit(self.held)
        self.held = ""
        if self.state == "call":
            yield from self._failed(CALL_OPEN + self.buffer, "the call has no closing <tool_call|>")
        elif self.state == "thought":
            yield from self._close_thought()

    def _emit(self, text: str) -> Iterator[Piece]:
        if not text:
            return
        if self.state == "call":
            self.buffer += text
        elif self.state == "thought" and not self.named:
            self.buffer += text  # the channel's name line is not part of the thought: wait until it is known
            if len(self.buffer) > len(CHANNEL_NAME) or not CHANNEL_NAME.startswith(self.buffer):
                yield from self._name_settled()
        else:
            yield from self._out(Piece(text, self.state))

    def _name_settled(self) -> Iterator[Piece]:
        self.named, rest, self.buffer = True, self.buffer, ""
        if not CHANNEL_NAME.startswith(rest) or len(rest) > len(CHANNEL_NAME):
            yield from self._out(Piece(rest.removeprefix(CHANNEL_NAME), "thought"))

    def _marker(self, marker: str) -> Iterator[Piece]:
        self.split.marked = self.split.marked or marker in MARKERS
        if self.state == "call" and marker != CALL_CLOSE:
            self.buffer += marker  # a call's syntax is made of special tokens (Gemma 4's <|"|>): kept for the parser
        elif marker == THOUGHT_OPEN and self.state == "text":
            self.state, self.buffer, self.named = "thought", "", False
        elif marker == THOUGHT_CLOSE and self.state == "thought":
            yield from self._close_thought()
        elif marker == CALL_OPEN and self.state == "text":
            self.state, self.buffer = "call", ""
        elif marker == CALL_CLOSE and self.state == "call":
            source, self.state, self.buffer = self.buffer, "text", ""
            try:
                yield from self._out(Piece("", "tool_call", parse_call(source)))
            except ValueError as e:
                yield from self._failed(CALL_OPEN + source + CALL_CLOSE, str(e))
        elif marker in (CALL_OPEN, CALL_CLOSE, THOUGHT_OPEN, THOUGHT_CLOSE):
            yield from self._emit(marker)  # out of place (a call marker inside a thought): kept as written
        # any other special token is dropped, as a plain decode drops it

    def _close_thought(self) -> Iterator[Piece]:
        if not self.named:
            yield from self._name_settled()
        self.state, self.buffer = "text", ""

    def _failed(self, source: str, reason: str) -> Iterator[Piece]:
        self.split.tool_call_error = self.split.tool_call_error or reason
        self.state = "text"
        yield from self._out(Piece(source, "text"))

    def _out(self, piece: Piece) -> Iterator[Piece]:
        if piece or piece.kind == "tool_call":
            self.split.add(piece)
            yield piece


def split(raw: str, specials: Iterable[str] = ()) -> Split:
    """The whole answer split at once (the same Pieces the stream gives, gathered)."""
    splitter = Splitter(specials)
    for _ in splitter.feed(raw):
        pass
    for _ in splitter.finish():
        pass
    return splitter.split


def pieces(deltas: Iterable[str], specials: Iterable[str] = ()) -> Iterator[Piece]:
    """The Pieces of an answer streamed as text deltas decoded with its special tokens."""
    splitter = Splitter(specials)
    for delta in deltas:
        yield from splitter.feed(delta)
    yield from splitter.finish()


class MarkerSet:
    """The markers and the other special tokens, found by lookups rather than by trying each: a tokenizer may have
    thousands of special tokens, and every streamed delta is searched."""

    def __init__(self, specials: tuple[str, ...]):
        self.all = set(MARKERS) | {t for t in specials if t}
        self.lengths = sorted({len(t) for t in self.all}, reverse=True)  # the longest first at a place
        self.prefixes = {t[:n] for t in self.all for n in range(1, len(t))}
        self.longest = self.lengths[0]

    def first(self, text: str) -> tuple[int, str] | None:
        """The earliest marker in text (the longest at that place)."""
        for at in range(len(text)):
            for n in self.lengths:
                if text[at:at + n] in self.all:
                    return at, text[at:at + n]
        return None

    def partial(self, text: str) -> int:
        """How many characters at text's end may be the start of a marker."""
        return max((n for n in range(1, min(len(text), self.longest - 1) + 1) if text[-n:] in self.prefixes),
                   default=0)


@functools.lru_cache(maxsize=4)
def marker_set(specials: tuple[str, ...]) -> MarkerSet:
    return MarkerSet(specials)


def parse_call(source: str) -> dict:
    """`call:NAME{key:value,...}` -> {"name", "arguments"}; ValueError saying what is wrong."""
    head = _NAME.match(source)
    if head is None:
        raise ValueError(f"a tool call must read call:NAME{{...}} (got {source[:60]!r})")
    value, end = _value(source, head.end() - 1)
    if end != len(source):
        raise ValueError(f"unexpected text after the call's arguments: {source[end:end + 40]!r}")
    return {"name": head.group(1), "arguments": value}


def _value(s: str, i: int) -> tuple[object, int]:
    """One value of Gemma 4's call syntax at s[i]: {k:v}, [v], <|"|>string<|"|>, a JSON string or a bare word."""
    if s.startswith("{", i) or s.startswith("[", i):
        return _container(s, i)
    if s.startswith(QUOTE, i):
        end = s.find(QUOTE, i + len(QUOTE))
        if end < 0:
            raise ValueError("a string in the call has no closing <|\"|>")
        return s[i + len(QUOTE):end], end + len(QUOTE)
    if s.startswith('"', i):
        try:
            return json.JSONDecoder().raw_decode(s, i)
        except json.JSONDecodeError as e:
            raise ValueError(f"a string in the call is not valid JSON ({e.msg})") from None
    word = _BARE.match(s, i)
    if word is None:
        raise ValueError(f"a value is missing at {s[i:i + 20]!r}")
    return _scalar(word.group().strip()), word.end()


def _container(s: str, i: int) -> tuple[object, int]:
    """{key:value,...} or [value,...] at s[i]; keys bare or quoted."""
    close, pairs, values, i = "}" if s[i] == "{" else "]", [], [], i + 1
    while not s.startswith(close, i):
        if i >= len(s):
            raise ValueError(f"the call's arguments end before their closing {close}")
        if close == "}":
            key, i = _value(s, i) if s.startswith((QUOTE, '"'), i) else _key(s, i)
            if not s.startswith(":", i):
                raise ValueError(f"expected ':' after the key {key!r}")
            value, i = _value(s, i + 1)
            pairs.append((str(key), value))
        else:
            value, i = _value(s, i)
            values.append(value)
        if s.startswith(",", i):
            i += 1
        elif not s.startswith(close, i):
            raise ValueError(f"expected ',' or {close!r} at {s[i:i + 20]!r}")
    return (dict(pairs) if close == "}" else values), i + 1


def _key(s: str, i: int) -> tuple[str, int]:
    word = _BARE.match(s, i)
    if word is None:
        raise ValueError(f"a key is missing at {s[i:i + 20]!r}")
    return word.group().strip(), word.end()


def _scalar(word: str) -> object:
    """A bare value as JSON reads it (numbers, true, false, null); any other word stays a string."""
    try:
        return json.loads(word)
    except json.JSONDecodeError:
        return word
