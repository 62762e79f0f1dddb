"""The strategies study (experiments.studies.strategies): exact resume after a SIGKILL, the
behaviour logs on resume, and a changed config refused without touching the workdir.

One tiny config (1 seed, 2 updates per chunk, the groups `online_dpo_prm`, `offline_dpo`
and `offline_sft_dpo`: an online group whose judge is a PRM it trains, offline DPO and
its logs, and SFT whose policy becomes DPO's reference at the second chunk) is run
straight once per module; the other runs compare with it. The killed run is the launcher
in a subprocess; the resumes run in this process, which reuses the straight run's
compiled programs (the tests that share the straight run are `slow`: about 90 s of CPU
together, most of it compiling the straight run's programs and tracing them again in the
killed launcher). PPO and GRPO resume through `loop.run` (tests/test_reliability.py
kills and resumes it); here a spy checks that they ask it to.
"""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from experiments.configs import strategies as strategies_config
from experiments.studies import strategies as study
from rlagent.host import loop
from rlagent.host.writers import MetricWriter
from rlagent.preference import data as pref_data

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = {
    "seeds": 1, "eval_every": 2, "eval_episodes": 4,
    "groups": "online_dpo_prm,offline_dpo,offline_sft_dpo", "sft_dpo_steps": 2,
    "online.num_updates": 4, "online.num_groups": 2, "online.group_size": 2,
    "online.num_epochs": 1, "judges": "outcome", "fork_judges": "outcome",
    "data_sizes": "2,4", "offline.num_updates": 4, "offline.pairs_per_step": 2,
    "log_pairs": True,
}  # fmt: skip
# The folders a straight run checkpoints in, and their last step.
GROUPS = {"online_dpo_prm": 4, "offline_dpo": 4, "offline_sft_dpo": 4}
DATA = os.path.join("data", "behaviour_pairs.jsonl")


def _config(**changes):
    config = strategies_config.get_config()
    for path, value in {**TINY, **changes}.items():
        *parents, name = path.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        node[name] = value
    return config


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted run of the tiny config: its workdir."""
    workdir = tmp_path_factory.mktemp("straight")
    study.run(_config(), str(workdir), progress=False)
    return workdir


@pytest.fixture
def saves(monkeypatch):
    """The (folder, step) of every checkpoint a group writes."""
    written, save = [], loop.save_state

    def spy(manager, step, state):
        written.append((os.path.basename(os.path.dirname(str(manager.directory))), step))
        save(manager, step, state)

    monkeypatch.setattr(loop, "save_state", spy)
    return written


def _same_rows(got, expected):
    """Rows equal field by field (NaN equal to NaN: metrics a row does not measure)."""
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            both_nan = isinstance(a[key], float) and math.isnan(a[key]) and math.isnan(b[key])
            assert both_nan or a[key] == b[key], (key, a, b)


def _assert_same_results(workdir, straight):
    """metrics.csv (every group's and the study's), summary.json (timings aside), the
    behaviour logs and every group's last checkpoint equal the straight run's."""
    for folder in ("", *GROUPS):
        _same_rows(MetricWriter(str(workdir / folder)).read(),
                   MetricWriter(str(straight / folder)).read())  # fmt: skip
    summaries = [json.loads((root / "summary.json").read_text()) for root in (workdir, straight)]
    for summary in summaries:
        assert summary.pop("wall_s")  # timings aside; json text: NaN equals NaN
    assert json.dumps(summaries[0], sort_keys=True) == json.dumps(summaries[1], sort_keys=True)
    assert (workdir / DATA).read_bytes() == (straight / DATA).read_bytes()
    # The online group's judged pairs: logged once each, in order, as the straight run's.
    online = os.path.join("online_dpo_prm", study.PAIRS_FILE)
    assert (workdir / online).read_bytes() == (straight / online).read_bytes()
    for folder, step in GROUPS.items():
        states = []
        for root in (workdir, straight):
            with ocp.CheckpointManager(str(root / folder / "checkpoints")) as manager:
                assert manager.latest_step() == step
                states.append(manager.restore(step, args=ocp.args.StandardRestore()))
        jax.tree.map(np.testing.assert_array_equal, *states)


def test_online_pairs_are_logged_per_update_with_their_policy_and_judge(straight):
    records = pref_data.load_records(str(straight / "online_dpo_prm" / study.PAIRS_FILE))
    assert records  # the PRM judge's scores rarely tie
    updates = [int(r.id.split("/")[-2]) for r in records]
    assert updates == sorted(updates) and set(updates) <= set(range(4))
    for record, update in zip(records, updates, strict=True):
        assert record.policy == {"name": "online_dpo/prm=implicit/seed0",
                                 "version": f"update {update}"}  # fmt: skip
        assert record.judge["name"] == "online_dpo/prm"
        assert record.id.startswith(f"online_dpo/prm=implicit/0/{update}/")
    rows = MetricWriter(str(straight / "online_dpo_prm")).read()
    assert len(records) == pytest.approx(sum(r["train_pairs"] for r in rows) * 2)


def test_sft_then_dpo_rows_and_report(straight):
    """offline_sft_dpo: SFT's chunk reports its NLL and no DPO loss, the next chunk DPO's
    loss and no NLL; its data-size rows sit in the offline table beside offline_dpo's."""
    rows = MetricWriter(str(straight / "offline_sft_dpo")).read()
    sft = [r for r in rows if r["update"] == 2]
    dpo = [r for r in rows if r["update"] == 4]
    assert len(sft) == len(dpo) == 2  # data sizes 2 and 4, one seed
    assert all(math.isfinite(r["train_sft_nll"]) and math.isnan(r["train_dpo_loss"]) for r in sft)
    assert all(math.isnan(r["train_sft_nll"]) and math.isfinite(r["train_dpo_loss"]) for r in dpo)
    table = (straight / "summary.md").read_text().split("## Offline DPO and SFT")[1]
    assert "offline_sft_dpo/4" in table and "offline_dpo/2" in table
    offline = json.loads((straight / "summary.json").read_text())["offline"]["conditions"]
    assert set(offline) == {f"{g}/{n}" for g in ("offline_dpo", "offline_sft_dpo") for n in (2, 4)}


