"""Renderings tokenized by their tail (`ChatFormat.rendering`, `chat.tail_cut_ids`): the
same tokens, spans and loss masks as tokenizing every rendering whole, for each template
family, with tool calls, reasoning, tool replies and user turns; and the characters a turn
tokenizes do not grow with the transcript."""

import dataclasses

import jax
import pytest
from text_helpers import CHATML
from text_helpers import family_tokenizer
from text_helpers import scripted_sampler
from text_helpers import tiny_tokenizer

from rlagent.text import ChatTemplateError
from rlagent.text import TextConfig
from rlagent.text import TextLoop
from rlagent.text import make_chat
from rlagent.text.chat import tail_cut_ids
from rlagent.text.guess import GUESS_TOOL
from rlagent.text.guess import GuessNumber

CONFIG = TextConfig(max_new_tokens=64, obs_len=800, max_prompt_len=6000)
CALL = '<tool_call>\n{"name": "guess", "arguments": {"number": 3}}\n</tool_call>'
LLAMA_CALL = '{"name": "guess", "parameters": {"number": 3}}'
REASONING = "<think>\nlow first\n</think>\n\n"
# (family, enable_thinking): the official templates (Qwen3's replaced by the shipped
# prefix-stable one) and the tests' ChatML.
CASES = [("qwen3", None), ("qwen3", False), ("qwen2.5", None), ("llama3.1", None),
         ("chatml", None)]  # fmt: skip


class Replies(GuessNumber):
    """GuessNumber (three-digit secrets: the scripted guesses never solve one) whose
    reply to a turn is its tool result, then by turn: nothing, a second tool result, or a
    user turn."""

    def step(self, text):
        reply, signals, done = super().step(text)
        more = [[], [{"role": "tool", "content": "noted"}], [{"role": "user", "content": "Go on."}]]
        return reply + more[self.guesses % 3], signals, done


def _chat(name, thinking):
    call = LLAMA_CALL if name == "llama3.1" else CALL
    if name == "chatml":
        tokenizer = tiny_tokenizer(CHATML, corpus=[call] * 3)
    else:
        tokenizer = family_tokenizer(name, corpus=[call] * 3)
    return make_chat(tokenizer, tools=[GUESS_TOOL], enable_thinking=thinking), call


def _play(chat, texts, turns):
    loop = TextLoop(chat, CONFIG, scripted_sampler(chat, texts, CONFIG.max_new_tokens))
    episodes = [loop.start(Replies(low=100, high=999, max_turns=turns, use_tools=True), seed)
                for seed in range(3)]  # fmt: skip
    return loop.play(None, episodes, jax.random.split(jax.random.key(0), len(episodes)))


@pytest.mark.parametrize(("name", "thinking"), CASES)
def test_tails_give_the_tokens_spans_and_masks_of_whole_renderings(name, thinking):
    chat, call = _chat(name, thinking)
    assert chat.cut_ids and chat.end_id in chat.cut_ids
    texts = [REASONING + call, "I guess 7.", call, REASONING + "Maybe 4.", "ünï 5\n\n", call]
    whole = _play(dataclasses.replace(chat, cut_ids=frozenset()), texts, 6)
    tail = _play(dataclasses.replace(chat, check_tails=True), texts, 6)  # each tail checked.
    roles = set()
    for one, other in zip(whole, tail, strict=True):
        assert len(other.turns) == 6 and not other.truncated
        assert other.tokens == one.tokens and other.loss_mask == one.loss_mask
        assert other.spans == one.spans and other.rendered.ids == one.rendered.ids
        assert [t.obs for t in other.turns] == [t.obs for t in one.turns]
        roles |= {span.role for span in other.spans}
    assert {"assistant", "tool", "user"} <= {r for role in roles for r in role.split("+")}


def test_a_rendering_that_does_not_extend_the_text_is_tokenized_whole():
    chat, _ = _chat("chatml", None)
    chat = dataclasses.replace(chat, check_tails=True)
    user = {"role": "user", "content": "hi"}
    first = chat.rendering([user], generation_prompt=False)
    assert first.text.endswith("<|im_end|>\n") and first.ids[first.cut[1]] == chat.end_id
    other = chat.rendering([{"role": "user", "content": "ho"}], generation_prompt=True, after=first)
    assert other.ids == chat.render([{"role": "user", "content": "ho"}], generation_prompt=True)
    with pytest.raises(ChatTemplateError, match="prefix-stably"):
        rewrites = dataclasses.replace(chat, template=CHATML.replace("message.content", "'x'"))
        rewrites.extend([user, user], 1, first, [])


def test_only_unambiguous_added_tokens_cut():
    tokenizer = tiny_tokenizer(CHATML, special=["<pad>", "<|im_start|>", "<|im_end|>", "<|im"])
    ids = tail_cut_ids(tokenizer)
    assert tokenizer.convert_tokens_to_ids("<|im") not in ids  # inside <|im_end|>.
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in ids


class Counting:
    """A tokenizer that counts the characters it tokenizes."""

    def __init__(self, tokenizer):
        self.tokenizer, self.chars = tokenizer, 0

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)

    def __call__(self, text, **options):
        self.chars += len(text)
        return self.tokenizer(text, **options)

    def encode(self, text, **options):
        self.chars += len(text)
        return self.tokenizer.encode(text, **options)


@pytest.mark.parametrize("cut", [True, False])
def test_a_turn_tokenizes_its_new_text_not_the_transcript(cut):
    chat, _ = _chat("qwen3", None)
    counting = Counting(chat.tokenizer)
    chat = dataclasses.replace(
        chat, tokenizer=counting, cut_ids=chat.cut_ids if cut else frozenset()
    )
    turns = 12
    loop = TextLoop(
        chat, CONFIG, scripted_sampler(chat, ["No idea."] * turns, CONFIG.max_new_tokens)
    )
    (episode,) = [loop.start(GuessNumber(low=100, high=999, max_turns=turns, use_tools=True), 0)]
    keys = jax.random.split(jax.random.key(0), 1)
    per_turn = []
    for _ in range(turns - 1):  # the last turn renders nothing (no next turn).
        before = counting.chars
        (episode,) = loop.play(None, [episode], keys, num_turns=1)
        per_turn.append(counting.chars - before)
    transcript = len(chat.decode(episode.tokens))
    if cut:  # the same reply each turn: the same characters, a fraction of the transcript.
        assert len(set(per_turn)) == 1 and 4 * per_turn[-1] < transcript
    else:  # whole renderings: each turn tokenizes the transcript again, more each turn.
        assert per_turn == sorted(per_turn) and per_turn[-1] > 2 * transcript
