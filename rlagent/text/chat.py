"""The model's own tokenizer and chat template, token in and token out (docs/text.md).

An episode is a token transcript built incrementally: system, user and tool messages
are appended as the tokens their chat template renders; an assistant turn is the ids
the policy generated, never re-tokenized from its text (the re-tokenization drift of
TRL issue #5144 cannot happen: decoding a turn and encoding the text again may give other
ids, and those other ids are never trained on).

The template's tokens of a message come from rendering the conversation prefix-wise:
the rendering after the messages that follow an assistant turn must extend the rendering
up to that turn token by token, and the new tokens are theirs (one span per message where
the template renders them one by one). For the tokens after an assistant turn, the conversation is
rendered with the assistant's decoded text (only to find where the template goes on: the
tokens between the end-of-turn token and the next message, then the next messages and
the generation prompt); the transcript keeps the generated ids. Renderings are compared
at message boundaries only, never inside an assistant's re-tokenized text. A template that does not
render prefix-stably (one that rewrites earlier turns, such as dropping the reasoning of
past assistant turns) is refused with `ChatTemplateError`, naming the messages; `make_chat`
checks that before anything runs, on probe conversations (`probe_cases`: a reply, reasoning,
a tool call and its result, each followed by a new user turn).

A rendering (`Rendering`) keeps its text: one whose text extends an earlier one's keeps that
one's ids up to its last cut token (an added token the tokenizer matches before anything
else, `tail_cut_ids`) and tokenizes the rest only, so a turn tokenizes its new text, not the
transcript; the ids are those of the whole text (`ChatFormat.check_tails` compares them).

Templates: the tokenizer's own, except Qwen3's official hybrid-thinking template, which is
not prefix-stable (it adds an empty think block to an assistant turn only while it is the
last message and drops the reasoning of turns before the last user query); it is replaced
by `templates/qwen3_prefix_stable.jinja` (recognised by its text, `select_template`), which
renders every assistant turn the same wherever it stands. `enable_thinking` is passed to
the template (Qwen3: False puts the empty think block in the generation prompt).

Tools: the tool schemas are rendered per episode (`ChatFormat.for_tools`: an environment's
own `tools`); an assistant turn whose text holds well-formed calls is appended with the
template's `tool_calls` field when the template reads one (`assistant_turn`), so that the
template renders the calls natively (Llama 3.x: `{"name": ..., "parameters": ...}`).

Vocabulary: the model may have more embedding rows than the tokenizer has tokens (HF
checkpoints pad their embeddings, Qwen2.5: 151936 rows for 151665 tokens); the ids past
the tokenizer are never sampled (`ChatFormat.sampling_mask`). A model with fewer rows than
the tokenizer has tokens is refused, as is a PolicyConfig.pad_id that is not the
tokenizer's padding token.
"""

from __future__ import annotations

import dataclasses
import json
import os
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlagent.models.hf import CheckpointError
from rlagent.models.llama import PolicyConfig
from rlagent.text.toolcalls import parse_tool_calls
from rlagent.text.toolcalls import text_outside_calls
from rlagent.text.toolcalls import tool_call_text

Message = dict[str, Any]  # {"role": ..., "content": ...} as `apply_chat_template` reads it.

# Probe messages of the checks at construction (`make_chat`).
_PROBE_SYSTEM = "probe system"
_PROBE_USER = "probe question"
_PROBE_REPLY = "probe reply"
_PROBE_TOOL = "probe tool result"
_PROBE_REASONING = "<think>\nprobe reasoning\n</think>\n\n"
_PROBE_NEXT = "probe next question"
# The templates shipped with rlagent (templates/*.jinja) and the name of the tokenizer's own.
TEMPLATES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
QWEN3_PREFIX_STABLE = "qwen3_prefix_stable"
OWN_TEMPLATE = "tokenizer"


class ChatTemplateError(ValueError):
    """A tokenizer or chat template that cannot serve a token-in / token-out episode."""


@dataclasses.dataclass(frozen=True)
class MessageSpan:
    """Where a message sits in an episode's transcript: tokens `[start, stop)`.

    Spans tile the transcript. A non-assistant message's span holds the tokens the
    template renders for it (the generation prompt belongs to the span before the
    assistant turn; a group of messages the template renders only as a whole has one span,
    its roles joined by '+'); an assistant span holds exactly the ids the policy generated, and the
    tokens the template adds after them (a forced end-of-turn token after a turn cut at
    `max_new_tokens`, the template's text after the end-of-turn token) are the next span's.
    """

    role: str
    start: int
    stop: int


