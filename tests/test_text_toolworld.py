"""ToolWorld in text mode (`rlagent.text.toolworld`): the text environment played with
tool-call texts matches the JAX ToolWorld played with the same DSL actions; malformed
texts are turns with their own signal, never exceptions; the text loop plays it.

The tokenizer, chat template and tiny policy are tests/text_helpers.py's (built locally);
the mixed DSL policy is tests/test_envs_reference.py's.
"""

import copy
import dataclasses
import functools
import json
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_envs_reference import _mixed_action
from text_helpers import assert_loss_mask_on_assistant_tokens
from text_helpers import scripted_generation
from text_helpers import tiny_text_policy
from text_helpers import tiny_tokenizer

from rlagent.envs.toolworld import Command
from rlagent.envs.toolworld import StepType
from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.envs.toolworld import dsl
from rlagent.envs.toolworld import oracle_policy
from rlagent.text import TextConfig
from rlagent.text import ToolWorldText
from rlagent.text import make_chat
from rlagent.text import make_text_loop
from rlagent.text import make_toolworld_text
from rlagent.text.toolworld import parse_turn
from rlagent.text.toolworld import tool_call_text
from rlagent.train.ppo import episode_metrics

# Levels 1 and 4 bound the rest (level 4 plays every tool); each config compiles its own
# reset and replay, so levels 2 and 3 are left to the oracle loop test and the JAX twin's.
CONFIGS = {
    "level1": ToolWorldConfig(level=1),
    "level4_penalise": ToolWorldConfig(level=4, guardrail="penalise"),
    "level4_dialogue_legacy": ToolWorldConfig(level=4, scenario="dialogue", verdict="legacy"),
}
# The system prompt with the 11 tools' schemas is ~3.6k tokens of the tiny tokenizer.
LOOP_CONFIG = TextConfig(max_new_tokens=12, obs_len=3712, max_prompt_len=4096)
SEEDS = 16  # even seeds: the oracle only; odd seeds: the mixed policy.
_LOOKUP_1 = '{"name": "lookup_order", "arguments": {"order_id": 1}}'
# (text, a part of the error the tool reports; None: any).
MALFORMED = [
    ("", "no tool call"),
    ("I will look your order up right away.", "no tool call"),
    ('<tool_call>{"name": "lookup_order", "arguments": {"order_id": 1', "unbalanced"),
    ('<tool_call>{"name": "lookup_order", "arguments": {"order_id": 1</tool_call>', "not valid"),
    ('{"name": "lookup_order", "arguments": {"order_id": 1}', "not valid JSON"),
    ('<tool_call>{"name": "delete_order", "arguments": {}}</tool_call>', "unknown tool"),
    ('<tool_call>{"name": "lookup_order", "arguments": {"order_id": "1"}}</tool_call>', "integer"),
    ('<tool_call>{"name": "lookup_order", "arguments": {"order_id": 1.0}}</tool_call>', "integer"),
    ('<tool_call>{"name": "lookup_order", "arguments": {"order_id": true}}</tool_call>', "integer"),
    ('<tool_call>{"name": "lookup_order", "arguments": {"order_id": 99}}</tool_call>', "in [0, 7]"),
    ('<tool_call>{"name": "check_stock", "arguments": {"item_id": -1}}</tool_call>', "in [0, 7]"),
    (
        '<tool_call>{"name": "tell_status", "arguments": {"order_id": 1, "status": "lost"}}'
        "</tool_call>",
        "status must be one of",
    ),
    (
        '<tool_call>{"name": "change_address", "arguments": {"order_id": 1}}</tool_call>',
        "missing ['address_id']",
    ),
    (
        '<tool_call>{"name": "lookup_order", "arguments": {"order_id": 1, "item_id": 2}}'
        "</tool_call>",
        "unexpected ['item_id']",
    ),
    (f"<tool_call>{_LOOKUP_1}</tool_call>\n<tool_call>{_LOOKUP_1}</tool_call>", "2 tool calls"),
    ('<tool_call>{"name": "lookup_order", "arguments": [1]}</tool_call>', "must be a JSON object"),
    ("<tool_call>[1, 2]</tool_call>", 'string "name"'),
    (f'<tool_call>{_LOOKUP_1[:-1]}, "id": 7}}</tool_call>', "unexpected keys ['id']"),
    ("<tool_call>" + "[" * 100_000 + "</tool_call>", "not valid JSON"),
    ('{"name": "lookup_order", "arguments": {"order_id": 1' + "0" * 5000 + "}}", None),
    ("<|im_start|>assistant\n<tool_call>", "unbalanced"),
]


