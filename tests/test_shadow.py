"""Shadow-mode logs (rlagent.host.shadow): framing, torn tails after a SIGKILL and by hand,
damage, records of played episodes and what trains from them (RS-SFT, DPO records, off-
policy evaluation), checkpoints."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlagent.envs.toolworld import ToolWorld
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.host import provenance
from rlagent.host import shadow
from rlagent.models import Policy
from rlagent.preference import data as pref_data
from rlagent.rollout import RolloutConfig
from rlagent.rollout import make_rollout
from rlagent.rollout import make_score

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _record(index: int, size: int = 3) -> dict:
    """A well-formed record with `size` padding tokens per observation."""
    dims = {
        "turns": 2,
        "obs_len": size,
        "turn_len": 3,
        "markers": 1,
        "vocab": 50,
        "pad": 0,
        "end": 1,
    }
    turn = {
        "obs": [2] * size,
        "progress": [0],
        "action": [5, 1],
        "logp": [-0.5, -0.1],
        "signals": {"outcome": 0.0},
    }
    return {
        "format": shadow.FORMAT,
        "id": f"r{index}",
        "policy": {"name": "p", "version": "v"},
        "env": {"name": "E", "config": {}, "task_key": [0, index]},
        "dims": dims,
        "sampling": {"temperature": 1.0},
        "played_at": "t0",
        "logged_at": "t1",
        "success": index % 2 == 0,
        "turns": [turn],
        "feedback": {},
    }


def test_frames_round_trip_and_every_cut_of_the_tail_is_skipped(tmp_path):
    path = str(tmp_path / "log.jsonl")
    with shadow.ShadowLog(path) as log:
        assert log.append([_record(0), _record(1)]) == 2
        assert log.append([_record(2)]) == 1
    data = open(path, "rb").read()
    assert [r["id"] for r in shadow.read_log(path).records] == ["r0", "r1", "r2"]
    boundary = data.rindex(b"\n", 0, len(data) - 1) + 1  # start of the last frame
    for cut in range(boundary, len(data)):  # every length that tears the last frame
        with open(path, "wb") as f:
            f.write(data[:cut])
        read = shadow.read_log(path)
        assert [r["id"] for r in read.records] == ["r0", "r1"]
        assert read.torn == (
            None if cut == boundary else shadow.TornTail(3, boundary, cut - boundary)
        )


def test_a_flipped_byte_at_the_end_is_torn_in_the_middle_is_damage(tmp_path):
    path = str(tmp_path / "log.jsonl")
    with shadow.ShadowLog(path) as log:
        log.append([_record(i) for i in range(3)])
    data = bytearray(open(path, "rb").read())
    last = data.rindex(b"\n", 0, len(data) - 1) + 1
    tail = bytearray(data)
    tail[last + 30] ^= 1  # the last frame's checksum fails: a torn tail
    open(path, "wb").write(tail)
    assert shadow.read_log(path).torn.line == 3
    middle = bytearray(data)
    middle[data.index(b"\n") + 30] ^= 1  # line 2 fails and line 3 is good: damage
    open(path, "wb").write(middle)
    with pytest.raises(shadow.ShadowLogError, match=r"log.jsonl:2: frame: .*damaged"):
        shadow.read_log(path)


def test_appending_after_a_torn_tail_cuts_it_first(tmp_path):
    path = str(tmp_path / "log.jsonl")
    with shadow.ShadowLog(path) as log:
        log.append([_record(0), _record(1)])
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-7])  # a kill in the middle of the second frame
    with shadow.ShadowLog(path) as log:
        log.append([_record(2)])
    read = shadow.read_log(path)
    assert [r["id"] for r in read.records] == ["r0", "r2"] and read.torn is None


def test_malformed_records_are_refused_naming_the_field(tmp_path):
    bad = _record(0)
    bad["turns"][0]["logp"] = [-0.5]
    with pytest.raises(shadow.ShadowLogError, match=r"turns\[0\]\.logp: has 1 values for 2"):
        shadow.ShadowLog(str(tmp_path / "a.jsonl")).append([bad])
    path = str(tmp_path / "b.jsonl")
    missing = _record(0)
    del missing["feedback"]
    open(path, "wb").write(shadow.frame(_record(1)) + shadow.frame(missing))
    with pytest.raises(shadow.ShadowLogError, match=r"b.jsonl:2: feedback: missing"):
        shadow.read_log(path)
    twice = str(tmp_path / "c.jsonl")
    open(twice, "wb").write(shadow.frame(_record(1)))
    with pytest.raises(shadow.ShadowLogError, match=r"c.jsonl:1: id: 'r1' repeats"):
        shadow.read_logs([twice, twice])


_WRITER = textwrap.dedent(
    """
    import sys
    from rlagent.host import shadow
    sys.path.insert(0, {tests!r})
    from test_shadow import _record
    with shadow.ShadowLog({path!r}) as log:
        batch = 0
        while True:
            log.append([_record(batch * 50 + i, size=2000) for i in range(50)])
            print(batch, flush=True)  # acknowledged: append returned after fsync
            batch += 1
    """
)


def test_sigkill_mid_write_loses_nothing_acknowledged(tmp_path):
    path = str(tmp_path / "log.jsonl")
    script = _WRITER.format(tests=os.path.join(ROOT, "tests"), path=path)
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    acknowledged = -1
    while acknowledged < 2:  # wait for three acknowledged batches
        line = child.stdout.readline()
        assert line, "the writer died before acknowledging"
        acknowledged = int(line)
    time.sleep(0.005)  # into the next batch's write (~200 KB) or its fsync
    child.send_signal(signal.SIGKILL)
    child.wait()
    for line in child.stdout.read().split():  # acknowledgements still in the pipe
        acknowledged = int(line)
    records = shadow.read_log(path).records
    ids = [r["id"] for r in records]
    assert ids == [f"r{i}" for i in range(len(ids))]  # complete, in order, none invented
    assert len(ids) >= 50 * (acknowledged + 1)


# --------------------------------------------------------------------------- episodes


@pytest.fixture(scope="module")
def played(tiny_policy_config):
    """A tiny ToolWorld, a random policy and 8 logged episodes (2 tasks x 4)."""
    env = ToolWorld(ToolWorldConfig(level=1, max_turns=3))
    rollout_config = RolloutConfig(window=None, constrained=True)  # full context: fast compile
    policy_config = tiny_policy_config(num_summary_slots=0)
    graphdef, params = nnx.split(Policy(policy_config, rngs=nnx.Rngs(0)))
    # Raw uint32 keys, 2 tasks x 4 samples: the shapes of tests/test_ab_test.py's arms, so
    # that the session's compilation cache serves both files one rollout program.
    env_keys = jnp.repeat(jax.random.split(jax.random.PRNGKey(1), 2), 4, axis=0)
    policy_keys = jax.random.split(jax.random.PRNGKey(2), 8)
    traj = jax.jit(make_rollout(env, graphdef, rollout_config))(params, env_keys, policy_keys)
    records = shadow.make_records(
        traj,
        env_keys,
        env,
        policy={"name": "random", "version": "v0"},
        sampling={"temperature": 1.0},
        id_prefix="round0",
        played_at=shadow.now(),
    )
    return env, rollout_config, graphdef, params, traj, records


def test_logged_episodes_replay_to_the_played_trajectory(played, tmp_path):
    env, rollout_config, graphdef, params, traj, records = played
    path = str(tmp_path / "log.jsonl")
    with shadow.ShadowLog(path) as log:
        log.append(records)
    loaded = shadow.read_log(path).records
    assert loaded == json.loads(json.dumps(records))
    assert set(loaded[0]["turns"][0]["signals"]) == set(env.signal_names)
    back, keys = shadow.to_trajectory(loaded, env, constrained=True)
    played = np.asarray(traj.turn_mask)
    np.testing.assert_array_equal(back.turn_mask, played)
    for name in ("obs_tokens", "progress", "action_tokens", "action_mask"):
        np.testing.assert_array_equal(
            np.asarray(getattr(back, name))[played], np.asarray(getattr(traj, name))[played]
        )
    np.testing.assert_array_equal(back.episode_success, traj.episode_success)
    np.testing.assert_allclose(back.logp, traj.logp * traj.loss_mask, atol=1e-6)
    # The behaviour policy scored on its own logs: every importance ratio is 1.
    score = jax.jit(make_score(env, graphdef, rollout_config))
    ratios = shadow.episode_log_ratios(score, params, back)
    np.testing.assert_allclose(ratios, 0.0, atol=1e-3)
    tampered = json.loads(json.dumps(loaded))
    tampered[3]["turns"][0]["obs"][0] += 1
    with pytest.raises(shadow.ShadowLogError, match=r"record 'round0/3': turns\[0\]\.obs"):
        shadow.to_trajectory(tampered, env, constrained=True)


def test_dpo_records_load_and_replay_as_preference_pairs(played, tmp_path):
    env, _, _, _, _, records = played
    scored = json.loads(json.dumps(records))
    for index, record in enumerate(scored):  # two outcomes per task: a preference exists
        record["success"] = index % 2 == 0
    assert [r["id"] for r in shadow.accepted(scored)] == [f"round0/{i}" for i in (0, 2, 4, 6)]
    out = shadow.dpo_records(scored, env, judge="outcome", key=jax.random.key(0))
    assert len(out) == 2 and all(r.chosen.success and not r.rejected.success for r in out)
    path = str(tmp_path / "pairs.jsonl")
    pref_data.write_records(path, out)
    loaded = pref_data.load_records(path)  # the preference format's validating loader
    assert [r.policy for r in loaded] == [{"name": "random", "version": "v0"}] * 2
    assert {tuple(r.env["task_key"]) for r in loaded} == {
        tuple(r["env"]["task_key"]) for r in scored
    }
    with pytest.raises(ValueError, match="K >= 2 episodes of every task"):
        shadow.dpo_records(scored[:5], env, judge="outcome", key=jax.random.key(0))


def test_judge_scores_of_logged_episodes_by_hand():
    turn = lambda violations: {"signals": {"violations": violations, "verdict": 1.0}}  # noqa: E731
    records = [
        {"success": True, "turns": [turn(0.0), turn(1.0), turn(1.0)]},
        {"success": False, "turns": [turn(0.0)]},
        {"success": True, "turns": [{"signals": {}}]},  # no rule layer: no violations
    ]
    np.testing.assert_array_equal(shadow.judge_scores(records, "outcome"), [1.0, 0.0, 1.0])
    np.testing.assert_array_equal(shadow.judge_scores(records, "guardrail"), [-1.0, 0.0, 1.0])
    assert shadow.accepted(records, judge="guardrail", threshold=0.0) == records[1:]
    for judge in ("prm", "process", "vibes"):  # a PRM's scores, or no judge at all
        with pytest.raises(ValueError, match=r"judge must be one of \['outcome', 'guardrail'\]"):
            shadow.judge_scores(records, judge)


def test_off_policy_estimate_hand_cases_and_unbiasedness():
    returns = np.array([1.0, 0.0, 1.0, 1.0])
    same = shadow.off_policy_estimate(np.zeros(4), returns)
    assert same["is"]["value"] == same["wis"]["value"] == 0.75 and same["ess"] == 4.0
    # A one-step bandit: the behaviour succeeds w.p. 0.3, the target w.p. 0.8.
    rng = np.random.default_rng(0)
    success = rng.random(20_000) < 0.3
    log_ratio = np.where(success, np.log(0.8 / 0.3), np.log(0.2 / 0.7))
    out = shadow.off_policy_estimate(log_ratio, success.astype(float), reps=500)
    # IS = (8/3) * mean(success): its standard error is (8/3) sqrt(0.3 * 0.7 / n).
    se = 8 / 3 * np.sqrt(0.3 * 0.7 / success.size)
    assert abs(out["is"]["value"] - 0.8) < 4 * se
    assert out["is"]["high"] - out["is"]["low"] == pytest.approx(2 * 1.96 * se, rel=0.2)
    assert out["is"]["low"] < out["is"]["value"] < out["is"]["high"]
    assert abs(out["wis"]["value"] - 0.8) < 0.03
    assert 0 < out["ess"] < 20_000


def test_checkpoints_round_trip_and_refusals(played, tmp_path):
    _, _, graphdef, params, _, _ = played
    folder = str(tmp_path / "v1")
    model = dataclasses.asdict(nnx.merge(graphdef, params).config)
    shadow.save_checkpoint(folder, params, {"env": {}, "model": model, "rollout": {}}, step=4)
    loaded = shadow.load_checkpoint(folder)
    assert loaded.step == 4 and loaded.version.endswith(shadow.params_hash(params))
    assert loaded.version.startswith(f"{folder}@4#policy/0:")
    with pytest.raises(ValueError, match=r"no checkpoint step 9 .* holds \[4\]"):
        shadow.load_checkpoint(f"{folder}@9")
    with pytest.raises(ValueError, match=r"no run 'x/1'"):
        shadow.load_checkpoint(f"{folder}#x/1")
    with pytest.raises(ValueError, match="not a run folder"):
        shadow.load_checkpoint(str(tmp_path))
    # A text run (experiments.hf_agent) and a study's top folder, each named with what to pass.
    text_run = tmp_path / "text_run"
    text_run.mkdir()
    text_config = {"algorithm": "grpo", "sampling": {}, "model": {}, "seed": 0}
    provenance.write(str(text_run), provenance.collect(text_config))
    with pytest.raises(ValueError, match=r"text run of experiments.hf_agent.*export_hf"):
        shadow.load_checkpoint(str(text_run))
    study = tmp_path / "study"
    (study / "ppo").mkdir(parents=True)
    provenance.write(str(study), provenance.collect({"seeds": 2, "train": {}}))
    provenance.write(str(study / "ppo"), provenance.collect({"seeds": [0, 1], "model": model}))
    with pytest.raises(ValueError, match=r"study's folder, not a run folder.*one of \['ppo'\]"):
        shadow.load_checkpoint(f"{study}@2")


@pytest.mark.slow
def test_shadow_study_serves_trains_and_tests_a_new_version(played, tmp_path):
    """End to end: serve a tiny random policy, train v1 from its log, estimate, A/B."""
    from experiments.configs import shadow as shadow_config
    from experiments.studies import shadow as shadow_study

    env, rollout_config, graphdef, params, _, _ = played
    served = str(tmp_path / "v0")
    model = dataclasses.asdict(nnx.merge(graphdef, params).config)
    stored = {"env": dataclasses.asdict(env.config), "model": model,
              "rollout": dataclasses.asdict(rollout_config)}  # fmt: skip
    shadow.save_checkpoint(served, params, stored, step=1)
    config = shadow_config.get_config()
    # The random policy rarely succeeds: the guardrail judge (success - violations) ranks
    # its episodes, and RS-SFT accepts every one of them.
    config.update(policy=served, rounds=2, tasks_per_round=2, samples=4, judge="guardrail",
                  accept=-10.0)  # fmt: skip
    config.sft.update(steps=2, batch_size=2)
    config.dpo.update(num_updates=2, pairs_per_step=2)
    config.ab.update(tasks=2, samples=4, greedy=False, reps=100)
    workdir = str(tmp_path / "shadow")
    summary = shadow_study.run(config, workdir)
    assert len(shadow.read_log(os.path.join(workdir, "shadow_log.jsonl")).records) == 16
    assert summary["serving"]["episodes"] == 16
    assert summary["ope"]["v0"]["is"]["value"] == pytest.approx(
        summary["serving"]["success"]["value"], abs=1e-3
    )  # v0 on its own log: every weight is 1
    sft = summary["training"]["v1_rs_sft"]
    assert sft["accepted"] == 16 and sft["loss_last"] < sft["loss_first"]  # SFT learns
    for name in ("v1_rs_sft", "v1_dpo"):
        assert shadow.load_checkpoint(os.path.join(workdir, name)).step == 1
        assert summary["ab"][name]["verdict"]
