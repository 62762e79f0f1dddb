"""Preference learning (rlagent.preference): the JSONL format and its loader, pairs, the
DPO loss against NumPy, and seeded smoke runs of the offline and online trainers on a
tiny ToolWorld level 1."""

import copy
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlagent import rollout as rollout_lib
from rlagent.credit import mc
from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.toolworld import level_config
from rlagent.preference import data
from rlagent.preference import dpo
from rlagent.preference import judges
from rlagent.preference import online
from rlagent.preference import pairs
from rlagent.rollout import RolloutConfig
from rlagent.train import rewards
from rlagent.train.config import TrainConfig
from rlagent.train.extras import PRMInputs
from rlagent.types import Trajectory

ENV = ToolWorld(level_config(1, max_turns=3))
# Full context and no summary: the smallest program to compile (the tests' budget), and
# forks then carry KV caches, the layout `forks_from_carries` moves.
ROLLOUT = RolloutConfig(window=None, constrained=True)
GROUPS, SIZE = 16, 4


# --------------------------------------------------------------------------- the format


def _record(**changes):
    dims = pairs.dims_of(ENV)
    obs, progress = [2] * dims["obs_len"], [0] * dims["markers"]
    value = {
        "format": data.FORMAT, "id": "r0",
        "env": {"name": "ToolWorld", "config": {}, "task_key": [0, 1]},
        "dims": dims, "policy": {"name": "p", "version": "v"},
        "judge": {"name": "outcome", "chosen_score": 1.0, "rejected_score": 0.0},
        "prefix": [{"obs": obs, "progress": progress, "action": [5, 1]}],
        "chosen": {"turns": [{"obs": obs, "progress": progress, "action": [6, 1]}],
                   "success": True},
        "rejected": {"turns": [{"obs": obs, "progress": progress, "action": [7, 1]}],
                     "success": False},
    }  # fmt: skip
    for path, new in changes.items():
        node = value
        *parents, last = path.split("/")
        for name in parents:
            node = node[int(name)] if isinstance(node, list) else node[name]
        if new is _DELETE:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = new
        else:
            node[last] = new
    return value


_DELETE = object()


def _write_lines(path, values):
    path.write_text("".join(json.dumps(v) + "\n" for v in values))
    return str(path)


def test_records_round_trip(tmp_path):
    record = data.parse_record(_record())
    path = str(tmp_path / "pairs.jsonl")
    other = data.PreferenceRecord(**{**record.__dict__, "id": "r1"})
    assert data.write_records(path, [record, other]) == 2
    loaded = data.load_records(path)
    assert [r.id for r in loaded] == ["r0", "r1"]
    assert loaded[1].source == (path, 2)
    assert data.record_to_json(loaded[0]) == data.record_to_json(record)
    data.write_records(path, loaded[:1], append=True)  # a repeated id is then refused
    with pytest.raises(data.PreferenceDataError, match=r"pairs.jsonl:3: id: 'r0' repeats line 1"):
        data.load_records(path)


@pytest.mark.parametrize(
    "changes,field",
    [
        ({"format": "other/1"}, "format"),
        ({"judge/rejected_score": _DELETE}, "judge.rejected_score: missing"),
        ({"judge/extra": 1}, "judge.extra: unknown field"),
        ({"judge/rejected_score": 1.0}, "judge: chosen_score"),  # a tie is no preference
        ({"chosen/turns/0/action": [6, 7]}, r"chosen.turns\[0\].action: must end with END"),
        ({"chosen/turns/0/action": [6, 0, 1]}, r"chosen.turns\[0\].action: holds PAD"),
        ({"chosen/turns/0/action": [1, 1]}, r"chosen.turns\[0\].action: END = 1 before"),
        ({"rejected/turns/0/action": []}, r"rejected.turns\[0\].action: has 0 tokens"),
        ({"prefix/0/obs": [2]}, r"prefix\[0\].obs: has 1 tokens"),
        ({"prefix/0/obs/0": 999}, r"prefix\[0\].obs\[0\]: 999 is outside"),
        ({"rejected/turns": []}, "rejected.turns: must be a list of at least 1"),
        ({"chosen/success": 1}, "chosen.success: must be true or false"),
        ({"env/task_key": [1]}, "env.task_key: must hold 2"),
        ({"dims/turns": 1}, "chosen.turns: prefix \\+ turns = 2 turns"),
    ],
)
def test_malformed_record_names_file_line_and_field(tmp_path, changes, field):
    path = _write_lines(tmp_path / "bad.jsonl", [_record(id="ok"), _record(**changes)])
    with pytest.raises(data.PreferenceDataError, match=f"bad.jsonl:2: {field}"):
        data.load_records(path)


