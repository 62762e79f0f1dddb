"""Every study refuses a bad config value before it writes anything, naming the field.

Each case calls a study's `run` in-process with one hostile override of its default
config. Reaching the workdir (`prepare_workdir`) fails the test at once instead of
training, so a check that goes missing costs no compile.
"""

import importlib
import math
import os
import subprocess
import sys

import pytest
from flax import nnx

from experiments import dialogue_baselines
from experiments import mastermind_differential
from experiments.studies import common
from rlagent.envs.toolworld import ToolWorldConfig
from rlagent.host import provenance
from rlagent.host import shadow
from rlagent.host import workdir as workdir_module
from rlagent.models import Policy
from rlagent.rollout import RolloutConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STUDY_MODULES = (
    "sparse_vs_dense", "process_rewards", "credit_accuracy", "horizon_sweep", "dialogue",
    "generalization", "rs_sft", "curriculum", "ab_test", "shadow", "strategies",
)  # fmt: skip


def _reached(*args, **kwargs):
    raise AssertionError("the study reached its workdir: the bad value was not refused")


@pytest.fixture(autouse=True)
def no_workdir(monkeypatch):
    """`prepare_workdir` / `common.prepare` fail the test (every study calls one first)."""
    for name in STUDY_MODULES:
        module = importlib.import_module(f"experiments.studies.{name}")
        if hasattr(module, "prepare_workdir"):
            monkeypatch.setattr(module, "prepare_workdir", _reached)
    monkeypatch.setattr(common, "prepare", _reached)
    monkeypatch.setattr(workdir_module, "prepare_workdir", _reached)


def refused(tmp_path, study: str, message: str, config_name: str | None = None, **fields):
    """Runs `study` with `fields` (dotted paths, `__` for `.`) set in its default config;
    asserts a one-line ValueError matching `message` and an untouched workdir."""
    config = importlib.import_module(f"experiments.configs.{config_name or study}").get_config()
    for path, value in fields.items():
        *parents, last = path.split("__")
        node = config
        for parent in parents:
            node = node[parent]
        with node.ignore_type():
            node[last] = value
    workdir = tmp_path / "run"
    module = importlib.import_module(f"experiments.studies.{study}")
    with pytest.raises(ValueError, match=message) as error:
        module.run(config, str(workdir))
    assert "\n" not in str(error.value)
    assert not workdir.exists()


