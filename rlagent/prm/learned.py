"""Process reward models the trainer builds: a noisy oracle and a learned scorer.

`make_noisy_oracle` (`PRMConfig.kind = "noisy_oracle"`): no parameters; the score of a
turn the oracle judged (verdict != 0) is `1[verdict > 0]`, flipped with probability
`PRMConfig.noise` by a fresh coin every update; a turn it judged neutral scores 1/2 (a centred
score of 0, as the oracle's own reward for it). A PRM of known accuracy, so that "how good
must a PRM be" is a curve; at noise 0 `learned_sum` is the sign of the oracle verdict.

`make_learned_prm` (`"completion"`, `"progress"`): a scorer trained online on automatic
step labels (`rlagent.prm.labels`) of `PRMConfig.label_episodes` episodes of every batch,
spread over its groups (`label_episodes`: other tasks when the count allows).

The scorer is a `Policy` of the policy's own architecture with its own parameters,
starting as a copy of the initial policy (a PRM is fine-tuned from the base model, as
in Math-Shepherd and PAV); `p_s = sigmoid(value head at the last generated token of
turn s)`, read through `rollout.make_score`. Chosen over a head on the policy's trunk
with stopped gradients because

* its errors are its own: a head on the trunk can only read features the policy learned
  for acting, which drift under it every update, so its mistakes would follow the
  policy's blind spots; a separate scorer learns what its labels teach;
* the PRM loss does not shape the policy's features (no shared parameters, so no
  gradient to stop and no coupling through the optimiser);
* it reads exactly the windowed state the policy reads (the same `ContextReader`
  contexts of `make_score`), so it sees no more and no less of the history.

Labels: `credit.mc.mc_values` over `credit.lm.forks_from_carries` of the rollout's
carries, `label_samples` continuations per value by `credit.lm.play_policy` with the
current policy (completion: the soft label `q_success`, Math-Shepherd), or with the
policy mixed per continuation with the oracle at `prover_epsilon` (progress: the
prover's advantage `(1 + q_success - success) / 2`, PAV; `prover_best_of = K`: the
prover is best-of-K of those continuations, `labels.best_of_k`, PAV's `BoK(pi)`, which
with `prover_epsilon = 0` needs no oracle). The scorer trains with
`losses.prm_loss` on those soft labels.

Cost per update, besides the labels: one no-grad scoring pass over the batch (`scores`,
before `update`, so a batch's rewards never come from a scorer that trained on it) and
one gradient step on the labelled episodes only. The labels play `E x S x N` LM
continuations of S turns each for completion (E labelled episodes, S turns, N samples;
Q only, `mc_values(q_only=True)`) and twice that for progress (V and Q), of which the
environment turns actually played are reported as `label_turns`. With
`PolicyConfig.value_head = "separate"` the scorer's value comes from its own critic
trunk and `make_score` also runs its actor (unused logits).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rlagent import losses
from rlagent.credit import accuracy
from rlagent.credit import lm
from rlagent.credit import mc
from rlagent.envs.base import VERDICT
from rlagent.envs.base import verdict_of
from rlagent.prm import labels
from rlagent.prm.base import PRMInputs
from rlagent.prm.base import PRMState
from rlagent.prm.base import ProcessRewardModel
from rlagent.prm.config import PRMConfig
from rlagent.rollout import Environment
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_score
from rlagent.train.config import TrainConfig
from rlagent.train.rewards import reward_weights
from rlagent.types import Trajectory

Metrics = dict[str, jax.Array]

# kind -> labels(MCValues, turn_mask [E, S]) -> [E, S] soft labels in [0, 1].
LABELLERS: dict[str, Callable[[mc.MCValues, jax.Array], jax.Array]] = {
    "completion": lambda values, turn_mask: labels.completion_labels(values, turn_mask)[1],
    "progress": labels.progress_labels,
}


def make_noisy_oracle(prm: PRMConfig, env: Any = None) -> ProcessRewardModel:
    """The oracle verdict as a binary score, each flipped with probability `prm.noise`.

    `scores` -> `[B, S]` `1[verdict > 0] XOR Bernoulli(noise)` on played turns with a
    non-zero verdict, 1/2 on neutral ones (verdict 0), 0 on unplayed turns; a fresh coin per
    turn and update (the key); nothing is learned, so
    `prm_loss` and `label_auroc` are NaN, `label_turns` 0 and `prm_auroc` is over every
    played turn. Refused for an environment (`env`, when given) without a verdict signal.
    """
    if env is not None and VERDICT not in env.signal_names:
        raise ValueError(
            f"PRMConfig.kind='noisy_oracle' flips the oracle verdict, and environment "
            f"{type(env).__name__} reports no {VERDICT!r} signal (it reports {env.signal_names})."
        )
    noise = prm.noise

    def init(key: jax.Array, policy_params: Any) -> PRMState:
        del key, policy_params  # nothing to learn.
        return PRMState(params=(), opt_state=())

    def scores(state: PRMState, inputs: PRMInputs, key: jax.Array) -> jax.Array:
        del state
        traj = inputs.trajectory
        flip = jax.random.bernoulli(key, noise, verdict_of(traj).shape)
        label = ((verdict_of(traj) > 0) ^ flip).astype(jnp.float32)
        score = jnp.where(verdict_of(traj) == 0, 0.5, label)
        return jnp.where(traj.turn_mask, score, 0.0)

    def update(state: PRMState, inputs: PRMInputs, key: jax.Array) -> tuple[PRMState, Metrics]:
        del key
        traj = inputs.trajectory
        nan = jnp.full((), jnp.nan, jnp.float32)
        return state, {
            "label_turns": jnp.zeros((), jnp.float32),
            "prm_loss": nan,
            "prm_auroc": accuracy.verdict_auroc(inputs.scores, traj.turn_mask, verdict_of(traj)),
            "label_auroc": nan,
        }

    return ProcessRewardModel(init=init, scores=scores, update=update, needs_carries=False)


def make_learned_prm(
    prm: PRMConfig,
    config: TrainConfig,
    env: Environment,
    graphdef: nnx.GraphDef,
    rollout_config: RolloutConfig,
) -> ProcessRewardModel:
    """The scorer of the module docstring, trained on `prm.kind`'s labels.

    Args:
      prm: `kind` ("completion" or "progress"), `label_episodes`, `label_samples`,
        `prover_epsilon`, `prover_best_of`, `learning_rate`.
      config: the run's `batch_size`, and the `gamma` / `prm_temperature` of the
        Monte-Carlo labels' rewards.
      env, graphdef, rollout_config: those of the policy (the scorer shares its
        architecture and contexts; its continuations play as the rollout does).
    Returns:
      A `ProcessRewardModel` (`needs_carries`): `init(key, initial policy params)` copies
      them; `scores -> [B, S]`; `update` labels the episodes, takes one AdamW step of
      `prm_loss` on them and reports `label_turns`, `prm_loss` (before the step),
      `prm_auroc` (of `inputs.scores` on the other episodes; NaN when none is left) and
      `label_auroc`.
    """
    if prm.kind not in LABELLERS:
        raise ValueError(
            f"PRMConfig.kind must be one of {tuple(LABELLERS)} for a learned scorer, "
            f"got {prm.kind!r}."
        )
    label = LABELLERS[prm.kind]
    if prm.kind == "progress" and prm.prover_best_of > 1:
        label = functools.partial(
            labels.progress_labels, best_of=prm.prover_best_of, num_samples=prm.label_samples
        )
    epsilon = prm.prover_epsilon if prm.kind == "progress" else 0.0
    score = make_score(env, graphdef, rollout_config)
    optimizer = optax.adamw(prm.learning_rate)
    batch_size = config.batch_size
    labelled = label_episodes(prm, batch_size)
    held_out = np.ones(batch_size, bool)
    held_out[labelled] = False
    # Labels read success probabilities only; the returns mc_values also estimates are
    # those of the cheapest form.
    weights = reward_weights(config, "outcome")

    def logits(params: nnx.State, traj: Trajectory) -> jax.Array:
        """`[B, S]` value-head logits at the last generated token of each turn."""
        _, values, _ = score(params, traj)
        last = jnp.maximum(jnp.sum(traj.loss_mask, axis=-1) - 1, 0)
        return jnp.take_along_axis(values, last[..., None], axis=-1)[..., 0]

    def init(key: jax.Array, policy_params: Any) -> PRMState:
        del key  # a copy of the initial policy.
        return PRMState(params=policy_params, opt_state=optimizer.init(policy_params))

    def scores(state: PRMState, inputs: PRMInputs, key: jax.Array) -> jax.Array:
        del key  # deterministic.
        traj = inputs.trajectory
        _check_batch(traj, batch_size)
        p = jax.nn.sigmoid(logits(state.params, traj))
        return jax.lax.stop_gradient(jnp.where(traj.turn_mask, p, 0.0))

    def update(state: PRMState, inputs: PRMInputs, key: jax.Array) -> tuple[PRMState, Metrics]:
        traj = inputs.trajectory
        _check_batch(traj, batch_size)
        if inputs.carries is None:
            raise ValueError("a learned PRM labels from rollout carries; PRMInputs.carries is None")
        rows = lambda x: x[labelled]  # noqa: E731
        episodes = jax.tree.map(rows, traj)
        forks = jax.tree.map(rows, lm.forks_from_carries(inputs.carries))
        prefix = mc.trajectory_signals(episodes)
        play = lm.play_policy(
            env, graphdef, rollout_config, inputs.policy_params, oracle_epsilon=epsilon
        )
        values = mc.mc_values(
            play,
            forks,
            prefix,
            key,
            num_samples=prm.label_samples,
            reward_weights=weights,
            config=config,
            q_only=prm.kind == "completion",
        )
        targets = label(values, prefix.turn_mask)

        def loss_fn(params: nnx.State) -> jax.Array:
            return losses.prm_loss(logits(params, episodes), targets, prefix.turn_mask)

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        new_state = PRMState(params=optax.apply_updates(state.params, updates), opt_state=opt_state)
        return new_state, {
            "label_turns": values.turns,
            "prm_loss": loss,
            "prm_auroc": accuracy.verdict_auroc(
                inputs.scores, traj.turn_mask & held_out[:, None], verdict_of(traj)
            ),
            "label_auroc": accuracy.verdict_auroc(targets, prefix.turn_mask, verdict_of(prefix)),
        }

    return ProcessRewardModel(init=init, scores=scores, update=update, needs_carries=True)


def label_episodes(prm: PRMConfig, batch_size: int) -> np.ndarray:
    """`[E]` int indices of the episodes labelled each update, E = `prm.label_episodes`,
    of a batch of `batch_size` (B) episodes.

    Spread evenly over the batch (`i * B // E`), so that with E <= num_groups each
    labelled episode comes from another group, hence another task.
    """
    if prm.label_episodes > batch_size:
        raise ValueError(
            f"PRMConfig.label_episodes must be at most TrainConfig.batch_size={batch_size}, "
            f"got {prm.label_episodes}."
        )
    return np.arange(prm.label_episodes) * batch_size // prm.label_episodes


def _check_batch(traj: Trajectory, batch_size: int) -> None:
    if traj.turn_mask.shape[0] != batch_size:
        raise ValueError(
            f"trajectory has {traj.turn_mask.shape[0]} episodes, TrainConfig.batch_size is "
            f"{batch_size}."
        )
