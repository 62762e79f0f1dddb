"""Multi-process training (rlagent.parallel, docs/distributed.md): two processes on this
machine's CPU, joined over gloo on localhost, each with one device, train as one process
with two host devices does, write one set of files, and resume exactly after both were
killed.

Each test launches its launcher and checks everything on those runs: one process with
`--xla_force_host_platform_device_count=2` (the reference), then two processes. The main
experiment's two are killed together right after the checkpoint of update 1 and resumed to
update 2; hf_agent's two run uninterrupted (two launches, not three: the kill and resume
of two processes is the main experiment's test, hf_agent's resume of one process
tests/test_hf_agent.py's). Metrics and parameters agree to float32 rounding (RTOL, ATOL): both
sides run one partitioned program over a mesh of two devices, but XLA compiles it for
one process of two devices and for two processes of one separately (the cross-process
reductions go over gloo), and the text engine's processes each generate their own
episodes on their own copy of the policy, so the last bits of a sum may differ (seen
here: the 7th significant digit of a metric).
"""

import csv
import glob
import json
import os
import signal
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from test_ab_test import checkpoints  # noqa: F401 - two tiny arms' fixture.
from test_hf_agent import TIMINGS
from test_hf_agent import assert_rows_close
from test_hf_agent import toolworld_model  # noqa: F401 - the tiny checkpoint's fixture.

from experiments.configs import ab_test as ab_config
from experiments.configs import dialogue as dialogue_config
from experiments.local_processes import finish
from experiments.local_processes import start_local
from experiments.studies import ab_test
from experiments.studies import credit_accuracy
from rlagent import parallel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# float32 rounding (module docstring): metrics and parameters to RTOL / ATOL, and
# parameters to PARAM_ATOL, a thousandth of one AdamW step at the runs' learning rate of
# 1e-2: Adam divides each step by the root of the gradient's second moment, so where a
# gradient is near 0 its rounding moves that step by up to the learning rate.
RTOL, ATOL, PARAM_ATOL = 1e-5, 1e-6, 1e-5

