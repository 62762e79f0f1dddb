"""Official chat templates (tests/fixtures/templates: Qwen3, Qwen2.5, Llama 3.1) in text
mode: Qwen3's replaced by the shipped prefix-stable one, every template checked for prefix
stability on multi-turn probes, tools rendered and called in each family's own format."""

import dataclasses
import hashlib
import json

import jax
import numpy as np
import pytest
from text_helpers import CHATML
from text_helpers import family_tokenizer
from text_helpers import official_template
from text_helpers import scripted_sampler
from text_helpers import tiny_tokenizer

from rlagent.text import ChatTemplateError
from rlagent.text import TextConfig
from rlagent.text import TextLoop
from rlagent.text import make_chat
from rlagent.text.chat import OWN_TEMPLATE
from rlagent.text.chat import QWEN3_PREFIX_STABLE
from rlagent.text.chat import check_prefix_stable
from rlagent.text.chat import shipped_template
from rlagent.text.guess import GUESS_TOOL
from rlagent.text.guess import GuessNumber
from rlagent.text.toolcalls import ToolCall
from rlagent.text.toolcalls import parse_tool_calls

SHA256 = {
    "qwen3": "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8",
    "qwen2.5": "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f",
    "llama3.1": "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65",
}
FAMILIES = tuple(SHA256)
CONFIG = TextConfig(max_new_tokens=64, obs_len=800, max_prompt_len=1400)
# A guess in each family's own call format (the calls its template renders).
CALLS = {
    "qwen3": '<tool_call>\n{"name": "guess", "arguments": {"number": 3}}\n</tool_call>',
    "qwen2.5": '<tool_call>\n{"name": "guess", "arguments": {"number": 3}}\n</tool_call>',
    "llama3.1": '{"name": "guess", "parameters": {"number": 3}}',
}
REASONING = "<think>\nlow first\n</think>\n\n"
USER = {"role": "user", "content": "hi"}
SYSTEM = {"role": "system", "content": "You guess numbers."}


@pytest.fixture(scope="module")
def tokenizers():
    return {name: family_tokenizer(name, corpus=[*CALLS.values()] * 3) for name in FAMILIES}


@pytest.mark.parametrize("name", FAMILIES)
def test_the_fixtures_are_the_official_texts(name):
    digest = hashlib.sha256(official_template(name).encode()).hexdigest()
    assert digest == SHA256[name], "tests/fixtures/templates/README.md says where it is from"


def test_qwen3s_official_template_is_refused_by_the_probe_and_replaced(tokenizers):
    chat = make_chat(tokenizers["qwen3"], tools=[GUESS_TOOL])
    assert chat.template_name == QWEN3_PREFIX_STABLE
    assert chat.template == shipped_template(QWEN3_PREFIX_STABLE)
    official = dataclasses.replace(chat, template=official_template("qwen3"), template_name="own")
    with pytest.raises(ChatTemplateError) as refused:
        check_prefix_stable(official)
    message = str(refused.value)
    assert "probe case 'a reply, then a new user turn'" in message
    assert "(own)" in message and "Fix: set the tokenizer's chat_template" in message
    # Without the empty think block of the last turn, the reasoning case fails next.
    no_empty = official_template("qwen3").replace(
        "{%- if loop.last or (not loop.last and reasoning_content) %}",
        "{%- if reasoning_content %}",
    )
    with pytest.raises(ChatTemplateError, match="probe case 'reasoning, a reply, then a new"):
        check_prefix_stable(dataclasses.replace(chat, template=no_empty))
    # Other templates are the tokenizer's own.
    assert make_chat(tokenizers["qwen2.5"]).template_name == OWN_TEMPLATE
    assert make_chat(tiny_tokenizer(CHATML)).template is CHATML


def _text(chat, messages, generation_prompt=False):
    return chat.decode(chat.render(messages, generation_prompt=generation_prompt))


