"""Shadow mode: a served policy's interactions in an append-only, crash-safe log.

A policy version (a checkpoint) plays episodes and every episode becomes one record of a
log file; training and evaluation read the log by name:

- `rs_sft` fine-tunes on the accepted episodes (rejection sampling -> SFT: minus the
  mean log-likelihood of their policy tokens, teacher-forced, as the warm start's SFT);
- `dpo_records` ranks the logged episodes of each task and writes the best against the
  worst in the preference format (`rlagent.preference.data`), which offline DPO reads;
- `off_policy_estimate` estimates another policy's success from the logged behaviour
  log-probs (per-episode importance sampling, plain and self-normalised, with bootstrap
  intervals and the effective sample size).

The file format (`FORMAT`): one frame per line, `<length> <crc32> <json>\\n`, with the
payload's byte length and CRC-32 as 8 hex digits each. `ShadowLog.append` writes a
batch of frames with one `write` and `fsync`s the file before it returns: a record is
acknowledged once `append` returned, and nothing acknowledged is lost. A kill can leave
a torn tail (a frame cut short, or bytes that fail their checksum after the last good
frame): `read_log` reports it (`LogRead.torn`, and a warning naming the file, line and
bytes) and skips it, never reading it as data; `ShadowLog` cuts it off before appending,
so that a new frame never follows a broken one. A bad frame *followed* by good ones is
no torn tail but damage, and `ShadowLogError` names the file and line.

An episode record (`make_records`): format, id, policy {name, version}, env {name,
config, task_key}, dims (`rlagent.preference.pairs.dims_of`), sampling {temperature,
constrained, window}, played_at / logged_at (UTC ISO times of the batch), success, and
turns [{obs, progress, action (the policy's tokens, END last), logp (the behaviour's
log-prob of each action token), signals {name: value of env.signal_names}}], plus
feedback {name: per-turn values} of the user-feedback signals the env reports
(`USER_FEEDBACK`, e.g. the dialogue user's thumbs and rating).

Checkpoints: `load_checkpoint("RUN_FOLDER[@STEP][#CONDITION/SEED]")` reads the policy
parameters of one run from the Orbax checkpoints the host loop writes (and those
`save_checkpoint` writes) with the resolved config of the folder's provenance.json.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import zlib
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from flax import nnx

from rlagent.envs.base import Environment
from rlagent.envs.base import env_name
from rlagent.host import provenance
from rlagent.host.loop import quiet_closed_loops
from rlagent.models import Policy
from rlagent.models import PolicyConfig
from rlagent.pipeline.warm_start import WarmStartConfig
from rlagent.pipeline.warm_start import given_demonstrations
from rlagent.pipeline.warm_start import make_sft as warm_start_sft
from rlagent.preference import pairs as pairing
from rlagent.preference.data import PreferenceRecord
from rlagent.preference.judges import JUDGES
from rlagent.rollout import RolloutConfig
from rlagent.train.rewards import COMPONENT_SIGNALS
from rlagent.types import Trajectory

FORMAT = "rlagent.shadow/1"
# Signals that come from the user (not from hidden ground truth), logged as feedback.
USER_FEEDBACK = ("feedback", "rating")
_HEADER = 18  # "%08x %08x " before the payload.
_FIELDS = (
    "format",
    "id",
    "policy",
    "env",
    "dims",
    "sampling",
    "played_at",
    "logged_at",
    "success",
    "turns",
    "feedback",
)


class ShadowLogError(ValueError):
    """A damaged or malformed log: `path:line: field: what is wrong`."""


class TornTail(NamedTuple):
    line: int  # first line of the tail (1-based).
    offset: int  # byte offset where it starts (the file's good length).
    size: int  # bytes in it.


class LogRead(NamedTuple):
    records: list[dict[str, Any]]  # the complete records, in the order written.
    torn: TornTail | None  # the torn tail skipped, None when the file ends cleanly.


class ShadowLog:
    """Appends records to a shadow log (see the module docstring); a context manager."""

    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        existed = os.path.exists(path)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        if not existed:  # the new directory entry must survive a crash as well
            _fsync_dir(path)
        torn = _scan(path, _read_bytes(path), validate=False).torn
        if torn is not None:
            logging.warning(
                "%s: cutting off a torn tail of %d bytes at line %d (never acknowledged)",
                path,
                torn.size,
                torn.line,
            )
            os.ftruncate(self._fd, torn.offset)
            os.fsync(self._fd)

    def append(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Validates, writes and fsyncs `records`; returns their number (acknowledged)."""
        frames = []
        for record in records:
            check_record(dict(record), f"{self.path}: record {record.get('id')!r}")
            frames.append(frame(record))
        data = b"".join(frames)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        os.fsync(self._fd)
        return len(frames)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ShadowLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def frame(record: Mapping[str, Any]) -> bytes:
    """One line of the log: `<length> <crc32> <json>\\n` (8 hex digits each)."""
    payload = json.dumps(record, separators=(",", ":"), sort_keys=True).encode()
    return b"%08x %08x " % (len(payload), zlib.crc32(payload)) + payload + b"\n"


