"""Judges: what ranks the episodes that online DPO / RLAIF learns from.

A `Judge` is three things: `init(key, policy_params) -> state` (what it learns, `()`
when nothing), `judge(state, inputs, weights, key) -> (scores [B], state, metrics)`
(score a batch of episodes, higher is better, then learn from it) and `needs_carries`.
`inputs` are the PRM's (`train.extras.PRMInputs`: current and reference parameters,
the episodes, the rollout carries), so a process reward model plugs in as it is; an LM
judge reading transcripts would be one more implementation of the same three.

`make_judge(config, prm=None)` scores an episode by a reward form's return,
`sum_s turn_rewards(episode, weights, prm_scores)_s`, with the weights as data (the
runner state's, so judges that differ only in weights train side by side):

* outcome (`JUDGES["outcome"]`): the sparse outcome, 1 for a solved task;
* guardrail: the outcome minus one per turn that breaks a rule of the environment's
  rule layer (its `violations` signal; ToolWorld's guardrail);
* prm: a process reward model's scores alone, `sum_s (2 p_s - 1)` (`learned_sum`'s
  component without the outcome): the PRM is the judge, learned or implicit
  (`rlagent.prm`), trained on each batch after scoring it as in PPO;
* any reward form of `rlagent.train.config.REWARDS`.

A noisy judge (an AI judge of known accuracy) is any of these with the accuracy knob of
`pairs.group_pairs`: the order of each pair is kept with probability `accuracy`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlagent.train.config import REWARDS
from rlagent.train.config import TrainConfig
from rlagent.train.extras import PRMInputs
from rlagent.train.extras import ProcessRewardModel
from rlagent.train.rewards import COMPONENTS
from rlagent.train.rewards import reward_weights
from rlagent.train.rewards import turn_rewards

# Named judges beyond the reward forms: the components each weights.
JUDGES = {
    "outcome": {"outcome": 1.0},
    "guardrail": {"outcome": 1.0, "violations": -1.0},
    "prm": {"learned_sum": 1.0},
}
# Judges that read a process reward model's scores.
PRM_JUDGES = ("prm", "learned_sum", "learned_min", "learned_potential", "learned_centred")


class Judge(NamedTuple):
    init: Callable[[jax.Array, Any], Any]
    # judge(state, inputs, weights [C], key) -> (scores [B] float32, state, metrics).
    judge: Callable[..., tuple[jax.Array, Any, dict[str, jax.Array]]]
    needs_carries: bool


def judge_weights(config: TrainConfig, name: str) -> np.ndarray:
    """`[C]` weights of `rewards.COMPONENTS` of judge `name` (`JUDGES` or a reward form;
    reward forms subtract `config.violation_penalty` per violating turn, as in PPO)."""
    if name in JUDGES:
        weights = dict.fromkeys(COMPONENTS, 0.0) | JUDGES[name]
        return np.asarray([weights[c] for c in COMPONENTS], np.float32)
    if name not in REWARDS:
        raise ValueError(f"Unknown judge {name!r}; expected one of {(*JUDGES, *REWARDS)}.")
    return reward_weights(config, name)


def make_judge(config: TrainConfig, prm: ProcessRewardModel | None = None) -> Judge:
    """The reward-form judge (see the module docstring), reading `prm`'s scores if given
    (its `label_turns` are in the metrics: environment turns its labels cost)."""

    def init(key: jax.Array, policy_params: Any) -> Any:
        return () if prm is None else prm.init(key, policy_params)

    def judge(state, inputs: PRMInputs, weights: jax.Array, key: jax.Array):
        if prm is None:
            scores, metrics = None, {"label_turns": jnp.zeros((), jnp.float32)}
        else:
            score_key, update_key = jax.random.split(key)
            scores = prm.scores(state, inputs, score_key)
            state, metrics = prm.update(state, inputs._replace(scores=scores), update_key)
        rewards = turn_rewards(inputs.trajectory, config, weights, scores)
        return jnp.sum(rewards, axis=1), state, metrics

    return Judge(init, judge, needs_carries=prm is not None and prm.needs_carries)
