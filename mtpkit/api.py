"""The Python API: export a Gemma 4 target + MTP drafter, open the export, generate, stream and chat.

Only the standard library is imported here at module level, so `import mtpkit` stays cheap: the runtime (numpy,
onnxruntime, tokenizers) loads when an export is opened, and the export side (torch, transformers) only inside
export_pair(). Programs that only run exports never import torch.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Generator, Iterator

if TYPE_CHECKING:
    from mtpkit.runtime.channels import Piece
    from mtpkit.runtime.conversation import Conversation as ConversationState
    from mtpkit.runtime.engine import Engine, GenConfig
    from mtpkit.runtime.stats import Stats

__all__ = ["Conversation", "Generation", "Model", "export_pair", "gen_config", "load"]


def export_pair(target: str | Path, drafter: str | Path, out: str | Path, **options) -> Path:
    """Export `target` + its MTP `drafter` (local HF folders or hub ids) to the folder `out`; returns it.

    Options are the fields of mtpkit.export.config.ExportConfig (one per `mtpkit export` flag), mainly:
      backend="onnx"         "onnx,litert" also writes the .tflite graphs and model.litertlm ([litert] extra)
      max_cache_len=None     KV capacity the runtime preallocates: prompt + generated tokens (None: 4096, or
                             the target's max_position_embeddings when that is smaller)
      force=False            replace an existing `out`
      check=True             compare every graph with PyTorch and fail loudly on any difference
      reference_tokens=32    new tokens per prompt recorded from transformers for `mtpkit parity`
      prefill_len=None, max_draft=None    LiteRT static shapes (prefill chunk: 128; drafts per verify call: the
                             drafter's num_assistant_tokens), each capped by the KV capacity when not given
      target_revision=None, drafter_revision=None     hub revisions
      memory_budget=None     GiB the export may use at its peak (default: MemAvailable); an export estimated to
                             need more anonymous memory raises MemoryBudgetError before any weight loads
                             (docs/export-memory.md)
      dtype="auto"           what the target's weights are held in while exporting: "fp32" / "bf16" / "fp16", or
                             auto: fp32 when the memory preflight says it fits, else the checkpoint's own dtype
                             (the graphs are the same: weights upcast exactly)
    Needs the [export] extra (torch, transformers).
    """
    from mtpkit.extras import require

    require("export", "mtpkit.export_pair()")  # one clear line instead of an ImportError from deep in the pipeline
    from mtpkit.export.config import ExportConfig
    from mtpkit.export.pipeline import export_model

    return export_model(ExportConfig(target=str(target), drafter=str(drafter), out=Path(out), **options))


def load(export_dir: str | Path, backend: str | None = None, threads: int | None = None) -> Model:
    """Open an export folder: checks every graph against its sha256, opens the sessions, preallocates the KV cache.

    backend: "onnx" | "litert" (default: onnx when the export has it); threads: intra-op threads (default: per
    graph, the faster of 1 and all cores, timed when the export opens).
    """
    from mtpkit.runtime.engine import Engine

    return Model(Engine(export_dir, threads, backend))


# Model's generation keywords, with their defaults (runtime/engine.py GenConfig and SamplingConfig hold them):
#   max_new_tokens=64        generation stops there or at an EOS token
#   mtp=True                 False decodes without the drafter on the same target graph
#   num_assistant_tokens=None  the draft length k per round; None or "auto": chosen each round by the cost model
#                            from measured call costs and observed acceptance (plain decoding when drafting does not pay)
#   temperature=0.0, top_k=0, top_p=1.0, seed=None   sampling; temperature 0 is greedy
# Sampling is lossless: with or without mtp the output follows the target's distribution (greedy: identical tokens).
GENERATION_OPTIONS = ("max_new_tokens", "mtp", "num_assistant_tokens", "temperature", "top_k", "top_p", "seed")


def gen_config(**options) -> GenConfig:
    """The runtime's GenConfig for Model's generation keywords (GENERATION_OPTIONS above); raises ValueError for a
    bad value and TypeError for an unknown keyword."""
    from mtpkit.runtime.engine import GenConfig

    unknown = sorted(set(options) - set(GENERATION_OPTIONS))
    if unknown:
        raise TypeError(f"unknown keyword {unknown[0]!r}; the generation keywords are {', '.join(GENERATION_OPTIONS)}")
    return GenConfig.from_options(**options)


@dataclass(frozen=True)
class Generation:
    text: str  # the decoded output; special tokens (EOS, turn markers) are left out
    token_ids: tuple[int, ...]  # output ids as produced, ending with the EOS id when generation stopped there
    prompt_ids: tuple[int, ...]
    stats: dict  # Stats.summary(): acceptance (overall, by position), calls, TTFT, latencies, tokens/s
    # chat answers only (runtime/channels.py): what the model wrote in its thought channel, apart from text
    thought: str = ""
    tool_calls: list[dict] = field(default_factory=list)  # [{"name", "arguments": the parsed arguments}, ...]
    tool_call_error: str | None = None  # why a call did not parse; the call is then in text as written


class Model:
    """An opened export. One generation at a time: the KV cache is preallocated once and reused by every call.

    The generation keywords of generate/stream/chat/stream_chat are GENERATION_OPTIONS. Generation stops at
    max_new_tokens or at an EOS token. A prompt that does not fit the export's KV capacity raises ValueError.
    """

    def __init__(self, engine: Engine):
        self.engine = engine  # manifest, sessions, KV cache and codec (mtpkit.runtime.engine.Engine)
        self.last_stats: dict | None = None  # Stats.summary() of the latest run, also one stopped early
        self.last_generation: Generation | None = None  # the latest chat answer, also a streamed one

    def generate(self, prompt: str, *, chat: bool = False, **options) -> Generation:
        """Generate a continuation of `prompt`; chat=True wraps it as one user turn in the chat template."""
        cfg = gen_config(**options)
        prompt_ids = self.engine.codec.encode(prompt, chat=chat)
        return self._generation(prompt_ids, self._run(prompt_ids, cfg))

    def stream(self, prompt: str, *, chat: bool = False, **options) -> Iterator[str]:
        """Like generate, but yields text deltas as tokens arrive; joined they equal generate's text.

        Arguments are checked now, not at the first next(); stats are in self.last_stats once the iterator ends.
        """
        cfg = gen_config(**options)
        prompt_ids = self.engine.codec.encode(prompt, chat=chat)
        self.engine.check_request(prompt_ids, cfg)  # now, not at the first next()
        return self._deltas(self._run(prompt_ids, cfg))

    def chat(self, messages: list[dict], *, tools: list[dict] | None = None, enable_thinking: bool | None = None,
             **options) -> Generation:
        """The next assistant turn for `messages` ([{"role": "user" | "assistant" | ..., "content": str}, ...]),
        rendered with the export's chat template: the tokens a fresh load(path).chat(messages) gives, whatever this
        model ran before. The cache keeps what the previous call left there: only what follows the prefix it
        shares with the rendered `messages` is prefilled (stats: cached_tokens, prefilled_tokens). A conversation
        that no longer fits raises ConversationFullError (a ValueError); conversation(drop_oldest=True) drops the
        oldest turns instead. tools (JSON-schema function declarations) and enable_thinking reach the template
        as transformers' apply_chat_template passes them; the answer's thought and tool calls come apart from
        its text (Generation.thought, .tool_calls)."""
        conversation = self.conversation(messages, tools=tools, enable_thinking=enable_thinking)
        return conversation.reply(**options)  # has generated nothing: all renders as text

    def stream_chat(self, messages: list[dict], *, tools: list[dict] | None = None,
                    enable_thinking: bool | None = None, **options) -> Iterator[Piece]:
        """chat(), streamed as Pieces: str deltas tagged by .kind, "text" or "thought" (a "tool_call" piece is
        empty, with the parsed call in .call); the text pieces join to chat's text. last_generation holds the
        whole answer once the stream ends."""
        conversation = self.conversation(messages, tools=tools, enable_thinking=enable_thinking)
        return conversation.stream_reply(**options)

    def conversation(self, messages: list[dict] | None = None, *, drop_oldest: bool = False,
                     tools: list[dict] | None = None, enable_thinking: bool | None = None) -> Conversation:
        """A chat kept between turns: send(text) answers and remembers; `messages` starts its history; tools and
        enable_thinking render with every turn."""
        from mtpkit.runtime.conversation import Conversation as State

        return Conversation(self, State(self.engine, messages, drop_oldest, tools, enable_thinking))

    def load_conversation(self, path: str | Path, *, drop_oldest: bool = False) -> Conversation:
        """A conversation written by Conversation.save(path) on this export, continuing with the tokens the saved
        one would have given."""
        from mtpkit.runtime.conversation import Conversation as State

        return Conversation(self, State.load(self.engine, path, drop_oldest))

    def _run(self, prompt_ids: list[int], cfg: GenConfig) -> Iterator[int]:
        """The engine's token ids for prompt_ids (a generate or stream: nothing reused from a conversation);
        its Stats are created now, before the first token is asked for."""
        return self._ids(self.engine.generate(prompt_ids, cfg, self._new_stats()))

    @staticmethod
    def _ids(run: Generator[tuple[int, bool], None, None]) -> Iterator[int]:
        try:
            for token, _ in run:
                yield token
        finally:
            run.close()  # the engine records its call counts when its generator closes

    def _new_stats(self) -> Stats:
        """A run's Stats, summarized into last_stats when its tokens end."""
        from mtpkit.runtime.stats import Stats

        self._stats = Stats()
        return self._stats

    def _generation(self, prompt_ids: list[int], tokens: Iterator[int]) -> Generation:
        out = list(self._tokens(tokens))
        return Generation(self.engine.codec.decode(out), tuple(out), tuple(prompt_ids), self.last_stats)

    def _deltas(self, tokens: Iterator[int]) -> Iterator[str]:
        from mtpkit.runtime.tokenizer import text_deltas

        with closing(self._tokens(tokens)) as ids:  # a caller that stops early still gets last_stats
            yield from text_deltas(self.engine.codec, ids)

    def _tokens(self, tokens: Iterator[int]) -> Iterator[int]:
        try:
            yield from tokens
        finally:
            getattr(tokens, "close", lambda: None)()
            self.last_stats = self._stats.summary()


class Conversation:
    """Model.conversation(): a chat whose KV cache outlives its turns, so each turn prefills only what is new.

    messages is the history; edit it between turns (a changed earlier message, a dropped last answer to
    regenerate) and reply() answers it as it stands: the cache rewinds to where the history first differs. Every
    turn's tokens are those a fresh prefill of the whole conversation gives. An answer it generated renders as the
    ids it generated (unless its text is edited), as LiteRT-LM's Conversation keeps it: its tokens may differ from
    Model.chat on the same messages, which renders every message as text. save(path) keeps all of that;
    Model.load_conversation(path) continues it. drop_oldest: when a turn does not fit the KV capacity, the oldest
    whole turns go (`dropped` counts them); otherwise ConversationFullError.
    """

    def __init__(self, model: Model, state: ConversationState):
        self.model, self.state = model, state

    @property
    def messages(self) -> list[dict]:
        return self.state.messages

    @property
    def dropped(self) -> int:
        return self.state.dropped

    def reset(self) -> None:
        self.state.reset()

    def save(self, path: str | Path) -> None:
        """Write the history and the ids of the answers it keeps as JSON (Model.load_conversation reads it)."""
        self.state.save(path)

    def send(self, text: str, **options) -> Generation:
        """Add a user message, answer it and keep the answer in the history."""
        return self._generation(self.state.send(text, gen_config(**options), self.model._new_stats()))

    def stream(self, text: str, **options) -> Iterator[Piece]:
        """send(), streamed as Pieces (see Model.stream_chat); the answer joins the history when the stream ends."""
        return self._pieces(self.state.send(text, gen_config(**options), self.model._new_stats()))

    def reply(self, **options) -> Generation:
        """The assistant's answer to the history as it stands, kept in it."""
        return self._generation(self.state.reply(gen_config(**options), self.model._new_stats()))

    def stream_reply(self, **options) -> Iterator[Piece]:
        return self._pieces(self.state.reply(gen_config(**options), self.model._new_stats()))

    def _generation(self, tokens: Iterator[int]) -> Generation:
        whole = self.model._generation(self.state.prompt_ids, tokens)  # the ids fit() rendered for this turn
        return self._answered(whole)

    def _answered(self, whole: Generation) -> Generation:
        """The answer in its channels (the state split it when its tokens ended)."""
        answer = self.state.split
        if answer is not None:
            whole = replace(whole, text=answer.text, thought=answer.thought, tool_calls=answer.tool_calls,
                            tool_call_error=answer.tool_call_error)
        self.model.last_generation = whole
        return whole

    def _pieces(self, tokens: Iterator[int]) -> Iterator[Piece]:
        from mtpkit.runtime.channels import pieces
        from mtpkit.runtime.tokenizer import text_deltas

        codec, seen, produced = self.model.engine.codec, [], self.model._tokens(tokens)

        def ids() -> Iterator[int]:
            for token in produced:
                seen.append(token)
                yield token

        with closing(produced):  # a caller that stops early still gets last_stats
            yield from pieces(text_deltas(codec, ids(), marked=True), codec.specials)
        # the state split the answer when its tokens ended
        self._answered(Generation("", tuple(seen), tuple(self.state.prompt_ids), self.model.last_stats))
