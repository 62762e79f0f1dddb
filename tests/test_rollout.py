"""Multi-turn rollout in ToolWorld and teacher-forced scoring (tiny policy, two configs)."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlagent.envs.toolworld import Command
from rlagent.envs.toolworld import StepType
from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.envs.toolworld import dsl
from rlagent.models import Policy
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_continue
from rlagent.rollout import make_rollout
from rlagent.rollout import make_score
from rlagent.rollout import make_score_sum
from rlagent.types import token_view

BATCH = 4
ENV = ToolWorld(ToolWorldConfig(level=2, max_turns=5, guardrail="penalise"))
MASK_ENV = ToolWorld(ToolWorldConfig(level=2, max_turns=5, guardrail="mask"))

# windowed + grammar/rule mask (guardrail='mask') + shared value head;
# full context + free sampling + critic.
CASES = {
    "windowed_constrained_shared": (
        RolloutConfig(window=2, constrained=True, temperature=0.9),
        "shared",
        MASK_ENV,
    ),
    "full_free_separate": (RolloutConfig(window=None, top_k=20), "separate", ENV),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tiny_policy_config):
    config, value_head, env = CASES[request.param]
    # The copy gate must be applied identically in rollout and score.
    policy_config = tiny_policy_config(value_head=value_head, copy_prior=2.0)
    graphdef, params = nnx.split(Policy(policy_config, rngs=nnx.Rngs(0)))
    inner, traces = make_rollout(env, graphdef, config, with_carries=True), []

    def counted(*args):
        traces.append(1)
        return inner(*args)

    rollout = jax.jit(counted)
    score = jax.jit(make_score(env, graphdef, config))
    env_keys = jax.random.split(jax.random.key(0), BATCH).at[1].set(jax.random.key(7))
    env_keys = env_keys.at[2].set(jax.random.key(7))  # rows 1 and 2 share a task
    policy_keys = jax.random.split(jax.random.key(8), BATCH)  # episodes of 1-3 turns
    traj, carries = rollout(params, env_keys, policy_keys)
    return dict(
        env=env,
        graphdef=graphdef,
        carries=carries,
        config=config,
        params=params,
        rollout=rollout,
        score=score,
        traj=traj,
        env_keys=env_keys,
        policy_keys=policy_keys,
        traces=traces,
    )


def test_score_sum_equals_the_sum_of_scores(case):
    """`make_score_sum` (fused over played turns when windowed) = summing `make_score`'s."""
    traj, params = case["traj"], case["params"]
    weights = jax.random.normal(jax.random.key(3), traj.logp.shape + (3,))

    def token_sum(scores, rows):
        weights, mask = rows
        terms = weights[..., 0] * scores.logp + weights[..., 1] * scores.values
        terms = terms + weights[..., 2] * scores.entropy
        return jnp.sum(jnp.where(mask, terms, 0.0), axis=-1), {"tokens": jnp.sum(mask, -1)}

    score_sum = make_score_sum(case["env"], case["graphdef"], case["config"], token_sum)
    score = make_score(case["env"], case["graphdef"], case["config"])

    def want(params):
        terms = jnp.sum(weights * jnp.stack(score(params, traj), axis=-1), axis=-1)
        return jnp.sum(terms), {"tokens": jnp.sum(traj.loss_mask)}

    def got(params):
        return score_sum(params, traj, (weights, traj.loss_mask))

    chex.assert_trees_all_close(
        jax.jit(jax.value_and_grad(got, has_aux=True))(params),
        jax.jit(jax.value_and_grad(want, has_aux=True))(params),
        atol=1e-4,
    )


def test_score_matches_rollout(case):
    traj = case["traj"]
    logp, values, entropy = case["score"](case["params"], traj)
    played = np.asarray(traj.loss_mask)
    assert played.sum() > 0
    np.testing.assert_allclose(np.where(played, logp, 0), traj.logp, atol=1e-5)
    np.testing.assert_allclose(np.where(played, values, 0), traj.values, atol=1e-5)
    assert (np.asarray(entropy)[played] >= -1e-6).all()
    assert (np.asarray(traj.logp)[played] <= 0).all()  # 0 where the mask forces a token
    assert (traj.sampling_mask is not None) == case["config"].constrained


