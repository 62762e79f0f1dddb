"""Runs that never lose or mix results: workdir safety, resume checks, divergence, faults.

Every loop run here uses the tiny setup of tests/test_train.py's resume test (same
objects, same shapes), so the compiled chunk of `rlagent.host.loop` is shared.
"""

import dataclasses
import glob
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

# pytest imports tests/ modules by their bare names: importing `test_train` (not
# `tests.test_train`) gives the very objects of its tests, hence the same cached trainer.
from test_train import ENV
from test_train import POLICY
from test_train import ROLLOUT

from experiments.configs import sparse_vs_dense as default_config
from experiments.studies import common
from experiments.studies.sparse_vs_dense import reward_runs
from rlagent.analysis import report
from rlagent.credit.probe import ProbeConfig
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.host import loop
from rlagent.host import provenance
from rlagent.host import shadow
from rlagent.host.writers import MetricWriter
from rlagent.models import PolicyConfig
from rlagent.prm import PRMConfig
from rlagent.rollout import RolloutConfig
from rlagent.train import TrainConfig
from rlagent.train import estimators
from rlagent.train.evaluation import EvalConfig
from rlagent.train.ppo import NONFINITE_METRICS
from rlagent.train.rewards import COMPONENTS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = TrainConfig(num_updates=2, num_groups=2, group_size=2, num_minibatches=1,
                   reward="process")  # fmt: skip
KWARGS = dict(seeds=[0, 1], conditions=["process", "outcome"], chunk_size=1, progress=False,
              tensorboard=False)  # fmt: skip


def _run(workdir, config=TINY, **kwargs):
    return loop.run(config, ENV, POLICY, ROLLOUT, workdir=str(workdir), **{**KWARGS, **kwargs})


