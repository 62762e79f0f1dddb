"""Differential tests: the JAX ToolWorld against the plain-Python reference.

Episodes start from JAX reset states loaded into `ReferenceToolWorld`. The reference plays
them with a mixed policy (oracle turns, oracle turns with a corrupted argument, random
commands with random arguments, random tokens) for one turn more than max_turns, so that
truncation and the absorbing state are covered; JAX replays the same actions with a
vmapped `lax.scan` of `env.step`, and every timestep, and the JAX oracle's action at every
visited state, must equal the reference's.
"""

import dataclasses
import functools
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlagent.envs.mastermind import Mastermind
from rlagent.envs.prompts import PromptEnv
from rlagent.envs.toolworld import Command
from rlagent.envs.toolworld import Signals
from rlagent.envs.toolworld import StepType
from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.envs.toolworld import dsl
from rlagent.envs.toolworld import generator
from rlagent.envs.toolworld import oracle_policy
from rlagent.envs.toolworld import random_policy
from rlagent.envs.toolworld.reference import ReferenceToolWorld
from rlagent.rollout import RolloutConfig
from rlagent.train import evaluation

CASES = {
    # name: (config, number of episodes); 2000 episodes in all, every verdict preset.
    "agent_off": (ToolWorldConfig(level=4), 800),
    "agent_legacy_verdict": (ToolWorldConfig(level=4, verdict="legacy"), 500),
    "dialogue_penalise_sizes": (
        ToolWorldConfig(
            level=4,
            scenario="dialogue",
            guardrail="penalise",
            penalty=0.5,
            obs_len=9,
            turn_len=7,
            num_orders=12,
            num_items=5,
            verdict_bye_failed=-1.0,
            verdict_wrong_final=-1.5,
        ),
        700,
    ),
}


def _mixed_action(reference: ReferenceToolWorld, state, rng: random.Random) -> list:
    """Oracle 50%, oracle with a random order 20%, a lookup of the task's order 5%, random
    command 20%, random tokens 5%."""
    cfg = reference.config
    u = rng.random()
    if 0.7 <= u < 0.75 and state.current < cfg.num_tasks:
        return reference.encode(Command.LOOKUP_ORDER, state.task_order[state.current])
    if u < 0.7:
        action = reference.oracle(state)
        is_order = dsl.ORDER_0 <= action[2] < dsl.ORDER_0 + cfg.num_orders
        if u >= 0.5 and is_order:
            action[2] = dsl.ORDER_0 + rng.randrange(cfg.num_orders)
        return action
    if u < 0.95:
        command = rng.randrange(dsl.NUM_COMMANDS)
        sizes = [size for literal, _, size in reference._patterns[command] if literal is None]
        args = [rng.randrange(size) for size in sizes] + [0, 0]
        return reference.encode(command, args[0], args[1])
    return [rng.randrange(dsl.VOCAB_SIZE) for _ in range(cfg.turn_len)]


@functools.cache
def _jax_replay(config: ToolWorldConfig):
    env = ToolWorld(config)

    def replay(state, actions):
        def turn(state, action):
            oracle = oracle_policy(env, state)
            state, timestep = env.step(state, action)
            return state, (oracle, timestep)

        return jax.lax.scan(turn, state, actions)[1]

    return env, jax.jit(jax.vmap(env.reset)), jax.jit(jax.vmap(replay))