def read_log(path: str) -> LogRead:
    """The complete records of a log; a torn tail is reported (warning) and skipped, a
    damaged or malformed frame before the end raises `ShadowLogError` (file:line)."""
    read = _scan(path, _read_bytes(path), validate=True)
    if read.torn is not None:
        logging.warning(
            "%s: skipping a torn tail of %d bytes from line %d (a write cut short; "
            "never acknowledged)",
            path,
            read.torn.size,
            read.torn.line,
        )
    return read


def read_logs(paths: Sequence[str]) -> list[dict[str, Any]]:
    """The records of several logs, in order; ids must be unique across them."""
    records, seen = [], {}
    for path in paths:
        for number, record in enumerate(read_log(path).records, start=1):
            if record["id"] in seen:
                raise ShadowLogError(
                    f"{path}:{number}: id: {record['id']!r} repeats {seen[record['id']]}"
                )
            seen[record["id"]] = f"{path}:{number}"
            records.append(record)
    return records


def check_record(record: Mapping[str, Any], where: str) -> None:
    """Refuses (`ShadowLogError` naming `where` and the field) a malformed record."""

    def fail(field: str, message: str):
        raise ShadowLogError(f"{where}: {field}: {message}")

    if set(record) != set(_FIELDS):
        missing = sorted(set(_FIELDS) - set(record))
        fail(
            missing[0] if missing else sorted(set(record) - set(_FIELDS))[0],
            "missing" if missing else "unknown field",
        )
    if record["format"] != FORMAT:
        fail("format", f"must be {FORMAT!r}, got {record['format']!r}")
    dims = record["dims"]
    if not isinstance(record["success"], bool):
        fail("success", f"must be true or false, got {record['success']!r}")
    turns = record["turns"]
    if not isinstance(turns, list) or not 1 <= len(turns) <= dims["turns"]:
        fail("turns", f"must hold 1..{dims['turns']} turns")
    for index, turn in enumerate(turns):
        at = f"turns[{index}]"
        if set(turn) != {"obs", "progress", "action", "logp", "signals"}:
            fail(at, "must hold obs, progress, action, logp and signals")
        if len(turn["obs"]) != dims["obs_len"] or len(turn["progress"]) != dims["markers"]:
            fail(f"{at}.obs", f"must hold {dims['obs_len']} tokens and {dims['markers']} markers")
        action = turn["action"]
        if not 1 <= len(action) <= dims["turn_len"] or action[-1] != dims["end"]:
            fail(f"{at}.action", f"must be 1..{dims['turn_len']} tokens ending with END")
        if len(turn["logp"]) != len(action):
            fail(f"{at}.logp", f"has {len(turn['logp'])} values for {len(action)} tokens")


# --------------------------------------------------------------------------- serving


