"""Sliding-window state encoder: window locality, summary pathway, gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlagent.models import Policy
from rlagent.models.state_encoder import gather_window
from rlagent.models.state_encoder import summary_sequence
from rlagent.models.state_encoder import window_context
from rlagent.rollout import turn_hidden_states
from rlagent.types import Trajectory

VOCAB, TURNS, OBS, MARKERS, ACT, WINDOW = 24, 6, 3, 2, 3, 2
UNIQUE = 22  # token that only turn 0 contains


def _trajectory(seed):
    keys = jax.random.split(jax.random.key(seed), 3)
    obs = jax.random.randint(keys[0], (1, TURNS, OBS), 1, 20).at[0, 0, 1].set(UNIQUE)
    action = jax.random.randint(keys[1], (1, TURNS, ACT), 1, 20)
    progress = jax.random.randint(keys[2], (1, TURNS, MARKERS), 0, 4)
    zeros = jnp.zeros((1, TURNS), jnp.float32)
    return Trajectory(
        obs_tokens=obs,
        progress=progress,
        action_tokens=action,
        action_mask=jnp.ones((1, TURNS, ACT), bool).at[0, 2, 2].set(False),
        logp=jnp.zeros((1, TURNS, ACT)),
        values=jnp.zeros((1, TURNS, ACT)),
        turn_mask=jnp.ones((1, TURNS), bool),
        signals={
            "outcome": zeros,
            "verdict": zeros,
            "efficiency": zeros,
            "violations": (jnp.zeros((1, TURNS), jnp.int32)).astype(jnp.float32),
        },
        success=(zeros) > 0,
        done=jnp.zeros((1, TURNS), bool),
        bootstrap_value=jnp.zeros((1,)),
    )


@pytest.fixture(scope="module", params=[0, 3], ids=["no_summary", "summary"])
def actor(request, tiny_policy_config):
    config = tiny_policy_config(vocab_size=VOCAB, num_summary_slots=request.param)
    graphdef, params = nnx.split(Policy(config, rngs=nnx.Rngs(0)).actor)
    return graphdef, params


@jax.jit
def _logits_and_grads(actor, traj):
    """Teacher-forced logits [S, L, V] and the gradient of the last turn's logit sum."""

    def last_turn(params):
        model = nnx.merge(actor[0], params)
        logits = model.logits(turn_hidden_states(model, traj, window=WINDOW))[0]
        return logits[-1].sum(), logits

    (_, logits), grads = jax.value_and_grad(last_turn, has_aux=True)(actor[1])
    return logits, grads


def _perturb_turn(traj, turn):
    obs = traj.obs_tokens.at[0, turn].set((traj.obs_tokens[0, turn] + 5) % 20 + 1)
    action = traj.action_tokens.at[0, turn].set((traj.action_tokens[0, turn] + 7) % 20 + 1)
    return traj._replace(obs_tokens=obs, action_tokens=action)


def test_out_of_window_turns_act_only_through_summary(actor):
    has_summary = nnx.merge(*actor).config.num_summary_slots > 0
    traj = _trajectory(0)
    base, grads = _logits_and_grads(actor, traj)
    changed, _ = _logits_and_grads(actor, _perturb_turn(traj, 1))
    diff = np.abs(np.asarray(changed - base)).max(axis=(1, 2))
    # Turn 1 is read at turns 1 (current observation), 2 and 3 (window of W=2).
    assert (diff[1:4] > 1e-5).all()
    assert diff[0] == 0.0
    # Gradient of turn 5's logits w.r.t. the embedding of a token only turn 0 contains.
    unique_row = np.abs(np.asarray(grads["lm"]["embed_tokens"]["embedding"][...][UNIQUE])).max()
    if not has_summary:  # M = 0: nothing leaves the window
        np.testing.assert_array_equal(diff[4:], 0.0)
        assert unique_row == 0.0
    else:  # turns 4, 5 see turn 1 (and turn 0) only through the summary; gradients flow
        assert (diff[4:] > 1e-7).all()
        assert unique_row > 0.0
        assert np.abs(np.asarray(grads["encoder"]["gru_x"]["kernel"][...])).max() > 0.0


def test_context_beyond_window_depends_only_on_summary(actor):
    """With the summary held fixed, the context of turn s ignores turns < s - W entirely."""
    model = nnx.merge(*actor)
    traj, other = _trajectory(0), _perturb_turn(_trajectory(0), 1)
    summary = summary_sequence(
        model.encoder,
        model.embed,
        traj.obs_tokens[0],
        traj.progress[0],
        traj.action_tokens[0],
        traj.action_mask[0],
        window=WINDOW,
    )
    for s in (4, 5):
        contexts = []
        for t in (traj, other):
            win = gather_window(
                t.obs_tokens[0], t.progress[0], t.action_tokens[0], t.action_mask[0], s, WINDOW
            )
            contexts.append(
                window_context(
                    model.encoder,
                    model.embed,
                    summary[s],
                    win,
                    t.obs_tokens[0, s],
                    t.progress[0, s],
                )
            )
        np.testing.assert_array_equal(contexts[0][0], contexts[1][0])
        np.testing.assert_array_equal(contexts[0][1], contexts[1][1])
    x, valid = contexts[0]
    slots = model.config.num_summary_slots
    assert x.shape[0] == slots + WINDOW * (OBS + MARKERS + ACT) + OBS + MARKERS
    assert valid[:slots].all()


def test_window_validity_of_early_turns(actor):
    model = nnx.merge(*actor)
    traj = _trajectory(2)
    win = gather_window(
        traj.obs_tokens[0],
        traj.progress[0],
        traj.action_tokens[0],
        traj.action_mask[0],
        1,
        WINDOW,
    )
    np.testing.assert_array_equal(win.valid, [False, True])
    np.testing.assert_array_equal(win.obs[1], traj.obs_tokens[0, 0])
    assert not win.action_mask[0].any()
    with pytest.raises(ValueError, match="max_markers"):
        model.encoder.markers(jnp.zeros((model.config.max_markers + 1,), jnp.int32))
