"""experiments.ab_test: two checkpoints on the same held-out tasks, refusals by field."""

import dataclasses
import json
import os

import pytest
from flax import nnx

from experiments import launch
from experiments.configs import ab_test as ab_config
from experiments.studies import ab_test
from rlagent.envs.dialogue import DialogueConfig
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.host import provenance
from rlagent.host import shadow
from rlagent.host.workdir import RunError
from rlagent.models import Policy
from rlagent.rollout import RolloutConfig

# The tiny setup of tests/test_shadow.py's episodes (one compiled rollout for both files).
ENV = ToolWorldConfig(level=1, max_turns=3)
ROLLOUT = RolloutConfig(window=None, constrained=True)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny_policy_config):
    """Two tiny policies of one env and model (seeds 0 and 1), and a bigger model."""
    root = tmp_path_factory.mktemp("checkpoints")
    out = {}
    for name, seed, overrides in (("a", 0, {}), ("b", 1, {}), ("wide", 0, {"mlp_dim": 48})):
        policy_config = tiny_policy_config(num_summary_slots=0, **overrides)
        params = nnx.state(Policy(policy_config, rngs=nnx.Rngs(seed)))
        config = provenance.resolved(env=ENV, model=policy_config, rollout=ROLLOUT)
        shadow.save_checkpoint(str(root / name), params, config, step=1)
        out[name] = str(root / name)
    return out


def _config(a, b, **fields):
    config = ab_config.get_config()
    config.update(a=a, b=b, tasks=2, samples=4, greedy=False, reps=200, **fields)
    return config


def test_env_kind_is_read_from_the_stored_fields():
    for kind, cfg in (("toolworld", ToolWorldConfig()), ("dialogue", DialogueConfig())):
        fields = provenance.resolved(env=cfg)["env"]
        assert ab_test.env_section(fields)["kind"] == kind
    with pytest.raises(ValueError, match="no environment kind has the config fields"):
        ab_test.env_section({"level": 1})


def test_different_environments_or_models_are_refused_naming_the_field():
    base = provenance.resolved(env=ENV, model={"d_model": 32}, rollout=ROLLOUT)
    ab_test.check_same(base, json.loads(json.dumps(base)))
    other = provenance.resolved(
        env=dataclasses.replace(ENV, level=2), model={"d_model": 32}, rollout=ROLLOUT
    )
    with pytest.raises(ValueError, match=r"differ \(A -> B\) in env.level: 1 -> 2"):
        ab_test.check_same(base, other)
    wider = {**base, "model": {"d_model": 64}}
    with pytest.raises(ValueError, match=r"model.d_model: 32 -> 64.*one environment and model"):
        ab_test.check_same(base, wider)


def test_ab_run_writes_paired_results_and_refuses_reruns(checkpoints, tmp_path):
    workdir = str(tmp_path / "ab")
    summary = ab_test.run(_config(checkpoints["a"], checkpoints["b"], guardrail_b="mask"), workdir)
    assert sorted(os.listdir(workdir)) == ["provenance.json", "summary.json", "summary.md"]
    assert summary["verdict"].split(":")[0] in (
        "B better than A on success",
        "B worse than A on success",
        "Cannot tell B from A on success",
    )
    assert (
        summary["arms"]["B"]["guardrail"] == "mask" and summary["arms"]["A"]["guardrail"] == "off"
    )
    assert summary["per_task"]["B"]["violations"] == [0.0, 0.0]  # masked rules are never broken
    assert set(summary["pass"]) == {f"pass{s}{k}" for s in "@^" for k in range(1, 5)}
    assert summary["comparisons"]["success"]["tasks"] == 2
    with open(os.path.join(workdir, "summary.md")) as f:
        assert f.readline() == "# A/B test\n" and summary["verdict"] in f.read()
    stored = provenance.read(workdir)
    assert stored["arms"]["A"]["version"].startswith(checkpoints["a"])
    with pytest.raises(RunError, match="is not empty"):
        ab_test.run(_config(checkpoints["a"], checkpoints["b"]), workdir)


def test_a_different_model_exits_with_one_line_before_writing(checkpoints, tmp_path):
    workdir = str(tmp_path / "x")
    config = _config(checkpoints["a"], checkpoints["wide"])
    with pytest.raises(SystemExit) as exit_info:  # the launcher's way out (launch.run_reported)
        launch.run_reported(lambda: ab_test.run(config, workdir))
    assert str(exit_info.value).startswith(
        "error: checkpoints A and B differ (A -> B) in model.mlp_dim: 32 -> 48"
    )
    assert not os.path.exists(workdir)
