"""Implicit process reward model: process rewards from a model trained on outcomes only.

Yuan et al. 2024 ("Free process rewards without process labels"); PRIME, Cui et al. 2025.
A language model phi of the policy's architecture, trained as an *outcome* model whose
logit is a log-likelihood ratio against a frozen reference, gives every generated token an
implicit reward

    r_t = beta (log pi_phi(a_t | .) - log pi_ref(a_t | .)),

and a turn the sum of its tokens' rewards, `R_s = sum_{t in turn s} r_t`. The episode's
outcome logit is `sum_s R_s`; phi learns with the binary cross-entropy of
`sigmoid(sum_s R_s)` against the episode's success (an outcome > 0 on some played turn),
so no step is ever labelled, yet `R_s` is the step's share of the outcome log-odds.

Score `p_s = sigmoid(R_s)` (0 on unplayed turns): the trainer's `learned_*` reward forms
take probabilities and use `2 p - 1 = tanh(R_s / 2)`, a bounded, sign-preserving image of
the turn's implicit reward. phi starts as the initial policy (the reference), so at init
every `R_s = 0` and every played turn scores 0.5 (`2 p - 1 = 0`).

Cost per trainer update: one teacher-forced pass of the reference and one of phi for the
scores, one gradient pass of phi for the update (`rollout.make_score`, the same contexts
the policy reads); `update` reuses the forward of its gradient pass for its `prm_auroc`.
`scores` and `update` each compute the reference log-probs from the same inputs: when both
run in one compiled program, as in the trainer, XLA's common-subexpression elimination
keeps one pass (checked on the compiled CPU program, which also merges the trainer's own
reference pass for its KL). No environment turns are spent (`label_turns` = 0).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from rlagent import losses
from rlagent.credit import accuracy  # a module: credit -> train -> ppo -> prm imports it
from rlagent.envs.base import verdict_of
from rlagent.prm.base import PRMInputs
from rlagent.prm.base import PRMState
from rlagent.prm.base import ProcessRewardModel
from rlagent.rollout import Environment
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_score
from rlagent.types import Trajectory


def make_implicit_prm(
    env: Environment,
    graphdef: nnx.GraphDef,
    rollout_config: RolloutConfig,
    *,
    beta: float = 0.05,
    learning_rate: float = 1e-3,
) -> ProcessRewardModel:
    """The implicit PRM of a `Policy(graphdef)` rolled out in `env` with `rollout_config`.

    Args:
      env, graphdef, rollout_config: those of the policy (phi reads what the policy reads).
      beta: scale of the implicit token reward `beta (log pi_phi - log pi_ref)`, > 0.
      learning_rate: AdamW step size of phi, > 0.
    Returns:
      A `ProcessRewardModel`: `init(key, initial policy params)` copies them into phi;
      `scores -> [B, S]` `sigmoid(R_s)`; `update` one AdamW step of the outcome
      cross-entropy on every episode of the batch, metrics `label_turns` (0), `prm_loss`
      (before the step), `prm_auroc` (of the scores before the step: the batch is new to
      phi) and `label_auroc` (NaN: no labels).
    """
    if not beta > 0:
        raise ValueError(f"`beta` must be > 0, got {beta}")
    if not learning_rate > 0:
        raise ValueError(f"`learning_rate` must be > 0, got {learning_rate}")
    score = make_score(env, graphdef, rollout_config)
    optimizer = optax.adamw(learning_rate)

    def turn_rewards(phi: nnx.State, ref_logp: jax.Array, traj: Trajectory) -> jax.Array:
        """`R_s [B, S]`: make_score's log-probs are 0 off `loss_mask`, so only generated
        tokens of played turns add up."""
        return beta * jnp.sum(score(phi, traj)[0] - ref_logp, axis=-1)

    def reference_logp(inputs: PRMInputs) -> jax.Array:
        return jax.lax.stop_gradient(score(inputs.ref_params, inputs.trajectory)[0])

    def init(key: jax.Array, params: Any) -> PRMState:
        del key  # phi is a copy of the initial policy.
        return PRMState(params=params, opt_state=optimizer.init(params))

    def scores(state: PRMState, inputs: PRMInputs, key: jax.Array) -> jax.Array:
        del key  # deterministic.
        traj = inputs.trajectory
        returns = turn_rewards(state.params, reference_logp(inputs), traj)
        return jax.lax.stop_gradient(_probabilities(returns, traj.turn_mask))

    def update(
        state: PRMState, inputs: PRMInputs, key: jax.Array
    ) -> tuple[PRMState, dict[str, jax.Array]]:
        del key  # one full-batch step.
        traj = inputs.trajectory
        ref_logp = reference_logp(inputs)
        success = traj.episode_success
        labels = success[:, None].astype(jnp.float32)  # [B, 1]: one outcome per episode.
        every_episode = jnp.ones_like(success)[:, None]

        def loss_fn(phi: nnx.State) -> tuple[jax.Array, jax.Array]:
            returns = turn_rewards(phi, ref_logp, traj)
            logits = jnp.sum(returns, axis=1, keepdims=True)  # [B, 1] outcome log-odds.
            return losses.prm_loss(logits, labels, every_episode), returns

        (loss, returns), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        metrics = {
            "label_turns": jnp.zeros((), jnp.float32),
            "prm_loss": loss,
            "prm_auroc": accuracy.verdict_auroc(
                _probabilities(returns, traj.turn_mask), traj.turn_mask, verdict_of(traj)
            ),
            "label_auroc": jnp.full((), jnp.nan, jnp.float32),
        }
        new_state = PRMState(params=optax.apply_updates(state.params, updates), opt_state=opt_state)
        return new_state, metrics

    return ProcessRewardModel(init=init, scores=scores, update=update, needs_carries=False)


def _probabilities(returns: jax.Array, turn_mask: jax.Array) -> jax.Array:
    """`p_s = sigmoid(R_s)` on played turns, 0 elsewhere: `[B, S]` float32."""
    return jnp.where(turn_mask, jax.nn.sigmoid(returns), 0.0).astype(jnp.float32)