def _strip(rows):
    return [{k: v for k, v in row.items() if k != "turns_per_sec"} for row in rows]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted run of TINY: its rows and workdir."""
    workdir = tmp_path_factory.mktemp("straight")
    return _run(workdir), workdir


def test_non_empty_workdir_is_refused_and_overwrite_starts_clean(straight, tmp_path):
    rows, old_run = straight
    shutil.copytree(old_run, tmp_path, dirs_exist_ok=True)  # an old run: checkpoints 1, 2.
    with pytest.raises(loop.RunError, match="is not empty.*resume.*overwrite"):
        _run(tmp_path)
    again = _run(tmp_path, overwrite=True, stop_after=1)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["0", "1"]  # no old one left.
    assert len((tmp_path / "metrics.csv").read_text().splitlines()) == 1 + len(again) == 5
    resumed = _run(tmp_path, resume=True)  # continues the new run, not the old one.
    assert _strip(resumed) == _strip(rows)


def test_resume_refuses_a_changed_config_before_restoring(straight, tmp_path, monkeypatch):
    _, workdir = straight
    restored = []
    monkeypatch.setattr(loop, "_restore", lambda *a: restored.append(a))
    with pytest.raises(loop.RunError, match=r"seeds: \[0, 1\] -> \[7, 8\]"):
        _run(workdir, resume=True, seeds=[7, 8])
    faster = dataclasses.replace(TINY, learning_rate=1e-2)
    with pytest.raises(loop.RunError, match=r"train.learning_rate: 0.003 -> 0.01"):
        _run(workdir, config=faster, resume=True)
    wider = dataclasses.replace(POLICY, d_model=64)
    with pytest.raises(loop.RunError, match=r"^Cannot resume .* model.d_model: 32 -> 64 \("):
        loop.run(TINY, ENV, wider, ROLLOUT, workdir=str(workdir), resume=True, **KWARGS)
    decaying = dataclasses.replace(TINY, num_updates=3, lr_schedule="linear")
    with pytest.raises(loop.RunError, match="train.num_updates: 2 -> 3"):
        _run(workdir, config=decaying, resume=True)
    # The extras' configs are part of the resolved config too.
    with pytest.raises(loop.RunError, match=r"eval.every: 0 -> 2"):
        _run(workdir, resume=True, evaluation=EvalConfig(every=2, episodes=4))
    with pytest.raises(loop.RunError, match=r"probe.every: 0 -> 2"):
        _run(workdir, resume=True, probe=ProbeConfig(every=2, episodes=2))
    with pytest.raises(loop.RunError, match=r"prm.kind: 'none' -> 'noisy_oracle'"):
        _run(workdir, resume=True, prm=PRMConfig(kind="noisy_oracle"))
    assert not restored
    stored = provenance.read(str(workdir))
    assert stored["config"]["train"]["learning_rate"] == 3e-3
    assert stored["config"]["seeds"] == [0, 1] and stored["git"]["commit"]
    assert stored["config"]["prm"] == dataclasses.asdict(PRMConfig())
    assert stored["config"]["probe"]["every"] == stored["config"]["eval"]["every"] == 0
    assert {"command", "packages", "devices"} <= set(stored)


class _Checked(Exception):
    """Raised in place of building the trainer: the workdir checks have passed."""


def _stop_after_checks(monkeypatch):
    def stop(*args, **kwargs):
        raise _Checked

    monkeypatch.setattr(loop, "_trainer", stop)


def test_resume_after_lost_metric_rows_restores_the_checkpoint_they_reach(straight, tmp_path):
    """metrics.csv cut in the middle of update 2's rows: the run resumes from checkpoint 1
    (the newest the metrics reach), drops checkpoint 2 and ends exactly as the straight run,
    turn totals included; with no row left it is refused and nothing on disk changes."""
    rows, old_run = straight
    shutil.copytree(old_run, tmp_path, dirs_exist_ok=True)
    lines = (tmp_path / "metrics.csv").read_text().splitlines(keepends=True)
    (tmp_path / "metrics.csv").write_text("".join(lines[:6]) + lines[6][:10])  # 5 rows + a cut
    assert _strip(_run(tmp_path, resume=True)) == _strip(rows)

    (tmp_path / "metrics.csv").write_text(lines[0])  # header only: no update is complete
    before = {p: open(p, "rb").read() for p in glob.glob(f"{tmp_path}/**", recursive=True)
              if os.path.isfile(p)}  # fmt: skip
    with pytest.raises(loop.RunError, match="up to update 0 only.*--overwrite"):
        _run(tmp_path, resume=True)
    after = {p: open(p, "rb").read() for p in glob.glob(f"{tmp_path}/**", recursive=True)
             if os.path.isfile(p)}  # fmt: skip
    assert after == before


def test_resume_may_extend_num_updates(straight, tmp_path, monkeypatch):
    shutil.copytree(straight[1], tmp_path, dirs_exist_ok=True)
    _stop_after_checks(monkeypatch)
    with pytest.raises(_Checked):
        _run(tmp_path, config=dataclasses.replace(TINY, num_updates=5), resume=True)


def test_resume_of_a_missing_workdir_says_so(tmp_path, caplog, monkeypatch):
    _stop_after_checks(monkeypatch)
    with caplog.at_level(logging.WARNING), pytest.raises(_Checked):
        _run(tmp_path / "nothing", resume=True)
    assert "holds no run; starting from scratch" in caplog.text


def test_checkpoint_write_failure_is_a_clear_error_and_closes(tmp_path, monkeypatch):
    def fail(self, step, *args, **kwargs):
        raise PermissionError(f"[Errno 13] Permission denied: '{self.directory}/{step}'")

    closed = []
    close = ocp.CheckpointManager.close
    monkeypatch.setattr(ocp.CheckpointManager, "save", fail)
    monkeypatch.setattr(ocp.CheckpointManager, "close", lambda self: closed.append(close(self)))
    with pytest.raises(loop.RunError, match="Could not write checkpoint step 0 to .*Permission"):
        _run(tmp_path)
    assert closed


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(straight, tmp_path, caplog):
    rows, old_run = straight
    shutil.copytree(old_run, tmp_path, dirs_exist_ok=True)
    for path in glob.glob(str(tmp_path / "checkpoints" / "2" / "**" / "d" / "*"), recursive=True):
        os.remove(path)
    with caplog.at_level(logging.WARNING):
        resumed = _run(tmp_path, resume=True)
    assert "Checkpoint step 2" in caplog.text and "unreadable" in caplog.text
    assert "from checkpoint step 1" in caplog.text
    assert _strip(resumed) == _strip(rows)
    assert len((tmp_path / "metrics.csv").read_text().splitlines()) == 1 + len(rows)


def _nan_outcome(monkeypatch):
    """Reward weights of NaN for the 'outcome' condition: its loss is NaN from update 1."""
    weights = loop.reward_weights

    def nan_outcome(config, condition):
        out = weights(config, condition).copy()
        if condition == "outcome":  # NaN on the components the environment offers
            out[[COMPONENTS.index(name) for name in ENV.reward_components]] = np.nan
        return out

    monkeypatch.setattr(loop, "reward_weights", nan_outcome)


def test_check_finite_stops_a_chunk_outside_the_loop():
    """`loop.check_finite`, the stop of trainers outside `loop.run` (the DPO groups)."""
    runs = [("offline_dpo/32", 0), ("offline_dpo/32", 1)]
    clean = {"nonfinite_loss": np.zeros((2, 3)), "nonfinite_grads": np.zeros((2, 3))}
    loop.check_finite(clean, 0, runs, None, [])  # nothing flagged
    flagged = {**clean, "nonfinite_grads": np.array([[0, 0, 0], [0, 1, 1.0]])}
    with pytest.raises(loop.Diverged, match=r"update 12: non-finite offline_dpo/32/seed 1: grads"):
        loop.check_finite(flagged, 10, runs, None, [{"update": 12}])
    with pytest.raises(ValueError, match="lack"):
        loop.check_finite({"nonfinite_loss": np.zeros((2, 3))}, 0, runs, None, [])


def test_the_start_is_checkpointed_kept_and_served_as_step_0(straight, tmp_path):
    rows, workdir = straight
    assert sorted(os.listdir(workdir / "checkpoints")) == ["0", "1", "2"]
    trainer = loop._trainer(TINY, ENV, POLICY, ROLLOUT, None)
    runs = [(c, s) for c in KWARGS["conditions"] for s in KWARGS["seeds"]]
    fresh = loop._initial_state(trainer, TINY, runs, KWARGS["seeds"], None)
    served = shadow.load_checkpoint(f"{workdir}@0#outcome/1")  # run 3 of 4
    assert served.step == 0 and served.version.startswith(f"{workdir}@0#outcome/1:")
    for mine, theirs in zip(
        jax.tree.leaves(nnx.to_pure_dict(served.params)),
        jax.tree.leaves(nnx.to_pure_dict(fresh.params)),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs)[3])
    newest = shadow.load_checkpoint(f"{workdir}#outcome/1")
    assert newest.step == 2 and newest.version != served.version
    # Step 0 outlives the newest two; later steps rotate.
    manager = loop.checkpoint_manager(str(tmp_path))
    for step in range(5):
        loop.save_state(manager, step, {"x": np.full(3, step)})
    assert sorted(manager.all_steps()) == [0, 3, 4]
    manager.close()


def test_divergence_stops_the_run_keeps_finite_state_and_is_reported(tmp_path, monkeypatch):
    _nan_outcome(monkeypatch)
    with pytest.raises(loop.Diverged, match=r"update 1: non-finite outcome/seed 0: loss, grads"):
        _run(tmp_path)
    assert os.listdir(tmp_path / "checkpoints") == ["0"]  # the non-finite chunk: unsaved.
    rows = MetricWriter(str(tmp_path)).read()
    assert [row["update"] for row in rows] == [1] * 4  # the flagged update is written.
    summary = report.summarize(rows)
    conditions = summary["conditions"]
    assert conditions["outcome"]["diverged_seeds"] == 2
    assert conditions["process"]["diverged_seeds"] == 0
    assert "outcome (DIVERGED: 2 seeds)" in report.markdown_table(summary)
    # Inside the update the non-finite step is skipped: parameters stay as they were.
    trainer = loop._trainer(TINY, ENV, POLICY, ROLLOUT, None)
    keys = jnp.stack([jax.random.PRNGKey(0)] * 4)
    weights = jnp.stack([loop.reward_weights(TINY, c) for c in ["process", "outcome"] * 2])
    state = loop._init(trainer)(keys, weights)
    new_state, metrics = loop._chunk(trainer, 1)(state)
    for flag in NONFINITE_METRICS:
        np.testing.assert_array_equal(np.asarray(metrics[flag])[:, 0] > 0, [0, 1, 0, 1])
    changed = []
    for old, new in zip(
        jax.tree.leaves(state.params), jax.tree.leaves(new_state.params), strict=True
    ):
        old, new = np.asarray(old), np.asarray(new)
        assert np.all(np.isfinite(new))
        np.testing.assert_array_equal(old[1::2], new[1::2])
        changed.append(not np.array_equal(old[0::2], new[0::2]))
    assert any(changed)


def test_check_inputs_changes_no_number(straight, tmp_path):
    checked = _run(tmp_path, dataclasses.replace(TINY, check_inputs=True))
    assert _strip(checked) == _strip(straight[0])


def test_check_inputs_stops_a_run_whose_kernel_inputs_are_wrong(tmp_path, monkeypatch):
    # A fault the checks exist for: RLOO's group ids one past the last group (unchecked,
    # the scatter drops them and the advantages are silently wrong). The config is used
    # by no other test, so its cached (faulty) trainer cannot leak into another.
    original = estimators.estimator_inputs

    def shifted(*args):
        inputs = original(*args)
        return inputs._replace(group_ids=inputs.group_ids + 1)

    monkeypatch.setattr(estimators, "estimator_inputs", shifted)
    config = dataclasses.replace(TINY, estimator="rloo", check_inputs=True)
    with pytest.raises(loop.RunError, match=r"check_inputs: .* updates 1-1 .*group_ids"):
        _run(tmp_path, config, conditions=["process"], seeds=[0])
    assert os.listdir(tmp_path / "checkpoints") == ["0"]  # the start only
    assert not MetricWriter(str(tmp_path)).read()


def test_launcher_exits_non_zero_on_divergence(tmp_path, monkeypatch):
    from absl import flags

    from experiments import sparse_vs_dense

    def diverge(*args, **kwargs):
        raise loop.Diverged("Diverged at update 2: non-finite outcome/seed 0: loss.", [])

    monkeypatch.setattr(common, "run_and_report", diverge)
    flags.FLAGS(["sparse_vs_dense", f"--workdir={tmp_path}"])
    try:
        with pytest.raises(SystemExit, match="error: Diverged at update 2"):
            sparse_vs_dense.main([])
    finally:
        flags.FLAGS.unparse_flags()


def test_experiment_reports_a_diverged_run_then_raises(tmp_path, monkeypatch):
    def diverging_run(*args, seeds, conditions, **kwargs):
        rows = [
            {"condition": condition, "seed": seed, "update": update, "success": 0.5,
             "violation_rate": 0.0, "turns": 2.0, "turns_over_plan": 0.0, "process_score": 0.0,
             "env_turns_total": 10.0 * update,
             "nonfinite_loss": float(condition == "outcome" and update == 2),
             "nonfinite_grads": 0.0}
            for condition in conditions for seed in seeds for update in (1, 2)
        ]  # fmt: skip
        raise loop.Diverged("Diverged at update 2: non-finite outcome/seed 0: loss.", rows)

    monkeypatch.setattr(loop, "run", diverging_run)
    config = default_config.get_config()
    config.conditions, config.seeds = "outcome,process", 1
    with pytest.raises(loop.Diverged, match="rewards: Diverged at update 2"):
        common.run_and_report(reward_runs(config), config, workdir=str(tmp_path))
    table = (tmp_path / "summary.md").read_text()
    assert "| outcome (DIVERGED: 1 seeds) |" in table and "| process |" in table
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["conditions"]["outcome"]["diverged_seeds"] == 1
    assert "wall_s" in json.loads((tmp_path / "provenance.json").read_text())


def test_experiment_refuses_non_empty_workdir_and_bad_seeds(tmp_path):
    config = default_config.get_config()
    (tmp_path / "metrics.csv").write_text("update\n1\n")
    with pytest.raises(loop.RunError, match="--resume.*--overwrite"):
        common.run_and_report(reward_runs(config), config, workdir=str(tmp_path))
    config.seeds = 0
    with pytest.raises(ValueError, match="config.seeds must be >= 1"):
        common.run_and_report(reward_runs(config), config, workdir=str(tmp_path))


@pytest.mark.parametrize(
    "field, value, message",
    [("conditions", "outcome,outcome", r"names reward form \['outcome'\] more than once"),
     ("conditions", "bogus", "config.conditions: Unknown reward 'bogus'"),
     ("chunk_size", 0, "config.chunk_size must be >= 1")],
)  # fmt: skip
def test_bad_study_configs_are_refused_before_anything_is_written(tmp_path, field, value, message):
    config = default_config.get_config()
    config[field] = value
    workdir = tmp_path / "run"
    with pytest.raises(ValueError, match=message):
        common.run_and_report(reward_runs(config), config, workdir=str(workdir))
    assert not workdir.exists()  # the corrected rerun needs no --overwrite


def test_every_config_field_is_settable_and_misspellings_list_the_fields():
    config = default_config.get_config()
    for section, cls in (("train", TrainConfig), ("env", ToolWorldConfig),
                         ("model", PolicyConfig), ("rollout", RolloutConfig)):  # fmt: skip
        assert set(config[section]) == {f.name for f in dataclasses.fields(cls)}, section
    config.train.kl_target = 0.02  # a None default is a typed placeholder.
    config.train.gamma = 0.9
    assert common.build(config).train_config.kl_target == 0.02
    message = common.unknown_override(config, ["--config.train.gamm=0.9"])
    assert message.startswith("Unknown config field config.train.gamm;") and "gamma" in message
    assert common.unknown_override(config, ["--config.train.gamma=0.9"]) is None
    launch = [sys.executable, "-m", "experiments.sparse_vs_dense", "--workdir=/nonexistent"]
    result = subprocess.run([*launch, "--config.train.gamm=0.9"], capture_output=True,
                            text=True, cwd=ROOT, timeout=300)  # fmt: skip
    assert result.returncode == 1
    assert "Unknown config field config.train.gamm; config.train has: " in result.stderr
    result = subprocess.run([*launch, "--config.train.num_minibatches=4", "--config.seeds=0",
                             "--config.train.reward=outcome", "--config.train.kl_target=0.1"],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == "error: config.seeds must be >= 1, got 0."


@pytest.mark.parametrize(
    "field, value", [("d_model", 0), ("num_heads", 0), ("num_layers", -1), ("head_dim", 0),
                     ("norm_eps", float("nan")), ("pad_id", 200)]
)  # fmt: skip
def test_policy_config_names_the_bad_field(field, value):
    with pytest.raises(ValueError, match=f"PolicyConfig.*{field}"):
        PolicyConfig(**{field: value})


FAULT_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    # The session's compilation cache (tests/conftest.py) reaches it through the
    # environment: the programs the `straight` run compiled are not compiled again.
    sys.path[:0] = [{root!r}, {root!r} + "/tests"]
    from orbax.checkpoint._src.path import atomicity
    from rlagent.host import loop, writers
    from test_reliability import _run

    mode, workdir = sys.argv[1], sys.argv[2]
    kill = lambda: os.kill(os.getpid(), signal.SIGKILL)
    if mode == "metric_write":  # killed half-way through the rows of update 2.
        write = writers.MetricWriter.write
        def write_half(self, rows, **kwargs):
            if rows[0]["update"] == 2:
                write(self, rows[:1], tensorboard=False)
                with open(self.path, "a") as f:
                    f.write("process,2,1,0.5")
                kill()
            write(self, rows, **kwargs)
        writers.MetricWriter.write = write_half
    if mode == "checkpoint_save":  # killed after the data of step 2, before it is final.
        finalize = atomicity.AtomicRenameTemporaryPath.finalize
        async def finalize_then_die(self):
            if self.get_final().name == "2":
                kill()
            await finalize(self)
        atomicity.AtomicRenameTemporaryPath.finalize = finalize_then_die
    _run(workdir, resume=mode != "metric_write")
    """
)