def make_records(
    trajectory: Trajectory,
    env_keys: jax.Array,
    env: Environment,
    *,
    policy: Mapping[str, str],
    sampling: Mapping[str, Any],
    id_prefix: str,
    played_at: str,
) -> list[dict[str, Any]]:
    """The records of a batch of played episodes (`[B, S, ...]`, reset keys `[B]`)."""
    traj = jax.device_get(trajectory)
    if jnp.issubdtype(env_keys.dtype, jax.dtypes.prng_key):
        env_keys = jax.random.key_data(env_keys)
    keys = np.asarray(jax.device_get(env_keys)).reshape(-1, 2)
    success = np.asarray(traj.episode_success)
    logged_at = now()
    out = []
    for row in range(keys.shape[0]):
        turns = []
        for s in np.flatnonzero(traj.turn_mask[row]):
            mask = traj.action_mask[row, s]
            turns.append(
                {
                    "obs": traj.obs_tokens[row, s].tolist(),
                    "progress": traj.progress[row, s].tolist(),
                    "action": traj.action_tokens[row, s][mask].tolist(),
                    "logp": [float(x) for x in traj.logp[row, s][mask]],
                    "signals": {k: float(v[row, s]) for k, v in sorted(traj.signals.items())},
                }
            )
        played = np.flatnonzero(traj.turn_mask[row])
        out.append(
            {
                "format": FORMAT,
                "id": f"{id_prefix}/{row}",
                "policy": dict(policy),
                "env": {
                    "name": env_name(env),
                    "config": pairing.env_config_record(env),
                    "task_key": [int(x) for x in keys[row]],
                },
                "dims": pairing.dims_of(env),
                "sampling": dict(sampling),
                "played_at": played_at,
                "logged_at": logged_at,
                "success": bool(success[row]),
                "turns": turns,
                "feedback": {
                    name: [float(traj.signals[name][row, s]) for s in played]
                    for name in USER_FEEDBACK
                    if name in traj.signals
                },
            }
        )
    return out


