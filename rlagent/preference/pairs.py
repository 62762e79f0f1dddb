"""Preference pairs as arrays: from records, from groups of ranked episodes, from forks.

A `PairBatch` holds N pairs of whole episodes as two `Trajectory`s `[N, S, ...]` and,
per side, the turns whose policy tokens enter the loss (`*_scored [N, S]`):

* trajectory level (ETO, Song et al. 2024): every played turn;
* segment level (SDPO, Kong et al. 2025): the turns from the first turn where the two
  episodes differ (`first_difference`), optionally at most `segment_turns` of them.

Pairs come from three places: JSONL records (`records_to_pairs`, which rebuilds the
constrained-decoding masks by replaying each task in the environment and refuses a
record whose observations the replay does not show), groups of episodes of one task
ranked by a judge (`group_pairs`: best against worst), and forks (`rollout.make_branch`:
a played prefix continued several times from the same rollout carry,
`rlagent.preference.online`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlagent.credit.mc import replay_states
from rlagent.envs.base import Environment
from rlagent.envs.base import env_name
from rlagent.preference.data import PreferenceDataError
from rlagent.preference.data import PreferenceRecord
from rlagent.preference.data import Side
from rlagent.preference.data import Turn
from rlagent.rollout import ban_pad
from rlagent.types import Trajectory

LEVELS = ("trajectory", "segment")


class PairBatch(NamedTuple):
    """N preference pairs of whole episodes."""

    chosen: Trajectory  # [N, S, ...] the preferred episodes.
    rejected: Trajectory  # [N, S, ...]
    chosen_scored: jax.Array  # [N, S] bool: turns of `chosen` whose policy tokens count.
    rejected_scored: jax.Array  # [N, S] bool
    weight: jax.Array  # [N] float32: 1 for a pair, 0 for padding or no preference.


def scored_turns(
    chosen: Trajectory, rejected: Trajectory, *, level: str, segment_turns: int = 0
) -> tuple[jax.Array, jax.Array]:
    """`(chosen_scored, rejected_scored)` `[N, S]` bool of a level (`LEVELS`).

    `"trajectory"`: the played turns. `"segment"`: played turns from the first turn where
    the sides differ; `segment_turns > 0` keeps at most that many of them.
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if level == "trajectory":
        return chosen.turn_mask, rejected.turn_mask
    start = first_difference(chosen, rejected)[:, None]
    turns = jnp.arange(chosen.turn_mask.shape[1])[None, :]
    inside = turns >= start
    if segment_turns:
        inside &= turns < start + segment_turns
    return chosen.turn_mask & inside, rejected.turn_mask & inside


def first_difference(a: Trajectory, b: Trajectory) -> jax.Array:
    """`[N]` int32: the first turn whose observation, markers, actions or played flag
    differ between rows of `a` and `b` (S when none does)."""
    same = (
        jnp.all(a.obs_tokens == b.obs_tokens, axis=-1)
        & jnp.all(a.progress == b.progress, axis=-1)
        & jnp.all(a.action_tokens == b.action_tokens, axis=-1)
        & (a.turn_mask == b.turn_mask)
    )
    first = jnp.argmin(same, axis=1).astype(jnp.int32)
    return jnp.where(jnp.all(same, axis=1), same.shape[1], first)