def test_report_only_rewrites_the_report_from_the_rows(straight, tmp_path):
    workdir = tmp_path / "copy"
    shutil.copytree(straight, workdir)
    (workdir / "summary.md").unlink()
    study.run(_config(), str(workdir), report_only=True)
    assert (workdir / "summary.md").read_text() == (straight / "summary.md").read_text()
    assert (workdir / "summary.json").read_text() == (straight / "summary.json").read_text()
    with pytest.raises(loop.RunError, match="summary.json is missing"):
        study.run(_config(), str(tmp_path / "none"), report_only=True)


def test_offline_family_pairs_each_declared_pair_at_each_size_by_seed():
    """B - A over the seeds both ran (by hand), only for pairs whose two groups ran at a
    size, Holm over the metric's family."""
    rng = np.random.default_rng(0)
    values = {(g, n, s): float(rng.uniform()) for g in ("offline_sft", "offline_sft_dpo",
              "offline_dpo") for n in (32, 128) for s in range(6)}  # fmt: skip
    rows = [
        study._eval_row(f"{g}/{n}", s, u, 100.0, {"eval_sampled_success": v,
                                                  "eval_greedy_success": 1 - v})
        for (g, n, s), v in values.items() for u in (100, 200)
    ]  # fmt: skip
    family = study.offline_family(study.report.summarize(rows, reps=50), reps=200)
    assert set(family) == set(study.OFFLINE_METRICS)
    sampled = family["eval_sampled_success"]
    assert [(e["a"], e["b"]) for e in sampled] == [
        ("offline_sft/32", "offline_sft_dpo/32"),
        ("offline_sft/128", "offline_sft_dpo/128"),
    ]
    for e in sampled:
        n = int(e["a"].split("/")[1])
        by_hand = np.mean([values["offline_sft_dpo", n, s] - values["offline_sft", n, s]
                           for s in range(6)])  # fmt: skip
        assert e["difference"]["value"] == pytest.approx(by_hand) and e["num_pairs"] == 6
        assert e["p_holm"] >= e["p_value"]


@pytest.mark.slow
def test_killed_run_resumes_exactly(straight, tmp_path, saves):
    """The launcher (`--resume` on a missing workdir: a fresh start) is SIGKILLed once the
    PRM group's first chunk is checkpointed; the resumed run trains only what was left
    and equals the straight run."""
    workdir = tmp_path / "run"
    flags = [f"--config.{key}={value}" for key, value in TINY.items()]
    command = [sys.executable, "-m", "experiments.strategies", f"--workdir={workdir}",
               "--resume", *flags]  # fmt: skip
    first = workdir / "online_dpo_prm" / "checkpoints" / "2"  # renamed into place when done
    with open(tmp_path / "stderr", "w+") as stderr:
        launcher = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + 600
        while not first.exists() and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        launcher.send_signal(signal.SIGKILL)
        code = launcher.wait()
        stderr.seek(0)
        assert code == -signal.SIGKILL and first.exists(), stderr.read()[-3000:]
    assert not (workdir / "summary.json").exists()
    # Every chunk not checkpointed when killed (in the PRM group, unless the launcher won
    # the race with this poll) is trained on resume, and only those.
    left = [(folder, step) for folder, last in GROUPS.items() for step in range(2, last + 1, 2)
            if not (workdir / folder / "checkpoints" / str(step)).exists()]  # fmt: skip
    assert ("offline_dpo", 2) in left
    study.run(_config(), str(workdir), resume=True, progress=False)
    assert saves == left
    _assert_same_results(workdir, straight)
    with ocp.CheckpointManager(str(first.parent)) as manager:  # the PRM judge learned
        prm = [manager.restore(s, args=ocp.args.StandardRestore())["judge_state"] for s in (2, 4)]
    assert not all(jax.tree.leaves(jax.tree.map(np.array_equal, *prm)))