def now() -> str:
    """The UTC time as an ISO string (the log's timestamps)."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def to_trajectory(records: Sequence[Mapping[str, Any]], env: Environment, *, constrained: bool):
    """`(Trajectory [N, S, ...], env_keys [N, 2] uint32)` of logged episodes.

    Each task is replayed with the logged actions: observations or markers the
    environment does not show are refused naming the record (the log belongs to this
    environment), and with `constrained` each token's sampling mask is rebuilt as the
    constrained sampler drew it, so that `make_score` renormalises over the same set.
    """
    if not records:
        raise ValueError("to_trajectory needs at least one record")
    s, o, k, length = env.max_turns, env.obs_len, env.num_markers, env.turn_len
    n, pad = len(records), env.token_spec.pad
    obs, progress = np.full((n, s, o), pad, np.int32), np.zeros((n, s, k), np.int32)
    actions, mask = np.full((n, s, length), pad, np.int32), np.zeros((n, s, length), bool)
    logp, played = np.zeros((n, s, length), np.float32), np.zeros((n, s), bool)
    signals = {name: np.zeros((n, s), np.float32) for name in env.signal_names}
    keys = np.asarray([r["env"]["task_key"] for r in records], np.uint32)
    for i, record in enumerate(records):
        for t, turn in enumerate(record["turns"]):
            obs[i, t], progress[i, t] = turn["obs"], turn["progress"]
            actions[i, t, : len(turn["action"])] = turn["action"]
            mask[i, t, : len(turn["action"])] = True
            logp[i, t, : len(turn["logp"])] = turn["logp"]
            for name in signals:
                signals[name][i, t] = turn["signals"][name]
        played[i, : len(record["turns"])] = True
    seen_obs, seen_progress, masks = pairing.replay_observations(
        env, jnp.asarray(keys), actions, constrained
    )
    bad = (
        np.any(np.asarray(seen_obs) != obs, -1) | np.any(np.asarray(seen_progress) != progress, -1)
    ) & played
    if bad.any():
        i, t = (int(x) for x in np.argwhere(bad)[0])
        raise ShadowLogError(
            f"record {records[i]['id']!r}: turns[{t}].obs: not what {env_name(env)} shows for "
            f"task {records[i]['env']['task_key']} after the logged actions"
        )
    last = played & ~np.pad(played[:, 1:], ((0, 0), (0, 1)))
    success = last & np.asarray([r["success"] for r in records])[:, None]
    trajectory = Trajectory(
        obs_tokens=jnp.asarray(obs),
        progress=jnp.asarray(progress),
        action_tokens=jnp.asarray(actions),
        action_mask=jnp.asarray(mask),
        logp=jnp.asarray(logp),
        values=jnp.zeros_like(jnp.asarray(logp)),
        turn_mask=jnp.asarray(played),
        signals={k: jnp.asarray(v) for k, v in signals.items()},
        success=jnp.asarray(success),
        done=jnp.asarray(last),
        bootstrap_value=jnp.zeros((n,), jnp.float32),
        sampling_mask=masks,
    )
    return trajectory, keys


# --------------------------------------------------------------------------- training


def judge_scores(records: Sequence[Mapping[str, Any]], judge: str) -> np.ndarray:
    """`[N]` scores of logged episodes by a judge of `rlagent.preference.judges.JUDGES` that
    reads signals alone (`outcome`, `guardrail`): its weighted components summed over the
    turns, each component's signal (`rewards.COMPONENT_SIGNALS`) taken from the records;
    the outcome is the episode's success."""
    weights = JUDGES.get(judge)
    if weights is None or any(COMPONENT_SIGNALS[name] is None for name in weights):
        readable = [n for n, w in JUDGES.items() if all(COMPONENT_SIGNALS[c] for c in w)]
        raise ValueError(f"judge must be one of {readable} on logged episodes, got {judge!r}")
    scores = np.zeros(len(records))
    for name, weight in weights.items():
        if name == "outcome":
            values = [float(r["success"]) for r in records]
        else:
            signal = COMPONENT_SIGNALS[name]
            values = [sum(t["signals"].get(signal, 0.0) for t in r["turns"]) for r in records]
        scores += weight * np.asarray(values, float)
    return scores


def accepted(
    records: Sequence[Mapping[str, Any]], *, judge: str = "outcome", threshold: float = 1.0
):
    """The records whose judge score reaches `threshold` (rejection sampling's accepted)."""
    scores = judge_scores(records, judge)
    return [r for r, score in zip(records, scores, strict=True) if score >= threshold]


def make_sft(
    env: Environment, graphdef: nnx.GraphDef, rollout_config: RolloutConfig, config: WarmStartConfig
) -> Callable[[nnx.State, Trajectory, jax.Array], tuple[nnx.State, jax.Array]]:
    """`sft(params, demonstrations [N, ...], key) -> (params, losses [steps])`: the warm
    start's SFT loop (`warm_start.make_sft`, `config.steps` AdamW steps on minus the mean
    log-likelihood of the policy tokens) on `batch_size` of the given episodes drawn at
    random each step (`warm_start.given_demonstrations`)."""

    def sft(params, demonstrations, key):
        source = given_demonstrations(demonstrations, config.batch_size)
        params, trace = warm_start_sft(config, [env], [source], graphdef, rollout_config)(
            params, key
        )
        return params, trace.loss

    return sft


