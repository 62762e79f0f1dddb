"""Process reward models: step labels, learned reward components, noisy oracle, learned scorer.

Hand-computed cases for the labels and reward components; the learned scorer and the
trainer share one tiny module-scope setup (level 1, B = 4, two labelled episodes).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_credit_lm import POLICY as CREDIT_LM_POLICY

from rlagent.credit import lm
from rlagent.credit import mc
from rlagent.credit.mc import MCValues
from rlagent.credit.mc import TurnSignals
from rlagent.credit.probe import ProbeConfig
from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.host import loop
from rlagent.host.extras import trainer_extras
from rlagent.models import Policy
from rlagent.prm import PRMConfig
from rlagent.prm import PRMInputs
from rlagent.prm import completion_labels
from rlagent.prm import label_quality
from rlagent.prm import make_prm
from rlagent.prm import progress_labels
from rlagent.prm.learned import label_episodes
from rlagent.prm.learned import make_learned_prm
from rlagent.returns import prm_rewards
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_rollout
from rlagent.train import make_train
from rlagent.train.config import LEARNED_REWARDS
from rlagent.train.config import TrainConfig
from rlagent.train.rewards import COMPONENTS
from rlagent.train.rewards import reward_components
from rlagent.train.rewards import reward_weights
from rlagent.train.rewards import turn_rewards

T, F = True, False


def _values(success, q_success) -> MCValues:
    zeros = jnp.zeros_like(jnp.asarray(success, jnp.float32))
    return MCValues(
        *(zeros,) * 6,
        success=jnp.asarray(success, jnp.float32),
        q_success=jnp.asarray(q_success, jnp.float32),
        turns=jnp.zeros((), jnp.float32),
    )


def test_completion_and_progress_labels_by_hand():
    mask = jnp.asarray([[T, T, F]])
    values = _values(success=[[0.5, 0.25, 0.5]], q_success=[[0.5, 0.0, 1.0]])
    hard, soft = completion_labels(values, mask)
    np.testing.assert_allclose(soft, [[0.5, 0.0, 0.0]])  # unplayed turns are 0
    np.testing.assert_allclose(hard, [[1.0, 0.0, 0.0]])  # some continuation succeeded
    # (1 + Q - V) / 2: Q = 0.5 from V = 0.5 is a neutral step, Q = 0 from 0.25 a bad one.
    np.testing.assert_allclose(progress_labels(values, mask), [[0.5, 0.375, 0.0]])


def test_best_of_k_is_the_unbiased_pass_at_k():
    from math import comb

    from rlagent.analysis.paired import pass_at_k
    from rlagent.prm.labels import best_of_k

    n = 6
    p = jnp.arange(n + 1, dtype=jnp.float32) / n  # c = 0 .. 6 successes of 6
    for k in (1, 2, 4, 6):  # the traced twin of the host estimator
        expected = [pass_at_k(n, c, k) for c in range(n + 1)]
        np.testing.assert_allclose(best_of_k(p, n, k), expected, atol=1e-6)
    np.testing.assert_allclose(best_of_k(p, n, 1), p, atol=1e-6)  # K = 1: the fraction
    # Unbiased: averaged over the binomial draws of c it is 1 - (1 - q)^K.
    q, k = 0.3, 3
    mean = sum(comb(n, c) * q**c * (1 - q) ** (n - c) * float(best_of_k(jnp.asarray(c / n), n, k))
               for c in range(n + 1))  # fmt: skip
    assert mean == pytest.approx(1 - (1 - q) ** k, abs=1e-6)
    with pytest.raises(ValueError, match="k <= num_samples"):
        best_of_k(p, n, n + 1)
    # Progress labels under the best-of-2 prover of 4 continuations, by hand:
    # V = 0.5 (2 of 4) -> 1 - C(2,2)/C(4,2) = 5/6; Q = 0.25 (1 of 4) -> 1 - C(3,2)/C(4,2) = 1/2.
    values = _values(success=[[0.5]], q_success=[[0.25]])
    got = progress_labels(values, jnp.asarray([[T]]), best_of=2, num_samples=4)
    np.testing.assert_allclose(got, [[(1 + 0.5 - 5 / 6) / 2]], atol=1e-6)
    with pytest.raises(ValueError, match="prover_best_of"):
        PRMConfig(kind="progress", label_samples=4, prover_best_of=5)


def test_label_quality_by_hand():
    labels = jnp.asarray([[0.9, 0.2, 0.6], [0.6, 0.5, 0.0]])
    mask = jnp.asarray([[T, T, T], [T, T, F]])
    verdict = jnp.asarray([[1.0, -1.0, 0.0], [-1.0, 1.0, 1.0]])
    quality = label_quality(labels, mask, verdict)
    # Judged: (0,0) + right, (0,1) - right, (1,0) - labelled 0.6 wrong, (1,1) + at 0.5 wrong;
    # the neutral (0,2) and unplayed (1,2) are left out.
    assert float(quality.num_turns) == 4
    assert float(quality.accuracy) == pytest.approx(0.5)
    # Positives {0.9, 0.5} over negatives {0.2, 0.6}: 3 of 4 pairs ordered.
    assert float(quality.auroc) == pytest.approx(0.75)
    # Only neutral verdicts: nothing to score. Only positive ones: accuracy but no AUROC.
    empty = label_quality(labels, mask, jnp.zeros_like(verdict))
    assert np.isnan(empty.accuracy) and np.isnan(empty.auroc) and float(empty.num_turns) == 0
    one_class = label_quality(labels, mask, jnp.abs(verdict))
    assert float(one_class.accuracy) == pytest.approx(0.5) and np.isnan(one_class.auroc)


def _signals() -> TurnSignals:
    """Row 0 terminates at turn 2 (solved); row 1 plays all 4 turns, truncated."""
    turn_mask = jnp.asarray([[T, T, T, F], [T, T, T, T]])
    zeros = jnp.zeros((2, 4), jnp.float32)
    return TurnSignals(
        turn_mask=turn_mask,
        signals={
            "outcome": zeros.at[0, 2].set(1.0),
            "verdict": zeros,
            "efficiency": zeros,
            "violations": (zeros.astype(jnp.int32)).astype(jnp.float32),
        },
        success=(zeros.at[0, 2].set(1.0)) > 0,
        done=jnp.asarray([[F, F, T, F], [F, F, F, F]]),
    )


SCORES = jnp.asarray([[0.8, 0.2, 0.6, 0.9], [0.5, 1.0, 0.0, 0.25]])


def test_learned_components_by_hand():
    signals, config = _signals(), TrainConfig(gamma=1.0)
    components = np.asarray(reward_components(signals, config, SCORES))
    learned = {name: components[..., COMPONENTS.index(name)] for name in LEARNED_REWARDS}
    np.testing.assert_allclose(
        learned["learned_sum"], [[0.6, -0.6, 0.2, 0.0], [0.0, 1.0, -1.0, -0.5]], atol=1e-6
    )
    # Phi_s = 0.5 x the scores before s; the episode's end has Phi = 0, so with gamma = 1
    # the shaping telescopes to -Phi_0 = 0 on every row.
    np.testing.assert_allclose(
        learned["learned_potential"], [[0.4, 0.1, -0.5, 0.0], [0.25, 0.5, 0.0, -0.75]], atol=1e-6
    )
    np.testing.assert_allclose(learned["learned_potential"].sum(axis=1), 0.0, atol=1e-6)
    expected_min = prm_rewards(
        2 * SCORES - 1, signals.turn_mask, form="min", temperature=config.prm_temperature
    )
    np.testing.assert_allclose(learned["learned_min"], expected_min, atol=1e-6)
    # Centred: 2 (p - mean p), the mean over the 7 played turns of the batch.
    mask = np.asarray(signals.turn_mask)
    mean = np.asarray(SCORES)[mask].mean()
    np.testing.assert_allclose(
        learned["learned_centred"], 2 * (np.asarray(SCORES) - mean) * mask, atol=1e-6
    )
    assert abs(learned["learned_centred"][mask].sum()) < 1e-5  # an average step earns 0
    # A bootstrapped truncated row ends at the potential of all its turns: Phi_S - Phi_0.
    boot = TrainConfig(gamma=1.0, bootstrap_truncated=True)
    shaped = np.asarray(reward_components(signals, boot, SCORES))[..., COMPONENTS.index(
        "learned_potential")]  # fmt: skip
    np.testing.assert_allclose(shaped.sum(axis=1), [0.0, 0.5 * 1.75], atol=1e-6)
    # A form is the outcome plus its component; without scores the components are 0.
    rewards = turn_rewards(signals, config, reward_weights(config, "learned_sum"), SCORES)
    np.testing.assert_allclose(
        rewards, signals.signals["outcome"] + learned["learned_sum"], atol=1e-6
    )
    unscored = np.asarray(reward_components(signals, config))
    assert not unscored[..., COMPONENTS.index("learned_sum") :].any()


def test_noisy_oracle_flips_labels_at_its_noise_rate():
    key_verdict, key_mask = jax.random.split(jax.random.key(0))
    shape = (100, 100)
    verdict = jax.random.choice(key_verdict, jnp.asarray([-1.0, 0.0, 1.0]), shape)
    mask = jax.random.uniform(key_mask, shape) < 0.9
    signals = _signals()._replace(
        turn_mask=mask,
        signals={"outcome": jnp.zeros(shape), "verdict": verdict},
        success=jnp.zeros(shape, bool),
        done=jnp.zeros(shape, bool),
    )
    good = np.asarray((verdict > 0) & mask, np.float32)
    judged = np.asarray(mask & (verdict != 0))
    inputs = PRMInputs(None, None, signals, None)
    for noise in (0.0, 0.3):
        noisy = PRMConfig(kind="noisy_oracle", noise=noise)
        prm = make_prm(noisy, TrainConfig(), None, None, None)
        state = prm.init(jax.random.key(1), None)
        scores = np.asarray(prm.scores(state, inputs, jax.random.key(2)))
        assert not scores[~np.asarray(mask)].any()
        # Neutral turns (verdict 0) score 1/2, a centred score of 0 as the oracle gives.
        np.testing.assert_array_equal(scores[np.asarray(mask) & ~judged], 0.5)
        flipped = np.mean(scores[judged] != good[judged])
        # ~6,000 judged turns: the flip rate's standard error is below 0.006.
        assert flipped == pytest.approx(noise, abs=0.03)
        _, metrics = prm.update(state, inputs._replace(scores=jnp.asarray(scores)), None)
        assert float(metrics["label_turns"]) == 0 and np.isnan(metrics["prm_loss"])
        if noise == 0.0:
            np.testing.assert_array_equal(scores, np.where(judged, good, scores))
            assert float(metrics["prm_auroc"]) == 1.0


# The learned scorer inside and outside the trainer ----------------------------------------

ENV = ToolWorld(ToolWorldConfig(level=1))
POLICY = CREDIT_LM_POLICY  # the tiny LM of the credit tests (same shapes, same compiles)
ROLLOUT = RolloutConfig(window=1, constrained=True)
CONFIG = TrainConfig(
    num_updates=2,
    num_groups=2,
    group_size=2,
    num_epochs=1,
    num_minibatches=1,
    reward="learned_potential",
)
PRM = PRMConfig(kind="completion", label_episodes=2, label_samples=2, learning_rate=1e-2)


@pytest.fixture(scope="module")
def trained():
    """Two trainer updates; then the first one's labels replayed outside the trainer."""
    extras = trainer_extras(CONFIG, ENV, ROLLOUT, prm=PRM)
    trainer = make_train(CONFIG, ENV, POLICY, ROLLOUT, **extras)
    state = trainer.init(jax.random.key(0))
    update = jax.jit(trainer.update)
    first, metrics_1 = update(state)
    _, metrics_2 = update(first)
    # The update's key schedule (ppo.make_train.update): rollout keys, then the PRM's.
    _, env_key, policy_key, shuffle_key = jax.random.split(state.key, 4)
    env_keys = jnp.repeat(jax.random.split(env_key, CONFIG.num_groups), CONFIG.group_size, 0)
    policy_keys = jax.random.split(policy_key, CONFIG.batch_size)
    rollout = jax.jit(make_rollout(ENV, trainer.graphdef, ROLLOUT, with_carries=True))
    traj, carries = rollout(state.params, env_keys, policy_keys)
    _, update_key = jax.random.split(jax.random.fold_in(shuffle_key, 0x9B3))
    labelled = label_episodes(PRM, CONFIG.batch_size)
    play = lm.play_policy(ENV, trainer.graphdef, ROLLOUT, state.params)
    values = jax.jit(mc.mc_values, static_argnames=("play", "num_samples", "config", "q_only"))(
        play,
        jax.tree.map(lambda x: x[labelled], lm.forks_from_carries(carries)),
        mc.trajectory_signals(jax.tree.map(lambda x: x[labelled], traj)),
        update_key,
        num_samples=PRM.label_samples,
        reward_weights=reward_weights(CONFIG, "outcome"),
        config=CONFIG,
        q_only=True,  # completion labels read Q only
    )
    return dict(
        state=state,
        update=update,
        metrics=[metrics_1, metrics_2],
        label_turns=float(values.turns),
        played=int(np.sum(np.asarray(traj.turn_mask)[labelled])),
    )