def _render(command, arg1, arg2, rng: random.Random) -> str:
    """A valid turn of the command in one of the accepted forms."""
    text = tool_call_text(command, arg1, arg2)
    form = rng.randrange(3)
    if form == 1:
        return f"Let me take care of that.\n{text}\nOne moment."
    if form == 2:  # a bare JSON object, no tags.
        return " " + text.removeprefix("<tool_call>").removesuffix("</tool_call>").strip() + "\n"
    return text


def _text_turn(env: ToolWorldText, rng: random.Random, oracle_only: bool):
    """`(DSL tokens, text)` of a turn: the oracle, the mixed DSL policy or a malformed text."""
    world, state = env.world, env.state
    if not oracle_only and rng.random() < 0.1:
        return [dsl.PAD] * env.config.turn_len, rng.choice(MALFORMED)[0]
    action = world.oracle(state) if oracle_only else _mixed_action(world, state, rng)
    command, arg1, arg2 = world.parse(action)
    if command == Command.MALFORMED:  # random tokens: no call of any tool.
        return action, rng.choice(MALFORMED)[0]
    return action, _render(command, arg1, arg2, rng)


@functools.cache
def _jax_replay(config: ToolWorldConfig):
    env = ToolWorld(config)

    def replay(seed, actions):
        state, _ = env.reset(jax.random.key(seed))

        def turn(state, action):
            oracle = oracle_policy(env, state)
            state, timestep = env.step(state, action)
            return state, (oracle, timestep)

        return jax.lax.scan(turn, state, actions)[1]

    return jax.jit(jax.vmap(replay))