@dataclasses.dataclass(frozen=True, eq=False)
class Rendering:
    """The template's rendering of a conversation: its text and its token ids.

    `cut` is `(char, token)`: where the last added token the rendering may be tokenized
    apart at (`ChatFormat.cut_ids`) starts in `text` and in `ids`; `(0, 0)` without one. A
    rendering whose text extends `text` keeps `ids[:token]` and tokenizes its text from
    `char` on only (`ChatFormat.rendering`).
    """

    text: str
    ids: list[int]
    cut: tuple[int, int] = (0, 0)


EMPTY = Rendering("", [])  # the rendering of no message (an episode's first `extend`).


@dataclasses.dataclass(frozen=True, eq=False)
class ChatFormat:
    """A tokenizer, its chat template and the tokens the episode loop needs."""

    tokenizer: Any  # a transformers PreTrainedTokenizer(Fast) with a chat_template.
    end_id: int  # the end-of-turn token: generation of a turn stops at it.
    pad_id: int  # pads the Trajectory's turns; never generated, never in a template's tokens.
    vocab_size: int  # len(tokenizer): ids the tokenizer knows.
    tools: tuple[dict, ...] | None = None  # tool schemas passed to the template.
    template: str | None = None  # the Jinja text rendered with (None: the tokenizer's own).
    template_name: str = OWN_TEMPLATE  # OWN_TEMPLATE or a shipped template's name.
    enable_thinking: bool | None = None  # passed to the template (None: its default).
    # The added tokens a rendering is tokenized apart at (`tail_cut_ids`; empty: every
    # rendering is tokenized whole).
    cut_ids: frozenset[int] = frozenset()
    check_tails: bool = False  # compare each tail's tokens with the whole text's (tests).

    @property
    def native_tool_calls(self) -> bool:
        """The template reads an assistant message's `tool_calls` field."""
        return "tool_calls" in (self.template or self.tokenizer.chat_template or "")

    def for_tools(self, tools: Sequence[dict] | None) -> ChatFormat:
        """The format of an episode whose environment has these tools (None: no tools)."""
        return dataclasses.replace(self, tools=tuple(tools) if tools else None)

    def render_text(self, messages: Sequence[Message], *, generation_prompt: bool) -> str:
        """The template's text of `messages` (and the assistant header if asked)."""
        options = {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}
        try:
            return self.tokenizer.apply_chat_template(
                list(messages),
                tools=None if self.tools is None else list(self.tools),
                add_generation_prompt=generation_prompt,
                tokenize=False,
                chat_template=self.template,
                **options,
            )
        except Exception as error:  # Jinja's TemplateError, raise_exception(), KeyError...
            roles = [m.get("role") for m in messages]
            raise ChatTemplateError(
                f"the chat template cannot render messages with roles {roles}: {error}"
            ) from error

    def render(self, messages: Sequence[Message], *, generation_prompt: bool) -> list[int]:
        """The template's token ids of `messages` (and the assistant header if asked)."""
        text = self.render_text(messages, generation_prompt=generation_prompt)
        return self.encode(text)

    def rendering(
        self, messages: Sequence[Message], *, generation_prompt: bool, after: Rendering = EMPTY
    ) -> Rendering:
        """The template's `Rendering` of `messages`: when its text extends `after.text`,
        `after`'s ids up to its cut and the tokens of the text from there on (the same ids
        as the whole text's, `tail_cut_ids`); else the whole text tokenized."""
        return self._tokenize(
            self.render_text(messages, generation_prompt=generation_prompt), after
        )

    def _tokenize(self, text: str, after: Rendering) -> Rendering:
        if not self.cut_ids:
            return Rendering(text, self.encode(text))
        char, token = after.cut if text.startswith(after.text) else (0, 0)
        tail = text[char:]
        encoded = self.tokenizer(tail, add_special_tokens=False, return_offsets_mapping=True)
        ids = after.ids[:token] + list(encoded["input_ids"])
        cut = (0, 0)
        for index in range(len(encoded["input_ids"]) - 1, -1, -1):
            if self._cuts_at(encoded["input_ids"][index], tail, encoded["offset_mapping"][index]):
                cut = (char + encoded["offset_mapping"][index][0], token + index)
                break
        if self.check_tails:
            whole = self.encode(text)
            if whole != ids:
                at = _first_difference(ids, whole)
                raise AssertionError(
                    f"the tail tokenized from character {char} (token {token}) gives other ids "
                    f"than the whole text (first difference at token {at})"
                )
        return Rendering(text, ids, cut)

    def _cuts_at(self, token_id: int, text: str, span: tuple[int, int]) -> bool:
        """The token is a cut token, matched where `text[span]` is its content."""
        if token_id not in self.cut_ids:
            return False
        return text[span[0] : span[1]] == self.tokenizer.convert_ids_to_tokens(token_id)

    def encode(self, text: str) -> list[int]:
        """The tokenizer's ids of `text`, no special tokens added (the template's own)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of generated ids, special tokens kept (what the environment reads)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def sampling_mask(self, model_vocab: int) -> np.ndarray:
        """`[model_vocab]` bool: ids the policy may sample (PAD and padded rows banned)."""
        allowed = np.arange(model_vocab) < self.vocab_size
        allowed[self.pad_id] = False
        return allowed

    def extend(
        self, messages: Sequence[Message], start: int, base: Rendering, glue: Sequence[int]
    ) -> tuple[list[int], list[MessageSpan], Rendering]:
        """Template tokens of `messages[start:]`, then the generation prompt.

        The tokens are where the rendering of `messages` with the generation prompt goes
        beyond `base`. A message ends a span where the rendering of the conversation up to
        it is a prefix of that; a template that renders a group of messages only as a
        whole (Qwen2.5 wraps consecutive tool results in one user turn) gives the group
        one span. Every rendering is tokenized after `base` (`rendering`): the text of
        the new messages only.

        Args:
          messages: the conversation; `messages[start:]` are new (not assistant).
          base: the rendering of `messages[:start]` (`EMPTY` for none).
          glue: tokens that go first (after an assistant turn: a forced end-of-turn token
            and the template's tokens after it, `after_assistant`).
        Returns:
          the new tokens; their spans (offsets into the new tokens: the glue in the first
          span, the generation prompt in the last; one span of role 'template' without a
          new message); the rendering of `messages` without the generation prompt (the
          `before` of `after_assistant` next turn).
        Raises:
          ChatTemplateError if the rendering of `messages` does not extend `base`.
        """
        prompt = self.rendering(messages, generation_prompt=True, after=base)
        self._check_extends(base.ids, prompt.ids, messages)
        tokens = list(glue) + prompt.ids[len(base.ids) :]
        spans, roles, rendered = [], [], base
        for stop in range(start + 1, len(messages) + 1):
            roles.append(messages[stop - 1]["role"])
            part = self._render_part(messages[:stop], base, last=stop == len(messages))
            if stop == len(messages) or _boundary(part, base.ids, prompt.ids):
                rendered = part
                end = (
                    len(tokens)
                    if stop == len(messages)
                    else len(glue) + len(part.ids) - len(base.ids)
                )
                begin = spans[-1].stop if spans else 0
                spans.append(MessageSpan("+".join(dict.fromkeys(roles)), begin, end))
                roles = []
        if not spans:
            spans = [MessageSpan("template", 0, len(tokens))]
        self._check_tokens(tokens)
        return tokens, spans, rendered

    def assistant_message(self, text: str) -> Message:
        """The assistant message of a turn's text: with the template's `tool_calls` field
        (the calls of `parse_tool_calls`, the content the text around them) when the
        template reads one and the text holds well-formed calls, else the text as content."""
        parsed = parse_tool_calls(text)
        if not self.native_tool_calls or parsed.error is not None or not parsed.calls:
            return {"role": "assistant", "content": text}
        calls = [
            {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in parsed.calls
        ]
        return {"role": "assistant", "content": text_outside_calls(text), "tool_calls": calls}

    def assistant_turn(
        self, messages: Sequence[Message], text: str, before: Rendering = EMPTY
    ) -> tuple[Message, Rendering]:
        """`(the assistant message of text, the rendering of messages with it)`, no
        generation prompt, tokenized after `before` (the rendering of `messages`,
        `rendering`); a template that refuses the structured calls (Llama 3.1 takes one
        call per message) gets the text as content."""
        message = self.assistant_message(text)
        try:
            return message, self.rendering(
                [*messages, message], generation_prompt=False, after=before
            )
        except ChatTemplateError:
            if "tool_calls" not in message:
                raise
        plain = {"role": "assistant", "content": text}
        return plain, self.rendering([*messages, plain], generation_prompt=False, after=before)

    def after_assistant(self, before: Sequence[int], closed: Sequence[int]) -> list[int]:
        """The template's tokens after an assistant turn's end-of-turn token.

        `before` is the rendering of the conversation before the turn (no generation
        prompt), `closed` the rendering with the assistant message; e.g. ChatML's "\\n"
        after `<|im_end|>`. The assistant header the template renders need not be the
        generation prompt the policy read (the transcript keeps what it read).
        """
        self._check_extends(before, closed, None)
        turn = list(closed[len(before) :])
        if self.end_id not in turn:
            raise ChatTemplateError(
                f"the chat template does not end assistant turns with the end-of-turn token "
                f"{self.tokenizer.convert_ids_to_tokens(self.end_id)!r} (id {self.end_id})"
            )
        return turn[len(turn) - turn[::-1].index(self.end_id) :]

    def _render_part(self, messages, base: Rendering, *, last: bool) -> Rendering | None:
        """The rendering of a conversation that ends inside a group of new messages (None
        if the template refuses it: then it is no span boundary)."""
        try:
            return self.rendering(messages, generation_prompt=False, after=base)
        except ChatTemplateError:
            if last:
                raise
            return None

    def _check_extends(self, previous, rendered, messages) -> None:
        if list(rendered[: len(previous)]) != list(previous):
            roles = "an assistant turn" if messages is None else [m.get("role") for m in messages]
            raise ChatTemplateError(
                f"the chat template does not render prefix-stably: rendering the messages "
                f"with roles {roles} changes the tokens of the messages before the last one "
                f"(first difference at token {_first_difference(previous, rendered)}); a "
                "template that rewrites earlier turns (e.g. drops past reasoning) cannot "
                "build an episode token by token"
            )

    def _check_tokens(self, tokens) -> None:
        if self.pad_id in tokens:
            raise ChatTemplateError(
                f"the chat template rendered the padding token (id {self.pad_id}) inside a "
                "message; the padding token must be one the template never emits"
            )


def load_tokenizer(model_dir: str) -> Any:
    """The folder's own tokenizer (`transformers.AutoTokenizer`, local files only)."""
    import transformers  # the `hf` extra: imported where a tokenizer is read.

    try:
        return transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as error:
        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else repr(error)
        raise CheckpointError(
            f"{model_dir}: no tokenizer transformers can load ({first})"
        ) from None


def make_chat(
    tokenizer: Any,
    *,
    tools: Sequence[dict] | None = None,
    end_token: str | None = None,
    pad_token: str | None = None,
    enable_thinking: bool | None = None,
) -> ChatFormat:
    """Wraps a HF tokenizer and its chat template, checked on probe conversations.

    Args:
      tokenizer: a transformers tokenizer with a `chat_template` (Qwen3's official one is
        replaced by the shipped prefix-stable one, `select_template`).
      tools: tool schemas the template is probed with (JSON-schema dicts, as
        `apply_chat_template` takes them); an episode renders its environment's own tools
        (`ChatFormat.for_tools`). With tools the template must render them and `tool`
        messages.
      end_token: the end-of-turn token (default: the tokenizer's `eos_token`).
      pad_token: the padding token (default: the tokenizer's `pad_token`).
      enable_thinking: passed to the template (None: not passed, the template's default).
    Raises:
      ChatTemplateError naming the fault: no chat template, no (or an unknown)
      end-of-turn or padding token, a template that does not end assistant turns with the
      end-of-turn token, ignores the tools, cannot render tool messages, or does not
      render prefix-stably (naming the probe case, `check_prefix_stable`).
    """
    own = getattr(tokenizer, "chat_template", None)
    if not own:
        raise ChatTemplateError(
            f"tokenizer {type(tokenizer).__name__} has no chat template (chat_template is "
            "None): a text environment needs the model's own template"
        )
    if not isinstance(own, str):
        raise ChatTemplateError(
            f"tokenizer {type(tokenizer).__name__} has several named chat templates "
            f"{sorted(own)}; set tokenizer.chat_template to the one to use"
        )
    name, template = select_template(own)
    chat = ChatFormat(
        tokenizer=tokenizer,
        end_id=_token_id(tokenizer, end_token or tokenizer.eos_token, "end-of-turn (eos)"),
        pad_id=_token_id(tokenizer, pad_token or tokenizer.pad_token, "padding"),
        vocab_size=len(tokenizer),
        tools=tuple(tools) if tools else None,
        template=template,
        template_name=name,
        enable_thinking=enable_thinking,
        cut_ids=tail_cut_ids(tokenizer),
    )
    if chat.end_id == chat.pad_id:
        raise ChatTemplateError(
            f"the end-of-turn and padding tokens are the same (id {chat.pad_id})"
        )
    _check_end(chat)
    if chat.tools:
        check_tools(chat)
    check_prefix_stable(chat)
    return chat


def tail_cut_ids(tokenizer: Any) -> frozenset[int]:
    """The added tokens a rendering may be tokenized apart at, just before one.

    A fast tokenizer matches its added tokens in the raw text first (leftmost-longest)
    and tokenizes the text between matches piece by piece, so the ids of a text are the
    ids before a matched added token, then those from it on. A token qualifies when that
    split is exact and stays a match whatever text follows: not normalized, no stripping
    of the whitespace around it, not single-word, and inside no other added token (so no
    longer match can start at or before it). For a rendering that extends an earlier
    one's text, the last such token matched in the earlier text is where its tail starts
    (`ChatFormat.rendering`). None qualifies for a slow tokenizer or one that splits its special
    tokens: every rendering is then tokenized whole.
    """
    if not getattr(tokenizer, "is_fast", False) or getattr(
        tokenizer, "split_special_tokens", False
    ):
        return frozenset()
    added = tokenizer.added_tokens_decoder
    contents = {token.content for token in added.values()}
    return frozenset(
        index
        for index, token in added.items()
        if token.content
        and not (token.normalized or token.lstrip or token.rstrip or token.single_word)
        and not any(token.content in other for other in contents - {token.content})
    )


def select_template(template: str) -> tuple[str, str]:
    """`(name, Jinja text)` of the template to render with: the shipped prefix-stable
    Qwen3 template for Qwen3's official hybrid-thinking one (recognised by its last-query
    scan and its enable_thinking switch), else the tokenizer's own (`OWN_TEMPLATE`)."""
    if "ns.last_query_index" in template and "enable_thinking" in template:
        return QWEN3_PREFIX_STABLE, shipped_template(QWEN3_PREFIX_STABLE)
    return OWN_TEMPLATE, template


def shipped_template(name: str) -> str:
    """The Jinja text of a template shipped with rlagent (`templates/<name>.jinja`)."""
    with open(os.path.join(TEMPLATES_DIR, f"{name}.jinja")) as file:
        return file.read()


def probe_cases(chat: ChatFormat) -> dict[str, list[Message]]:
    """The multi-turn conversations `check_prefix_stable` renders: a reply and a reply
    with reasoning, each followed by a new user turn, and (with tools) a tool call, its
    result and a reply, with and without reasoning, then a new user turn."""
    opening = [
        {"role": "system", "content": _PROBE_SYSTEM},
        {"role": "user", "content": _PROBE_USER},
    ]
    user = {"role": "user", "content": _PROBE_NEXT}
    cases = {}
    for label, prefix in (("", ""), ("reasoning, ", _PROBE_REASONING)):
        reply = chat.assistant_message(prefix + _PROBE_REPLY)
        cases[f"{label}a reply, then a new user turn"] = [*opening, reply, user]
        if chat.tools:
            name = chat.tools[0].get("function", chat.tools[0]).get("name", "probe")
            call = chat.assistant_message(prefix + tool_call_text(name, {}))
            tool = {"role": "tool", "content": _PROBE_TOOL}
            case = f"{label}a tool call, its result, a reply, then a new user turn"
            cases[case] = [*opening, call, tool, chat.assistant_message(_PROBE_REPLY), user]
    return cases


def check_prefix_stable(chat: ChatFormat) -> None:
    """Refuses a template whose rendering of a probe conversation (`probe_cases`) does not
    extend, token by token, its rendering up to each assistant turn and after it: what the
    episode loop needs to build a transcript message by message.

    Raises:
      ChatTemplateError naming the probe case, the message whose tokens change and the
      fix.
    """
    for case, messages in probe_cases(chat).items():
        full = chat.render(messages, generation_prompt=True)
        for index, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            for stop, where in ((index, "before"), (index + 1, "through")):
                part = chat.render(messages[:stop], generation_prompt=False)
                if full[: len(part)] != part:
                    _unstable(chat, case, messages, index=index, where=where, part=part, full=full)


def _unstable(chat, case, messages, *, index, where, part, full) -> None:
    at = _first_difference(part, full)
    shown = lambda ids: repr(chat.decode(ids[at : at + 8]))  # noqa: E731
    raise ChatTemplateError(
        f"the chat template ({chat.template_name}) does not render prefix-stably in the probe "
        f"case {case!r} (roles {[m['role'] for m in messages]}): the tokens {where} assistant "
        f"message {index} change once later messages follow (first difference at token {at}: "
        f"{shown(full)} where the conversation ending there has {shown(part)}), as with a "
        "template that drops past reasoning or gives a turn an empty think block only while "
        "it is the last message. An episode is built token by token, so every turn must "
        "render the same wherever it stands. Fix: set the tokenizer's chat_template to a "
        "prefix-stable one (rlagent ships one for Qwen3, used in place of the official Qwen3 "
        "template; docs/text.md, 'Chat templates')"
    )


def check_vocab(chat: ChatFormat, config: PolicyConfig) -> None:
    """Refuses a policy whose vocabulary cannot hold the tokenizer's, or another PAD.

    The model may have more rows than the tokenizer has tokens (padded embeddings; the
    extra ids are never sampled), not fewer.
    """
    if config.vocab_size < chat.vocab_size:
        raise ChatTemplateError(
            f"PolicyConfig.vocab_size={config.vocab_size} is smaller than the tokenizer's "
            f"{chat.vocab_size} tokens: the model cannot embed every id the template emits"
        )
    if config.pad_id != chat.pad_id:
        raise ChatTemplateError(
            f"PolicyConfig.pad_id={config.pad_id} is not the tokenizer's padding token "
            f"(id {chat.pad_id})"
        )


def _check_end(chat: ChatFormat) -> None:
    """The template closes an assistant message with the end-of-turn token."""
    user = [{"role": "user", "content": _PROBE_USER}]
    reply = [*user, {"role": "assistant", "content": _PROBE_REPLY}]
    before = chat.render(user, generation_prompt=False)
    chat.after_assistant(before, chat.render(reply, generation_prompt=False))
    turn = chat.decode(chat.render(reply, generation_prompt=False)[len(before) :])
    end = chat.tokenizer.convert_ids_to_tokens(chat.end_id)
    if _PROBE_REPLY not in turn or end not in turn[turn.index(_PROBE_REPLY) :]:
        raise ChatTemplateError(
            f"the chat template does not end assistant turns with the end-of-turn token "
            f"{end!r} (id {chat.end_id}): it renders an assistant message as {turn!r}"
        )


def check_tools(chat: ChatFormat) -> None:
    """Refuses a template that ignores `chat.tools` or cannot render `tool` messages. A
    tool set that passed once with a tokenizer and template is not rendered again (the
    loop checks every episode's tools as it starts: a BFCL batch repeats a few sets)."""
    key = (chat.template, chat.enable_thinking, json.dumps(chat.tools, sort_keys=True))
    passed = _TOOLS_PASSED.setdefault(chat.tokenizer, set())
    if key in passed:
        return
    _check_tools(chat)
    passed.add(key)


# tokenizer -> the (template, enable_thinking, tools) that `check_tools` passed with it.
_TOOLS_PASSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _check_tools(chat: ChatFormat) -> None:
    names = [tool.get("function", tool).get("name") for tool in chat.tools]
    user = [{"role": "user", "content": _PROBE_USER}]
    text = chat.decode(chat.render(user, generation_prompt=True))
    ignored = [name for name in names if name and name not in text]
    if ignored:
        raise ChatTemplateError(
            f"the chat template ignores tools=: the tool(s) {ignored} do not appear in its "
            "rendering"
        )
    tool_turn = [*user, {"role": "assistant", "content": _PROBE_REPLY},
                 {"role": "tool", "content": _PROBE_TOOL}]  # fmt: skip
    try:
        rendered = chat.render(tool_turn, generation_prompt=True)
    except ChatTemplateError as error:
        raise ChatTemplateError(f"the chat template cannot render tool messages: {error}") from None
    if _PROBE_TOOL not in chat.decode(rendered):
        raise ChatTemplateError(
            "the chat template cannot render tool messages: a 'tool' message's content does "
            "not appear in its rendering"
        )


def _token_id(tokenizer: Any, token: str | None, what: str) -> int:
    if token is None:
        raise ChatTemplateError(f"the tokenizer has no {what} token; pass it by name to make_chat")
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is None or (token_id == tokenizer.unk_token_id and token != tokenizer.unk_token):
        raise ChatTemplateError(f"the {what} token {token!r} is not a token of the tokenizer")
    return int(token_id)


def _boundary(part: Rendering | None, base: Sequence[int], prompt: Sequence[int]) -> bool:
    """`part` (of a conversation ending inside new messages) splits them in `prompt`."""
    return part is not None and len(part.ids) >= len(base) and prompt[: len(part.ids)] == part.ids


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))
