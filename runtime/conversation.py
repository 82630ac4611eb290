"""A conversation whose KV cache outlives its turns: each turn prefills only what is new.

The messages are rendered with the export's chat template every turn, and the engine prefills only the ids after
the longest common prefix with what its cache holds (Engine.cached_prefix): an edited or regenerated turn rewinds to
where the history first differs, the way a rejected draft rewinds, where the cache still holds the window before it
(on ONNX a sliding layer keeps the last answer and its window: an edit before that prefills again). The tokens of every turn are therefore the tokens
a fresh prefill of the whole rendered conversation gives. An answer this conversation generated renders as the ids
it generated, not its text re-tokenized (TextCodec.encode_chat's kept), so the cache holds it as the history renders
it; an answer whose text was edited renders as text. save() writes the history with those ids, and load() restores
it to continue with the tokens the saved conversation would have given.

When the next turn does not fit the export's KV capacity, the oldest whole turns are dropped (drop_oldest) and
what remains is prefilled again, or ConversationFullError names both ways out.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from mtpkit.errors import UsageError

from .channels import Split, split

if TYPE_CHECKING:
    from .engine import Engine, GenConfig
    from .stats import Stats


MAX_ANSWERS = 256  # generated answers remembered as ids (a history longer than this renders the oldest as text)
FORMAT, VERSION = "mtpkit.conversation", 1  # what save() writes and load() reads


class ConversationFullError(UsageError):
    """The next turn does not fit the export's KV capacity, even after dropping what drop_oldest may drop."""


class Conversation:
    """messages: the history ([{"role", "content"}, ...]), editable between turns; reply() answers its last user
    message and appends the answer. dropped: whole turns dropped so far to fit the cache (drop_oldest)."""

    def __init__(self, engine: Engine, messages: list[dict] | None = None, drop_oldest: bool = False,
                 tools: list[dict] | None = None, enable_thinking: bool | None = None):
        self.engine, self.drop_oldest = engine, drop_oldest
        self.tools, self.enable_thinking = tools, enable_thinking  # rendered by the template every turn
        self.messages: list[dict] = list(messages or [])
        self.dropped = 0
        self.prompt_ids: list[int] = []  # the latest turn's rendered history
        self.answers: dict[str, list[int]] = {}  # generated answers' text -> their ids without the stop token
        self.split: Split | None = None  # the latest answer in its channels (text, thought, tool calls)

    def save(self, path: str | Path) -> None:
        """Write the history as JSON: the messages, the tools and enable_thinking, each kept answer's ids by message
        index, the turns dropped so far and the sha256 of the tokenizer the ids belong to. Replaced in one step: a
        crash leaves the old file."""
        state = {"format": FORMAT, "version": VERSION, "tokenizer_sha256": self.engine.manifest.tokenizer["sha256"],
                 "messages": self.messages, "dropped": self.dropped, "tools": self.tools,
                 "enable_thinking": self.enable_thinking,
                 "kept": [{"message": i, "ids": ids} for i, ids in sorted(self._kept().items())]}
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(state, ensure_ascii=False, indent=1), encoding="utf-8")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)  # gone after the replace; a failed write leaves no stray file

    @classmethod
    def load(cls, engine: Engine, path: str | Path, drop_oldest: bool = False) -> Conversation:
        """A conversation saved by save(), on the export it was saved from (the same tokenizer): its next turn
        renders, and so generates, exactly as the saved one's would have."""
        state = _read_state(Path(path), engine)
        conversation = cls(engine, state["messages"], drop_oldest, state.get("tools"), state.get("enable_thinking"))
        conversation.dropped = state["dropped"]
        for entry in state["kept"]:
            conversation.answers[conversation.messages[entry["message"]]["content"]] = list(entry["ids"])
        return conversation

    def reset(self) -> None:
        """Forget the history (the cache is overwritten from the first position by the next turn)."""
        self.messages.clear()

    def send(self, text: str, cfg: GenConfig, stats: Stats | None = None) -> Iterator[int]:
        """Add a user message and stream the answer's token ids (see reply)."""
        self.messages.append({"role": "user", "content": text})
        try:
            prompt = self.fit(cfg)
        except UsageError:
            self.messages.pop()  # a turn that cannot run never happened
            raise
        return self._answer(prompt, cfg, stats)

    def reply(self, cfg: GenConfig, stats: Stats | None = None) -> Iterator[int]:
        """Stream the token ids of the assistant's answer to the history as it stands (a regenerated answer: drop
        the last assistant message first), appended to messages once the stream ends. Raises
        ConversationFullError (before any token) when the turn cannot fit."""
        return self._answer(self.fit(cfg), cfg, stats)

    def fit(self, cfg: GenConfig) -> list[int]:
        """The rendered history's ids, after dropping the oldest whole turns while it does not fit (drop_oldest)."""
        while True:
            ids = self.engine.codec.encode_chat(list(self.messages), self._kept(), self.tools, self.enable_thinking)
            needed = self.engine.target.positions_needed(len(ids), cfg.max_new_tokens)
            if needed <= self.engine.kv.capacity:
                self.prompt_ids = ids
                return ids
            if not self.drop_oldest or not self._drop_oldest_turn():
                raise ConversationFullError(self._full_message(needed, cfg, alone=len(self._users()) < 2))

    def _kept(self) -> dict[int, list[int]]:
        """The assistant messages whose text is an answer this conversation generated: index -> its ids."""
        return {i: self.answers[m["content"]] for i, m in enumerate(self.messages) if m.get("role") == "assistant"
                and not m.get("tool_calls") and isinstance(m.get("content"), str) and m["content"] in self.answers}

    def _drop_oldest_turn(self) -> bool:
        """Remove the first turn (a user message and what follows it up to the next user message) unless it is
        the last one; system messages stay. False when nothing can go."""
        users = self._users()
        if len(users) < 2:
            return False
        del self.messages[users[0]:users[1]]
        self.dropped += 1
        return True

    def _users(self) -> list[int]:
        return [i for i, m in enumerate(self.messages) if m["role"] == "user"]

    def _full_message(self, needed: int, cfg: GenConfig, alone: bool) -> str:
        room = f"{needed} positions with max_new_tokens {cfg.max_new_tokens}, beyond the export's KV capacity of " \
            f"{self.engine.kv.capacity}"
        if alone:
            return f"the last message alone needs {room}: shorten it, lower max_new_tokens or re-export with a " \
                "larger --max-cache-len"
        return f"the conversation needs {room}: drop the oldest turns (--drop-oldest, drop_oldest=True) or start " \
            "over (/reset, reset())"

    def _answer(self, prompt: list[int], cfg: GenConfig, stats: Stats | None) -> Iterator[int]:
        produced: list[int] = []
        run = self.engine.generate(prompt, cfg, stats, reuse=True)
        self.split = None
        try:
            for token, _ in run:
                produced.append(token)
                yield token
        finally:  # an answer cut short (the caller stopped reading) stays in the history as far as it was seen
            run.close()
            if produced:
                self._keep_answer(produced)

    def _keep_answer(self, produced: list[int]) -> None:
        """The answer joins the history in its channels: its text as content, its calls as tool_calls, its thought
        as reasoning_content (the template decides which thoughts it renders). Only an answer without markup is
        remembered as its ids: those hold the markup its content does not."""
        codec = self.engine.codec
        self.split = answer = split(codec.decode_marked(produced), codec.specials)
        message: dict = {"role": "assistant", "content": answer.text}
        if answer.tool_calls:
            message["tool_calls"] = [{"type": "function", "function": call} for call in answer.tool_calls]
        if answer.thought:
            message["reasoning_content"] = answer.thought
        self.messages.append(message)
        if not answer.marked:
            self._remember(answer.text, produced)

    def _remember(self, text: str, produced: list[int]) -> None:
        """Keep an answer's ids (without its stop token) under its text, newest last: past MAX_ANSWERS the oldest
        go first."""
        self.answers.pop(text, None)
        self.answers[text] = produced[:-1] if produced[-1] in self.engine.manifest.eos_ids else produced
        while len(self.answers) > MAX_ANSWERS:
            del self.answers[next(iter(self.answers))]