@pytest.mark.parametrize("name", sorted(CASES))
def test_jax_matches_reference(name):
    config, batch = CASES[name]
    env, reset, replay = _jax_replay(config)
    reference = ReferenceToolWorld(config)
    states, first = reset(jax.random.split(jax.random.PRNGKey(len(name)), batch))
    host_states = jax.tree.map(np.asarray, states)
    turns = env.max_turns + 1
    rng = random.Random(name)
    actions = np.zeros((batch, turns, env.turn_len), np.int32)
    oracles = np.zeros_like(actions)
    expected = {
        "step_type": np.zeros((batch, turns), np.int8),
        "reward": np.zeros((batch, turns), np.float32),
        "discount": np.zeros((batch, turns), np.float32),
        "tokens": np.zeros((batch, turns, env.obs_len), np.int32),
        "progress": np.zeros((batch, turns, env.num_markers), np.int32),
    }
    expected.update({key: [] for key in Signals._fields})
    for b in range(batch):
        state = reference.load(jax.tree.map(lambda x, b=b: x[b], host_states))
        assert state.obs == np.asarray(first.observation.tokens[b]).tolist()
        for s in range(turns):
            oracles[b, s] = reference.oracle(state)
            actions[b, s] = _mixed_action(reference, state, rng)
            state, ts = reference.step(state, actions[b, s].tolist())
            expected["step_type"][b, s] = ts.step_type
            expected["reward"][b, s] = ts.reward
            expected["discount"][b, s] = ts.discount
            expected["tokens"][b, s] = ts.obs
            expected["progress"][b, s] = ts.progress
            for key in Signals._fields:
                expected[key].append(getattr(ts.signals, key))

    jax_oracles, timesteps = jax.tree.map(np.asarray, replay(states, jnp.asarray(actions)))
    got = {
        "step_type": timesteps.step_type,
        "reward": timesteps.reward,
        "discount": timesteps.discount,
        "tokens": timesteps.observation.tokens,
        "progress": timesteps.observation.progress,
    }
    got.update(timesteps.signals._asdict())
    for key, want in expected.items():
        want = np.asarray(want).reshape(got[key].shape)
        bad = np.argwhere(~np.isclose(got[key], want, rtol=1e-6).reshape(batch, turns, -1).all(-1))
        if bad.size:
            b, s = bad[0]
            raise AssertionError(
                f"{key} differs at episode {b} turn {s} after action "
                f"{dsl.render(actions[b, s])!r}: jax {got[key][b, s]} vs reference {want[b, s]}"
            )
    np.testing.assert_array_equal(jax_oracles, oracles)
    # The action mix must reach every command, verdict and (agent scenario) rule.
    commands = {reference.parse(a)[0] for a in actions.reshape(-1, env.turn_len).tolist()}
    assert commands == set(range(dsl.NUM_COMMANDS + 1))
    verdicts = set(np.unique(expected["verdict"]).tolist())
    values = {-1.0, 0.0, 1.0, config.verdict_wrong_final, config.verdict_bye_failed}
    if {"change_address", "cancel"} & set(config.kinds):
        values.add(config.verdict_unneeded_lookup)
    assert verdicts == values
    assert 0 < np.asarray(expected["success"]).mean()
    if config.scenario == "agent":
        assert np.asarray(expected["violation_flags"]).any(axis=0).all()
    else:
        assert set(np.unique(expected["user_feedback"]).tolist()) == {-1.0, 0.0, 1.0}
    if config.guardrail == "penalise":
        assert (np.asarray(expected["reward"]) == -config.penalty).any()


def test_reference_reset_distribution_matches():
    """Reference `reset` samples the same task distribution as the JAX `reset`."""
    config = ToolWorldConfig(level=4)
    env = ToolWorld(config)
    reference = ReferenceToolWorld(config)
    states, _ = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(0), 2000))
    rng = random.Random(0)
    ref_states = [reference.reset(rng) for _ in range(2000)]
    jax_plan = np.asarray(states.shortest_plan)
    ref_plan = np.array([s.shortest_plan for s in ref_states])
    assert abs(jax_plan.mean() - ref_plan.mean()) < 0.2
    jax_kinds = np.bincount(np.asarray(states.task_kind).ravel(), minlength=6) / 8000
    ref_kinds = np.bincount([k for s in ref_states for k in s.task_kind], minlength=6) / 8000
    np.testing.assert_allclose(jax_kinds, ref_kinds, atol=0.03)
    # The oracle solves reference-sampled episodes in the shortest plan too.
    for state in ref_states[:200]:
        for _ in range(config.max_turns):
            state, ts = reference.step(state, reference.oracle(state))
            if ts.step_type == StepType.LAST:
                break
        assert ts.signals.success and state.turn == state.shortest_plan


