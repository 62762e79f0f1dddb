"""Typed, validated configuration of a PPO run.

Experiments describe runs with `ml_collections` (see experiments/configs); the trainer
takes this frozen dataclass so that kernels see typed scalars, unknown option names fail
before anything is traced, and the config can be a static argument of `jit`.

The settings of the trainer's extras belong to the packages that use them: the process
reward model's (`rlagent.prm.config.PRMConfig`), the credit probe's
(`rlagent.credit.probe.ProbeConfig`) and held-out evaluation's
(`rlagent.train.evaluation.EvalConfig`); checks across configs are made where they meet
(`make_train`, `rlagent.host.extras.trainer_extras`, `rlagent.host.loop.run`).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any

from rlagent.losses import AGG_MODES
from rlagent.losses import KL_KINDS
from rlagent.train.estimators import ESTIMATORS as ESTIMATOR_TABLE
from rlagent.train.tree import BRANCH_AT

# Estimator names, in the order of the table they come from (`rlagent.train.estimators`).
ESTIMATORS = tuple(ESTIMATOR_TABLE)
REWARDS = (
    "outcome",  # sparse: 1 on the final turn if the task is solved without a violation.
    "process",  # dense: the oracle process verdict (+1 / 0 / -1) of every turn.
    "composed",  # outcome / process / efficiency mix, `reward_weights`.
    "prm_sum",  # outcome + verdict (prm_rewards form "sum"): process with its outcome term.
    "prm_min",  # outcome + prm_rewards(verdict, form="min").
    "potential",  # outcome + shaping, Phi = 0.5 x valid plan steps taken (rewards.py).
    # A PRM's scores p_s (a PRMConfig.kind other than "none", rlagent.prm) added to the outcome:
    "learned_sum",  # outcome + (2 p - 1).
    "learned_min",  # outcome + prm_rewards(2 p - 1, form="min").
    "learned_potential",  # outcome + shaping, Phi = 0.5 x sum of the scores of past turns.
    "learned_centred",  # outcome + 2 (p - the batch's mean score): the sum form, centred.
    # Dialogue environments (rlagent.envs.dialogue):
    "dialogue",  # the brief's mix: fluency + factuality + user feedback (`dialogue_weights`).
    "rating",  # the simulated user's end-of-dialogue satisfaction rating alone.
    "feedback",  # the user's sparse, noisy thumbs up / down alone.
)
# Reward forms that read a process reward model's scores.
LEARNED_REWARDS = ("learned_sum", "learned_min", "learned_potential", "learned_centred")
KL_PLACEMENTS = ("none", "reward", "loss")
SCHEDULES = ("constant", "linear", "cosine")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters of `make_train`. Every field is a typed scalar or a tuple."""

    num_updates: int = 60  # PPO iterations (rollout + optimisation).
    num_groups: int = 8  # distinct tasks per iteration.
    group_size: int = 8  # episodes per task (GRPO / RLOO / GiGPO groups).
    reward: str = "process"  # one of REWARDS.
    reward_weights: tuple[float, float, float] = (0.5, 0.3, 0.2)  # outcome, process, efficiency
    dialogue_weights: tuple[float, float, float] = (1.0, 1.0, 1.0)  # fluency, factuality, feedback
    prm_temperature: float = 0.1  # temperature of the min-form PRM credit.
    violation_penalty: float = 0.0  # subtracted once per turn that breaks a guardrail rule.
    malformed_penalty: float = 0.0  # subtracted per malformed turn (text environments' signal).
    estimator: str = "gae_turn"  # one of ESTIMATORS.
    # ToolWorld's turn limit is part of the task (running out of turns fails it), so by
    # default a truncated episode is not bootstrapped from V (Pardo et al., 2018).
    bootstrap_truncated: bool = False
    gamma: float = 1.0
    lam: float = 0.95
    gigpo_omega: float = 1.0
    # Tree rollouts (rlagent.train.tree), read only by tree estimators (`tree_grpo`): K
    # leaves per tree (a root and K - 1 siblings forked at one of its turns; divides
    # group_size), where the tree branches (BRANCH_AT) and the within-tree term's weight.
    tree_branches: int = 2
    tree_branch_at: str = "uniform"
    tree_omega: float = 1.0
    normalize_advantages: bool = True  # masked whitening of critic-based advantages.
    # Divide turn rewards by a running std of the run's episode returns (rewards.py
    # scale_rewards), so reward forms of different ranges get the same effective step size.
    normalize_returns: bool = False
    num_epochs: int = 2
    num_minibatches: int = 2
    # Episodes per forward / backward pass of the text update (`rlagent.text.update`): a
    # minibatch's gradient is summed over its micro-batches, one optimiser step for all
    # of them (gradient accumulation), and the reference's and critic's passes run in
    # micro-batches too. None = the whole minibatch at once. The main trainer refuses it.
    micro_batch_size: int | None = None
    clip_low: float = 0.2
    clip_high: float = 0.28  # asymmetric "clip-higher" upper bound.
    dual_clip: float | None = 3.0
    agg: str = "token-mean"  # one of AGG_MODES.
    value_coef: float = 0.5
    value_clip: float | None = 0.2
    entropy_coef: float = 0.01
    kl_placement: str = "loss"  # one of KL_PLACEMENTS: KL to the frozen initial policy.
    kl_kind: str = "k3"  # one of KL_KINDS.
    kl_coef: float = 0.0
    kl_target: float | None = None  # adaptive coefficient when set (Ziegler et al. 2019).
    kl_horizon: float = 1000.0  # adaptive controller horizon, in episodes.
    learning_rate: float = 3e-3
    lr_schedule: str = "constant"  # one of SCHEDULES.
    warmup_updates: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    # Debug: run the kernels' run-time input checks (traced group ids of GRPO / RLOO /
    # GiGPO, `check_inputs` under `jax.experimental.checkify`) inside the compiled update;
    # the host loop stops at the first failing chunk naming its updates. Slower; changes
    # no result, so a resumed run may switch it.
    check_inputs: bool = False

    def __post_init__(self):
        self._check_types()
        _check_choice("reward", self.reward, REWARDS)
        _check_choice("estimator", self.estimator, ESTIMATORS)
        _check_choice("kl_placement", self.kl_placement, KL_PLACEMENTS)
        _check_choice("kl_kind", self.kl_kind, KL_KINDS)
        _check_choice("agg", self.agg, AGG_MODES)
        _check_choice("lr_schedule", self.lr_schedule, SCHEDULES)
        for name in ("num_updates", "num_groups", "group_size", "num_epochs", "num_minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}.")
        if self.batch_size % self.num_minibatches:
            raise ValueError(
                f"num_groups * group_size = {self.batch_size} episodes must divide into "
                f"num_minibatches = {self.num_minibatches} equal minibatches."
            )
        self._check_micro_batch()
        if ESTIMATOR_TABLE[self.estimator].grouped and self.group_size < 2:
            raise ValueError(f"estimator={self.estimator!r} needs group_size >= 2.")
        _check_choice("tree_branch_at", self.tree_branch_at, BRANCH_AT)
        if self.tree_branches < 2:
            raise ValueError(f"TrainConfig.tree_branches must be >= 2, got {self.tree_branches}.")
        if self.uses_trees:
            self._check_trees()
        if not 0.0 <= self.gamma <= 1.0 or not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"gamma and lam must lie in [0, 1], got {self.gamma}, {self.lam}.")
        if len(self.reward_weights) != 3:
            raise ValueError("reward_weights must be (outcome, process, efficiency).")
        if len(self.dialogue_weights) != 3:
            raise ValueError("dialogue_weights must be (fluency, factuality, feedback).")
        if self.kl_target is not None and self.kl_placement == "none":
            raise ValueError("kl_target (adaptive KL) needs kl_placement 'reward' or 'loss'.")
        for name in ("learning_rate", "clip_low", "clip_high"):
            if getattr(self, name) <= 0:
                raise ValueError(f"TrainConfig.{name} must be > 0, got {getattr(self, name)!r}.")
        self._check_ranges()

    def _check_trees(self):
        """A tree estimator's batch: whole trees per group, no truncation bootstrap."""
        if self.group_size % self.tree_branches:
            raise ValueError(
                f"estimator={self.estimator!r}: TrainConfig.tree_branches = "
                f"{self.tree_branches} must divide group_size = {self.group_size} (a group "
                "holds whole trees of its task)."
            )
        if self.bootstrap_truncated:
            raise ValueError(
                f"estimator={self.estimator!r} trains on tree rollouts, whose siblings do "
                "not bootstrap a truncated episode: set TrainConfig.bootstrap_truncated=False."
            )

    def _check_micro_batch(self):
        if self.micro_batch_size is None:
            return
        rows = self.batch_size // self.num_minibatches
        micro = self.micro_batch_size
        if not isinstance(micro, numbers.Integral) or isinstance(micro, bool) or micro < 1:
            raise ValueError(f"TrainConfig.micro_batch_size must be None or an integer >= 1, "
                             f"got {micro!r}.")  # fmt: skip
        if rows % micro:
            raise ValueError(
                f"TrainConfig.micro_batch_size = {micro} must divide a minibatch of {rows} "
                f"episodes (num_groups * group_size / num_minibatches = {self.num_groups} * "
                f"{self.group_size} / {self.num_minibatches})."
            )

    def _check_types(self):
        """Counts are integers (2.5 updates would truncate), numbers are finite numbers."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in _INTEGER_FIELDS:
                if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                    raise ValueError(f"TrainConfig.{field.name} must be an integer, got {value!r}.")
            elif field.name in _REAL_FIELDS and value is not None:
                values = value if isinstance(value, tuple) else (value,)
                if not all(_is_real(v) and math.isfinite(v) for v in values):
                    raise ValueError(
                        f"TrainConfig.{field.name} must be a finite number, got {value!r}."
                    )

    def _check_ranges(self):
        """Ranges of the loss, optimiser and reward settings (each refusal names its field)."""
        bounds = {
            "value_coef": self.value_coef >= 0,
            "entropy_coef": self.entropy_coef >= 0,
            "kl_coef": self.kl_coef >= 0,
            "weight_decay": self.weight_decay >= 0,
            "violation_penalty": self.violation_penalty >= 0,
            "malformed_penalty": self.malformed_penalty >= 0,
            "gigpo_omega": self.gigpo_omega >= 0,
            "tree_omega": self.tree_omega >= 0,
            "warmup_updates": 0 <= self.warmup_updates <= self.num_updates,
            "max_grad_norm": self.max_grad_norm > 0,
            "prm_temperature": self.prm_temperature > 0,
            "kl_horizon": self.kl_horizon > 0,
            "kl_target": self.kl_target is None or self.kl_target > 0,
            "value_clip": self.value_clip is None or self.value_clip >= 0,
            "dual_clip": self.dual_clip is None or self.dual_clip > 1,
        }
        for name, ok in bounds.items():
            if not ok:
                raise ValueError(
                    f"TrainConfig.{name} must be {_RANGES[name]}, got {getattr(self, name)!r}."
                )

    @property
    def batch_size(self) -> int:
        """Episodes per iteration."""
        return self.num_groups * self.group_size

    @property
    def uses_critic(self) -> bool:
        return ESTIMATOR_TABLE[self.estimator].uses_critic

    @property
    def uses_trees(self) -> bool:
        """The estimator trains on tree rollouts (`rlagent.train.tree`)."""
        return ESTIMATOR_TABLE[self.estimator].tree

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> TrainConfig:
        """Builds a config from a dict / ConfigDict, rejecting unknown field names."""
        check_fields(cls, values)
        kwargs = dict(values)
        for name in ("reward_weights", "dialogue_weights"):
            if name in kwargs:
                kwargs[name] = tuple(float(w) for w in kwargs[name])
        return cls(**kwargs)


_INTEGER_FIELDS = (
    "num_updates", "num_groups", "group_size", "num_epochs", "num_minibatches", "warmup_updates",
    "tree_branches",
)  # fmt: skip
_REAL_FIELDS = (
    "reward_weights", "dialogue_weights", "prm_temperature", "violation_penalty",
    "malformed_penalty", "gamma", "lam", "gigpo_omega", "tree_omega", "clip_low", "clip_high",
    "dual_clip", "value_coef", "value_clip",
    "entropy_coef", "kl_coef", "kl_target", "kl_horizon", "learning_rate", "weight_decay",
    "max_grad_norm",
)  # fmt: skip
_NON_NEGATIVE = (
    "value_coef", "entropy_coef", "kl_coef", "weight_decay", "violation_penalty",
    "malformed_penalty", "gigpo_omega", "tree_omega",
)  # fmt: skip
_RANGES = {
    **dict.fromkeys(_NON_NEGATIVE, ">= 0"),
    **dict.fromkeys(("max_grad_norm", "prm_temperature", "kl_horizon"), "> 0"),
    "warmup_updates": "in [0, num_updates] (a longer warmup never reaches learning_rate)",
    "kl_target": "> 0 or None",
    "value_clip": ">= 0 or None (no value clipping)",
    "dual_clip": "> 1 or None (dual-clip PPO bounds the loss at c > 1 times the advantage)",
}


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_fields(cls: type, values: Mapping[str, Any]) -> None:
    """Refuses names in `values` that are no field of dataclass `cls` (`from_mapping`)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"Unknown {cls.__name__} fields {unknown}; known: {sorted(fields)}.")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"Unknown {name} {value!r}; expected one of {choices}.")