@pytest.mark.parametrize(
    ("study", "fields", "message"),
    [
        ("sparse_vs_dense", {"seeds": 2.5}, r"config.seeds must be an integer, got 2.5"),
        ("sparse_vs_dense", {"chunk_size": 2.5}, r"config.chunk_size must be an integer"),
        ("sparse_vs_dense", {"train__learning_rate": math.nan}, "learning_rate must be a finite"),
        ("horizon_sweep", {"seeds": 0}, r"config.seeds must be >= 1, got 0"),
        ("horizon_sweep", {"chunk_size": 0}, r"config.chunk_size must be >= 1, got 0"),
        ("horizon_sweep", {"slack": 2.5}, r"config.slack must be an integer"),
        ("horizon_sweep", {"eval__every": -1}, r"EvalConfig.every must be >= 0"),
        ("horizon_sweep", {"probe__every": -1}, r"ProbeConfig.every must be >= 0"),
        ("horizon_sweep", {"warm_start__steps": -1}, r"WarmStartConfig.steps must be >= 0"),
        ("horizon_sweep", {"warm_start_horizons": "99"}, r"config.warm_start_horizons: "),
        ("rs_sft", {"seeds": 0}, r"config.seeds must be >= 1, got 0"),
        ("rs_sft", {"chunk_size": 0}, r"config.chunk_size must be >= 1, got 0"),
        ("curriculum", {"seeds": 0}, r"config.seeds must be >= 1, got 0"),
        ("curriculum", {"chunk_size": -1}, r"config.chunk_size must be >= 1, got -1"),
        ("credit_accuracy", {"seeds": 2.5}, r"config.seeds must be an integer, got 2.5"),
        ("credit_accuracy", {"num_samples": 0}, r"config.num_samples must be >= 1, got 0"),
        ("credit_accuracy", {"critic_samples": -1}, r"config.critic_samples must be >= 1"),
        ("credit_accuracy", {"chunk_size": 0}, r"config.chunk_size must be >= 1, got 0"),
        ("credit_accuracy", {"ppo__estimator": "bogus"}, r"config.ppo: Unknown estimator"),
        (
            "credit_accuracy",
            {"estimators": "gae_token@x"},
            r"config.estimators: 'gae_token@x': lam",
        ),
        ("credit_accuracy", {"estimators": "bogus"}, r"config.estimators: 'bogus': Unknown"),
        ("dialogue", {"conditions": "dialogue/prm=implicit"}, r"config.conditions: 'dialogue/prm"),
        ("dialogue", {"credit__num_samples": 0}, r"config.credit.num_samples must be >= 1"),
        ("generalization", {"seeds": 2.5}, r"config.seeds must be an integer, got 2.5"),
        ("generalization", {"credit_reward": "bogus"}, r"config.credit_reward 'bogus' must be"),
        ("generalization", {"credit_policy": "oracle"}, r"config.credit_policy 'oracle' must"),
        ("ab_test", {"a": "A", "b": "B", "tasks": 1}, r"config.tasks must be >= 2, got 1"),
        ("ab_test", {"a": "A", "b": "B", "samples": 0}, r"config.samples must be >= 1, got 0"),
        ("ab_test", {"a": "A", "b": "B", "alpha": math.nan}, r"config.alpha must be in \(0, 1\)"),
        ("ab_test", {"a": "A", "b": "B", "greedy": "yes"}, r"config.greedy must be True or"),
        ("shadow", {"policy": "P", "rounds": 0}, r"config.rounds must be >= 1, got 0"),
        ("shadow", {"policy": "P", "samples": 1}, r"config.samples must be >= 2, got 1"),
        ("shadow", {"policy": "P", "judge": "bogus"}, r"config.judge must be one of"),
        ("shadow", {"policy": "P", "ab__tasks": 1}, r"config.ab.tasks must be >= 2, got 1"),
        ("shadow", {"policy": "P", "traffic_seed": -1}, r"config.traffic_seed must be >= 0"),
        ("ab_test", {"a": "A", "b": "B", "first_seed": -1}, r"config.first_seed must be >= 0"),
        ("shadow", {"policy": "P", "ab__first_seed": -1}, r"config.ab.first_seed must be >= 0"),
        ("horizon_sweep", {"horizons": "3,03"}, r"config.horizons names horizon \[3\] more than"),
        (
            "horizon_sweep",
            {"paired_to": "outcome/gpro"},
            r"config.paired_to: \['outcome/gpro'\] are",
        ),
        ("horizon_sweep", {"estimators": "gae_turn"}, r"config.estimators: 'gae_turn' trains what"),
        ("horizon_sweep", {"estimators": "grpo,grpo@0.95"}, r"'grpo@0.95' trains what 'grpo'"),
        ("dialogue", {"feedback__rates": "1,1.0"}, r"config.feedback.rates names probability"),
        ("credit_accuracy", {"model__d_model": 0}, r"config.model: PolicyConfig.d_model must"),
        (
            "process_rewards",
            {"conditions": "learned_sum/prm=bogus"},
            r"'learned_sum/prm=bogus': Unk",
        ),
        (
            "process_rewards",
            {"conditions": "learned_sum/prm=noisy_oracle@0.1,learned_sum/prm=noisy_oracle@0.10"},
            r"config.conditions: 'learned_sum/prm=noisy_oracle@0.1' and .* are one condition",
        ),
        ("process_rewards", {"labels__behaviours": "ppo_-1"}, r"'ppo_-1': the number of updates"),
        ("process_rewards", {"labels__horizon": -1}, r"config.labels.horizon must be >= 0, got -1"),
        (
            "process_rewards",
            {"labels__behaviours": "ppo_1", "labels__ppo__estimator": "bogus"},
            r"config.labels.ppo: Unknown estimator 'bogus'",
        ),
        ("generalization", {"rewards__labels__samples": 0}, r"rewards: config.labels.samples must"),
        ("strategies", {"eval_every": 0}, r"config.eval_every must be >= 1, got 0"),
        # A value the section's dataclass refuses names the section.
        ("sparse_vs_dense", {"model__num_heads": 3}, r"config.model: d_model=32 is not divisible"),
        ("strategies", {"data_sizes": "32,032"}, r"config.data_sizes names pair count \[32\] more"),
        ("strategies", {"data_sizes": "0"}, r"config.data_sizes: pair count 0 is below 1"),
        (
            "strategies",
            {"judges": "outcome,outcome@1"},
            r"config.judges names judge 'outcome@1' tw",
        ),
        ("strategies", {"offline_judge": "bogus"}, r"config.offline_judge: Unknown judge 'bogus'"),
        ("strategies", {"grpo_estimator": "bogus"}, r"config.grpo_estimator: Unknown estimator"),
        ("strategies", {"prm_kind": "bogus"}, r"config.prm_kind: Unknown PRMConfig.kind 'bogus'"),
        ("strategies", {"behaviour": "bogus"}, r"config.behaviour: Unknown policy 'bogus'"),
        # The same entry spelt two ways would train and count the same runs twice.
        (
            "credit_accuracy",
            {"estimators": "gae_token@0.9,gae_token@0.90"},
            r"config.estimators: 'gae_token@0.9' and 'gae_token@0.90' name the same estimator",
        ),
        (
            "credit_accuracy",
            {"policies": "ppo_0,ppo_00"},
            r"config.policies: 'ppo_0' and 'ppo_00' name the same policy",
        ),
        ("curriculum", {"stages": "h3,h03"}, r"config.stages: 'h3' and 'h03' name the same stage"),
        (
            "curriculum",
            {"schedules": "success/frontier_share=0.5,success/frontier_share=0.50"},
            r"config.schedules: 'success/frontier_share=0.5' and .* name the same schedule",
        ),
        (
            "rs_sft",
            {"thresholds": "outcome@1,outcome@1.0"},
            r"config.thresholds names judge@threshold \['outcome@1'\] more than once",
        ),
    ],
)
def test_counts_and_sections_are_refused_before_the_workdir(tmp_path, study, fields, message):
    refused(tmp_path, study, message, **fields)