def test_training_with_a_learned_prm_reports_its_label_cost(trained):
    nan_able = ("prm_auroc", "label_auroc")  # NaN when a verdict class is missing
    for metrics in trained["metrics"]:
        assert all(np.isfinite(v) for k, v in metrics.items() if k not in nan_able), metrics
        assert float(metrics["label_turns"]) > 0
    # The first update's labels cost the turns its Monte-Carlo continuations played:
    # N continuations from after every played turn but the last of the labelled episodes
    # (one per group), 1 to S turns each.
    labelled = label_episodes(PRM, CONFIG.batch_size)
    np.testing.assert_array_equal(labelled, [0, 2])
    assert float(trained["metrics"][0]["label_turns"]) == trained["label_turns"]
    forks = (trained["played"] - len(labelled)) * PRM.label_samples
    assert forks <= trained["label_turns"] <= forks * ENV.max_turns


def test_scorer_loss_decreases_on_fixed_labels(trained):
    # The same policy, batch and keys every update: fixed labels; only the scorer learns.
    state, losses = trained["state"], []
    for _ in range(4):
        learned, metrics = trained["update"](state)
        state = state._replace(prm_state=learned.prm_state)
        losses.append(float(metrics["prm_loss"]))
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize(
    "overrides,field",
    [
        (dict(kind="oracle"), "PRMConfig.kind"),
        (dict(noise=0.7), "PRMConfig.noise"),
        (dict(kind="progress", label_episodes=0), "PRMConfig.label_episodes"),
        (dict(label_samples=0), "PRMConfig.label_samples"),
        (dict(prover_epsilon=-0.1), "PRMConfig.prover_epsilon"),
        (dict(learning_rate=0.0), "PRMConfig.learning_rate"),
        (dict(beta=0.0), "PRMConfig.beta"),
    ],
)
def test_bad_prm_config_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        PRMConfig(**overrides)
    with pytest.raises(ValueError, match=field):
        PRMConfig.from_mapping(overrides)
    with pytest.raises(ValueError, match=r"Unknown PRMConfig fields \['prm_noise'\]"):
        PRMConfig.from_mapping({"prm_noise": 0.1})