def test_random_policy_with_rule_mask():
    """Grammatical, never breaks a rule, and (almost) never solves a level-4 task."""
    env = ToolWorld(ToolWorldConfig(level=4, guardrail="mask"))

    def episode(key):
        reset_key, policy_key = jax.random.split(key)
        state, _ = env.reset(reset_key)

        def turn(state, turn_key):
            action = random_policy(env, state, turn_key)
            command, _, _ = env.parse(action)
            state, ts = env.step(state, action)
            return state, (command, ts.signals.violations, ts.signals.success)

        _, out = jax.lax.scan(turn, state, jax.random.split(policy_key, env.max_turns))
        return out

    keys = jax.random.split(jax.random.PRNGKey(1), 256)
    commands, violations, success = jax.jit(jax.vmap(episode))(keys)
    assert np.asarray(success).any(axis=1).mean() < 0.05
    assert int(violations.sum()) == 0
    commands = np.asarray(commands)
    assert (commands != Command.MALFORMED).all()
    # Rule-guarded commands are still sampled when they are safe.
    assert np.isin([Command.REFUND, Command.CANCEL_ORDER, Command.CHANGE_ADDRESS], commands).all()


@pytest.mark.parametrize("level", [1, 4])
def test_task_split_holds_out_cells_and_the_reference_agrees(level):
    """`task_split`: train episodes hold no held-out cell, held-out episodes at least one,
    in JAX and in the reference; the JAX hash equals the reference's on every cell; the
    quarter held out is about a quarter."""
    base = ToolWorldConfig(level=level)
    reference = ReferenceToolWorld(base)
    n, i, a = base.num_orders, base.num_items, base.num_addresses
    kinds = np.array([int(k) for k in base.kind_ids])
    grid = np.stack(np.meshgrid(kinds, np.arange(n), np.arange(i), np.arange(a), indexing="ij"))
    cells = grid.reshape(4, -1)
    jax_held = np.asarray(generator.heldout_cells(base, *cells))
    ref_held = [reference.heldout_cell(*(int(v) for v in c)) for c in cells.T]
    np.testing.assert_array_equal(jax_held, ref_held)
    assert 0.2 < jax_held.mean() < 0.3

    keys = jax.random.split(jax.random.PRNGKey(level), 256)
    plain = jax.vmap(ToolWorld(base).reset)(keys)[0]
    assert 0 < np.mean(jax.vmap(lambda s: generator.episode_heldout(base, s))(plain)) < 1
    for split, want in (("train", False), ("heldout", True)):
        config = dataclasses.replace(base, task_split=split)
        states = jax.jit(jax.vmap(ToolWorld(config).reset))(keys)[0]
        flags = np.asarray(jax.vmap(lambda s, c=config: generator.episode_heldout(c, s))(states))
        assert (flags == want).all(), split
        for b in range(0, 256, 32):  # the reference reads the same cells off the JAX state
            one = jax.tree.map(lambda x, b=b: x[b], states)
            assert ReferenceToolWorld(config).episode_heldout(reference.load(one)) == want
        rng = random.Random(level)
        twin = ReferenceToolWorld(config)
        assert all(twin.episode_heldout(twin.reset(rng)) == want for _ in range(200))
    with pytest.raises(ValueError, match="task_split"):
        ToolWorldConfig(task_split="test")


def test_heldout_evaluation_plays_the_heldout_env(monkeypatch):
    """EvalConfig.tasks='heldout' evaluates on `heldout_env()`; refused where training could
    draw the held-out tasks or the environment has no split."""
    rollout, played = RolloutConfig(), []
    monkeypatch.setattr(evaluation, "make_rollout", lambda env, *_: played.append(env))
    train = ToolWorld(ToolWorldConfig(level=2, task_split="train"))
    evaluation.make_evaluate(train, None, rollout, num_episodes=4, tasks="heldout")
    assert [env.config.task_split for env in played] == ["heldout", "heldout"]
    evaluation.make_evaluate(train, None, rollout, num_episodes=4)  # 'same': the training env
    assert played[-1] is train
    with pytest.raises(ValueError, match="task_split='train'"):
        evaluation.make_evaluate(ToolWorld(), None, rollout, num_episodes=4, tasks="heldout")
    with pytest.raises(ValueError, match="MastermindConfig.task_split='train'"):
        evaluation.make_evaluate(Mastermind(), None, rollout, num_episodes=4, tasks="heldout")
    with pytest.raises(ValueError, match="no train / held-out split"):
        evaluation.make_evaluate(PromptEnv(), None, rollout, num_episodes=4, tasks="heldout")
    with pytest.raises(ValueError, match="EvalConfig.tasks"):
        evaluation.EvalConfig(tasks="test")
