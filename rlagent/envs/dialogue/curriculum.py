"""Curriculum helpers: the config of each level and configs of an exact horizon.

Levels (`config.LEVELS`, short answers, no volunteering): shortest dialogues of 3
(one constraint), 5, 8, 11 and 16 turns (six constraints, four requests, four remarks).
"""

from __future__ import annotations

from rlagent.envs.dialogue import dsl
from rlagent.envs.dialogue.config import LEVELS
from rlagent.envs.dialogue.config import MAX_CHATS
from rlagent.envs.dialogue.config import DialogueConfig
from rlagent.envs.dialogue.config import Persona

MAX_LEVEL = max(LEVELS)
MAX_HORIZON = 2 + dsl.MAX_ATTRIBUTES + MAX_CHATS  # 20 turns


def level_config(level: int, **overrides) -> DialogueConfig:
    """The default config of a curriculum level, with field overrides."""
    return DialogueConfig(level=level, **overrides)


def horizon_config(shortest: int, task_split: str = "all", **persona_fields) -> DialogueConfig:
    """A short-answer config whose shortest dialogue is exactly `shortest` turns (3..20).

    `shortest - 2` is split into constraints C = min(6, ceil(n / 2)), requests
    R = min(6, n - C) and off-topic remarks (the rest); `persona_fields` set the persona
    (patience, feedback; not answers or volunteers, which would change the horizon);
    `task_split` is the config's held-out goals split (DialogueConfig.task_split).
    """
    if not 3 <= shortest <= MAX_HORIZON:
        raise ValueError(f"shortest must be in [3, {MAX_HORIZON}], got {shortest}")
    fixed = {"answers", "volunteers", "chats"} & set(persona_fields)
    if fixed:
        raise ValueError(f"horizon_config sets {sorted(fixed)} itself")
    n = shortest - 2
    constraints = min(6, (n + 1) // 2)
    requests = min(6, n - constraints)
    persona = Persona(chats=n - constraints - requests, **persona_fields)
    config = DialogueConfig(
        num_constraints=constraints, num_requests=requests, persona=persona, task_split=task_split
    )
    assert config.shortest == shortest
    return config
