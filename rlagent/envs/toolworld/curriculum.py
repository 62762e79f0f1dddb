"""Curriculum helpers: configs per level, exact-horizon configs and level promotion.

Levels (see `toolworld`): 1 single tool (2 turns), 2 several tools (3 turns), 3 nested
calls (4 turns), 4 several intents in one dialogue. `horizon_config(h)` builds a config
whose shortest plan is exactly `h` turns for every episode, for horizon sweeps.
"""

from __future__ import annotations

import dataclasses

from rlagent.envs.toolworld.config import KIND_COST
from rlagent.envs.toolworld.config import ToolWorldConfig

MAX_LEVEL = 4


def level_config(level: int, **overrides) -> ToolWorldConfig:
    """The default config of a curriculum level, with field overrides."""
    return ToolWorldConfig(level=level, **overrides)


def shortest_plan_range(config: ToolWorldConfig) -> tuple[int, int]:
    """Smallest and largest shortest-plan length (turns, BYE included) of a config."""
    costs = [KIND_COST[k] for k in config.kind_ids]
    fixed = 1 + config.num_distractors
    return fixed + config.num_intents * min(costs), fixed + config.num_intents * max(costs)


def horizon_config(shortest_plan: int, **overrides) -> ToolWorldConfig:
    """A config whose every episode has a shortest plan of exactly `shortest_plan` turns.

    2 turns: one change_address / cancel; 3: one status / refund; h >= 4: (h - 1) // 3
    exchanges (3 turns each: lookup, check_stock, exchange or no_stock) and
    (h - 1) % 3 off-topic distractors, then BYE. max_turns defaults to h + 2.
    """
    if shortest_plan < 2:
        raise ValueError(f"shortest_plan must be >= 2, got {shortest_plan}")
    if shortest_plan == 2:
        fields = dict(level=1)
    elif shortest_plan == 3:
        fields = dict(level=2)
    else:
        exchanges, distractors = divmod(shortest_plan - 1, 3)
        fields = dict(
            level=4,
            kinds=("exchange",),
            num_intents=exchanges,
            num_distractors=distractors,
        )
    fields.update(overrides)
    try:
        config = ToolWorldConfig(**fields)
    except ValueError as error:
        raise ValueError(f"shortest_plan={shortest_plan} is not reachable: {error}") from None
    low, high = shortest_plan_range(config)
    if low != high or low != shortest_plan:
        raise ValueError(
            f"shortest_plan={shortest_plan}: overrides {overrides} give plans of {low}..{high}"
        )
    return config


@dataclasses.dataclass(frozen=True)
class Promotion:
    """Level promotion on a moving average of the success rate (host-side, per update).

    `advance` raises the level once the exponential moving average of the success rate
    reaches `threshold`, and resets the average for the new level.
    """

    threshold: float = 0.8  # success rate that promotes to the next level.
    smoothing: float = 0.9  # EMA weight of the past: avg <- s * avg + (1 - s) * rate.
    max_level: int = MAX_LEVEL

    def __post_init__(self):
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"Promotion.threshold must be in (0, 1], got {self.threshold}")
        if not 0.0 <= self.smoothing < 1.0:
            raise ValueError(f"Promotion.smoothing must be in [0, 1), got {self.smoothing}")

    def advance(self, level: int, average: float, success_rate: float) -> tuple[int, float]:
        """`(level, average)` after one update whose batch success rate is `success_rate`."""
        average = self.smoothing * average + (1.0 - self.smoothing) * float(success_rate)
        if average >= self.threshold and level < self.max_level:
            return level + 1, 0.0
        return level, average
