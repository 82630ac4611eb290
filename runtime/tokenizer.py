"""Text <-> token ids from the manifest's tokenizer.json and chat template (tokenizers + jinja2 only)."""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Iterable, Iterator

from mtpkit.errors import UsageError

from .chat_template import MAX_TEMPLATE_BYTES, render
from .manifest import Manifest, ManifestError

if TYPE_CHECKING:
    import jinja2
    import jinja2.nodes
    import jinja2.parser


class TextCodec:
    def __init__(self, manifest: Manifest):
        from tokenizers import Tokenizer

        entry = manifest.tokenizer
        path = manifest.path(entry["file"])
        if not path.is_file():
            raise ManifestError(f"the tokenizer file {path} is missing; re-export the model")
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception for a file it cannot parse
            reason = (str(e).splitlines() or [type(e).__name__])[0][:200]
            raise ManifestError(f"{path} is not a valid tokenizer.json ({reason}); re-export the model") from e
        self.bos = manifest.tokens.bos
        self.add_bos = bool(entry.get("add_bos", True)) and self.bos is not None
        self.template, self.template_path = None, None
        if entry.get("chat_template_file"):
            self.template_path = path = manifest.path(entry["chat_template_file"])
            try:
                if path.stat().st_size > MAX_TEMPLATE_BYTES:
                    raise ManifestError(f"the chat template {path} is larger than {MAX_TEMPLATE_BYTES} bytes, which "
                                        "no chat template needs; re-export from a checkpoint with a working one")
                self.template = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise ManifestError(f"cannot read the chat template {path} ({e}); re-export the model") from e

    def encode(self, text: str, chat: bool = False) -> list[int]:
        """Token ids for a prompt; with chat, the text is one user turn in the model's chat template."""
        _check_text(text)
        if chat:
            return self.encode_chat([{"role": "user", "content": text}])
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        bos = self.bos if self.add_bos else None
        if bos is not None and (not ids or ids[0] != bos):
            ids = [bos, *ids]
        return ids

    def encode_chat(self, messages: list[dict], kept: dict[int, list[int]] | None = None,
                    tools: list[dict] | None = None, enable_thinking: bool | None = None) -> list[int]:
        """Token ids for a conversation ([{"role", "content"}, ...]) rendered with the chat template, ready for
        the model's next turn. kept: for some assistant messages (by index), the ids the model generated for their
        content (runtime/conversation.py); see _spliced. tools and enable_thinking reach the template as
        transformers' apply_chat_template passes them."""
        if not messages:
            raise UsageError("the conversation is empty; pass at least one message")
        for m in messages:  # a clear error instead of jinja's UndefinedError deep in the template
            _check_message(m)
        options = _template_options(tools, enable_thinking)
        text = self.render_chat(messages, **options)
        spliced = self._spliced(messages, text, kept, options) if kept else None
        return spliced if spliced is not None else self._ids(text)

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids  # the template writes BOS itself

    def _spliced(self, messages: list[dict], text: str, kept: dict[int, list[int]],
                 options: dict) -> list[int] | None:
        """The rendered conversation with each kept answer as the ids the model generated, where the template
        inserts that answer's text as it is or trimmed (Gemma's `| trim`) and nothing else: the model then reads
        its own answers as it wrote them (as LiteRT-LM's Conversation does), where text re-tokenized or trimmed
        would differ from what its cache holds. None (render the text) where the template does more."""
        marks = {_mark(i): i for i in kept}
        if "\ue000" in text:  # a message holds our mark's character: no splice rather than a wrong one
            return None
        marked = self.render_chat([{**m, "content": _mark(i)} if i in kept else m for i, m in enumerate(messages)],
                                  **options)
        pieces = re.split("(\ue000\\d+\ue001)", marked)
        if sorted(p for p in pieces if p in marks) != sorted(marks):  # each kept answer rendered once
            return None
        for trim in (False, True):
            content: dict[str, str] = {mark: messages[i]["content"].strip() if trim else messages[i]["content"]
                                       for mark, i in marks.items()}
            if "".join(content.get(p, p) for p in pieces) == text:
                return [t for p in pieces for t in (kept[marks[p]] if p in marks else self._ids(p) if p else [])]
        return None

    def render_chat(self, messages: list[dict], **options: object) -> str:
        """The conversation in the chat template, sandboxed and bounded (runtime/chat_template.py); options:
        tools, enable_thinking (_template_options)."""
        if self.template is None or self.template_path is None:  # set together in __init__
            raise ManifestError("this export has no chat template; drop --chat or re-export from a checkpoint with one")
        bos = self.tokenizer.id_to_token(self.bos) if self.bos is not None else ""
        return render(self.template, self.template_path, messages=_aliased(messages), add_generation_prompt=True,
                      bos_token=bos, **{"tools": None, **options})

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def decode_marked(self, ids: list[int]) -> str:
        """The text of ids with their special tokens (a chat answer's channel markers; runtime/channels.py)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    @functools.cached_property
    def specials(self) -> tuple[str, ...]:
        """The special tokens' texts, which a plain decode leaves out."""
        return tuple(t.content for t in self.tokenizer.get_added_tokens_decoder().values() if t.special)


REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # transformers' names for a message's thought


def _aliased(messages: list[dict]) -> list[dict]:
    """A message's thought under every name transformers gives it, so a template reads whichever it uses."""
    out = []
    for m in messages:
        thought = next((m[key] for key in REASONING_FIELDS if m.get(key) is not None), None)
        out.append(m if thought is None else {"thinking": thought, **m, "reasoning_content": thought})
    return out


def _template_options(tools: list[dict] | None, enable_thinking: bool | None) -> dict:
    """The template variables beyond the messages: tools always (None when absent, as transformers passes it),
    enable_thinking only when given (a template may test whether it is defined)."""
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise UsageError(f"tools must be a list of JSON-schema function declarations (dicts), got {tools!r:.80}")
    if enable_thinking is not None and not isinstance(enable_thinking, bool):
        raise UsageError(f"enable_thinking must be a bool (got {enable_thinking!r})")
    return {"tools": tools} if enable_thinking is None else {"tools": tools, "enable_thinking": enable_thinking}


def _check_message(m: object) -> None:
    """A message the template can read: a dict with a str role and a str content (an assistant message carrying
    tool_calls may leave its content out, as transformers allows)."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise UsageError(f"each chat message must be a dict with string 'role' and 'content' (got {m!r})")
    if m.get("content") is None and m.get("tool_calls"):
        return
    if not isinstance(m.get("content"), str):
        raise UsageError(f"each chat message must be a dict with string 'role' and 'content' (got {m!r})")
    _check_text(m["content"])


def _check_text(text: object) -> None:
    """Refuse what the tokenizer cannot take: a non-str, or lone surrogates (how Python passes on command-line
    bytes that are not UTF-8)."""
    if not isinstance(text, str):
        raise UsageError(f"the prompt must be a str (got {type(text).__name__})")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UsageError(f"the prompt is not valid UTF-8 (undecodable byte at character {e.start}); pass UTF-8 "
                         "text (or use --prompt-file)") from None


def _mark(index: int) -> str:
    """A placeholder for message `index`'s content (private-use characters: no template trims or escapes them)."""
    return f"\ue000{index}\ue001"


class StreamDecoder:
    """Turns a growing list of ids into text deltas without splitting multi-byte characters."""

    def __init__(self, codec: TextCodec, marked: bool = False):
        self.decode = codec.decode_marked if marked else codec.decode  # marked: special tokens kept
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.decode(self.ids)
        if text.endswith("\ufffd"):  # incomplete UTF-8 sequence; wait for the next token
            return ""
        delta, self.emitted = text[len(self.emitted):], text
        return delta


def text_deltas(codec: TextCodec, tokens: Iterable[int], marked: bool = False) -> Iterator[str]:
    """Text deltas of a stream of token ids; joined, they equal codec.decode (marked: decode_marked) of all."""
    decoder = StreamDecoder(codec, marked)
    for token in tokens:
        delta = decoder.push(token)
        if delta:
            yield delta
    # StreamDecoder holds back a trailing U+FFFD (it may be half a character); at the end it is final text
    tail = decoder.decode(decoder.ids)[len(decoder.emitted):]
    if tail:
        yield tail
