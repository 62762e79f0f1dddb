"""Curriculum helpers, horizon configs, rendering and the dialogue scenario."""

import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlagent.envs.toolworld import Command
from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.envs.toolworld import dsl
from rlagent.envs.toolworld import horizon_config
from rlagent.envs.toolworld import level_config
from rlagent.envs.toolworld import oracle_policy
from rlagent.envs.toolworld import render_transcript
from rlagent.envs.toolworld.curriculum import Promotion
from rlagent.envs.toolworld.curriculum import shortest_plan_range
from rlagent.envs.toolworld.reference import ReferenceToolWorld


@pytest.mark.parametrize("horizon", [2, 3, 4, 9, 16, 20])
def test_horizon_config_is_exact(horizon):
    config = horizon_config(horizon)
    assert shortest_plan_range(config) == (horizon, horizon)
    assert config.max_turns == horizon + 2
    # Reference oracle (fast, no compile) solves sampled episodes in exactly `horizon`.
    reference = ReferenceToolWorld(config)
    rng = random.Random(horizon)
    for _ in range(20):
        state = reference.reset(rng)
        for _ in range(config.max_turns):
            state, ts = reference.step(state, reference.oracle(state))
            if ts.step_type == 2:
                break
        assert ts.signals.success and state.turn == horizon == state.shortest_plan


def test_horizon_config_errors():
    with pytest.raises(ValueError, match="shortest_plan"):
        horizon_config(1)
    with pytest.raises(ValueError, match="not reachable"):
        horizon_config(40)  # more exchanges than items


def test_level_ranges():
    assert [shortest_plan_range(level_config(lv)) for lv in (1, 2, 3)] == [(2, 2), (3, 3), (4, 4)]
    assert shortest_plan_range(level_config(4)) == (5, 11)
    assert shortest_plan_range(level_config(4, num_intents=5, num_distractors=2)) == (8, 18)


def test_promotion():
    promotion = Promotion(threshold=0.5, smoothing=0.5)
    level, average = promotion.advance(1, 0.0, 0.6)
    assert (level, average) == (1, 0.3)
    level, average = promotion.advance(level, average, 0.9)
    assert (level, average) == (2, 0.0)
    assert promotion.advance(4, 0.9, 1.0)[0] == 4
    with pytest.raises(ValueError, match="threshold"):
        Promotion(threshold=0.0)


def _play_dialogue(env, state, step, oracle, first_turns):
    """Plays `first_turns` (command tuples) then the oracle to the end."""
    obs, actions, signals = [state.obs], [], []
    for turn in range(env.max_turns):
        if turn < len(first_turns):
            action = np.asarray(dsl.encode(*first_turns[turn], turn_len=env.turn_len))
        else:
            action = np.asarray(oracle(state))
        actions.append(action)
        state, ts = step(state, jnp.asarray(action))
        obs.append(ts.observation.tokens)
        signals.append(ts.signals)
        if ts.step_type == 2:
            break
    return np.stack(obs[:-1]), np.stack(actions), signals


def test_dialogue_accuracy_and_feedback_and_transcript():
    env = ToolWorld(ToolWorldConfig(level=4, scenario="dialogue", num_distractors=0))
    reset = jax.jit(env.reset)
    step = jax.jit(env.step)
    oracle = jax.jit(lambda s: oracle_policy(env, s))
    state, _ = reset(jax.random.PRNGKey(0))
    assert set(np.asarray(state.task_kind).tolist()) == {2}  # status questions only
    # The oracle answers all three questions right, in the shortest plan.
    _, actions, signals = _play_dialogue(env, state, step, oracle, [])
    assert len(actions) == int(state.shortest_plan) == 7
    assert [float(e.accuracy) for e in signals] == [0] * 6 + [1]
    assert [float(e.user_feedback) for e in signals] == [0] * 6 + [1]

    # Answer the first question wrongly: accuracy 2/3 and a thumbs down.
    order = int(state.task_order[0])
    wrong = (int(state.status[order]) + 1) % 3
    turns = [(Command.LOOKUP_ORDER, order), (Command.SAY_STATUS, order, wrong)]
    obs, actions, signals = _play_dialogue(env, state, step, oracle, turns)
    assert float(signals[-1].accuracy) == pytest.approx(2 / 3)
    assert float(signals[-1].user_feedback) == -1 and float(signals[-1].outcome) == 0
    text = render_transcript(obs, actions, outcome=signals[-1].outcome)
    assert f"SAY status ORDER_{order} {dsl.TOKEN_NAMES[dsl.STATUS_0 + wrong]} END" in text
    assert text.splitlines()[0].endswith(f"USER ask_status ORDER_{order}")
    assert text.splitlines()[-1] == "outcome: 0"
    with pytest.raises(ValueError, match="obs_tokens"):
        render_transcript(np.zeros(3), np.zeros((3, 6)))
