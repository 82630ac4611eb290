"""A conversation whose KV cache outlives its turns: each turn prefills only what is new.

The messages are rendered with the export's chat template every turn, and the engine prefills only the ids after
the longest common prefix with what its cache holds (Engine.cached_prefix): an edited or regenerated turn rewinds to
where the history first differs, the way a rejected draft rewinds. The tokens of every turn are therefore the tokens
a fresh prefill of the whole rendered conversation gives. An answer the model generated renders as the ids it
generated, not its text re-tokenized (TextCodec.encode_chat's kept), so the cache holds it as the history renders it;
an answer whose text was edited renders as text.

When the next turn does not fit the export's KV capacity, the oldest whole turns are dropped (drop_oldest) and
what remains is prefilled again, or ConversationFullError names both ways out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from mtpkit.errors import UsageError

if TYPE_CHECKING:
    from .engine import Engine, GenConfig
    from .stats import Stats


MAX_ANSWERS = 256  # generated answers remembered as ids (a history longer than this renders the oldest as text)


class ConversationFullError(UsageError):
    """The next turn does not fit the export's KV capacity, even after dropping what drop_oldest may drop."""


class Conversation:
    """messages: the history ([{"role", "content"}, ...]), editable between turns; reply() answers its last user
    message and appends the answer. dropped: whole turns dropped so far to fit the cache (drop_oldest)."""

    def __init__(self, engine: Engine, messages: list[dict] | None = None, drop_oldest: bool = False,
                 answers: dict[str, list[int]] | None = None):
        self.engine, self.drop_oldest = engine, drop_oldest
        self.messages: list[dict] = list(messages or [])
        self.dropped = 0
        self.prompt_ids: list[int] = []  # the latest turn's rendered history
        # generated answers' text -> their ids without the stop token (shared between Model.chat calls)
        self.answers: dict[str, list[int]] = {} if answers is None else answers

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
            ids = self.engine.codec.encode_chat(list(self.messages), self._kept())
            needed = self.engine.target.positions_needed(len(ids), cfg.max_new_tokens)
            if needed <= self.engine.kv.capacity:
                self.prompt_ids = ids
                return ids
            if not self.drop_oldest or not self._drop_oldest_turn():
                raise ConversationFullError(self._full_message(needed, cfg, alone=len(self._users()) < 2))

    def _kept(self) -> dict[int, list[int]]:
        """The assistant messages whose text is an answer this conversation generated: index -> its ids."""
        return {i: self.answers[m["content"]] for i, m in enumerate(self.messages)
                if m.get("role") == "assistant" and isinstance(m.get("content"), str) and m["content"] in self.answers}

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
        try:
            for token, _ in run:
                produced.append(token)
                yield token
        finally:  # an answer cut short (the caller stopped reading) stays in the history as far as it was seen
            run.close()
            if produced:
                text = self.engine.codec.decode(produced)
                self.messages.append({"role": "assistant", "content": text})
                self._remember(text, produced)

    def _remember(self, text: str, produced: list[int]) -> None:
        """Keep an answer's ids (without its stop token) under its text, newest last: past MAX_ANSWERS the oldest
        go first."""
        self.answers.pop(text, None)
        self.answers[text] = produced[:-1] if produced[-1] in self.engine.manifest.eos_ids else produced
        while len(self.answers) > MAX_ANSWERS:
            del self.answers[next(iter(self.answers))]
