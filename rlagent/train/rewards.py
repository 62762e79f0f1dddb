"""Per-turn training rewards built from a trajectory's environment signals.

The environment reports per-turn signals by name (`Trajectory.signals`; ToolWorld: the
sparse outcome, the oracle process verdict, the efficiency signal and guardrail
violations) and names the reward components it offers (`env.reward_components`). Which of
them the learner sees is the experimental variable of sparse-vs-dense studies. Every
reward form is a weighted sum of a few per-turn *components*; the weights are data (a
`[C]` array in the runner state), so runs that differ only in their reward form share
one compiled program and train side by side under `vmap`.

The `learned_*` forms read a process reward model's scores `p [B, S]` (`rlagent.prm`,
`PRMConfig.kind`), which the trainer passes as `prm_scores`; without scores (e.g. the
Monte-Carlo continuations of `rlagent.credit.mc`, which no PRM scores) their components
are 0, so a Monte-Carlo target never sees a learned reward (`make_train` refuses a
learned form without a PRM, `rlagent.host.extras` a PRM beside the credit probe).

Reward forms differ in range (process returns span about [-5, 3], outcome [0, 1]), and
under one learning rate and gradient clip the range changes the effective step size.
`TrainConfig.normalize_returns` divides every turn reward by a running standard deviation
of the run's episode returns (`ReturnStats`, `scale_rewards`), so that conditions differ
in the shape of their reward, not in its scale.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rlagent.envs.base import check_components
from rlagent.returns import prm_rewards
from rlagent.train.config import LEARNED_REWARDS
from rlagent.train.config import REWARDS
from rlagent.train.config import TrainConfig
from rlagent.types import Trajectory

# Per-turn reward components, in the order of the weight vectors, and the environment
# signal each is built from (`Trajectory.signals`; None: a PRM's scores, any environment).
# An environment offers a subset (`env.reward_components`); `check_reward` refuses a form
# that weights one it lacks.
COMPONENT_SIGNALS = {
    "outcome": "outcome",  # the sparse outcome of the episode, on its last turn.
    "process": "verdict",  # a per-turn process verdict (+ useful, - harmful, 0 neutral).
    "efficiency": "efficiency",  # a per-turn efficiency signal (<= 0).
    "potential": "verdict",  # shaping by the verdict's valid steps.
    "prm_min": "verdict",  # the verdict's min-form credit.
    "violations": "violations",  # rules broken by the turn (counted once per turn).
    "learned_sum": None,
    "learned_min": None,
    "learned_potential": None,
    "learned_centred": None,
    # Dialogue (rlagent.envs.dialogue): each the signal itself, a negated error count or
    # the simulated user's feedback / end-of-dialogue rating.
    "fluency": "fluency",
    "factuality": "factuality",
    "feedback": "feedback",
    "rating": "rating",
    "coherence": "coherence",
    # Text environments (rlagent.text): 1 on a turn whose text parses as no valid call.
    "malformed": "malformed",
}
# Components that are the environment's signal as it is (masked to played turns).
DIRECT = ("fluency", "factuality", "feedback", "rating", "coherence", "malformed")
COMPONENTS = tuple(COMPONENT_SIGNALS)

# Potential Phi_s = POTENTIAL_SCALE * (number of valid plan steps taken before turn s):
# one valid step is worth half the outcome, so shaping and outcome share one scale.
POTENTIAL_SCALE = 0.5
# Smallest return standard deviation divided by: a run whose returns have not varied yet
# (all 0 under the outcome reward) is not scaled up without bound.
RETURN_STD_FLOOR = 1e-2


class ReturnStats(NamedTuple):
    """Running mean and spread of a run's episode returns (one per run, in RunnerState)."""

    count: jax.Array  # [] float32: episodes seen.
    mean: jax.Array  # [] float32: mean episode return.
    m2: jax.Array  # [] float32: sum of squared deviations from the mean.

    @classmethod
    def zeros(cls) -> ReturnStats:
        zero = jnp.zeros((), jnp.float32)
        return cls(count=zero, mean=zero, m2=zero)