@pytest.mark.parametrize(
    "prm,probe,field",
    [
        (PRMConfig(kind="completion"), ProbeConfig(every=5), "ProbeConfig.every"),
        (PRMConfig(kind="completion", label_episodes=65), ProbeConfig(), "label_episodes"),
        (PRMConfig(), ProbeConfig(every=1, episodes=65), "ProbeConfig.episodes"),
    ],
)
def test_extras_that_do_not_fit_the_run_are_refused_by_name(prm, probe, field):
    with pytest.raises(ValueError, match=field):
        trainer_extras(TrainConfig(), ENV, ROLLOUT, prm=prm, probe=probe)


def test_learned_rewards_and_make_prm_need_a_prm():
    config = TrainConfig(reward="learned_min")
    with pytest.raises(ValueError, match=r"TrainConfig.reward='learned_min'.*make_train\(prm=\)"):
        make_train(config, ENV, POLICY, ROLLOUT)
    graphdef, _ = nnx.split(Policy(POLICY, rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match="PRMConfig.kind"):
        make_prm(PRMConfig(), config, ENV, graphdef, ROLLOUT)
    with pytest.raises(ValueError, match="PRMConfig.kind"):
        make_learned_prm(PRMConfig(kind="implicit"), config, ENV, graphdef, ROLLOUT)
    with pytest.raises(ValueError, match="PRMConfig.label_episodes"):
        label_episodes(PRMConfig(label_episodes=5), batch_size=4)


def test_the_loop_refuses_a_learned_condition_without_a_prm(tmp_path):
    with pytest.raises(ValueError, match=r"condition 'learned_sum'.*PRMConfig.kind"):
        loop.run(
            TrainConfig(), ENV, POLICY, ROLLOUT, seeds=[0], workdir=str(tmp_path),
            conditions=["outcome", "learned_sum"], progress=False,
        )  # fmt: skip
    assert not list(tmp_path.iterdir())  # refused before anything is written