# Runs a launcher as `python -m <module> <flags>`; with a marker path, the process writes
# `<marker>.<pid>` once the checkpoint of update 1 is written and waits there to be killed.
KILLED_AFTER = """
import os, runpy, signal, sys
sys.path.insert(0, {root!r})
from rlagent.host import loop
module, marker, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
save = loop.save_state
def save_then_wait(manager, done, state):
    save(manager, done, state)
    if marker and done == 1:
        manager.wait_until_finished()
        open(f"{{marker}}.{{os.getpid()}}", "w").close()
        signal.pause()
loop.save_state = save_then_wait
sys.argv = [module, *flags]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""

# Episodes over a mesh of two devices (the default of two processes; one process's two).
SVD_FLAGS = [
    "--num_devices=2",
    "--config.conditions=outcome,potential", "--config.seeds=1", "--config.chunk_size=1",
    "--config.env.level=1", "--config.train.num_updates=2", "--config.train.num_groups=2",
    "--config.train.group_size=2", "--config.train.num_minibatches=1",
]  # fmt: skip


def _start(module: str, flags: list[str], *, processes: int, marker: str = "") -> list:
    """Starts `module` as `processes` processes of one device each (joined over gloo on
    localhost), or one process of two devices when `processes` is 1."""
    argv = ["-c", KILLED_AFTER.format(root=ROOT), module, marker, *flags]
    return start_local(argv, processes=processes, devices=2 if processes == 1 else 1)


def _killed(module: str, flags: list[str], marker) -> list:
    """Two processes SIGKILLed together once both have checkpointed update 1."""
    children = _start(module, flags, processes=2, marker=str(marker))
    deadline = time.monotonic() + 600
    while len(glob.glob(f"{marker}.*")) < 2 and time.monotonic() < deadline:
        if any(child.poll() is not None for child in children):
            break  # one ended early: its error is reported below.
        time.sleep(0.2)
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
    return finish(children)


def _check_exits(results, code: int) -> None:
    for status, _, stderr in results:
        assert status == code, stderr[-3000:]


def _rows(path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        timings = (*TIMINGS, "turns_per_sec")
        return [{k: v for k, v in row.items() if k not in timings} for row in csv.DictReader(f)]


def _params(folder, step: int):
    """Every array of checkpoint `step` (saved over two devices) read onto this one."""
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    handler = ocp.StandardCheckpointHandler()
    with ocp.CheckpointManager(str(folder), item_handlers=handler) as manager:
        target = jax.tree.map(
            lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=one),
            manager.item_metadata(step),
        )
        restored = manager.restore(step, args=ocp.args.StandardRestore(target))
    return [np.asarray(leaf) for leaf in jax.tree.leaves(restored)]


def _reference_and_two(module: str, flags: list[str], tmp_path, *, kill: bool):
    """The reference run (one process, two devices) in tmp_path/one; two processes in
    tmp_path/two: with `kill`, killed after update 1 and then resumed, else uninterrupted."""
    one, two = tmp_path / "one", tmp_path / "two"
    _check_exits(finish(_start(module, [*flags, f"--workdir={one}"], processes=1)), 0)
    resume = []
    if kill:
        killed = _killed(module, [*flags, f"--workdir={two}"], tmp_path / "saved")
        _check_exits(killed, -signal.SIGKILL)
        resume = ["--resume"]
    _check_exits(finish(_start(module, [*flags, f"--workdir={two}", *resume], processes=2)), 0)
    return one, two


def _assert_one_writer(folder, metrics: set[str]) -> None:
    """Exactly the `metrics` CSVs (their rows checked by the caller: none twice), one
    provenance.json naming both processes, process 0's TensorBoard events only."""
    found = {os.path.relpath(os.path.join(d, n), folder) for d, _, names in os.walk(folder)
             for n in names if n.startswith("metrics.csv")}  # fmt: skip
    assert found == metrics, found
    record = json.loads((folder / "provenance.json").read_text())
    assert record["processes"] == 2 and len(record["devices"]) == 2, record
    tensorboard = [d for d, _, names in os.walk(folder) if any("tfevents" in n for n in names)]
    for events in tensorboard:  # process 0's events only, once per segment (run[, resume]).
        assert len(os.listdir(events)) <= 2, os.listdir(events)


def _assert_same_run(two_rows, one_rows, two_params, one_params) -> None:
    """Metrics (timings aside) and parameters equal to float32 rounding (module docstring)."""
    assert_rows_close(two_rows, one_rows, rel=RTOL, abs=ATOL)
    assert len(two_params) == len(one_params)
    for got, want in zip(two_params, one_params, strict=True):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=PARAM_ATOL)


@pytest.mark.slow
def test_main_experiment_on_two_processes_equals_two_devices_and_resumes(tmp_path):
    one, two = _reference_and_two("experiments.sparse_vs_dense", SVD_FLAGS, tmp_path, kill=True)
    rows = _rows(two / "metrics.csv")
    assert len(rows) == 2 * 2  # conditions x updates
    _assert_same_run(
        rows, _rows(one / "metrics.csv"),
        _params(two / "rewards" / "checkpoints", 2), _params(one / "rewards" / "checkpoints", 2),
    )  # fmt: skip
    assert len(_rows(two / "rewards" / "metrics.csv")) == 2 * 2
    _assert_one_writer(two, {"metrics.csv", "rewards/metrics.csv"})  # the study's, the run's


# PPO with its critic (GRPO's advantages are 0 on this tiny model), float32 compute, a mesh
# of two devices as two data rows: one process's in the reference, one each otherwise.
HF_FLAGS = [
    "--env=toolworld_text", "--config.algorithm=ppo", "--config.train.num_updates=2",
    "--config.train.num_groups=1", "--config.train.group_size=2",
    "--config.train.num_epochs=1", "--config.train.num_minibatches=1",
    "--config.train.learning_rate=0.01", "--config.env.toolworld_text.max_turns=2",
    "--config.sampling.max_new_tokens=6", "--config.sampling.obs_len=1100",
    "--config.sampling.max_prompt_len=1240", "--config.eval.every=0",
    "--config.model.dtype=float32", "--config.mesh.devices=-1", "--config.mesh.data=2",
]  # fmt: skip