def dpo_records(
    records: Sequence[Mapping[str, Any]], env: Environment, *, judge: str, key: jax.Array
) -> list[PreferenceRecord]:
    """Preference records (`rlagent.preference.data`) of logged episodes: per task (its
    reset key), the best against the worst by `judge` (`judge_scores`; ties broken at
    random, a task whose episodes all score alike states no preference and is left out).
    Tasks need the same number of logged episodes (shadow mode plays K per task)."""
    groups: dict[tuple[int, int], list[int]] = {}
    for index, record in enumerate(records):
        groups.setdefault(tuple(record["env"]["task_key"]), []).append(index)
    sizes = {len(rows) for rows in groups.values()}
    if len(sizes) != 1 or sizes == {1}:
        raise ValueError(
            f"dpo_records needs K >= 2 episodes of every task, got sizes {sorted(sizes)}"
        )
    order = [i for rows in groups.values() for i in rows]
    ordered = [records[i] for i in order]
    trajectory, keys = to_trajectory(ordered, env, constrained=False)
    scores = judge_scores(ordered, judge)
    size = sizes.pop()
    chosen, rejected, weight = pairing.group_pairs(jnp.asarray(scores.reshape(-1, size)), key)
    base = np.arange(len(groups)) * size
    policies = {json.dumps(r["policy"], sort_keys=True) for r in ordered}
    if len(policies) != 1:
        raise ValueError(
            f"dpo_records reads the logs of one policy version, got {sorted(policies)}"
        )
    return pairing.trajectory_records(
        trajectory,
        keys,
        (base + np.asarray(chosen), base + np.asarray(rejected), weight),
        scores,
        env=env,
        meta={"id": f"shadow/{judge}", "policy": ordered[0]["policy"], "judge": judge},
    )