def group_pairs(
    scores: jax.Array, key: jax.Array, accuracy: jax.Array | float = 1.0
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Best against worst episode of every group: `(chosen [G], rejected [G], weight [G])`.

    Args:
      scores: `[G, K]` judge scores of K episodes of each of G tasks (higher is better).
      key: PRNG key: ties among the best (worst) are broken at random, and a noisy
        judge's flips are drawn from it.
      accuracy: probability that the judge keeps the true order of a pair (1: exact; a
        noisy judge, standing in for an AI judge of known accuracy, swaps the sides
        otherwise). May be traced (a condition of runs side by side).
    Returns:
      Indices into the K episodes of each group, and 1.0 where the scores differ (a
      group whose episodes all score alike states no preference: weight 0).
    """
    tie_key, flip_key = jax.random.split(key)
    jitter = jax.random.uniform(tie_key, scores.shape)
    best = jnp.argmax(jnp.where(scores == scores.max(1, keepdims=True), jitter, -1.0), axis=1)
    worst = jnp.argmax(jnp.where(scores == scores.min(1, keepdims=True), jitter, -1.0), axis=1)
    flip = jax.random.uniform(flip_key, scores.shape[:1]) >= accuracy
    chosen, rejected = jnp.where(flip, worst, best), jnp.where(flip, best, worst)
    weight = (scores.max(1) > scores.min(1)).astype(jnp.float32)
    return chosen, rejected, weight


def take_pairs(
    trajectory: Trajectory, chosen: jax.Array, rejected: jax.Array, group_size: int
) -> tuple[Trajectory, Trajectory]:
    """The chosen and rejected episodes `[G, ...]` of `trajectory [G * K, ...]` by their
    indices within each group (`group_pairs`)."""
    rows = jnp.arange(chosen.shape[0]) * group_size
    pick = lambda index: jax.tree.map(lambda x: x[rows + index], trajectory)  # noqa: E731
    return pick(chosen), pick(rejected)


def records_to_pairs(
    records: Sequence[PreferenceRecord], env: Environment, *, constrained: bool, level: str,
    segment_turns: int = 0, pad_to: int | None = None,
) -> PairBatch:  # fmt: skip
    """The `PairBatch` of loaded records for training on `env`.

    Every record's dims must be the environment's, and replaying its task key with each
    side's actions must show the recorded observations and markers (the data belongs to
    this environment and task); otherwise `PreferenceDataError` names the record's file
    and line and the field. With `constrained`, each token's sampling mask is rebuilt
    from the replayed state, as the constrained sampler drew it (`make_score`
    renormalises over it). `pad_to` pads the batch with weight-0 pairs.
    """
    if not records:
        raise ValueError("records_to_pairs needs at least one record")
    for record in records:
        _check_dims(record, env)
    size = len(records) if pad_to is None else pad_to
    if size < len(records):
        raise ValueError(f"pad_to={pad_to} is below the {len(records)} records")
    keys = np.zeros((size, 2), np.uint32)
    keys[: len(records)] = [r.env["task_key"] for r in records]
    sides = []
    for name in ("chosen", "rejected"):
        arrays = _side_arrays(records, name, env, size)
        sides.append(_replayed(arrays, keys, env, records, name, constrained=constrained))
    chosen_scored, rejected_scored = scored_turns(*sides, level=level, segment_turns=segment_turns)
    weight = (np.arange(size) < len(records)).astype(np.float32)
    return PairBatch(sides[0], sides[1], chosen_scored, rejected_scored, jnp.asarray(weight))


def trajectory_records(
    trajectory: Trajectory, env_keys: jax.Array, pairs: tuple[Any, Any, Any], scores: Any, *,
    env: Environment, meta: dict[str, Any], prefix_turns: Any = None,
) -> list[PreferenceRecord]:  # fmt: skip
    """Records of ranked pairs of rows of `trajectory` (host side, for `write_records`).

    Args:
      trajectory: `[B, S, ...]` episodes.
      env_keys: `[B]` reset keys (the tasks; typed, or `[B, 2]` uint32).
      pairs: `(chosen [N], rejected [N], weight [N])` row indices into the batch; pairs of
        weight 0 (no preference) are left out.
      scores: `[B]` the judge's scores.
      env: the environment (its config and dims).
      meta: `{"id", "policy", "judge"}`: an id prefix, the policy's `{"name",
        "version"}` and the judge's name.
      prefix_turns: `[N]` turns shared by the two sides (0 without forks).
    """
    traj = jax.device_get(trajectory)
    if jnp.issubdtype(env_keys.dtype, jax.dtypes.prng_key):
        env_keys = jax.random.key_data(env_keys)
    keys = np.asarray(jax.device_get(env_keys)).reshape(-1, 2)
    chosen, rejected, weight = (np.asarray(jax.device_get(x)) for x in pairs)
    scores = np.asarray(jax.device_get(scores))
    shared = np.zeros(len(chosen), int) if prefix_turns is None else np.asarray(prefix_turns)
    out = []
    for n in np.flatnonzero(weight > 0):
        c, r, k = int(chosen[n]), int(rejected[n]), int(shared[n])
        turns_c, turns_r = _row_turns(traj, c, env), _row_turns(traj, r, env)
        out.append(
            PreferenceRecord(
                id=f"{meta['id']}/{n}",
                env={
                    "name": env_name(env),
                    "config": env_config_record(env),
                    "task_key": [int(x) for x in keys[c]],
                },
                dims=dims_of(env),
                policy=dict(meta["policy"]),
                judge={
                    "name": meta["judge"],
                    "chosen_score": float(scores[c]),
                    "rejected_score": float(scores[r]),
                },
                prefix=turns_c[:k],
                chosen=Side(turns_c[k:], bool(traj.success[c].any())),
                rejected=Side(turns_r[k:], bool(traj.success[r].any())),
            )  # fmt: skip
        )
    return out


def log_records(log: Any, *, env: Environment, meta: dict[str, Any]) -> list[PreferenceRecord]:
    """Records of one online iteration's pairs (`online.PairLog`, one iteration's arrays;
    `meta` as `trajectory_records`'). A noisy judge states the preference it flipped, so a
    flipped pair (the chosen side scored below the rejected) is recorded as the judge
    stated it: its scores swapped and `(flipped)` after the judge's name, the true scores
    recoverable by swapping back."""
    log = jax.device_get(log)
    scores = np.asarray(log.scores, np.float64)
    chosen, rejected = np.asarray(log.chosen), np.asarray(log.rejected)
    weight = np.asarray(log.weight, np.float64)
    flipped = scores[chosen] < scores[rejected]
    stated = scores.copy()
    c, r = chosen[flipped], rejected[flipped]
    stated[c], stated[r] = scores[r], scores[c]
    out = []
    for part, suffix in ((~flipped, ""), (flipped, " (flipped)")):
        pairs = (chosen, rejected, weight * part)
        named = {**meta, "judge": meta["judge"] + suffix}
        out += trajectory_records(log.trajectory, np.asarray(log.env_keys), pairs, stated,
                                  env=env, meta=named, prefix_turns=log.prefix_turns)  # fmt: skip
    return sorted(out, key=lambda record: int(record.id.rsplit("/", 1)[1]))


def dims_of(env: Environment) -> dict[str, int]:
    """The `dims` field of `env`'s records."""
    spec = env.token_spec
    return {
        "turns": env.max_turns, "obs_len": env.obs_len, "turn_len": env.turn_len,
        "markers": env.num_markers, "vocab": spec.vocab_size, "pad": spec.pad, "end": spec.end,
    }  # fmt: skip


# --------------------------------------------------------------------------- helpers


def env_config_record(env: Environment) -> dict[str, Any]:
    """The env config's plain fields (a record's `env.config`), `{}` without a dataclass."""
    config = getattr(env, "config", None)
    if config is None or not hasattr(config, "__dataclass_fields__"):
        return {}
    return {
        k: list(v) if isinstance(v, tuple) else v
        for k, v in config.__dict__.items()
        if isinstance(v, int | float | str | bool | tuple | type(None))
    }


def _row_turns(traj: Trajectory, row: int, env: Environment) -> tuple[Turn, ...]:
    turns = []
    for s in np.flatnonzero(traj.turn_mask[row]):
        action = traj.action_tokens[row, s][traj.action_mask[row, s]]
        turns.append(
            Turn(
                tuple(int(x) for x in traj.obs_tokens[row, s]),
                tuple(int(x) for x in traj.progress[row, s]),
                tuple(int(x) for x in action),
            )
        )
    return tuple(turns)


def _check_dims(record: PreferenceRecord, env: Environment) -> None:
    for name, value in dims_of(env).items():
        if record.dims[name] != value:
            raise PreferenceDataError(
                f"{record.where}: dims.{name}: {record.dims[name]}, but {env_name(env)} has {value}"
            )


def _side_arrays(records, name: str, env: Environment, size: int) -> dict[str, np.ndarray]:
    """Padded `[size, S, ...]` arrays of the prefix + side turns of every record."""
    s, o, k, length = env.max_turns, env.obs_len, env.num_markers, env.turn_len
    pad = env.token_spec.pad
    out = {
        "obs_tokens": np.full((size, s, o), pad, np.int32),
        "progress": np.zeros((size, s, k), np.int32),
        "action_tokens": np.full((size, s, length), pad, np.int32),
        "action_mask": np.zeros((size, s, length), bool),
        "turn_mask": np.zeros((size, s), bool),
        "success": np.zeros((size, s), bool),
    }
    for n, record in enumerate(records):
        side: Side = getattr(record, name)
        turns = record.prefix + side.turns
        for t, turn in enumerate(turns):
            out["obs_tokens"][n, t] = turn.obs
            out["progress"][n, t] = turn.progress
            out["action_tokens"][n, t, : len(turn.action)] = turn.action
            out["action_mask"][n, t, : len(turn.action)] = True
        out["turn_mask"][n, : len(turns)] = True
        out["success"][n, len(turns) - 1] = side.success
    return out


def _replayed(arrays, keys, env, records, name, *, constrained: bool) -> Trajectory:
    """The side's Trajectory, checked against (and masked by) the replayed environment."""
    obs, progress, sampling_mask = replay_observations(
        env, jnp.asarray(keys), arrays["action_tokens"], constrained
    )
    played = arrays["turn_mask"]
    for field, seen in (("obs", np.asarray(obs)), ("progress", np.asarray(progress))):
        recorded = arrays["obs_tokens" if field == "obs" else "progress"]
        bad = np.any(seen != recorded, axis=-1) & played
        if bad[: len(records)].any():
            n, t = (int(i) for i in np.argwhere(bad)[0])
            record = records[n]
            where = (
                f"prefix[{t}]"
                if t < len(record.prefix)
                else (f"{name}.turns[{t - len(record.prefix)}]")
            )
            raise PreferenceDataError(
                f"{record.where}: {where}.{field}: {recorded[n, t].tolist()} is not what "
                f"{env_name(env)} shows for task {record.env['task_key']} ({seen[n, t].tolist()})"
            )
    shape = arrays["action_tokens"].shape
    last = played & ~np.pad(played[:, 1:], ((0, 0), (0, 1)))
    return Trajectory(
        obs_tokens=jnp.asarray(arrays["obs_tokens"]),
        progress=jnp.asarray(arrays["progress"]),
        action_tokens=jnp.asarray(arrays["action_tokens"]),
        action_mask=jnp.asarray(arrays["action_mask"]),
        logp=jnp.zeros(shape, jnp.float32),
        values=jnp.zeros(shape, jnp.float32),
        turn_mask=jnp.asarray(played),
        signals={},
        success=jnp.asarray(arrays["success"]),
        done=jnp.asarray(last),
        bootstrap_value=jnp.zeros(shape[:1], jnp.float32),
        sampling_mask=sampling_mask,
    )


@functools.partial(jax.jit, static_argnums=(0, 3))
def replay_observations(env: Environment, keys: jax.Array, actions: jax.Array, constrained: bool):
    """`(obs [N, S, O], progress [N, S, K], sampling masks [N, S, L, V] or None)` of the
    tasks `keys` replayed with `actions`: what each turn showed, and with `constrained`
    the constrained sampler's mask of every token."""
    states = replay_states(env, keys, actions)
    observed = jax.vmap(jax.vmap(env.observe))(states)
    masks = _sampling_masks(env, states, actions) if constrained else None
    return observed.tokens, observed.progress, masks


def _sampling_masks(env: Environment, states: Any, actions: jax.Array) -> jax.Array:
    """`[N, S, L, V]` bool: the constrained sampler's mask of every token, as in the rollout
    (`allowed_tokens` of the turn so far, PAD banned)."""
    length = actions.shape[-1]
    pad = env.token_spec.pad

    def turn(state, action):
        def position(i):
            prefix = jnp.where(jnp.arange(length) < i, action, pad)
            return ban_pad(env.allowed_tokens(state, prefix, i), pad)

        return jax.vmap(position)(jnp.arange(length))

    return jax.vmap(jax.vmap(turn))(states, actions)