def reward_weights(config: TrainConfig, reward: str | None = None) -> np.ndarray:
    """`[C]` float32 weights of COMPONENTS for a reward form (default `config.reward`).

      outcome:   r_s = outcome_s (1 on the final turn of a solved episode).
      process:   r_s = verdict_s, the oracle process verdict (values: ToolWorldConfig.verdict).
      composed:  w_o * outcome_s + w_p * verdict_s + w_e * efficiency_s, the mix of
                 `compose_rewards` with `config.reward_weights` (default 0.5 / 0.3 / 0.2).
      prm_sum:   outcome_s + prm_rewards(verdict, form="sum")_s = outcome_s + verdict_s:
                 the process reward with its outcome term.
      prm_min:   outcome_s + prm_rewards(verdict, form="min", temperature)_s.
      potential: outcome_s + gamma * Phi_{s+1} - Phi_s, Phi_s = progress before turn s
                 (Ng et al., 1999: leaves the optimal policy unchanged).
      learned_sum:       outcome_s + (2 p_s - 1), p_s the PRM's score of turn s.
      learned_min:       outcome_s + prm_rewards(2 p - 1, form="min", temperature)_s.
      learned_potential: outcome_s + gamma * Phi_{s+1} - Phi_s with
                         Phi_s = POTENTIAL_SCALE * sum_{t < s} p_t (as `potential`, with
                         the PRM's scores in place of the oracle's valid steps).
      learned_centred:   outcome_s + 2 (p_s - mean p), the mean over the batch's played
                         turns: the sum form without its calibration offset, so that an
                         average step earns 0 whatever the PRM's scale (the sum form's
                         2 p - 1 < 0 on every step of an under-confident PRM makes the
                         shortest episode the best; docs/process_rewards.md).
    The learned forms read a PRM's scores (their components are 0 without them):
    `make_train` and `rlagent.host.loop.run` refuse them without a PRM.
    Every form subtracts `config.violation_penalty` once per turn that breaks a guardrail
    rule, however many rules it breaks (a blocked call in penalise mode costs it once), and
    `config.malformed_penalty` per malformed turn (a text environment's `malformed` signal:
    output that parses as no valid call; refused for an environment without it).
    """
    reward = config.reward if reward is None else reward
    if reward not in REWARDS:
        raise ValueError(f"Unknown reward {reward!r}; expected one of {REWARDS}.")
    outcome_w, process_w, efficiency_w = config.reward_weights
    forms = {
        "outcome": {"outcome": 1.0},
        "process": {"process": 1.0},
        "composed": {"outcome": outcome_w, "process": process_w, "efficiency": efficiency_w},
        "prm_sum": {"outcome": 1.0, "process": 1.0},
        "prm_min": {"outcome": 1.0, "prm_min": 1.0},
        "potential": {"outcome": 1.0, "potential": 1.0},
        **{form: {"outcome": 1.0, form: 1.0} for form in LEARNED_REWARDS},
        "dialogue": dict(
            zip(("fluency", "factuality", "feedback"), config.dialogue_weights, strict=True)
        ),  # fmt: skip
        "rating": {"rating": 1.0},
        "feedback": {"feedback": 1.0},
    }
    weights = dict.fromkeys(COMPONENTS, 0.0)
    weights.update(forms[reward])
    weights["violations"] = -config.violation_penalty
    weights["malformed"] = -config.malformed_penalty
    return np.asarray([weights[name] for name in COMPONENTS], np.float32)


def check_reward(env, weights: np.ndarray, what: str) -> None:
    """Refuses `weights [C]` (of a reward form, `what`) that weight a component `env` lacks."""
    check_components(env, [n for n, w in zip(COMPONENTS, weights, strict=True) if w != 0], what)


def check_forms(env, config: TrainConfig, forms, what: str) -> None:
    """Refuses reward forms (named by `what`, e.g. a config field) that are unknown or
    weight a component `env` does not offer; the errors start with `what`."""
    for form in forms:
        try:
            weights = reward_weights(config, form)
        except ValueError as error:
            raise ValueError(f"{what}: {error}") from None
        check_reward(env, weights, f"{what} {form!r}")


def reward_components(
    trajectory: Trajectory, config: TrainConfig, prm_scores: jax.Array | None = None
) -> jax.Array:
    """`[B, S, C]` float32 per-turn components (0 on unplayed turns), C = len(COMPONENTS).

    `trajectory` has `turn_mask`, `done` and `signals` (a Trajectory, or the turn signals
    of `rlagent.credit.mc`); a component whose signal the environment does not report is 0
    (`check_reward` refuses weighting it). `prm_scores` `[B, S]` in [0, 1] are a PRM's
    scores of the turns (the learned components); None (no PRM, or Monte-Carlo
    continuations) makes those components 0.
    """
    turn_mask = trajectory.turn_mask
    valid = turn_mask.astype(jnp.float32)
    zeros = jnp.zeros_like(valid)
    names = {name for name in COMPONENT_SIGNALS.values() if name is not None}
    signal = {name: trajectory.signals.get(name, zeros) for name in names}
    verdict = signal["verdict"] * valid
    truncated = turn_mask[:, -1] & ~trajectory.done[:, -1]
    components = (
        signal["outcome"],
        verdict,
        signal["efficiency"],
        _potential_shaping((verdict > 0).astype(jnp.float32), turn_mask, truncated, config),
        prm_rewards(verdict, turn_mask, form="min", temperature=config.prm_temperature),
        (signal["violations"] > 0).astype(jnp.float32),
    )
    if prm_scores is None:
        learned = (jnp.zeros_like(valid),) * 4
    else:
        learned = _learned_components(prm_scores, turn_mask, truncated, config)
    direct = tuple(signal[name] for name in DIRECT)
    stacked = [c * valid for c in components + learned + direct]
    return jnp.stack(stacked, axis=-1).astype(jnp.float32)


