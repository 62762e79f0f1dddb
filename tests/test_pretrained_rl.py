"""experiments.pretrained_rl: RL from a pretrained checkpoint over seeds, paired with its
start (the trainer is replaced by a writer of metric rows; the notebook test and
tests/test_hf_agent.py train for real)."""

import csv
import json
import os
import shutil
import subprocess
import threading

import ml_collections
import numpy as np
import pytest

from experiments.configs import pretrained_rl as pretrained_rl_config
from experiments.studies import pretrained_rl

START = {
    "eval_sampled_success": 0.2, "eval_greedy_success": 0.3, "eval_sampled_entropy": 0.08,
    "eval_sampled_malformed_rate": 0.05, "eval_greedy_malformed_rate": 0.0,
}  # fmt: skip
FINAL_SAMPLED = {0: 0.30, 1: 0.35, 2: 0.25, 3: 0.40}


def _rows(seed: int, num_updates: int) -> list[dict]:
    """metrics.csv rows of a fake run: 10 environment turns an update, evaluations at
    updates 2 and 4 (sampled success rising to FINAL_SAMPLED[seed]), NaN elsewhere."""
    rows = []
    for update in range(1, num_updates + 1):
        final = FINAL_SAMPLED.get(seed, 0.5) * update / num_updates

        def value(v, evaluated=update % 2 == 0):
            return v if evaluated else float("nan")

        rows.append({
            "update": update, "env_turns": 10.0, "eval_sampled_success": value(final),
            "eval_greedy_success": value(0.3), "eval_sampled_entropy": value(0.07),
            "eval_sampled_malformed_rate": value(0.04), "eval_greedy_malformed_rate": value(0.0),
        })  # fmt: skip
    return rows


def _write(folder: str, rows: list[dict]) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "metrics.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@pytest.fixture
def fake_trainer(monkeypatch):
    """hf_agent's prepare / evaluate_start / run replaced: calls are recorded; a run
    writes the rows of the updates it has not written yet."""
    calls = {"start": 0, "runs": []}

    def evaluate_start(config, *, model_dir, env):
        calls["start"] += 1
        return dict(START)

    def run(config, folder, *, model_dir, env, resume=False, progress=True):
        calls["runs"].append((config.seed, resume))
        _write(folder, _rows(config.seed, config.train.num_updates))

    monkeypatch.setattr(pretrained_rl.hf_agent, "prepare", lambda *a, **k: None)
    monkeypatch.setattr(pretrained_rl.hf_agent, "evaluate_start", evaluate_start)
    monkeypatch.setattr(pretrained_rl.hf_agent, "run", run)
    return calls


def _config(seeds) -> ml_collections.ConfigDict:
    config = pretrained_rl_config.get_config()
    config.seeds = tuple(seeds)
    config.agent.train.num_updates = 4
    return config


def test_seeds_are_shared_between_processes_and_paired_with_the_start(tmp_path, fake_trainer):
    """Two shares of the seeds train into one folder: the start is evaluated once, a
    finished seed is never trained again, a partial one is resumed, and the report pairs
    every finished seed's last evaluation with the start."""
    workdir = str(tmp_path / "study")
    pretrained_rl.run(_config([0, 2]), workdir, progress=False)
    assert fake_trainer == {"start": 1, "runs": [(0, False), (2, False)]}
    _write(os.path.join(workdir, "seed_3"), _rows(3, 4)[:2])  # a share killed mid-run.
    summary = pretrained_rl.run(_config([1, 3, 2]), workdir, resume=True, progress=False)
    assert fake_trainer == {"start": 1, "runs": [(0, False), (2, False), (1, False), (3, True)]}
    assert summary["seeds"] == [0, 1, 2, 3]
    sampled, greedy = summary["success"]
    differences = np.array([FINAL_SAMPLED[s] for s in range(4)]) - START["eval_sampled_success"]
    np.testing.assert_allclose(sampled["difference"]["value"], differences.mean())
    assert sampled["difference"]["low"] > 0 and sampled["num_pairs"] == 4
    assert sampled["p_value"] == pytest.approx(1 / 8)  # exact: 4 positive differences.
    assert sampled["reading"].startswith("cannot tell at 4 seeds")  # p_holm > 0.05.
    assert greedy["difference"] == {"value": 0.0, "low": 0.0, "high": 0.0}
    with open(os.path.join(workdir, "eval.csv")) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 * 3  # the start and two evaluations per seed.
    first = [r for r in rows if r["seed"] == "1"]
    assert [(r["update"], r["env_turns_total"]) for r in first] == [
        ("0", "0.0"), ("2", "20.0"), ("4", "40.0")
    ]  # fmt: skip
    assert float(first[0]["eval_sampled_success"]) == 0.2
    markdown = open(os.path.join(workdir, "summary.md")).read()
    assert "| sampled | 0.200 | 0.325 |" in markdown and "4 seeds" in markdown
    assert os.path.exists(os.path.join(workdir, "curves.png"))
    record = json.load(open(os.path.join(workdir, "provenance.json")))
    assert record["seeds_reported"] == [0, 1, 2, 3]


def test_bad_seeds_and_another_config_are_refused(tmp_path, fake_trainer):
    """Bad seeds are refused before anything is written; a folder whose start was
    evaluated under another agent config is refused naming start.json."""
    workdir = str(tmp_path / "study")
    for seeds, words in (([], "config.seeds"), ([-1], "config.seeds"), ([1, 1], "seed")):
        with pytest.raises(ValueError, match=words):
            pretrained_rl.run(_config(seeds), workdir)
    assert not os.path.exists(workdir)
    pretrained_rl.run(_config([0]), workdir, progress=False)
    other = _config([1])
    other.agent.train.learning_rate = 3e-4
    with pytest.raises(ValueError, match="start.json was computed under another config"):
        pretrained_rl.run(other, workdir, resume=True)
    assert [seed for seed, _ in fake_trainer["runs"]] == [0]


def test_processes_sharing_a_folder_evaluate_the_start_once(tmp_path, fake_trainer, monkeypatch):
    """A process that finds another live process's start.json.lock waits for start.json and
    evaluates nothing; a lock left by a dead process is taken over."""
    monkeypatch.setattr(pretrained_rl, "LOCK_POLL_S", 0.05)
    first = str(tmp_path / "first")
    pretrained_rl.run(_config([0]), first, progress=False)
    assert fake_trainer["start"] == 1 and not os.path.exists(os.path.join(first, "start.json.lock"))

    workdir = tmp_path / "shared"
    workdir.mkdir()
    sleeper = subprocess.Popen(["sleep", "30"])  # another live process holds the lock.
    try:
        (workdir / "start.json.lock").write_text(str(sleeper.pid))
        later = threading.Timer(
            0.3, shutil.copy, (os.path.join(first, "start.json"), workdir / "start.json")
        )
        later.start()
        pretrained_rl.run(_config([1]), str(workdir), resume=True, progress=False)
        later.join()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert fake_trainer["start"] == 1  # waited for the holder's start.json.
    assert (workdir / "start.json.lock").read_text() == str(sleeper.pid)  # not ours to remove.

    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / "start.json.lock").write_text(str(sleeper.pid))  # its process has ended.
    pretrained_rl.run(_config([2]), str(stale), resume=True, progress=False)
    assert fake_trainer["start"] == 2 and not (stale / "start.json.lock").exists()