def test_masks_and_turn_ids_match_transcript(case):
    """Replays the sampled actions in the env, step by step, and checks every field."""
    traj = jax.tree.map(np.asarray, case["traj"])
    env = case["env"]
    step, reset = jax.jit(env.step), jax.jit(env.reset)
    for b in range(BATCH):
        state, ts = reset(case["env_keys"][b])
        alive = True
        for s in range(ENV.max_turns):
            assert traj.turn_mask[b, s] == alive
            action = traj.action_tokens[b, s]
            ends = np.flatnonzero(action == dsl.END)
            length = ends[0] + 1 if len(ends) else ENV.turn_len
            expected_mask = np.arange(ENV.turn_len) < length if alive else np.zeros(ENV.turn_len)
            np.testing.assert_array_equal(traj.action_mask[b, s], expected_mask)
            assert (action[length:] == dsl.PAD).all() and (action[:length] != dsl.PAD).all()
            if not alive:
                break
            np.testing.assert_array_equal(traj.obs_tokens[b, s], ts.observation.tokens)
            np.testing.assert_array_equal(traj.progress[b, s], ts.observation.progress)
            state, ts = step(state, jnp.asarray(action))
            last = int(ts.step_type) == StepType.LAST
            assert traj.done[b, s] == (last and float(ts.discount) == 0.0)
            assert traj.signals["verdict"][b, s] == ts.signals.verdict
            assert traj.signals["outcome"][b, s] == ts.signals.outcome
            assert traj.signals["violations"][b, s] == ts.signals.violations
            alive = not last
    view = token_view(case["traj"])
    turn_of_token = np.repeat(np.arange(ENV.max_turns), ENV.obs_len + ENV.turn_len)
    loss_mask = np.asarray(view.loss_mask)
    np.testing.assert_array_equal(
        np.asarray(view.turn_ids), np.where(loss_mask, turn_of_token[None], -1)
    )
    assert loss_mask.sum() == traj.loss_mask.sum()


def test_constrained_sampling_obeys_mask(case):
    traj = jax.tree.map(np.asarray, case["traj"])
    played = traj.loss_mask
    if not case["config"].constrained:
        assert (traj.action_tokens[played] != dsl.PAD).all()  # PAD is never generated
        return
    chosen = np.take_along_axis(traj.sampling_mask, traj.action_tokens[..., None], -1)[..., 0]
    assert chosen[played].all()
    commands = jax.vmap(jax.vmap(lambda a: ENV.parse(a)[0]))(jnp.asarray(traj.action_tokens))
    assert (np.asarray(commands)[traj.turn_mask] != Command.MALFORMED).all()
    assert traj.signals["violations"].sum() == 0  # guardrail='mask': the mask keeps the rules


def test_deterministic_per_key_and_compiled_once(case):
    rollout, params = case["rollout"], case["params"]
    again, _ = rollout(params, case["env_keys"], case["policy_keys"])
    chex.assert_trees_all_equal(again, case["traj"])
    other_keys = jax.random.split(jax.random.key(2), BATCH)
    other, _ = rollout(jax.tree.map(lambda p: p * 1.01, params), case["env_keys"], other_keys)
    assert not np.array_equal(other.action_tokens, case["traj"].action_tokens)
    # Rows 1 and 2 share an env key: same task, same first message.
    np.testing.assert_array_equal(other.obs_tokens[1, 0], other.obs_tokens[2, 0])
    assert len(case["traces"]) == 1  # new keys and parameters reuse the compiled program