def turn_rewards(
    trajectory: Trajectory,
    config: TrainConfig,
    weights: jax.Array | None = None,
    prm_scores: jax.Array | None = None,
) -> jax.Array:
    """Per-turn rewards `[B, S]` float32: `reward_components @ weights`.

    `weights` (`[C]`, e.g. traced from the runner state) default to
    `reward_weights(config)`; `prm_scores` `[B, S]` feed the learned components (0 when
    None).
    """
    if weights is None:
        weights = reward_weights(config)
    weights = jnp.asarray(weights, jnp.float32)
    if weights.shape != (len(COMPONENTS),):
        raise ValueError(f"weights must have shape ({len(COMPONENTS)},), got {weights.shape}.")
    return reward_components(trajectory, config, prm_scores) @ weights


def scale_rewards(
    rewards: jax.Array, stats: ReturnStats, config: TrainConfig
) -> tuple[jax.Array, ReturnStats]:
    """`(rewards / sigma, stats with this batch)` if `config.normalize_returns`, else as given.

    `sigma = max(sqrt(m2 / count), RETURN_STD_FLOOR)` is the standard deviation of every
    episode return the run has seen, this batch's `G_b = sum_s rewards[b, s]` included,
    merged by the parallel Welford update (Chan et al., 1979):
    `delta = mean_B - mean`, `mean += delta * B / (count + B)`,
    `m2 += m2_B + delta^2 * count * B / (count + B)`. Only the scale changes: the rewards
    are not centred, so their sign (and an outcome of 0) keeps its meaning.

    Args:
      rewards: `[B, S]` float32 turn rewards, 0 on unplayed turns.
      stats: the run's statistics before this batch.
      config: reads `normalize_returns`.
    """
    if not config.normalize_returns:
        return rewards, stats
    returns = jnp.sum(rewards, axis=1)
    size = jnp.float32(returns.shape[0])
    batch_mean = jnp.mean(returns)
    batch_m2 = jnp.sum(jnp.square(returns - batch_mean))
    count = stats.count + size
    delta = batch_mean - stats.mean
    stats = ReturnStats(
        count=count,
        mean=stats.mean + delta * size / count,
        m2=stats.m2 + batch_m2 + jnp.square(delta) * stats.count * size / count,
    )
    sigma = jnp.maximum(jnp.sqrt(stats.m2 / count), RETURN_STD_FLOOR)
    return rewards / sigma, stats


def _learned_components(
    prm_scores: jax.Array, turn_mask: jax.Array, truncated: jax.Array, config: TrainConfig
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """`learned_sum`, `learned_min`, `learned_potential`, `learned_centred` components
    `[B, S]` of PRM scores."""
    chex.assert_equal_shape([prm_scores, turn_mask])
    scores = jnp.where(turn_mask, prm_scores, 0.0).astype(jnp.float32)
    signed = 2.0 * scores - 1.0  # P(good step) -> [-1, 1], the scale of the oracle verdict.
    mean = jnp.sum(scores) / jnp.maximum(jnp.sum(turn_mask), 1)  # over the batch's turns
    return (
        signed,
        prm_rewards(signed, turn_mask, form="min", temperature=config.prm_temperature),
        _potential_shaping(scores, turn_mask, truncated, config),
        2.0 * (scores - mean),
    )


def _potential_shaping(
    steps: jax.Array, turn_mask: jax.Array, truncated: jax.Array, config: TrainConfig
) -> jax.Array:
    """`[B, S]` shaping `gamma Phi_{s+1} - Phi_s` with `Phi_s = POTENTIAL_SCALE * sum_{t<s}
    steps_t` (`steps [B, S]`: 1 per valid oracle step, or a PRM's scores; 0 off the mask).

    A truncated row that the estimator bootstraps from V(s_S) ends in a non-terminal state
    whose potential is that of every step taken; otherwise the episode's end is terminal
    (Phi = 0) and the shaping telescopes to -Phi_0.
    """
    potential = POTENTIAL_SCALE * (jnp.cumsum(steps, axis=1) - steps)
    final_potential = None
    if config.bootstrap_truncated:
        final_potential = jnp.where(truncated, POTENTIAL_SCALE * jnp.sum(steps, axis=1), 0.0)
    return prm_rewards(
        potential, turn_mask, form="potential", gamma=config.gamma, final_potential=final_potential
    )