@pytest.mark.parametrize("spec", ["learned_sum/prm=bogus", "process/prm=noisy_oracle@0.1"])
def test_the_main_experiment_refuses_per_condition_prms_it_would_ignore(tmp_path, spec):
    # It trains config.prm for every condition: the label's PRM would be silently dropped.
    refused(
        tmp_path,
        "sparse_vs_dense",
        rf"config.conditions: '{spec}': this study trains",
        conditions=spec,
    )


@pytest.mark.parametrize("study", ["process_rewards", "horizon_sweep", "critic_factorial"])
@pytest.mark.parametrize("kind", ["missing", "file"])
def test_a_report_of_nothing_is_refused_and_writes_nothing(tmp_path, study, kind):
    # Reading a report's CSVs created the folder (or failed on a file with a traceback).
    config = importlib.import_module(f"experiments.configs.{study}").get_config()
    workdir = tmp_path / "run"
    if kind == "file":
        workdir.write_text("not a folder")
    module = importlib.import_module(f"experiments.studies.{study}")
    with pytest.raises(ValueError, match=r"holds no finished|no critic's sweep has finished"):
        module.run(config, str(workdir), report_only=True)
    if kind == "file":
        assert workdir.read_text() == "not a folder"
    else:
        assert not workdir.exists()