@pytest.mark.slow
def test_resume_after_kills_between_writes(straight, tmp_path, monkeypatch, saves):
    """Complete logs are reused, not logged again. A run killed between the PRM group's
    last rows and their checkpoint, in a row of the offline group's metrics and while
    logging (no marker, half a file) trains that chunk again, reads the rest back, logs
    again (the same bytes) and equals the straight run. Logs changed since they were
    marked complete are refused."""
    workdir = tmp_path / "run"
    shutil.copytree(straight, workdir)
    config, path = _config(), str(workdir / DATA)
    log_behaviour = study._log_behaviour
    monkeypatch.setattr(study, "_log_behaviour", lambda *args: pytest.fail("logged again"))
    marker = workdir / "data" / study.LOGGING
    cost = study._behaviour_logs(config, study._setup(config), path, 4, resume=True)
    assert cost == {int(n): t for n, t in json.loads(marker.read_text())["logging_turns"].items()}
    assert sorted(cost) == [2, 4] and 0 < cost[2] < cost[4]
    shutil.rmtree(workdir / "online_dpo_prm" / "checkpoints" / "4")
    with open(workdir / "offline_dpo" / "metrics.csv", "a") as metrics:
        metrics.write("offline_dpo/2,0,6,1")
    expected = (workdir / DATA).read_bytes()
    marker.unlink()
    (workdir / (DATA + ".partial")).write_bytes(expected[: len(expected) // 2])
    monkeypatch.setattr(study, "_log_behaviour", log_behaviour)
    study.run(config, str(workdir), resume=True, progress=False)
    assert saves == [("online_dpo_prm", 4)]
    assert (workdir / DATA).read_bytes() == expected and marker.exists()
    assert not (workdir / (DATA + ".partial")).exists()
    _assert_same_results(workdir, straight)
    (workdir / DATA).write_bytes(expected.replace(b'"judge"', b'"judge" ', 1))
    with pytest.raises(loop.RunError, match="behaviour_pairs.jsonl is missing or is not the file"):
        study.run(config, str(workdir), resume=True, progress=False)


def _snapshot(root):
    return {
        path: (open(path, "rb").read(), os.stat(path).st_mtime_ns)
        for path in (os.path.join(d, f) for d, _, files in os.walk(root) for f in files)
    }


@pytest.mark.slow
def test_resume_refuses_a_changed_config_and_changes_nothing(straight):
    before = _snapshot(straight)
    with pytest.raises(ValueError, match="config.groups: unknown.*'dpo'"):
        study.run(_config(groups="ppo,dpo"), str(straight), resume=True, progress=False)
    for field, value, diff in [
        ("online.beta", 0.2, "online.beta: 0.1 -> 0.2"),
        (
            "groups",
            "offline_dpo",
            "groups: 'online_dpo_prm,offline_dpo,offline_sft_dpo' -> 'offline_dpo'",
        ),
        ("seeds", 2, "seeds: 1 -> 2"),
    ]:
        with pytest.raises(loop.RunError, match=f"^Cannot resume .*{diff}"):
            study.run(_config(**{field: value}), str(straight), resume=True, progress=False)
    with pytest.raises(loop.RunError, match="is not empty.*--resume.*--overwrite"):
        study.run(_config(), str(straight), progress=False)
    assert _snapshot(straight) == before


def test_ppo_and_grpo_checkpoint_and_resume_through_the_loop(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(loop, "run", lambda *args, **kwargs: calls.append(kwargs) or [])
    config = _config(groups="ppo,grpo")
    for resume in (False, True):
        study._ppo_rows(config, study._setup(config), str(tmp_path), resume=resume,
                        progress=False)  # fmt: skip
    assert [(os.path.basename(c["workdir"]), c["resume"]) for c in calls] == [
        ("ppo", False), ("grpo", False), ("ppo", True), ("grpo", True)
    ]  # fmt: skip
    assert all(c.get("checkpoint", True) and c["chunk_size"] == c["evaluation"].every == 20
               for c in calls)  # fmt: skip


def test_heldout_tasks_need_the_split_and_reach_every_evaluation(tmp_path):
    with pytest.raises(ValueError, match="task_split='train'"):
        study.run(_config(eval_tasks="heldout"), str(tmp_path / "w"), progress=False)
    assert not (tmp_path / "w").exists()
    with pytest.raises(ValueError, match="config.eval: EvalConfig.tasks must be one of"):
        study.run(_config(eval_tasks="unseen"), str(tmp_path / "w"), progress=False)
    setup = study._setup(_config(eval_tasks="heldout", **{"env.task_split": "train"}))
    assert (setup.evaluation.tasks, setup.evaluation.episodes) == ("heldout", 4)