def test_killed_runs_resume_exactly(straight, tmp_path):
    """SIGKILL during a metric write, then during a checkpoint save; resume equals straight."""
    rows, straight_dir = straight
    script = FAULT_SCRIPT.format(root=ROOT)
    workdir = tmp_path / "run"
    for mode in ("metric_write", "checkpoint_save"):
        result = subprocess.run([sys.executable, "-c", script, mode, workdir], cwd=ROOT,
                                capture_output=True, text=True, timeout=600)  # fmt: skip
        assert result.returncode == -signal.SIGKILL, (mode, result.stderr[-3000:])
    assert glob.glob(str(workdir / "checkpoints" / "2.orbax-checkpoint-tmp*"))
    _run(workdir, resume=True)  # finished here: the straight run's programs are compiled.
    resumed = MetricWriter(str(workdir)).read()
    on_disk = MetricWriter(str(straight_dir)).read()
    assert _strip(resumed) == _strip(on_disk) and len(on_disk) == len(rows)
    manager = ocp.CheckpointManager(str(straight_dir / "checkpoints"))
    resumed_manager = ocp.CheckpointManager(str(workdir / "checkpoints"))
    try:
        assert manager.latest_step() == resumed_manager.latest_step() == 2
        expected = manager.restore(2, args=ocp.args.StandardRestore())
        got = resumed_manager.restore(2, args=ocp.args.StandardRestore())
        jax.tree.map(np.testing.assert_array_equal, expected, got)
    finally:
        manager.close()
        resumed_manager.close()
    assert json.loads((workdir / "provenance.json").read_text())["config"]["seeds"] == [0, 1]
    # provenance.json is the first process's; the resume that finished (this one) is a line
    # of its own beside it, with the updates it ran (the killed one never finished).
    records = provenance.segments(str(workdir))
    assert len({record["segment"] for record in records}) == len(records) == 2
    assert records[-1]["segment"] == provenance.SEGMENT and records[-1]["updates"] == [1, 2]


def test_compiled_programs_are_cleared_near_the_memory_map_limit(monkeypatch):
    """XLA CPU maps each program's code in many regions; past half of vm.max_map_count a
    run clears the compiled programs first (a long sweep died at the limit otherwise)."""
    counts = loop.memory_maps()
    if counts is not None:  # Linux: real numbers, well below the limit in a test.
        assert 0 < counts[0] < counts[1]
    cleared = []
    monkeypatch.setattr(loop, "clear_compiled", lambda: cleared.append(True))
    monkeypatch.setattr(loop, "memory_maps", lambda: (40_000, 65_530))
    assert loop.clear_compiled_if_crowded() and cleared == [True]
    monkeypatch.setattr(loop, "memory_maps", lambda: (30_000, 65_530))
    assert not loop.clear_compiled_if_crowded() and cleared == [True]
    monkeypatch.setattr(loop, "memory_maps", lambda: None)  # no /proc: nothing to go by.
    assert not loop.clear_compiled_if_crowded() and cleared == [True]