def test_a_compilation_cache_that_is_a_file_is_refused_in_one_line(tmp_path):
    cache, out = tmp_path / "cache", tmp_path / "out"
    cache.write_text("not a folder")
    result = subprocess.run(
        [sys.executable, "-m", "experiments.sparse_vs_dense", f"--workdir={out}",
         f"--compilation_cache_dir={cache}"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: --compilation_cache_dir (or $JAX_COMPILATION_CACHE_DIR): {cache} is a file, "
        "not a folder."
    )
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_a_learned_form_without_a_prm_is_refused_before_the_workdir(tmp_path):
    refused(
        tmp_path,
        "sparse_vs_dense",
        "reads a process reward model's scores",
        conditions="learned_sum",
    )


def test_damaged_checkpoint_folders_are_refused_naming_them(tmp_path, tiny_policy_config):
    policy_config = tiny_policy_config(num_summary_slots=0)
    config = provenance.resolved(
        env=ToolWorldConfig(level=1, max_turns=3), model=policy_config, rollout=RolloutConfig()
    )
    folder = tmp_path / "policy"
    shadow.save_checkpoint(
        str(folder), nnx.state(Policy(policy_config, rngs=nnx.Rngs(0))), config, step=1
    )
    with pytest.raises(ValueError, match=r"@abc: the checkpoint step 'abc' is not a whole number"):
        shadow.load_checkpoint(f"{folder}@abc")
    for path in (folder / "checkpoints" / "1").rglob("*"):
        if path.is_file():
            path.write_text("garbage")
    with pytest.raises(ValueError, match=rf"^{folder}: cannot read the checkpoint \("):
        shadow.load_checkpoint(str(folder))
    (folder / "provenance.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"provenance.json is not valid JSON"):
        shadow.load_checkpoint(str(folder))


def test_baseline_scripts_refuse_counts_and_levels_that_measure_nothing():
    assert dialogue_baselines.levels(" 2, 3,", 5) == [2, 3]
    for text, episodes, message in (
        ("1", 0, r"--episodes must be >= 1, got 0"),
        ("", 5, r"--levels names no level"),
        ("9", 5, r"--levels: '9': DialogueConfig.level"),
        ("1,1", 5, r"--levels names a level more than once"),
    ):
        with pytest.raises(ValueError, match=message):
            dialogue_baselines.levels(text, episodes)
    mastermind_differential.check_flags(1, 1)
    with pytest.raises(ValueError, match=r"--games must be >= 1, got 0"):
        mastermind_differential.check_flags(0, 10)
    with pytest.raises(ValueError, match=r"--oracle_games must be >= 1, got -1"):
        mastermind_differential.check_flags(10, -1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["experiments.ab_test", "--config=experiments/configs/nope.py", "--a=x", "--b=y"],
         "error: --config: [Errno 2] No such file or directory: 'experiments/configs/nope.py'"),
        (["experiments.sparse_vs_dense", "--config=experiments/configs/nope.py"],
         "error: --config: [Errno 2] No such file or directory: 'experiments/configs/nope.py'"),
        (["experiments.dialogue_baselines", "--episodes=0"],
         "error: --episodes must be >= 1, got 0."),
        # absl's own flag errors, as one line (launch.parse_flags).
        (["experiments.sparse_vs_dense", "--config.seeds=2.5"],
         "error: flag --config.seeds=2.5: invalid literal for int() with base 10: '2.5'"),
        (["experiments.pipeline", "--no_such_flag=1"],
         "error: Unknown command line flag 'no_such_flag'"),
    ],
)  # fmt: skip
def test_launchers_exit_with_one_line_errors(tmp_path, args, message):
    out = tmp_path / "out"
    where = f"--out={out}" if args[0].endswith("baselines") else f"--workdir={out}"
    result = subprocess.run(
        [sys.executable, "-m", *args, where], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == message
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_the_guardrail_sweep_refuses_an_environment_without_guardrails(tmp_path):
    config = importlib.import_module("experiments.configs.dialogue").get_config()
    with pytest.raises(ValueError, match=r"--guardrail_sweep: config.env.kind 'dialogue' has no"):
        importlib.import_module("experiments.studies.sparse_vs_dense").run(
            config, str(tmp_path / "run"), guardrail_sweep=True
        )
    assert not (tmp_path / "run").exists()