def test_blank_and_broken_lines_are_errors(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(_record()) + "\n\n")
    with pytest.raises(data.PreferenceDataError, match="x.jsonl:2: blank line"):
        data.load_records(str(path))
    path.write_text(json.dumps(_record())[:-5] + "\n")
    with pytest.raises(data.PreferenceDataError, match="x.jsonl:1: not JSON"):
        data.load_records(str(path))


# --------------------------------------------------------------------------- pairs


def _toy(actions, played):
    """A Trajectory [N, S=3, L=2] of given action tokens and played turns."""
    actions = jnp.asarray(actions, jnp.int32)
    n, s, length = actions.shape
    zeros = jnp.zeros((n, s, length), jnp.float32)
    return Trajectory(
        obs_tokens=jnp.zeros((n, s, 2), jnp.int32), progress=jnp.zeros((n, s, 1), jnp.int32),
        action_tokens=actions, action_mask=actions > 0, logp=zeros, values=zeros,
        turn_mask=jnp.asarray(played, bool), signals={}, success=jnp.zeros((n, s), bool),
        done=jnp.zeros((n, s), bool), bootstrap_value=jnp.zeros((n,), jnp.float32),
    )  # fmt: skip


def test_first_difference_and_segments():
    a = _toy([[[3, 1], [4, 1], [5, 1]], [[3, 1], [4, 1], [5, 1]]], [[1, 1, 1], [1, 1, 1]])
    b = _toy([[[3, 1], [6, 1], [5, 1]], [[3, 1], [4, 1], [5, 1]]], [[1, 1, 1], [1, 1, 0]])
    np.testing.assert_array_equal(pairs.first_difference(a, b), [1, 2])
    chosen, rejected = pairs.scored_turns(a, b, level="segment", segment_turns=1)
    np.testing.assert_array_equal(chosen, [[0, 1, 0], [0, 0, 1]])
    np.testing.assert_array_equal(rejected, [[0, 1, 0], [0, 0, 0]])
    chosen, _ = pairs.scored_turns(a, b, level="trajectory")
    np.testing.assert_array_equal(chosen, a.turn_mask)


def test_group_pairs_best_worst_ties_and_flips():
    scores = jnp.asarray([[0.0, 2.0, 1.0], [1.0, 1.0, 1.0], [3.0, 0.0, 3.0]])
    chosen, rejected, weight = pairs.group_pairs(scores, jax.random.key(0))
    np.testing.assert_array_equal(weight, [1, 0, 1])
    assert (int(chosen[0]), int(rejected[0])) == (1, 0)
    assert int(chosen[2]) in (0, 2) and int(rejected[2]) == 1
    flipped, unflipped, _ = pairs.group_pairs(scores, jax.random.key(0), accuracy=0.0)
    np.testing.assert_array_equal(flipped, rejected)
    np.testing.assert_array_equal(unflipped, chosen)
    many = jnp.tile(jnp.asarray([[0.0, 1.0]]), (4000, 1))
    kept = pairs.group_pairs(many, jax.random.key(1), accuracy=0.7)[0] == 1
    assert abs(float(kept.mean()) - 0.7) < 0.03