def off_policy_estimate(
    log_ratios: Sequence[float],
    returns: Sequence[float],
    *,
    reps: int = 5000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """Per-episode importance sampling of a target policy's mean return from logs.

    `log_ratios[i] = log pi_target(episode i) - log pi_behaviour(episode i)` (sums over
    the policy tokens), `returns[i]` its return (e.g. success 0/1). `is`: the unbiased
    mean of w_i R_i, w = exp(log ratio); `wis`: the self-normalised sum w R / sum w
    (biased, bounded by the returns' range, lower variance; Precup et al. 2000). Each
    with a percentile bootstrap CI over episodes; `ess` = (sum w)^2 / sum w^2, the
    episodes' worth of information the weights leave (Kong 1992), and the largest
    weight's share of sum w.
    """
    log_w, r = np.asarray(log_ratios, np.float64), np.asarray(returns, np.float64)
    if log_w.ndim != 1 or log_w.shape != r.shape or not log_w.size:
        raise ValueError(f"log_ratios and returns must be one length, got {log_w.shape}, {r.shape}")
    w = np.exp(log_w - log_w.max())  # the scale cancels in wis and ess; restored for is
    scale = np.exp(log_w.max())
    rng = np.random.default_rng(seed)
    index = rng.integers(0, r.size, size=(reps, r.size))
    boot_is = (w[index] * r[index]).mean(1) * scale
    boot_wis = (w[index] * r[index]).sum(1) / w[index].sum(1)
    tail = 100 * (1 - confidence) / 2

    def interval(value, boot):
        low, high = np.percentile(boot, [tail, 100 - tail])
        return {"value": float(value), "low": float(low), "high": float(high)}

    return {
        "is": interval(np.mean(w * r) * scale, boot_is),
        "wis": interval(np.sum(w * r) / np.sum(w), boot_wis),
        "ess": float(np.sum(w) ** 2 / np.sum(w**2)),
        "max_weight_share": float(w.max() / w.sum()),
        "episodes": int(r.size),
    }


def episode_log_ratios(score: Callable, params: nnx.State, trajectory: Trajectory) -> np.ndarray:
    """`[N]` log pi_params(episode) - log pi_behaviour(episode) over the policy tokens
    (`score = make_score(...)` with the serving temperature and masks)."""
    logp = score(params, trajectory)[0]
    mask = trajectory.loss_mask
    return np.asarray(jnp.sum(jnp.where(mask, logp - trajectory.logp, 0.0), axis=(1, 2)))


# --------------------------------------------------------------------------- checkpoints


class Checkpoint(NamedTuple):
    params: nnx.State  # the policy's parameters (one run).
    config: dict[str, Any]  # the run folder's resolved config (provenance.json).
    version: str  # `<folder>@<step>#<condition>/<seed>:<params sha256[:12]>`.
    step: int


def load_checkpoint(spec: str) -> Checkpoint:
    """The policy of `RUN_FOLDER[@STEP][#CONDITION/SEED]`: a folder with `checkpoints/`
    and `provenance.json` (the host loop's run folder, or `save_checkpoint`'s); STEP
    defaults to the newest (`@0`: the loop's start, before RL), the run to the only one
    (several are refused by name). A folder it cannot read (a damaged provenance.json or
    checkpoint, a STEP that is no number) is refused in one line naming `spec`."""
    step_text = spec.partition("#")[0].partition("@")[2]
    if step_text and not step_text.isdigit():
        raise ValueError(
            f"{spec}: the checkpoint step {step_text!r} is not a whole number >= 0 "
            "(RUN_FOLDER@STEP)"
        )
    try:
        with quiet_closed_loops():  # a damaged checkpoint: no 'Event loop is closed' noise
            return _load_checkpoint(spec)
    except Exception as error:  # noqa: BLE001 - any failure to read means a damaged folder.
        message = str(error).splitlines()[0] if str(error) else ""
        if isinstance(error, ValueError) and message.startswith(spec):
            raise ValueError(message) from None  # our own, naming the spec
        raise ValueError(
            f"{spec}: cannot read the checkpoint ({type(error).__name__}: {message[:200]})"
        ) from None


def checkpoint_step(spec: str, folder: str, step_text: str) -> int:
    """The checkpoint step `step_text` names in `folder`'s checkpoints ('' = the newest),
    refused (ValueError naming `spec`) when the folder holds none or not that one."""
    directory = os.path.abspath(os.path.join(folder, "checkpoints"))
    steps = []
    if os.path.isdir(directory):
        with ocp.CheckpointManager(directory) as manager:
            steps = sorted(manager.all_steps())
    if not steps:
        raise ValueError(f"{spec}: {folder}/checkpoints holds no checkpoint")
    step = int(step_text) if step_text else steps[-1]
    if step not in steps:
        raise ValueError(f"{spec}: no checkpoint step {step} in {folder}; it holds {steps}")
    return step


def _check_policy_run(spec: str, folder: str, config: Mapping[str, Any]) -> None:
    """Refuses, in one line naming the folder and what to pass, a folder that is no run of
    the token policy: a text run of `experiments.hf_agent` (an HF model's checkpoints) or
    a study's top folder (its runs are its subfolders)."""
    if "algorithm" in config and "sampling" in config:
        raise ValueError(
            f"{spec}: {folder} is a text run of experiments.hf_agent; ab_test and shadow read "
            "run folders of the token policy (loop.run's: one with checkpoints/ and seeds); "
            f"export the text policy with `python -m experiments.export_hf {folder}`"
        )
    if not isinstance(config.get("seeds"), list) or "model" not in config:
        subfolders = sorted(
            name for name in os.listdir(folder)
            if os.path.isfile(os.path.join(folder, name, provenance.FILENAME))
        )  # fmt: skip
        listed = f": one of {subfolders}" if subfolders else ""
        raise ValueError(
            f"{spec}: {folder} is a study's folder, not a run folder; pass one of its run "
            f"folders (with checkpoints/){listed}"
        )


def _load_checkpoint(spec: str) -> Checkpoint:
    folder, _, run = spec.partition("#")
    folder, _, step_text = folder.partition("@")
    stored = provenance.read(folder)
    if stored is None:
        raise ValueError(f"{spec}: {folder} has no {provenance.FILENAME}; not a run folder")
    config = stored["config"]
    _check_policy_run(spec, folder, config)
    runs = [f"{c}/{s}" for c in config.get("conditions", ["policy"]) for s in config["seeds"]]
    if not run and len(runs) > 1:
        raise ValueError(f"{spec}: the folder holds runs {runs}; name one as {folder}#<run>")
    if run and run not in runs:
        raise ValueError(f"{spec}: no run {run!r} in {folder}; it holds {runs}")
    run = run or runs[0]
    step = checkpoint_step(spec, folder, step_text)
    with ocp.CheckpointManager(os.path.abspath(os.path.join(folder, "checkpoints"))) as manager:
        tree = manager.restore(step, args=ocp.args.StandardRestore())
    abstract = nnx.eval_shape(lambda: Policy(PolicyConfig(**config["model"]), rngs=nnx.Rngs(0)))
    params = nnx.state(abstract, nnx.Param)
    row = runs.index(run)
    pure = jax.tree.map(lambda x: jnp.asarray(np.asarray(x)[row]), strip_value(tree["params"]))
    nnx.replace_by_pure_dict(params, pure)
    return Checkpoint(
        params, config, f"{os.path.normpath(folder)}@{step}#{run}:{params_hash(params)}", step
    )


def save_checkpoint(
    folder: str, params: nnx.State, config: Mapping[str, Any], *, step: int
) -> None:
    """Writes `params` as run folder `folder` (`load_checkpoint` reads it): an Orbax
    checkpoint `{"params": [1, ...]}` at `step` and provenance.json with `config` (the
    resolved env, model, rollout sections of the policy, seeds [0], conditions)."""
    os.makedirs(folder, exist_ok=True)
    record = provenance.collect({**config, "seeds": [0], "conditions": ["policy"]})
    provenance.write(folder, record)
    stacked = {"params": jax.tree.map(lambda x: np.asarray(x)[None], nnx.to_pure_dict(params))}
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False)
    with ocp.CheckpointManager(
        os.path.abspath(os.path.join(folder, "checkpoints")), options=options
    ) as manager:
        manager.save(step, args=ocp.args.StandardSave(stacked))