def test_live_chunks_play_the_same_episodes(case):
    """Playing only the live rows (`live_chunks=8`) plays the episodes of every row's.

    Also under `vmap` over two runs (their chunks packed into shared steps). Tokens,
    masks and signals are equal; log-probs and values agree to float32 rounding (XLA CPU
    picks its matmul kernel by the number of rows). Turns after an episode ended hold
    PAD actions and an empty sampling mask instead of tokens played against the
    absorbing state.
    """
    env, graphdef, dense_config = case["env"], case["graphdef"], case["config"]
    assert dense_config.live_chunks == 0  # the default: every row.
    config = dataclasses.replace(dense_config, live_chunks=8)
    dense = lambda *args: case["rollout"](*args)[0]  # noqa: E731 - compiled by the fixture
    params = [case["params"], jax.tree.map(lambda p: 1.02 * p, case["params"])]
    env_keys = [case["env_keys"], jax.random.split(jax.random.key(5), BATCH)]
    policy_keys = [case["policy_keys"], jax.random.split(jax.random.key(6), BATCH)]
    want = [dense(*args) for args in zip(params, env_keys, policy_keys, strict=True)]
    stack = lambda trees: jax.tree.map(lambda *x: jnp.stack(x), *trees)  # noqa: E731
    got = jax.jit(jax.vmap(make_rollout(env, graphdef, config)))(
        stack(params), stack(env_keys), stack(policy_keys)
    )
    _assert_same_episodes(got, stack(want))
    ended = ~np.asarray(got.turn_mask)
    assert (np.asarray(got.action_tokens)[ended] == dsl.PAD).all()
    if got.sampling_mask is not None:
        assert not np.asarray(got.sampling_mask)[ended].any()


def _assert_same_episodes(got, want):
    """Equal where turns were played (floats to 1e-5), whatever ended episodes hold."""
    ended = ~np.asarray(want.turn_mask)

    def played(traj):
        traj = jax.tree.map(np.asarray, traj)
        mask = traj.sampling_mask
        if mask is not None:
            mask = np.where(ended[..., None, None], False, mask)
        action = np.where(ended[..., None], dsl.PAD, traj.action_tokens)
        return traj._replace(action_tokens=action, sampling_mask=mask)

    got, want = played(got), played(want)
    floats = ("logp", "values", "bootstrap_value")
    chex.assert_trees_all_equal(
        got._replace(**dict.fromkeys(floats)), want._replace(**dict.fromkeys(floats))
    )
    for name in floats:
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), atol=1e-5, err_msg=name)


def test_bootstrap_only_when_truncated(case):
    traj = case["traj"]
    truncated = np.asarray(traj.turn_mask[:, -1] & ~traj.done[:, -1])
    assert (np.asarray(traj.bootstrap_value)[~truncated] == 0).all()
    if truncated.any():
        assert (np.asarray(traj.bootstrap_value)[truncated] != 0).all()


def test_continue_replays_and_forks(case):
    """Continuing from the carry of a turn start with the rollout's keys replays the rest."""
    traj, carries, start = case["traj"], case["carries"], 1
    continue_ = jax.jit(
        make_continue(case["env"], case["graphdef"], case["config"]), static_argnames="num_turns"
    )
    carry = jax.tree.map(lambda x: x[start], carries)
    rest = case["env"].max_turns - start
    suffix = continue_(case["params"], carry, start, case["policy_keys"], num_turns=rest)
    expected = jax.tree.map(lambda x: x[:, start:], traj._replace(bootstrap_value=None))
    chex.assert_trees_all_close(
        suffix._replace(bootstrap_value=None), expected, atol=1e-5, rtol=1e-5
    )
    np.testing.assert_allclose(suffix.bootstrap_value, traj.bootstrap_value, atol=1e-5)
    # A one-turn segment bootstraps from V where its turn was played without termination.
    one = continue_(case["params"], carry, start, case["policy_keys"], num_turns=1)
    cut = np.asarray(one.turn_mask[:, 0] & ~one.done[:, 0])
    assert cut.any() and (np.asarray(one.bootstrap_value)[~cut] == 0).all()
    assert (np.asarray(one.bootstrap_value)[cut] != 0).all()
    fork = continue_(case["params"], carry, start, case["policy_keys"][::-1], num_turns=rest)
    assert not np.array_equal(fork.action_tokens, suffix.action_tokens)


def test_bad_arguments(tiny_policy_config):
    with pytest.raises(ValueError, match="constrained"):
        make_rollout(MASK_ENV, None, RolloutConfig(constrained=False))
    with pytest.raises(ValueError, match="window"):
        RolloutConfig(window=-1)
    wrong = tiny_policy_config(vocab_size=dsl.VOCAB_SIZE + 1)
    graphdef, params = nnx.split(nnx.eval_shape(lambda: Policy(wrong, rngs=nnx.Rngs(0))))
    keys = jax.random.split(jax.random.key(0), 2)
    with pytest.raises(ValueError, match="vocab_size"):
        jax.eval_shape(make_rollout(ENV, graphdef), params, keys, keys)