@pytest.mark.slow
def test_hf_agent_on_two_processes_equals_two_devices(toolworld_model, tmp_path):  # noqa: F811
    flags = [*HF_FLAGS, f"--model_dir={toolworld_model}"]
    one, two = _reference_and_two("experiments.hf_agent", flags, tmp_path, kill=False)
    rows = _rows(two / "metrics.csv")
    assert [row["update"] for row in rows] == ["1", "2"]
    assert float(rows[1]["kl_ref"]) > 1e-9  # the first update moved the policy.
    _assert_same_run(
        rows, _rows(one / "metrics.csv"),
        _params(two / "checkpoints", 2), _params(one / "checkpoints", 2),
    )  # fmt: skip
    _assert_one_writer(two, {"metrics.csv"})


def test_bad_process_flags_are_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--process_id must be in 0..1"):
        parallel.initialize_distributed("localhost:1", 2, 2)
    with pytest.raises(ValueError, match="needs --num_processes, --process_id as well"):
        parallel.initialize_distributed("localhost:1")
    with pytest.raises(ValueError, match="--process_id must be >= 0"):
        parallel.initialize_distributed(process_id=-1, from_environment=True)
    with pytest.raises(ValueError, match="--num_processes must be >= 1"):
        parallel.initialize_distributed("localhost:1", 0, 0)
    parallel.initialize_distributed()  # nothing given: one process, nothing to join.
    assert jax.process_count() == 1 and parallel.is_primary()
    assert parallel.primary_decides(lambda: 3) == 3 and parallel.broadcast([1]) == [1]


# The dialogue study's credit part: two seeds, one measured by each process.
CREDIT = dict(
    horizons="3", policies="prover_0.5", estimators="gae_turn", rewards="outcome", seeds=2,
    num_groups=1, group_size=2, num_samples=2,
)  # fmt: skip

# The start of a `python -c` script run by `start_local`: joins the processes its flags
# name (the arguments that are no flags are the script's own, in sys.argv[1:]).
JOIN = f"""
import json, os, sys
sys.path.insert(0, {ROOT!r})
from absl import flags
from rlagent import parallel
parallel.define_distributed_flags()
flags.FLAGS(sys.argv[:1] + [arg for arg in sys.argv[1:] if arg.startswith("--")])
parallel.maybe_initialize_distributed()
"""

# Two processes running the dialogue study (its credit part splits its seeds over the
# processes) and the curriculum (host decisions from the metrics of a mesh run) on the
# smallest configs, each on the global mesh; every process prints the summaries it got.
STUDIES = """
from experiments.configs import curriculum as curriculum_config
from experiments.configs import dialogue as dialogue_config
from experiments.studies import curriculum, dialogue
d = dialogue_config.get_config()
d.update(dict(seeds=1, chunk_size=1, conditions="dialogue"))
d.train.update(num_updates=1, num_groups=2, group_size=2, num_minibatches=1)
d.feedback.rates, d.feedback.noises = "0.3", "0.2"
d.credit.update({credit!r})
c = curriculum_config.get_config()
c.update(dict(stages="l1,l2", seeds=1, schedules="success"))
c.train.update(num_updates=2, num_groups=2, group_size=2, num_minibatches=1)
c.curriculum.every, c.eval.every, c.eval.episodes = 1, 2, 2
mesh = parallel.data_mesh(None)
summaries = {{
    name: study.run(config, os.path.join(sys.argv[1], name), mesh=mesh, progress=False)
    for name, study, config in [("dialogue", dialogue, d), ("curriculum", curriculum, c)]
}}
parallel.sync("after the studies")  # the processes' calls to the coordinator still pair up.
print(json.dumps(summaries, default=float, sort_keys=True))
"""