def test_splice_puts_the_continuation_after_the_prefix():
    prefix = _toy([[[3, 1], [4, 1], [5, 1]]] * 2, [[1, 1, 1]] * 2)
    branch = _toy([[[7, 1], [8, 1], [9, 1]]] * 2, [[1, 1, 0]] * 2)
    out = rollout_lib.splice(prefix, branch, jnp.asarray([0, 1]))
    np.testing.assert_array_equal(out.action_tokens[:, :, 0], [[7, 8, 9], [3, 7, 8]])
    np.testing.assert_array_equal(out.turn_mask, [[1, 1, 0], [1, 1, 1]])


# --------------------------------------------------------------------------- the loss


def _numpy_dpo(h, kind, beta, eps):
    log_sigmoid = lambda x: -np.logaddexp(0.0, -x)  # noqa: E731
    if kind == "sigmoid":
        return -(1 - eps) * log_sigmoid(beta * h) - eps * log_sigmoid(-beta * h)
    if kind == "ipo":
        return (h - 1 / (2 * beta)) ** 2
    return np.maximum(0.0, 1 - beta * h)


@pytest.mark.parametrize("kind", ["sigmoid", "ipo", "hinge"])
@pytest.mark.parametrize("length_norm", ["none", "tokens"])
def test_preference_loss_matches_numpy(kind, length_norm):
    """Two pairs; log-probs are a parameter table indexed by token, so the hand case is
    exact: the loss counts policy tokens of scored turns only (not PAD slots, not the
    unplayed or unscored turns), with the reference's values subtracted."""
    chosen = _toy([[[3, 1], [4, 1], [5, 1]], [[6, 1], [0, 0], [0, 0]]], [[1, 1, 0], [1, 0, 0]])
    rejected = _toy([[[3, 1], [7, 1], [0, 0]], [[8, 8], [0, 0], [0, 0]]], [[1, 1, 0], [1, 0, 0]])
    scored_c, scored_r = pairs.scored_turns(chosen, rejected, level="segment")
    batch = pairs.PairBatch(chosen, rejected, scored_c, scored_r, jnp.asarray([1.0, 1.0]))
    table = -jnp.linspace(0.1, 2.0, 10)
    score = lambda params, traj: (params[traj.action_tokens],)  # noqa: E731
    ref = dpo.pair_logps(score, table * 0.5, batch, length_norm)
    config = dpo.DPOConfig(kind=kind, beta=0.7, label_smoothing=0.1 if kind == "sigmoid" else 0.0,
                           length_norm=length_norm)  # fmt: skip
    loss, metrics = dpo.preference_loss(table, batch, ref, score=score, config=config)

    t, r = np.asarray(table), np.asarray(table) * 0.5
    tokens = {"c": [[4, 1], [6, 1]], "r": [[7, 1], [8, 8]]}  # scored from the first difference
    norm = (lambda x: np.mean(x)) if length_norm == "tokens" else np.sum  # noqa: E731
    h = np.asarray([
        norm(t[tokens["c"][n]]) - norm(t[tokens["r"][n]])
        - (norm(r[tokens["c"][n]]) - norm(r[tokens["r"][n]]))
        for n in range(2)
    ])  # fmt: skip
    expected = _numpy_dpo(h, kind, 0.7, config.label_smoothing)
    np.testing.assert_allclose(loss, expected.mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["pref_accuracy"], np.mean(0.7 * h > 0))
    grads = jax.grad(lambda p: dpo.preference_loss(p, batch, ref, score=score, config=config)[0])(
        table
    )
    assert float(grads[5]) == 0.0 and float(grads[3]) == 0.0  # unscored turns get nothing
    assert float(grads[0]) == 0.0  # PAD slots get nothing