@pytest.mark.parametrize("thinking", [None, True, False])
def test_the_shipped_qwen3_template_renders_as_the_official_one_but_for_past_turns(
    tokenizers, thinking
):
    stable = make_chat(tokenizers["qwen3"], tools=[GUESS_TOOL], enable_thinking=thinking)
    official = dataclasses.replace(stable, template=official_template("qwen3"))
    reply = {"role": "assistant", "content": REASONING + "I guess 3."}
    call = stable.assistant_message(CALLS["qwen3"])
    tool = {"role": "tool", "content": "higher"}
    same = [[SYSTEM, USER], [SYSTEM, USER, call, tool], [SYSTEM, USER, reply]]
    if thinking is False:  # every turn keeps the empty think block its prompt gave.
        assert "assistant\n<think>\n\n</think>\n\n<tool_call>" in _text(stable, same[1])
        same = same[:1]
    for messages in same:
        for prompt in (True, False):
            assert _text(stable, messages, prompt) == _text(official, messages, prompt)
    empty = "<think>\n\n</think>\n\n"
    assert _text(stable, [USER], True).endswith(
        "<|im_start|>assistant\n" + (empty if thinking is False else "")
    )
    # What the official template rewrites: the reasoning of a turn before the last user
    # query (kept here) and the empty think block of a last turn without reasoning.
    later = [SYSTEM, USER, reply, {"role": "user", "content": "again"}]
    assert "low first" in _text(stable, later) and "low first" not in _text(official, later)
    plain = [USER, {"role": "assistant", "content": "3"}]
    expected = "<|im_start|>assistant\n" + (empty if thinking is False else "") + "3<|im_end|>"
    assert _text(stable, plain).endswith(expected + "\n")
    assert _text(official, plain).endswith(f"<|im_start|>assistant\n{empty}3<|im_end|>\n")
    assert _text(stable, [*plain, USER]).startswith(_text(stable, plain))


@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_plays_tool_calls_in_its_own_format(tokenizers, name):
    chat = make_chat(tokenizers[name], tools=[GUESS_TOOL])
    assert chat.native_tool_calls
    texts = [CALLS[name], "I guess 7.", CALLS[name]]
    loop = TextLoop(chat, CONFIG, scripted_sampler(chat, texts, CONFIG.max_new_tokens))
    keys = jax.random.split(jax.random.key(0), 1)
    (episode,) = loop.play(None, [loop.start(GuessNumber(low=5, high=5, use_tools=True), 1)], keys)
    assert len(episode.turns) == 3 and not episode.truncated
    first = chat.decode(episode.turns[0].obs)
    assert '"guess"' in first and "Guess my number" in first  # the tools, the question.
    # Calls are structured messages the template renders natively; prose is content.
    assistant = [m for m in episode.messages if m["role"] == "assistant"]
    call = {"type": "function", "function": {"name": "guess", "arguments": {"number": 3}}}
    assert assistant[0] == {"role": "assistant", "content": "", "tool_calls": [call]}
    assert assistant[1] == {"role": "assistant", "content": "I guess 7."}
    reply = chat.decode(episode.turns[1].obs)
    header = {"llama3.1": "<|start_header_id|>ipython<|end_header_id|>\n\n"}
    assert header.get(name, "<tool_response>\n") in reply and "higher" in reply
    # The transcript is the policy's ids between the template's own tokens.
    tokens = np.asarray(episode.tokens)
    mask = np.asarray(episode.loss_mask)
    assert tokens[mask].tolist() == sum((t.action for t in episode.turns), [])
    assert episode.spans[-1].stop == len(tokens)
    rendered = chat.render(episode.messages[:-1], generation_prompt=False)
    assert chat.decode(rendered).count("guess") == chat.decode(episode.tokens).count("guess")


def test_llama_calls_parse_and_a_template_that_refuses_the_structured_calls_gets_the_text(
    tokenizers,
):
    llama = '{"name": "guess", "parameters": {"number": 3}}'
    for text in (llama, "<|python_tag|>" + llama, f" {llama}\n"):
        assert parse_tool_calls(text) == ([ToolCall("guess", {"number": 3})], None)
    both = '{"name": "guess", "parameters": {}, "arguments": {}}'
    assert "not both" in parse_tool_calls(both).error
    chat = make_chat(tokenizers["llama3.1"], tools=[GUESS_TOOL])
    two = f"<tool_call>{json.dumps({'name': 'guess', 'arguments': {'number': 1}})}</tool_call>"
    message, rendered = chat.assistant_turn([SYSTEM, USER], two + two)
    assert message == {"role": "assistant", "content": two + two}  # one call per message.
    assert rendered.ids == chat.render([SYSTEM, USER, message], generation_prompt=False)
    one, _ = chat.assistant_turn([SYSTEM, USER], two)
    assert one["tool_calls"][0]["function"]["name"] == "guess"