def _read_state(path: Path, engine: Engine) -> dict:
    """The JSON save() wrote, checked: UsageError in one line for a file that is not one, or holds ids of another
    tokenizer (they would render as other text)."""
    def refuse(reason: str) -> UsageError:
        return UsageError(f"{path} is not a conversation mtpkit can restore ({reason}); restore a file written by "
                          "Conversation.save on the same export")

    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise refuse(f"{type(e).__name__}: {e}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT or state.get("version") != VERSION:
        raise refuse(f"no {FORMAT} version {VERSION} header")
    if state.get("tokenizer_sha256") != engine.manifest.tokenizer["sha256"]:
        raise refuse("it was saved with another tokenizer, so its kept ids would read as other text")
    messages, kept, dropped = state.get("messages"), state.get("kept"), state.get("dropped")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise refuse("'messages' is not a list of messages")
    if not isinstance(dropped, int) or isinstance(dropped, bool) or dropped < 0:
        raise refuse("'dropped' is not a count")
    vocab = engine.codec.tokenizer.get_vocab_size()
    for entry in kept if isinstance(kept, list) else [None]:
        if not _kept_entry_fits(entry, messages, vocab):
            raise refuse(f"a 'kept' entry is not an assistant message's index with ids below {vocab}: {entry!r:.80}")
    return state


def _kept_entry_fits(entry: object, messages: list[dict], vocab: int) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("ids"), list):
        return False
    i = entry.get("message")
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(messages):
        return False
    is_answer = messages[i].get("role") == "assistant" and isinstance(messages[i].get("content"), str)
    return is_answer and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in entry["ids"])