def test_config_is_validated():
    with pytest.raises(ValueError, match="DPOConfig.kind"):
        dpo.DPOConfig(kind="orpo")
    with pytest.raises(ValueError, match="DPOConfig.group_size"):
        dpo.DPOConfig(group_size=1)
    with pytest.raises(ValueError, match=r"DPOConfig.sft_steps must be in \[0, num_updates=3\]"):
        dpo.DPOConfig(sft_steps=4, num_updates=3)
    with pytest.raises(ValueError, match="Unknown DPOConfig fields"):
        dpo.DPOConfig.from_mapping({"betta": 0.1})
    with pytest.raises(ValueError, match="Unknown judge"):
        judges.judge_weights(TrainConfig(), "oracle")


def test_judges_score_the_return_of_their_weights():
    """Outcome: 1 for the solved episode; guardrail: minus one per violating turn; a
    reward form subtracts its violation penalty; the weights are data (one judge)."""
    traj = _toy([[[3, 1], [4, 1], [5, 1]]] * 3, [[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    outcome = jnp.asarray([[0, 0, 1], [0, 0, 0], [0, 0, 0]], jnp.float32)
    violations = jnp.asarray([[0, 2, 0], [1, 1, 0], [0, 0, 0]], jnp.float32)
    traj = traj._replace(signals={"outcome": outcome, "violations": violations})
    config = TrainConfig(violation_penalty=0.5)
    judge = judges.make_judge(config)
    inputs = PRMInputs(None, None, traj, None)
    cases = {
        "outcome": (judges.judge_weights(config, "outcome"), [1, 0, 0]),
        "guardrail": (judges.judge_weights(config, "guardrail"), [0, -2, 0]),
        "outcome form": (rewards.reward_weights(config, "outcome"), [0.5, -1, 0]),
    }
    for name, (weights, values) in cases.items():
        scores, state, metrics = jax.jit(judge.judge)((), inputs, weights, jax.random.key(0))
        np.testing.assert_allclose(scores, values, err_msg=name)
        assert state == () and float(metrics["label_turns"]) == 0.0


# --------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def logged(tiny_policy_config, tmp_path_factory):
    """Behaviour-policy logs (uniform over the grammar) ranked by the process judge (the
    verdict's return: random play varies in it where it rarely succeeds), written to
    JSONL and loaded back."""
    policy = mc.uniform_random(ENV)
    env_key, policy_key = jax.random.split(jax.random.key(0))
    env_keys = jnp.repeat(jax.random.split(env_key, GROUPS), SIZE, axis=0)
    episodes = jax.jit(lambda e, p: mc.rollout_env_policy(ENV, policy, e, p))(
        env_keys, jax.random.split(policy_key, GROUPS * SIZE)
    )
    traj = mc.env_trajectory(ENV, episodes)
    config = TrainConfig()
    judge = judges.make_judge(config)
    inputs = PRMInputs(None, None, traj, None)
    scores, _, _ = judge.judge((), inputs, judges.judge_weights(config, "process"), None)
    chosen, rejected, weight = pairs.group_pairs(scores.reshape(GROUPS, SIZE), jax.random.key(1))
    rows = jnp.arange(GROUPS) * SIZE
    meta = {"id": "logs", "policy": {"name": "random", "version": "env"}, "judge": "process"}
    records = pairs.trajectory_records(
        traj, env_keys, (rows + chosen, rows + rejected, weight), scores, env=ENV, meta=meta
    )
    path = str(tmp_path_factory.mktemp("logs") / "pairs.jsonl")
    data.write_records(path, records)
    policy_config = tiny_policy_config(num_summary_slots=0)
    return dict(path=path, records=data.load_records(path), policy_config=policy_config)


def test_records_replay_in_the_environment(logged):
    records = logged["records"]
    assert len(records) >= 6  # enough pairs from 16 tasks for the smoke run below
    batch = pairs.records_to_pairs(records, ENV, constrained=True, level="trajectory", pad_to=32)
    assert batch.chosen.sampling_mask.shape[-1] == ENV.token_spec.vocab_size
    # every policy token is one the constrained sampler allowed at its position
    tokens = batch.chosen.action_tokens[..., None] == jnp.arange(ENV.token_spec.vocab_size)
    allowed = jnp.any(tokens & batch.chosen.sampling_mask, axis=-1)
    assert bool(jnp.all(allowed | ~batch.chosen.loss_mask))
    broken = copy.deepcopy(data.record_to_json(records[1]))
    broken["chosen"]["turns"][0]["obs"][0] = (broken["chosen"]["turns"][0]["obs"][0] + 1) % 60
    bad = [records[0], data.parse_record(broken, ("edited.jsonl", 7))]
    with pytest.raises(data.PreferenceDataError, match=r"edited.jsonl:7: chosen.turns\[0\].obs"):
        pairs.records_to_pairs(bad, ENV, constrained=True, level="trajectory", pad_to=32)
    other = ToolWorld(level_config(1, max_turns=4))
    with pytest.raises(data.PreferenceDataError, match="dims.turns: 3, but ToolWorld has 4"):
        pairs.records_to_pairs(records, other, constrained=True, level="trajectory")


def test_offline_dpo_learns_the_logged_preferences(logged):
    """Seeded smoke run: 40 steps of sigmoid DPO on the logged pairs rank >= 90% of them
    by the implicit reward (50% at the start: the policy is its own reference)."""
    records = logged["records"]
    batch = pairs.records_to_pairs(records, ENV, constrained=True, level="segment", pad_to=32)
    config = dpo.DPOConfig(beta=0.5, learning_rate=3e-3, pairs_per_step=16)
    trainer = dpo.make_offline_dpo(config, ENV, logged["policy_config"], ROLLOUT)
    state = trainer.init(jax.random.key(0), len(records))

    @jax.jit
    def train(state):
        return trainer.updates(state, batch, trainer.reference(state, batch), 40)

    state, metrics = train(state)
    assert float(metrics["dpo_loss"][0]) == pytest.approx(np.log(2.0), abs=1e-4)
    assert float(metrics["pref_accuracy"][-5:].mean()) >= 0.9
    assert float(metrics["nonfinite_loss"].sum()) == 0.0


def test_an_open_segment_is_the_trajectory_loss(logged):
    """Pairs that share their first turn: the shared turns' log-probs are the same on both
    sides (the policy's context is causal) and cancel in the DPO margin, so the segment
    level without `segment_turns` is the trajectory level (loss and gradient); a bounded
    segment (SDPO's) is not."""
    records = logged["records"]
    batch = pairs.records_to_pairs(records, ENV, constrained=True, level="trajectory")
    rejected = rollout_lib.splice(batch.chosen, batch.rejected, jnp.ones(len(records), jnp.int32))
    first = pairs.first_difference(batch.chosen, rejected)
    assert bool(jnp.all(first >= 1)) and bool(jnp.any(first < rejected.turn_mask.shape[1]))
    config = dpo.DPOConfig(beta=0.5)
    trainer = dpo.make_offline_dpo(config, ENV, logged["policy_config"], ROLLOUT)
    start = trainer.init(jax.random.key(0), len(records))
    noise = jax.random.split(jax.random.key(1), len(jax.tree.leaves(start.params)))
    moved = jax.tree.map(lambda x, k: x + 0.1 * jax.random.normal(k, x.shape, x.dtype),
                         start.params, jax.tree.unflatten(jax.tree.structure(start.params),
                                                          list(noise)))  # fmt: skip
    score = rollout_lib.make_score(ENV, trainer.graphdef, ROLLOUT)

    @jax.jit
    def value_and_grad(scored):  # one program for the three levels (equal shapes)
        pair = pairs.PairBatch(batch.chosen, rejected, *scored, batch.weight)
        ref = dpo.pair_logps(score, start.params, pair, "none")
        loss = lambda p: dpo.preference_loss(p, pair, ref, score=score, config=config)[0]  # noqa: E731
        return jax.value_and_grad(loss)(moved)

    def loss_and_grad(level, segment_turns=0):
        return value_and_grad(pairs.scored_turns(batch.chosen, rejected, level=level,
                                                 segment_turns=segment_turns))  # fmt: skip

    trajectory, segment = loss_and_grad("trajectory"), loss_and_grad("segment")
    bounded = loss_and_grad("segment", segment_turns=1)
    assert abs(float(trajectory[0]) - np.log(2.0)) > 1e-3  # the policy moved off the reference
    np.testing.assert_allclose(segment[0], trajectory[0], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(segment[1]), jax.tree.leaves(trajectory[1]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert abs(float(bounded[0]) - float(trajectory[0])) > 1e-4


def test_sft_then_dpo_against_the_policy_sft_left(logged):
    """`sft_steps`: the first steps minimise the chosen sides' mean NLL (checked by hand on
    the first drawn batch), DPO then starts at log 2 against the policy they left (the
    reference, kept to the end), the chunked run equals the whole one, and online DPO
    refuses the schedule."""
    records = logged["records"]
    batch = pairs.records_to_pairs(records, ENV, constrained=True, level="trajectory", pad_to=32)
    config = dpo.DPOConfig(beta=0.5, learning_rate=3e-3, pairs_per_step=8, num_updates=12,
                           sft_steps=6, level="trajectory")  # fmt: skip
    trainer = dpo.make_offline_dpo(config, ENV, logged["policy_config"], ROLLOUT)
    start = trainer.init(jax.random.key(0), len(records))
    train = jax.jit(trainer.updates, static_argnums=3)
    ref = trainer.reference(start, batch)
    half, first = train(start, batch, ref, 6)
    end, second = train(half, batch, ref, 6)
    whole, metrics = train(start, batch, ref, 12)
    sft, dpo_loss = np.asarray(metrics["sft_nll"]), np.asarray(metrics["dpo_loss"])
    assert np.all(np.isfinite(sft[:6])) and np.all(np.isnan(sft[6:]))
    assert np.all(np.isnan(dpo_loss[:6])) and np.all(np.isfinite(dpo_loss[6:]))
    assert sft[5] < sft[0]  # cloning the chosen sides raises their likelihood
    assert dpo_loss[6] == pytest.approx(np.log(2.0), abs=1e-4)  # policy == reference
    np.testing.assert_allclose(np.concatenate([first["sft_nll"], second["sft_nll"]]), sft)
    leaves = jax.tree.leaves
    for ref_leaf, sft_leaf in zip(leaves(end.ref_params), leaves(half.params), strict=True):
        np.testing.assert_array_equal(ref_leaf, sft_leaf)
    assert any(not np.array_equal(a, b) for a, b in
               zip(leaves(half.params), leaves(start.params), strict=True))  # fmt: skip
    # The first step's NLL by hand: the same draw, the start's token log-probs.
    index = jax.random.randint(jax.random.split(start.key)[1], (8,), 0, len(records))
    drawn = jax.tree.map(lambda x: x[index], batch)
    logp = rollout_lib.make_score(ENV, trainer.graphdef, ROLLOUT)(start.params, drawn.chosen)[0]
    mask = np.asarray(drawn.chosen.loss_mask) * np.asarray(drawn.weight)[:, None, None]
    assert sft[0] == pytest.approx(-np.sum(np.asarray(logp) * mask) / mask.sum(), rel=1e-5)
    judge = judges.make_judge(TrainConfig())
    with pytest.raises(ValueError, match="DPOConfig.sft_steps=6"):
        online.make_online_dpo(config, ENV, logged["policy_config"], ROLLOUT, judge=judge)


def test_online_fork_pairs(logged):
    """Fork mode: K continuations of one carry share the played turns before the fork,
    every pair differs from the fork turn on, and all turns played are counted."""
    config = dpo.DPOConfig(num_groups=4, group_size=3, pairs="fork", level="segment")
    judge = judges.make_judge(TrainConfig())
    trainer = online.make_online_dpo(config, ENV, logged["policy_config"], ROLLOUT, judge=judge)
    state = trainer.init(jax.random.key(0), judges.judge_weights(TrainConfig(), "process"), 1.0)
    sample = online._sampler(config, ENV, trainer.graphdef, ROLLOUT, False)
    found = jax.jit(sample)(state.params, jax.random.key(3))
    spliced, played = jax.device_get((found.trajectory, found.played))
    start = np.asarray(found.prefix_turns)
    assert spliced.turn_mask.shape == (12, ENV.max_turns)
    for row in range(12):
        group, fork = row // 3, int(start[row])
        assert fork < played.turn_mask[group].sum()  # a played turn
        np.testing.assert_array_equal(  # the played turns before the fork are kept ...
            spliced.action_tokens[row, :fork], played.action_tokens[group, :fork]
        )
        np.testing.assert_array_equal(  # ... and the fork resumes from the same state
            spliced.obs_tokens[row, : fork + 1], played.obs_tokens[group, : fork + 1]
        )
    assert float(found.turns) == played.turn_mask.sum() + float(
        np.sum(spliced.turn_mask) - sum(start)
    )


@pytest.mark.parametrize("mode", ["trajectory", "fork"])
def test_online_pairs_are_logged_as_records_that_replay(logged, tmp_path, mode):
    """`logged_updates` trains exactly as `updates` and returns each iteration's pairs;
    `pairs.log_records` turns them into records that validate, load back and replay in
    the environment; a noisy judge's flipped pairs are recorded as it stated them. The
    `updates` reference runs in trajectory mode only: both scan the one `logged`
    iteration, `updates` dropping its PairLog, whatever the pairs mode (online.py)."""
    level = "segment" if mode == "fork" else "trajectory"
    config = dpo.DPOConfig(num_groups=4, group_size=3, pairs=mode, level=level, num_updates=2)
    judge = judges.make_judge(TrainConfig())
    trainer = online.make_online_dpo(config, ENV, logged["policy_config"], ROLLOUT, judge=judge)
    weights = judges.judge_weights(TrainConfig(), "process")
    state = trainer.init(jax.random.key(0), weights, 0.5)  # a noisy judge: flips happen
    new_state, (metrics, logs) = jax.jit(lambda s: trainer.logged_updates(s, 2))(state)
    if mode == "trajectory":
        plain_state, plain = jax.jit(lambda s: trainer.updates(s, 2))(state)
        for name in plain:  # the same program but for its outputs: XLA may fuse otherwise
            np.testing.assert_allclose(metrics[name], plain[name], rtol=1e-5, err_msg=name)
        close = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-7)
        jax.tree.map(close, new_state.params, plain_state.params)
    records = []
    for update in range(2):
        log = jax.tree.map(lambda x, u=update: x[u], logs)
        meta = {"id": f"online/{update}", "policy": {"name": "tiny", "version": f"update {update}"},
                "judge": "process@0.5"}  # fmt: skip
        these = pairs.log_records(log, env=ENV, meta=meta)
        assert len(these) == int(log.weight.sum())
        records += these
        scores = np.asarray(log.scores)
        for record in these:
            n = int(record.id.rsplit("/", 1)[1])
            c, r = int(log.chosen[n]), int(log.rejected[n])
            flipped = scores[c] < scores[r]
            assert record.judge["name"] == "process@0.5" + (" (flipped)" if flipped else "")
            assert {record.judge["chosen_score"], record.judge["rejected_score"]} == {
                float(scores[c]), float(scores[r])}  # fmt: skip
            assert len(record.prefix) == int(log.prefix_turns[n])
    assert any("(flipped)" in r.judge["name"] for r in records)
    path = str(tmp_path / "online.jsonl")
    data.write_records(path, records)
    loaded = data.load_records(path)
    assert [r.id for r in loaded] == [r.id for r in records]
    batch = pairs.records_to_pairs(loaded, ENV, constrained=True, level=level, pad_to=16)
    assert float(batch.weight.sum()) == len(records)
