"""Shapes and a synthetic text-mode batch shared by the benchmarks and the tests.

`QWEN25_05B` is Qwen2.5-0.5B's PolicyConfig (from its config.json), `TINY_QWEN` the same
family at test size; `text_trajectory` lays random episodes out as the text loop does
(`rlagent.text.loop.to_trajectory`), so an update can be timed or tested without a
tokenizer or an environment. No flags here: tests import it beside the launchers.
"""

from __future__ import annotations

import dataclasses
import types

from rlagent.models.llama import PolicyConfig
from rlagent.text.chat import EMPTY
from rlagent.text.loop import Episode
from rlagent.text.loop import TextConfig
from rlagent.text.loop import TurnRecord
from rlagent.text.loop import to_trajectory

QWEN25_05B = PolicyConfig(
    vocab_size=151936, pad_id=151643, d_model=896, num_layers=24, num_heads=14,
    num_kv_heads=2, mlp_dim=4864, rope_theta=1e6, norm_eps=1e-6, qkv_bias=True,
    tie_embeddings=True, param_dtype="bfloat16", dtype="bfloat16",
)  # fmt: skip
TINY_QWEN = dataclasses.replace(
    QWEN25_05B, vocab_size=512, pad_id=0, d_model=64, num_layers=2, num_heads=4,
    num_kv_heads=2, mlp_dim=128,
)  # fmt: skip


def text_trajectory(
    rng, *, batch, turns, obs_len, turn_len, tokenizer_size, chat, later_obs_len=None
) -> object:
    """A text-loop `Trajectory` (`to_trajectory`) of random episodes: every turn reads
    `obs_len` template ids (turns after the first `later_obs_len`, when given: a tool's
    reply after a long system prompt) and generates between half of `turn_len` and
    `turn_len` ids, the last END (the rest cut); outcome 1 on the last turn of a random
    half."""
    later = obs_len if later_obs_len is None else later_obs_len
    env = types.SimpleNamespace(max_turns=turns, signal_names=("outcome",))
    ids = [i for i in range(min(tokenizer_size, 4096)) if i not in (chat.pad_id, chat.end_id)]
    episodes = []
    for _ in range(batch):
        solved = float(rng.random() < 0.5)
        records = []
        for turn in range(turns):
            length = int(rng.integers(turn_len // 2 + 1, turn_len + 1))
            action = rng.choice(ids, length).tolist()
            action[-1] = chat.end_id
            last = turn == turns - 1
            records.append(TurnRecord(
                obs=rng.choice(ids, later if turn else obs_len).tolist(), action=action,
                logp=[0.0] * length,
                signals={"outcome": solved if last else 0.0}, done=last,
            ))  # fmt: skip
        episodes.append(Episode(env, [], [], [], [], records, EMPTY, []))
    config = text_config(turns, obs_len, turn_len, later_obs_len)
    return to_trajectory(episodes, config, chat.pad_id)


def text_config(turns: int, obs_len: int, turn_len: int, later_obs_len=None) -> TextConfig:
    """The `TextConfig` of `text_trajectory`'s episodes, P the longest transcript before
    their last turn: the scorer's packed width (`TextConfig.transcript_len`, P + L) is all
    of turns x (O + L) when every turn reads O tokens, less when later turns read fewer."""
    later = obs_len if later_obs_len is None else later_obs_len
    prompt = obs_len + (turns - 1) * (turn_len + later)  # before the last turn.
    return TextConfig(max_new_tokens=turn_len, obs_len=obs_len, max_prompt_len=prompt)
