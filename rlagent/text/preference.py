"""Online DPO / RLAIF in text mode: a judge ranks the episodes of each task, DPO learns.

The text loop plays `num_groups` tasks x `group_size` episodes (a group shares its task,
`rlagent.text.train.play_batch`), and `make_text_dpo(config, score, judge)`'s jitted
`update(state, trajectory, key)` does one iteration of `rlagent.preference.online` on
that batch:

1. the judge scores every episode (`rlagent.preference.judges.Judge`: a reward form of
   the environment's signals, `judges.make_judge`, or an LM reading the transcripts,
   `rlagent.text.judge.make_lm_judge`);
2. `pairs.group_pairs` takes the best against the worst episode of each task (`accuracy`
   < 1: a noisy judge), a group whose episodes tie gives no pair;
3. `num_epochs` AdamW steps of `dpo.preference_loss` on those pairs against the frozen
   reference (the parameters `init` was given), with the text scorer's log-probs of the
   generated ids (`rlagent.text.score.make_text_score`: the loss mask is exactly the
   policy's tokens) at the configured level (`trajectory`, or `segment` from the first
   turn where the two episodes differ) and length normalisation.

Only the pairs' episodes are scored by the policy and the reference (2 x num_groups
rows, not the whole batch).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlagent.preference import pairs as pairing
from rlagent.preference.dpo import DPOConfig
from rlagent.preference.dpo import make_optimizer
from rlagent.preference.dpo import pair_logps
from rlagent.preference.dpo import preference_loss
from rlagent.preference.judges import Judge
from rlagent.preference.online import dpo_steps
from rlagent.preference.online import pair_batch
from rlagent.train.extras import PRMInputs
from rlagent.types import Trajectory

Metrics = dict[str, jax.Array]


class TextDPOState(NamedTuple):
    """A text-mode online DPO run between iterations."""

    params: Any  # policy parameters (nnx.State).
    opt_state: Any
    ref_params: Any  # the frozen reference (the parameters `init` was given).
    judge_state: Any  # the judge's (an LM judge: its parameters; a reward form: ()).
    step: jax.Array  # [] int32 iterations done.


class TextDPO(NamedTuple):
    init: Callable[[Any, jax.Array], TextDPOState]  # init(params, key)
    # update(state, trajectory [G * K, ...], key) -> (state, metrics); the state is donated.
    update: Callable[[TextDPOState, Trajectory, jax.Array], tuple[TextDPOState, Metrics]]


def make_text_dpo(
    config: DPOConfig,
    score: Callable[[Any, Trajectory], jax.Array],
    judge: Judge,
    *,
    weights: np.ndarray | None = None,
    accuracy: float = 1.0,
) -> TextDPO:
    """Online DPO of a text policy (module docstring).

    Args:
      config: kind, beta, label_smoothing, level, segment_turns, length_norm,
        learning_rate, max_grad_norm, num_groups x group_size (= the batch's episodes),
        num_epochs.
      score: teacher-forced `[B, S, L]` log pi of the generated ids (`make_text_score`).
      judge: what ranks the episodes.
      weights: `[C]` the judge's reward-form weights (`judges.judge_weights`); unused by
        an LM judge.
      accuracy: probability that the judge keeps a pair's true order.
    """
    optimizer = make_optimizer(config)
    weights = jnp.zeros((1,), jnp.float32) if weights is None else jnp.asarray(weights)
    scorer = lambda params, trajectory: (score(params, trajectory),)  # noqa: E731
    loss = functools.partial(preference_loss, score=scorer, config=config)

    def init(params: Any, key: jax.Array) -> TextDPOState:
        reference = jax.tree.map(jnp.copy, params)
        return TextDPOState(
            params, optimizer.init(params), reference, judge.init(key, reference),
            jnp.zeros((), jnp.int32),
        )  # fmt: skip

    def update(state: TextDPOState, trajectory: Trajectory, key: jax.Array):
        episodes = trajectory.turn_mask.shape[0]
        if episodes != config.num_groups * config.group_size:
            raise ValueError(
                f"the trajectory has {episodes} episodes, DPOConfig num_groups x group_size "
                f"= {config.num_groups * config.group_size}"
            )
        judge_key, pair_key = jax.random.split(key)
        inputs = PRMInputs(state.params, state.ref_params, trajectory, None, None)
        scores, judge_state, judge_metrics = judge.judge(
            state.judge_state, inputs, weights, judge_key
        )
        grouped = scores.reshape(config.num_groups, config.group_size)
        chosen, rejected, weight = pairing.group_pairs(grouped, pair_key, accuracy)
        batch = pair_batch(trajectory, chosen, rejected, weight, config)
        ref = jax.lax.stop_gradient(pair_logps(scorer, state.ref_params, batch, config.length_norm))
        params, opt_state, stats = dpo_steps(
            loss, optimizer, (state.params, state.opt_state), (batch, ref), config.num_epochs
        )
        metrics = {name: value[0] for name, value in stats.items()}  # before the first step.
        metrics |= {f"last_{name}": value[-1] for name, value in stats.items()}
        metrics |= {
            "judge_score": jnp.mean(scores), "judge_spread": jnp.mean(jnp.ptp(grouped, axis=1)),
            **judge_metrics,
        }  # fmt: skip
        new = TextDPOState(params, opt_state, state.ref_params, judge_state, state.step + 1)
        return new, metrics

    return TextDPO(init=jax.jit(init), update=jax.jit(update, donate_argnums=0))