def params_hash(params: nnx.State) -> str:
    """The first 12 hex digits of a sha256 over the parameters' bytes (a version id)."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(nnx.to_pure_dict(params)):
        digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return digest.hexdigest()[:12]


# --------------------------------------------------------------------------- helpers


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _scan(path: str, data: bytes, *, validate: bool) -> LogRead:
    """Frames of `data`: the records up to the last good frame and the torn tail after it;
    a bad frame followed by a good one raises `ShadowLogError`."""
    records, offset, line, bad = [], 0, 1, None
    while offset < len(data):
        end = data.find(b"\n", offset)
        stop = len(data) if end < 0 else end + 1
        payload = _payload(data[offset:stop])
        if payload is None:
            bad = bad or (line, offset)
        elif bad is not None:
            raise ShadowLogError(
                f"{path}:{bad[0]}: frame: length or checksum does not match, and good frames "
                f"follow (line {line}): the file is damaged, not cut short"
            )
        else:
            record = json.loads(payload)
            if validate:
                check_record(record, f"{path}:{line}")
            records.append(record)
        offset, line = stop, line + 1
    torn = None if bad is None else TornTail(bad[0], bad[1], len(data) - bad[1])
    return LogRead(records, torn)


def _payload(line: bytes) -> bytes | None:
    """The payload of one complete, intact frame, else None."""
    if (
        len(line) < _HEADER + 1
        or not line.endswith(b"\n")
        or line[8:9] != b" "
        or line[17:18] != b" "
    ):
        return None
    try:
        length, crc = int(line[:8], 16), int(line[9:17], 16)
    except ValueError:
        return None
    payload = line[_HEADER:-1]
    if len(payload) != length or zlib.crc32(payload) != crc:
        return None
    return payload


def strip_value(tree: Any) -> Any:
    """A restored nnx.State as a pure dict: Orbax stores each variable as `{"value": x}`."""
    if isinstance(tree, Mapping):
        if set(tree) == {"value"} and not isinstance(tree["value"], Mapping):
            return tree["value"]
        return {key: strip_value(value) for key, value in tree.items()}
    return tree


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