@pytest.mark.slow
def test_dialogue_and_curriculum_on_two_processes_write_once_and_agree(tmp_path):
    """Both exit, hold process 0's summaries, write one set of files; the credit part's
    seeds, split over the processes and joined, give the rows of one process."""
    script = JOIN + STUDIES.format(credit=CREDIT)
    results = finish(start_local(["-c", script, str(tmp_path)], processes=2, devices=1))
    _check_exits(results, 0)
    first, second = (json.loads(out.strip().splitlines()[-1]) for _, out, _ in results)
    assert first == second  # process 1 got process 0's summaries.
    assert set(first["dialogue"]) == {"rewards", "feedback", "credit"}
    assert first["dialogue"]["credit"]["outcome"]["prover_0.5"]["gae_turn"]["3"]["spearman"]
    assert set(first["curriculum"]["stage_reached"]) == {"success"}
    _assert_one_writer(tmp_path / "curriculum", {"metrics.csv", "success/metrics.csv"})
    assert len(_rows(tmp_path / "curriculum" / "metrics.csv")) == 2  # updates (one seed)
    _assert_one_writer(tmp_path / "dialogue", {"metrics.csv", "rewards/metrics.csv"})
    # The credit rows of the two processes' seeds, joined, equal one process's.
    config = dialogue_config.get_config().credit
    config.update(CREDIT)
    credit_accuracy.run(config, str(tmp_path / "one"))
    joined = _rows(tmp_path / "dialogue" / "credit" / "credit.csv")
    assert [row["seed"] for row in joined] == ["0", "1"]
    assert joined == _rows(tmp_path / "one" / "credit.csv")


def test_split_gather_and_process_zero_alone_inside_primary_decides(tmp_path):
    """`split` deals the items, `gather` joins every process's value in process order and
    `gather_items` the shares' values in item order; nested `primary_decides`,
    `broadcast`, `sync`, `split` and `gather` inside process 0's decision talk to no other
    process (it takes every item), so the calls both processes make afterwards still pair
    up."""
    script = (
        JOIN
        + """
def alone():
    parallel.sync("inside")
    mine = parallel.split(range(5))
    return parallel.primary_decides(lambda: 1) + parallel.broadcast(2) + sum(mine)
print(parallel.primary_decides(alone), parallel.broadcast(parallel.is_primary() and 7),
      parallel.gather(parallel.split(range(5))),
      parallel.gather_items({i: i * i for i in parallel.split(range(5))}, range(5)))
"""
    )
    # Out of step, process 1 would wait for a key process 0 never sets: a timeout here.
    results = finish(start_local(["-c", script], processes=2, devices=1), timeout=120)
    _check_exits(results, 0)
    # Process 0 alone took all 5 items (10 + 1 + 2); the squares come back in item order.
    every = "13 7 [[0, 2, 4], [1, 3]] [0, 1, 4, 9, 16]"
    assert [out.strip() for _, out, _ in results] == [every, every]


def test_a_one_process_launcher_refuses_several_naming_the_page(monkeypatch):
    from experiments import launch

    monkeypatch.setattr(parallel, "maybe_initialize_distributed", lambda: None)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    one = launch.LauncherFlags(None, None, None, None, None, False, name="strategies")
    with pytest.raises(ValueError, match="experiments.strategies runs in one process.*"
                       "docs/distributed.md"):  # fmt: skip
        launch.start_processes(one)
    launch.start_processes(one._replace(name="credit_accuracy", multi_process=True))


def test_ab_test_on_two_processes_splits_the_tasks_and_equals_one(checkpoints, tmp_path):  # noqa: F811
    """Each process plays half of the held-out tasks of both arms; the joined comparison is
    one process's (the same keys per task), written once."""
    flags = [f"--config.a={checkpoints['a']}", f"--config.b={checkpoints['b']}",
             "--config.tasks=4", "--config.samples=4", "--config.greedy=False",
             "--config.reps=200"]  # fmt: skip
    argv = ["-m", "experiments.ab_test", f"--workdir={tmp_path / 'two'}", *flags]
    _check_exits(finish(start_local(argv, processes=2, devices=1)), 0)
    config = ab_config.get_config()
    config.update(
        a=checkpoints["a"], b=checkpoints["b"], tasks=4, samples=4, greedy=False, reps=200
    )
    one = ab_test.run(config, str(tmp_path / "one"))
    two = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert two == json.loads(json.dumps(one, default=float))
    assert sorted(os.listdir(tmp_path / "two")) == ["provenance.json", "summary.json", "summary.md"]
