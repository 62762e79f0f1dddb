"""The critic of text-mode PPO: a separate value model read from an HF checkpoint.

    critic = CriticConfig()                        # the policy's checkpoint, its learning rate
    checked = check_critic(critic, model)          # before anything is written
    graphdef, params = load_critic(checked, model)

As in InstructGPT-style PPO (and verl's / OpenRLHF's critic role) the critic is a model of
its own: the trunk of a checkpoint (by default the policy's, so it starts from what the
policy knows) with its LM head dropped and a scalar value head that starts at zero
(`rlagent.models.policy.ValueLM`). It reads the very tokens the policy read
(`rlagent.text.score.make_text_values`), so its checkpoint must share the policy's
tokenizer (the same vocabulary, id for id); it may be another size (a smaller critic).
It trains with its own AdamW (`learning_rate`, default the policy's) on the clipped value
loss (`rlagent.text.update`), for `warmup_updates` updates alone before the policy moves.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any
from typing import NamedTuple

from flax import nnx

from rlagent.models import checkpoint
from rlagent.models.hf import CheckpointError
from rlagent.text.chat import ChatTemplateError
from rlagent.text.chat import check_vocab
from rlagent.text.chat import load_tokenizer


@dataclasses.dataclass(frozen=True)
class CriticConfig:
    """Where text-mode PPO's critic comes from and how it learns (read only when the
    estimator reads values: gae_token, gae_turn, hierarchical)."""

    model_dir: str = ""  # a checkpoint folder; '' = the policy's.
    learning_rate: float | None = None  # its AdamW's; None = TrainConfig.learning_rate.
    warmup_updates: int = 0  # first updates in which only the critic learns.

    def __post_init__(self):
        if not isinstance(self.warmup_updates, int) or self.warmup_updates < 0:
            raise ValueError(
                f"CriticConfig.warmup_updates must be an integer >= 0, got {self.warmup_updates!r}"
            )
        if self.learning_rate is not None and not self.learning_rate > 0:
            raise ValueError(
                f"CriticConfig.learning_rate must be > 0 (or None), got {self.learning_rate!r}"
            )


class CheckedCritic(NamedTuple):
    """A critic config whose checkpoint folder was checked (`check_critic`)."""

    config: CriticConfig
    model_dir: str  # absolute path of the critic's checkpoint folder.
    checkpoint: checkpoint.Checkpoint


def check_critic(config: CriticConfig, model: Any) -> CheckedCritic:
    """Checks the critic's checkpoint without reading a tensor: a folder the loader reads,
    in the policy's dtypes (float32 master weights and AdamW moments under bfloat16 compute
    by default, as the policy's), with the policy's tokenizer (`model`: an AgentModel of
    `rlagent.text.train`); a one-line error names the fault."""
    policy = model.checkpoint.config
    model_dir = os.path.abspath(config.model_dir) if config.model_dir else model.model_dir
    if model_dir != model.model_dir and not os.path.isdir(model_dir):
        raise CheckpointError(f"config.critic.model_dir={config.model_dir!r} is not a folder")
    found = checkpoint.read_checkpoint(
        model_dir, pad_id=policy.pad_id, param_dtype=policy.param_dtype, dtype=policy.dtype,
        remat=policy.remat,
    )  # fmt: skip
    if model_dir != model.model_dir:
        _check_same_tokenizer(model_dir, model)
    try:
        check_vocab(model.chat, found.config)
    except ChatTemplateError as error:
        raise CheckpointError(f"{model_dir}: the critic's {error}") from None
    return CheckedCritic(config, model_dir, found)


def load_critic(critic: CheckedCritic) -> tuple[nnx.GraphDef, nnx.State]:
    """`(graphdef, params)` of the checked critic (`ValueLM`, its value head at zero)."""
    config = critic.checkpoint.config
    module, _ = checkpoint.load_value_model(
        critic.model_dir, dtype=config.param_dtype, compute_dtype=config.dtype,
        pad_id=config.pad_id, remat=config.remat,
    )  # fmt: skip
    return nnx.split(module)


def provenance_record(critic: CheckedCritic) -> dict[str, Any]:
    """provenance.json's `critic`: the config, the folder and the critic's shape."""
    return dict(
        **dataclasses.asdict(critic.config), folder=critic.model_dir,
        policy=dataclasses.asdict(critic.checkpoint.config),
    )  # fmt: skip


def _check_same_tokenizer(model_dir: str, model: Any) -> None:
    vocab = load_tokenizer(model_dir).get_vocab()
    if vocab != model.chat.tokenizer.get_vocab():
        raise CheckpointError(
            f"config.critic.model_dir={model_dir!r}: its tokenizer is not the policy's "
            f"({len(vocab)} vs {len(model.chat.tokenizer.get_vocab())} tokens, or other ids); "
            "the critic reads the policy's token ids"
        )
