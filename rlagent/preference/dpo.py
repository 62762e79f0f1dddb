"""Direct preference optimisation of a multi-turn policy on pairs of episodes.

For a pair (y_w preferred to y_l) of episodes of one task, with a frozen reference
policy pi_ref (the initial policy), the loss is `losses.dpo_loss` of

    log pi(y) = sum over scored turns s, policy tokens i of turn s: log pi(a_{s,i} | context)

(`sequence_logps`), where the context is the policy's own (`rollout.make_score`: the
window, summary and constrained-decoding mask of the rollout) and only tokens of
`Trajectory.loss_mask` count: the environment's observations never enter the loss.
The scored turns are every played turn (trajectory level) or the segment from the
first differing turn (`pairs.scored_turns`). `length_norm="tokens"` divides each
side's sum by its number of scored tokens (the per-token normalisation of SimPO / the
length normalisation DMPO argues for, which keeps long failed episodes from dominating
the margin); `"none"` keeps the sums of DPO.

`make_offline_dpo` trains on a fixed `PairBatch` (e.g. loaded from JSONL): the
reference log-probs are computed once (`reference`), every update draws
`pairs_per_step` pairs uniformly among the first `num_pairs` (a traced count, so
data-size conditions share one program under `vmap`). `rlagent.preference.online`
builds the online trainer on the same loss.

`DPOConfig.sft_steps` puts supervised fine-tuning first (ETO's pipeline, Song et al.
2024): the first `sft_steps` offline steps minimise minus the mean log-likelihood of
the drawn pairs' chosen sides (every played turn's policy tokens:
`losses.weighted_log_likelihood`), and DPO then takes the policy after them as its
frozen reference. `sft_steps = num_updates` is SFT on the chosen sides alone, the
baseline that DPO's rejected sides must beat at equal data and steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from rlagent import losses
from rlagent.models import Policy
from rlagent.models import PolicyConfig
from rlagent.preference.pairs import LEVELS
from rlagent.preference.pairs import PairBatch
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_score
from rlagent.train.config import check_fields
from rlagent.train.ppo import guarded_step
from rlagent.train.ppo import policy_graphdef
from rlagent.types import Trajectory

LENGTH_NORMS = ("none", "tokens")
PAIR_SOURCES = ("trajectory", "fork")
# The diagnostics `preference_loss` returns beside the loss.
PREFERENCE_METRICS = ("dpo_loss", "pref_accuracy", "reward_margin", "pairs")
Metrics = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class DPOConfig:
    """Hyperparameters of the offline and online DPO trainers (typed, validated)."""

    kind: str = "sigmoid"  # losses.DPO_KINDS: sigmoid (DPO), ipo, hinge (SLiC).
    beta: float = 0.1  # inverse temperature of the implicit reward.
    label_smoothing: float = 0.0  # cDPO: probability that a label is flipped (sigmoid).
    level: str = "trajectory"  # pairs.LEVELS: every played turn, or the differing segment.
    segment_turns: int = 0  # segment level: at most this many turns (0: to the end).
    length_norm: str = "none"  # LENGTH_NORMS: sum of log-probs, or their per-token mean.
    learning_rate: float = 1e-3
    max_grad_norm: float = 1.0
    num_updates: int = 100  # offline: gradient steps; online: sample-judge-learn iterations.
    pairs_per_step: int = 32  # offline: pairs drawn per gradient step.
    # Online: G tasks per iteration, K episodes each (or K continuations of one fork).
    num_groups: int = 8
    group_size: int = 4
    num_epochs: int = 2  # online: gradient steps on each iteration's pairs.
    pairs: str = "trajectory"  # PAIR_SOURCES: K whole episodes, or K forks of one turn.
    # Offline: SFT on the chosen sides for the first steps, then DPO against the policy
    # they reached (0: DPO from the first step; num_updates: SFT only).
    sft_steps: int = 0

    def __post_init__(self):
        choices = (("kind", losses.DPO_KINDS), ("level", LEVELS),
                   ("length_norm", LENGTH_NORMS), ("pairs", PAIR_SOURCES))  # fmt: skip
        for name, options in choices:
            if getattr(self, name) not in options:
                raise ValueError(
                    f"DPOConfig.{name} must be one of {options}, got {getattr(self, name)!r}."
                )
        for name in ("beta", "learning_rate", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise ValueError(f"DPOConfig.{name} must be > 0, got {getattr(self, name)}.")
        if not 0.0 <= self.label_smoothing <= 0.5:
            raise ValueError(
                f"DPOConfig.label_smoothing must be in [0, 0.5], got {self.label_smoothing}."
            )
        for name in ("num_updates", "pairs_per_step", "num_groups", "num_epochs"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"DPOConfig.{name} must be >= 1, got {getattr(self, name)}.")
        if self.group_size < 2:
            raise ValueError(f"DPOConfig.group_size must be >= 2, got {self.group_size}.")
        if self.segment_turns < 0:
            raise ValueError(f"DPOConfig.segment_turns must be >= 0, got {self.segment_turns}.")
        if not 0 <= self.sft_steps <= self.num_updates:
            raise ValueError(
                f"DPOConfig.sft_steps must be in [0, num_updates={self.num_updates}], got "
                f"{self.sft_steps}."
            )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> DPOConfig:
        """Builds a config from a dict / ConfigDict, rejecting unknown field names."""
        check_fields(cls, values)
        return cls(**dict(values))


class DPOState(NamedTuple):
    """What a DPO run carries from one update to the next (one seed)."""

    params: Any  # policy parameters (nnx.State).
    opt_state: Any
    ref_params: Any  # the frozen reference (the initial policy; with sft_steps, SFT's).
    key: jax.Array
    step: jax.Array  # [] int32
    num_pairs: jax.Array  # [] int32 offline: pairs of the data drawn from (a prefix).


class OfflineDPO(NamedTuple):
    init: Callable[..., DPOState]  # init(key, num_pairs=1, params=None)
    reference: Callable[[DPOState, PairBatch], tuple[jax.Array, jax.Array]]
    update: Callable[..., tuple[DPOState, Metrics]]  # update(state, data, ref)
    updates: Callable[..., tuple[DPOState, Metrics]]  # updates(state, data, ref, length)
    graphdef: Any


def sequence_logps(
    logp: jax.Array, trajectory: Trajectory, scored: jax.Array, length_norm: str
) -> jax.Array:
    """`[N]` log pi of a side: token log-probs `logp [N, S, L]` summed over the policy's
    tokens (`trajectory.loss_mask`) of the `scored [N, S]` turns; per-token mean with
    `length_norm="tokens"`."""
    mask = trajectory.loss_mask & scored[..., None]
    total = jnp.sum(jnp.where(mask, logp, 0.0), axis=(1, 2))
    if length_norm == "tokens":
        return total / jnp.maximum(jnp.sum(mask, axis=(1, 2)), 1)
    return total


def pair_logps(
    score: Callable, params: Any, batch: PairBatch, length_norm: str
) -> tuple[jax.Array, jax.Array]:
    """`(log pi(chosen) [N], log pi(rejected) [N])` under `params` (`make_score`)."""
    chosen = sequence_logps(
        score(params, batch.chosen)[0], batch.chosen, batch.chosen_scored, length_norm
    )
    rejected = sequence_logps(
        score(params, batch.rejected)[0], batch.rejected, batch.rejected_scored, length_norm
    )
    return chosen, rejected


def preference_loss(
    params: Any,
    batch: PairBatch,
    ref: tuple[jax.Array, jax.Array],
    *,
    score: Callable,
    config: DPOConfig,
) -> tuple[jax.Array, Metrics]:
    """The weighted mean DPO loss of `batch` and its diagnostics (`ref`: the reference's
    `pair_logps`). `pref_accuracy`: fraction of weighted pairs whose implicit reward
    ranks the chosen side higher; `reward_margin`: their mean implicit-reward margin."""
    chosen, rejected = pair_logps(score, params, batch, config.length_norm)
    out = losses.dpo_loss(
        chosen, rejected, ref[0], ref[1], beta=config.beta, kind=config.kind,
        label_smoothing=config.label_smoothing,
    )  # fmt: skip
    weight = batch.weight
    count = jnp.maximum(jnp.sum(weight), 1.0)
    margin = out.chosen_rewards - out.rejected_rewards
    metrics = {
        "dpo_loss": jnp.sum(weight * out.losses) / count,
        "pref_accuracy": jnp.sum(weight * (margin > 0)) / count,
        "reward_margin": jnp.sum(weight * margin) / count,
        "pairs": jnp.sum(weight),
    }
    return metrics["dpo_loss"], jax.tree.map(jax.lax.stop_gradient, metrics)


def make_optimizer(config: DPOConfig) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm), optax.adam(config.learning_rate)
    )


def fresh_state(key: jax.Array, policy_config: PolicyConfig, optimizer, params=None) -> DPOState:
    """A new run: a fresh policy (or `params`, e.g. a behaviour-cloned start), which is also
    the frozen reference."""
    key, init_key = jax.random.split(key)
    if params is None:
        _, params = nnx.split(Policy(policy_config, rngs=nnx.Rngs(init_key)))
    return DPOState(
        params=params, opt_state=optimizer.init(params), ref_params=params, key=key,
        step=jnp.zeros((), jnp.int32), num_pairs=jnp.ones((), jnp.int32),
    )  # fmt: skip


def make_offline_dpo(
    config: DPOConfig, env: Any, policy_config: PolicyConfig, rollout_config: RolloutConfig
) -> OfflineDPO:
    """Pure functions of DPO on a fixed `PairBatch` (jit- and vmap-able over seeds and
    `num_pairs`)."""
    graphdef = policy_graphdef(policy_config)
    score = make_score(env, graphdef, rollout_config)
    optimizer = make_optimizer(config)

    def loss(params, batch, ref):
        return preference_loss(params, batch, ref, score=score, config=config)

    def init(key: jax.Array, num_pairs: int | jax.Array = 1, params: Any = None) -> DPOState:
        state = fresh_state(key, policy_config, optimizer, params)
        return state._replace(num_pairs=jnp.asarray(num_pairs, jnp.int32))

    def reference(state: DPOState, data: PairBatch) -> tuple[jax.Array, jax.Array]:
        # With sft_steps the update reads the reference's log-probs of each batch itself
        # (the reference changes when SFT ends).
        return jax.lax.stop_gradient(pair_logps(score, state.ref_params, data, config.length_norm))

    def staged_loss(params, batch, ref_params, sft):
        """SFT on the chosen sides while `sft`, else DPO against `ref_params`."""

        def clone(params):
            logp = score(params, batch.chosen)[0]
            nll = -losses.weighted_log_likelihood(logp, batch.chosen.loss_mask, batch.weight)
            return nll, {**dict.fromkeys(PREFERENCE_METRICS, jnp.nan), "sft_nll": nll}

        def prefer(params):
            ref = jax.lax.stop_gradient(pair_logps(score, ref_params, batch, config.length_norm))
            value, metrics = loss(params, batch, ref)
            return value, {**metrics, "sft_nll": jnp.asarray(jnp.nan, jnp.float32)}

        return jax.lax.cond(sft, clone, prefer, params)

    def update(state: DPOState, data: PairBatch, ref) -> tuple[DPOState, Metrics]:
        key, pick_key = jax.random.split(state.key)
        index = jax.random.randint(pick_key, (config.pairs_per_step,), 0, state.num_pairs)
        batch = jax.tree.map(lambda x: x[index], data)
        ref_params = state.ref_params
        if config.sft_steps:  # the reference is the policy SFT left (read from the state)
            ref_params = jax.tree.map(
                lambda old, now: jnp.where(state.step == config.sft_steps, now, old),
                state.ref_params, state.params,
            )  # fmt: skip
            params, opt_state, metrics = guarded_step(
                staged_loss, state.params, state.opt_state, optimizer, batch, ref_params,
                state.step < config.sft_steps,
            )  # fmt: skip
        else:
            params, opt_state, metrics = guarded_step(
                loss, state.params, state.opt_state, optimizer, batch,
                jax.tree.map(lambda x: x[index], ref),
            )  # fmt: skip
        new = state._replace(params=params, opt_state=opt_state, ref_params=ref_params,
                             key=key, step=state.step + 1)  # fmt: skip
        return new, metrics

    def updates(state: DPOState, data: PairBatch, ref, length: int):
        return jax.lax.scan(lambda s, _: update(s, data, ref), state, None, length=length)

    return OfflineDPO(init, reference, update, updates, graphdef)
