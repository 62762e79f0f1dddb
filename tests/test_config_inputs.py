"""Typed configs refuse the bad values a hostile user types, naming the field; the host's
workdir guard and checkpoint restore stay quiet and exact (no training: every case fails
in a config's `__post_init__` or a host helper)."""

import asyncio
import math

import pytest

from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.host import loop
from rlagent.host.loop import quiet_closed_loops
from rlagent.host.workdir import RunError
from rlagent.host.workdir import prepare_workdir
from rlagent.host.writers import MetricWriter
from rlagent.models import PolicyConfig
from rlagent.rollout import RolloutConfig
from rlagent.train.config import TrainConfig


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_updates": 2.5}, "TrainConfig.num_updates must be an integer, got 2.5"),
        ({"group_size": True}, "TrainConfig.group_size must be an integer"),
        ({"learning_rate": math.nan}, "TrainConfig.learning_rate must be a finite number"),
        ({"learning_rate": math.inf}, "TrainConfig.learning_rate must be a finite number"),
        ({"entropy_coef": math.nan}, "TrainConfig.entropy_coef must be a finite number"),
        ({"reward_weights": (math.nan, 0.0, 0.0)}, "TrainConfig.reward_weights must be a finite"),
        ({"learning_rate": -1.0}, "TrainConfig.learning_rate must be > 0, got -1.0"),
        ({"clip_high": 0.0}, "TrainConfig.clip_high must be > 0"),
        ({"dual_clip": 0.5}, "TrainConfig.dual_clip must be > 1 or None"),
        ({"value_clip": -0.2}, "TrainConfig.value_clip must be >= 0 or None"),
        ({"value_coef": -1.0}, "TrainConfig.value_coef must be >= 0"),
        ({"kl_coef": -1.0}, "TrainConfig.kl_coef must be >= 0"),
        ({"kl_target": -0.1}, "TrainConfig.kl_target must be > 0 or None"),
        ({"kl_horizon": 0.0}, "TrainConfig.kl_horizon must be > 0"),
        ({"max_grad_norm": 0.0}, "TrainConfig.max_grad_norm must be > 0"),
        ({"weight_decay": -1.0}, "TrainConfig.weight_decay must be >= 0"),
        ({"warmup_updates": -1}, r"TrainConfig.warmup_updates must be in \[0, num_updates\]"),
        ({"warmup_updates": 61}, r"TrainConfig.warmup_updates must be in \[0, num_updates\]"),
        ({"prm_temperature": 0.0}, "TrainConfig.prm_temperature must be > 0"),
        ({"violation_penalty": -1.0}, "TrainConfig.violation_penalty must be >= 0"),
        ({"gigpo_omega": -1.0}, "TrainConfig.gigpo_omega must be >= 0"),
    ],
)
def test_train_config_refuses_bad_values_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**fields)


def test_train_config_keeps_the_edges_of_its_ranges():
    TrainConfig(warmup_updates=60, value_clip=0.0, dual_clip=None, kl_target=0.02)


@pytest.mark.parametrize(("level", "max_turns", "easiest"), [(2, 2, 3), (4, 4, 5), (1, 1, 2)])
def test_toolworld_refuses_a_turn_limit_no_task_fits(level, max_turns, easiest):
    with pytest.raises(ValueError, match=rf"ToolWorldConfig.max_turns: must be >= {easiest}"):
        ToolWorldConfig(level=level, max_turns=max_turns)
    assert ToolWorldConfig(level=level, max_turns=easiest).max_turns == easiest


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dtype": "float13"}, "PolicyConfig.dtype must name a floating-point dtype"),
        ({"param_dtype": "int32"}, "PolicyConfig.param_dtype must name a floating-point dtype"),
        ({"copy_prior": math.nan}, "PolicyConfig.copy_prior must be finite or None"),
        ({"d_model": 30, "num_heads": 2}, "the head width 15 .* must be even"),
        ({"head_dim": 7}, "the head width 7 .* must be even"),
    ],
)
def test_policy_config_refuses_what_the_model_cannot_build(fields, message):
    with pytest.raises(ValueError, match=message):
        PolicyConfig(**fields)


def test_rollout_config_refuses_a_nan_temperature():
    with pytest.raises(ValueError, match="RolloutConfig.temperature must be >= 0, got nan"):
        RolloutConfig(temperature=math.nan)


def test_a_workdir_that_is_a_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "results"
    path.write_text("not a folder")
    for resume in (False, True):
        with pytest.raises(RunError, match=rf"{path} is a file, not a folder"):
            prepare_workdir(str(path), resume=resume)
    assert path.read_text() == "not a folder"


def test_restores_run_on_loops_that_drop_completions_arriving_after_close():
    # A failed Orbax restore closes its loop while TensorStore reads are in flight; their
    # completions must not print 'RuntimeError: Event loop is closed' (rlagent.host.loop).
    policy = asyncio.get_event_loop_policy()
    with quiet_closed_loops():
        event_loop = asyncio.new_event_loop()
        event_loop.close()
        assert event_loop.call_soon_threadsafe(print) is None
    assert asyncio.get_event_loop_policy() is policy
    plain = asyncio.new_event_loop()
    plain.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        plain.call_soon_threadsafe(print)


def test_resume_refuses_a_damaged_metrics_csv_naming_it(tmp_path):
    writer = MetricWriter(str(tmp_path), tensorboard=False)
    writer.write([{"condition": "outcome", "update": 1, "seed": 0, "success": 0.5}])
    assert loop._stored_reach(writer, [("outcome", 0)]) == 1
    (tmp_path / "metrics.csv").write_bytes(b"not,a\x00csv\n\x01\x02\n")
    with pytest.raises(RunError, match=r"--resume: .*metrics.csv is damaged \(TypeError"):
        loop._stored_reach(writer, [("outcome", 0)])