def _play_text(config: ToolWorldConfig):
    """Plays SEEDS text episodes: their DSL actions `[E, S, L]` (PAD after the end), the
    twin's oracle actions, the text env's signals `{name: [E, S]}` and done flags (0 after
    the end), and the turns each episode lasted `[E]`."""
    shape = (SEEDS, config.max_turns)
    actions = np.zeros((*shape, config.turn_len), np.int32)
    oracles = np.zeros_like(actions)
    names = (*ToolWorldText.signal_names, "success")
    signals = {name: np.zeros(shape, np.float32) for name in names}
    done = np.zeros(shape, bool)
    lengths = np.zeros(SEEDS, int)
    rng = random.Random(config.level)
    for seed in range(SEEDS):
        env = ToolWorldText(config)
        env.reset(seed)
        while not (env.state.terminated or env.state.truncated):
            s = lengths[seed]
            oracles[seed, s] = env.world.oracle(env.state)
            actions[seed, s], text = _text_turn(env, rng, oracle_only=seed % 2 == 0)
            reply, turn_signals, done[seed, s] = env.step(text)
            assert reply and all(m["role"] in ("tool", "user") for m in reply)
            for name in names:
                signals[name][seed, s] = turn_signals[name]
            lengths[seed] += 1
    return actions, oracles, signals, done, lengths


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_text_turns_play_as_the_jax_toolworld_plays_their_dsl_actions(name):
    config = CONFIGS[name]
    actions, oracles, signals, done, lengths = _play_text(config)
    jax_oracles, timesteps = jax.tree.map(
        np.asarray, _jax_replay(config)(jnp.arange(SEEDS), jnp.asarray(actions))
    )
    last = timesteps.step_type == StepType.LAST
    assert last.any(axis=1).all()
    np.testing.assert_array_equal(lengths, last.argmax(axis=1) + 1)  # the first LAST step.
    played = np.arange(config.max_turns) < lengths[:, None]
    np.testing.assert_array_equal(jax_oracles[played], oracles[played])
    for key in ("outcome", "verdict", "efficiency", "violations", "success"):
        want = np.where(played, getattr(timesteps.signals, key), 0)
        np.testing.assert_allclose(signals[key], want, err_msg=key)
    np.testing.assert_array_equal(done, played & (timesteps.discount == 0))
    # Malformed exactly on the played turns ToolWorld parses as MALFORMED.
    sizes = (config.num_orders, config.num_items, config.num_addresses)
    commands = np.asarray([[dsl.parse(a, *sizes)[0] for a in row] for row in actions])
    np.testing.assert_array_equal(
        signals["malformed"] == 1, played & (commands == Command.MALFORMED)
    )
    oracle_episodes = np.arange(SEEDS) % 2 == 0
    assert signals["success"][oracle_episodes].sum(axis=1).tolist() == [1.0] * (SEEDS // 2)
    shortest = timesteps.signals.shortest_plan[:, 0]
    np.testing.assert_array_equal(lengths[oracle_episodes], shortest[oracle_episodes])
    assert (signals["malformed"][~oracle_episodes] == 1).any()
    assert (signals["verdict"][~oracle_episodes] < 0).any()
    if config.level == 4 and config.scenario == "agent":  # every tool, and malformed turns.
        assert set(commands[played].tolist()) == set(Command)


@pytest.mark.parametrize("text,error", MALFORMED, ids=range(len(MALFORMED)))
def test_a_malformed_text_is_a_turn_with_the_malformed_signal_never_an_exception(text, error):
    env = make_toolworld_text(level=2)
    env.reset(3)
    twin_state = copy.deepcopy(env.state)
    reply, signals, done = env.step(text)
    _, timestep = env.world.step(twin_state, [dsl.PAD] * env.config.turn_len)
    assert signals["malformed"] == 1.0 and signals["verdict"] == -1.0 and not done
    for name in ("outcome", "verdict", "efficiency", "violations"):
        assert signals[name] == float(getattr(timestep.signals, name)), name
    assert env.state.turn == 1 and env.state.current == 0  # the turn is spent, no task settled.
    (message,) = reply
    assert message["role"] == "tool"
    assert json.loads(message["content"])["error"].startswith("malformed turn: ")
    if error is not None:
        assert error in json.loads(message["content"])["error"]
    # The episode goes on: the oracle's call is played normally after it.
    command, arg1, arg2 = env.world.parse(env.world.oracle(env.state))
    _, signals, _ = env.step(tool_call_text(command, arg1, arg2))
    assert signals["malformed"] == 0.0 and signals["verdict"] == 1.0


def test_accepted_forms_of_a_call_parse_to_the_same_command():
    config = ToolWorldConfig(level=4)
    call = '{"name": "change_address", "arguments": {"address_id": 3, "order_id": 5}}'
    for text in (
        f"<tool_call>{call}</tool_call>",
        f"<tool_call>\n  {call}\n</tool_call>",
        f"I will update the address.\n<tool_call>{call}</tool_call> Done soon.",
        f"\n {call}  \n",
    ):
        assert parse_turn(text, config) == (Command.CHANGE_ADDRESS, 5, 3, None), text
    for text in ('<tool_call>{"name": "end_conversation"}</tool_call>', '{"name": '
                 '"end_conversation", "arguments": {}}'):  # fmt: skip
        assert parse_turn(text, config) == (Command.BYE, 0, 0, None)
    assert parse_turn(f"Sure: {call}", config).command == Command.MALFORMED  # no tags.
    for command in Command:
        if command != Command.MALFORMED:
            arg1 = 1 if dsl.num_args(command) >= 1 else 0
            arg2 = (2 if command == Command.SAY_STATUS else 1) if dsl.num_args(command) == 2 else 0
            assert parse_turn(tool_call_text(command, arg1, arg2), config) == (
                command, arg1, arg2, None
            )  # fmt: skip


def test_replies_state_the_world_in_words():
    env = make_toolworld_text(level=3)  # exchange: lookup, check_stock, then the final step.
    messages = env.reset(5)
    order = env.state.task_order[0]
    assert messages[1] == {
        "role": "user", "content": f"I would like to exchange the item of my order {order}."
    }  # fmt: skip
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "amount level is at most 2" in messages[0]["content"]
    before = copy.deepcopy(env.state)
    reply, _, _ = env.step(tool_call_text(Command.LOOKUP_ORDER, order))
    item = before.item[order]
    assert json.loads(reply[0]["content"]) == {
        "order_id": order, "item_id": item, "status": "delivered",
        "address_id": before.address[order], "amount_level": before.amount[order],
    }  # fmt: skip
    reply, _, _ = env.step(tool_call_text(Command.CHECK_STOCK, item))
    in_stock = before.in_stock[item]
    assert json.loads(reply[0]["content"]) == {"item_id": item, "in_stock": in_stock}
    final = (Command.EXCHANGE, order, item) if in_stock else (Command.SAY_NO_STOCK, item, 0)
    reply, _, _ = env.step(tool_call_text(*final))
    thanks = {"role": "user", "content": "Thank you, that is all I needed."}
    if in_stock:  # a world call that settles the request: its result, then the user.
        assert reply == [{"role": "tool", "content": f'{{"order_id": {order}, "result": "ok"}}'},
                         thanks]  # fmt: skip
    else:
        assert reply == [thanks]
    reply, signals, done = env.step(tool_call_text(Command.BYE))
    assert reply == [{"role": "user", "content": "Goodbye!"}] and done and signals["success"] == 1
    # A failed world call: the order of a delivered exchange cannot be cancelled.
    env.reset(5)
    reply, signals, _ = env.step(tool_call_text(Command.CANCEL_ORDER, order))
    assert json.loads(reply[0]["content"]) == {"order_id": order, "result": "error"}
    assert signals["violations"] == 1.0 and signals["malformed"] == 0.0


def test_a_blocked_call_ends_the_episode_with_the_penalty_signals():
    env = make_toolworld_text(level=3, guardrail="penalise")
    env.reset(5)
    reply, signals, done = env.step(tool_call_text(Command.REFUND, env.state.task_order[0]))
    assert done and signals["violations"] >= 1 and signals["verdict"] == -1.0
    assert json.loads(reply[0]["content"])["error"].startswith("blocked")


def test_same_seed_same_messages_and_a_fork_continues_alike():
    texts = ["hello", tool_call_text(Command.LOOKUP_ORDER, 2), tool_call_text(Command.BYE)]
    first, second = make_toolworld_text(level=4), make_toolworld_text(level=4)
    assert first.reset(7) == second.reset(7)
    assert len({json.dumps(make_toolworld_text(level=4).reset(s)) for s in range(8)}) > 1
    forked = None
    for text in texts:
        assert first.step(text) == second.step(text)
        forked = forked or copy.deepcopy(first)
    assert forked.state != first.state
    first.reset(7)
    first.step(texts[0])
    assert [first.step(t) for t in texts[1:]] == [forked.step(t) for t in texts[1:]]


def test_refusals():
    with pytest.raises(ValueError, match="guardrail='mask'"):
        make_toolworld_text(level=1, guardrail="mask")
    env = make_toolworld_text(level=1)
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("hello")
    env.reset(0)
    env.step(tool_call_text(Command.BYE))
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("hello")


@pytest.fixture(scope="module")
def loop():
    chat = make_chat(tiny_tokenizer(), tools=make_toolworld_text(level=1).tools)
    policy_config, graphdef, params = tiny_text_policy(chat)
    return make_text_loop(chat, graphdef, policy_config, LOOP_CONFIG), params


def test_the_text_loop_plays_toolworld_with_a_random_policy(loop):
    loop, params = loop
    chat = loop.chat
    episodes = [loop.start(make_toolworld_text(level=1), seed) for seed in range(2)]
    loop.play(params, episodes, jax.random.split(jax.random.key(0), 2))
    traj = loop.trajectory(episodes)
    env = episodes[0].env
    assert set(traj.signals) == set(env.signal_names) and traj.turn_mask.shape == (2, 4)
    # A random policy writes no tool call: every turn is malformed, spent as ToolWorld
    # spends a MALFORMED turn (verdict -1; past the 2-turn shortest plan, efficiency -1).
    assert np.asarray(traj.turn_mask).all() and not np.asarray(traj.done).any()
    np.testing.assert_array_equal(traj.signals["malformed"], np.ones((2, 4)))
    np.testing.assert_array_equal(traj.signals["verdict"], -np.ones((2, 4)))
    np.testing.assert_array_equal(traj.signals["efficiency"], [[0, 0, -1, -1]] * 2)
    assert_loss_mask_on_assistant_tokens(traj, episodes)
    for episode in episodes:
        for turn in episode.turns[1:]:
            assert '<|im_start|>tool\n{"error": "malformed turn: ' in chat.decode(turn.obs)
    metrics = episode_metrics(env, traj)
    assert float(metrics["malformed_rate"]) == 1.0 and float(metrics["process_score"]) == -1.0
    assert float(metrics["success"]) == 0.0


def _oracle_sampler(chat, episodes, length):
    """A sampler that writes the ToolWorld oracle's call (then END) for every live episode."""

    def sample(params, prompts, valid, keys):
        texts = [None if episode.over else episode.env.oracle_text() for episode in episodes]
        return scripted_generation(chat, texts, len(keys), length)

    return sample


def test_the_oracle_calls_written_as_text_solve_episodes_in_the_loop(loop):
    loop, _ = loop
    config = dataclasses.replace(LOOP_CONFIG, max_new_tokens=128)
    episodes = [loop.start(make_toolworld_text(level=2), seed) for seed in range(2)]
    scripted = loop._replace(
        config=config, sample=_oracle_sampler(loop.chat, episodes, 128), cached=None
    )
    scripted.play(None, episodes, jax.random.split(jax.random.key(0), 2))
    traj = scripted.trajectory(episodes)
    np.testing.assert_array_equal(traj.turn_mask, [[1, 1, 1, 0, 0]] * 2)  # the shortest plan.
    np.testing.assert_array_equal(traj.success, traj.done)
    assert np.asarray(traj.episode_success).all()
    np.testing.assert_array_equal(traj.signals["verdict"], traj.turn_mask)
    assert not np.asarray(traj.signals["malformed"]).any()
    assert '"status": ' in loop.chat.decode(episodes[0].turns[1].obs)  # the lookup's result.
