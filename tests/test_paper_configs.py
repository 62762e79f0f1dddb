"""experiments/configs/papers: every paper's config is accepted by its study, and sets
the conditions its docstring names (docs/papers.md reads the runs they reproduce)."""

import importlib

import pytest

from experiments.configs import horizon_no_oracle
from experiments.studies import common
from experiments.studies import horizon_sweep
from experiments.studies import sparse_vs_dense
from experiments.studies import strategies

# paper -> (the study that runs it, what must be among its runs).
PAPERS = {
    "gigpo": ("horizon_sweep", {"process/grpo", "process/gigpo", "process/gae_turn"}),
    "archer": (
        "horizon_sweep",
        {"process/gae_turn", "process/gae_token@0.9", "process/hierarchical"},
    ),
    "pure": (
        "process_rewards",
        {
            f"{f}/prm={k}"
            for f in ("learned_sum", "learned_min")
            for k in ("completion", "progress", "implicit")
        }
        | {"outcome"},
    ),  # fmt: skip
    "pav": (
        "process_rewards",
        {"outcome", "learned_potential/prm=progress", "learned_sum/prm=progress"},
    ),
    "prime": (
        "process_rewards",
        {"outcome", "learned_sum/prm=implicit", "learned_potential/prm=implicit"},
    ),
    "math_shepherd": ("process_rewards", {"outcome"}),
    "potential_shaping": ("sparse_vs_dense", {"outcome", "potential"}),
    "eto_sdpo": (
        "strategies",
        {
            f"{group}/{n}"
            for group in ("offline_dpo", "offline_dpo_trajectory", "offline_sft", "offline_sft_dpo")
            for n in (32, 128, 512)
        },
    ),
    "tree_grpo": (
        "horizon_sweep",
        {"outcome/gae_turn", "outcome/grpo", "outcome/gigpo", "outcome/tree_grpo"},
    ),
}


def _labels(study, config):
    if study == "horizon_sweep":
        return {
            label for _, runs in horizon_sweep.plan(config) for r in runs for label in r.conditions
        }
    if study == "strategies":  # offline groups only: every one a data-size curve
        sizes = common.ints(config.data_sizes, "data_sizes", "number of pairs")
        return {f"{group}/{n}" for group in strategies._setup(config).groups for n in sizes}
    runs = (
        common.prm_runs(config)
        if study == "process_rewards"
        else sparse_vs_dense.reward_runs(config)
    )
    common.check_runs(runs, config)
    return {label for r in runs for label in r.conditions}


@pytest.mark.parametrize("paper", sorted(PAPERS))
def test_paper_config_plans_its_conditions(paper):
    study, expected = PAPERS[paper]
    module = importlib.import_module(f"experiments.configs.papers.{paper}")
    assert f"python -m experiments.{study} --config=experiments/configs/papers/{paper}.py" in (
        " ".join(module.__doc__.split()).replace("\\ ", "")
    )
    assert _labels(study, module.get_config()) == expected


def test_the_eto_sdpo_arms_differ_in_their_loss_and_schedule_only():
    from experiments.configs.papers import eto_sdpo

    config = eto_sdpo.get_config()
    arms = strategies.offline_arms(config, strategies._setup(config).offline)
    assert arms["offline_dpo"].level == "segment" and arms["offline_dpo"].sft_steps == 0
    assert {name: (c.level, c.sft_steps) for name, c in arms.items() if name != "offline_dpo"} == {
        "offline_dpo_trajectory": ("trajectory", 0),
        "offline_sft": ("trajectory", 200),
        "offline_sft_dpo": ("trajectory", 100),
    }
    same = {"num_updates", "pairs_per_step", "beta", "learning_rate", "kind", "length_norm"}
    assert all(
        all(getattr(c, f) == getattr(arms["offline_dpo"], f) for f in same) for c in arms.values()
    )
    assert (config.seeds, config.eval_tasks, config.env.task_split) == (20, "heldout", "train")
    config.sft_dpo_steps = 201
    with pytest.raises(ValueError, match=r"config.sft_dpo_steps must be in \[0, offline"):
        strategies._setup(config)


def test_the_long_horizon_question_config_plans_from_the_weak_start():
    config = horizon_no_oracle.get_config()
    plans = horizon_sweep.plan(config)
    assert [h for h, _ in plans] == [12, 16]
    assert horizon_sweep._demo_horizons(config, 12) == [3, 5, 7]
    labels = {label for _, runs in plans for r in runs for label in r.conditions}
    assert labels == {
        "outcome/gae_token",
        "process/gae_token",
        "learned_potential/prm=implicit/gae_token",
        "learned_potential/prm=completion/gae_token",
    }


def test_the_long_horizon_question_heldout_variant_reads_no_oracle_in_its_no_oracle_arms():
    from rlagent.prm.config import PRMConfig

    config = horizon_no_oracle.get_config("heldout")
    plans = horizon_sweep.plan(config)
    assert [h for h, _ in plans] == [12, 16] and config.seeds == 20
    assert horizon_sweep._demo_horizons(config, 12) == [3, 5, 7]
    for _, runs in plans:
        assert [c for r in runs for c in r.conditions] == [
            "outcome/gae_token", "process/gae_token", "learned_potential/prm=progress/gae_token",
            "learned_potential/prm=implicit/gae_token",
            "outcome/tree_grpo+tree_branch_at=surprisal",
        ]  # fmt: skip
        assert {(r.config.env.task_split, r.config.eval.tasks) for r in runs} == {
            ("train", "heldout")
        }
        tree = runs[-1].config.train
        branch = ("tree_grpo", 2, "surprisal")
        assert (tree.estimator, tree.tree_branches, tree.tree_branch_at) == branch
    prm = PRMConfig.from_mapping({**dict(config.prm), "kind": "progress"})
    assert prm.prover_epsilon == 0.0 and prm.prover_best_of == 2
    assert config.paired_to == "process/gae_token"
    with pytest.raises(ValueError, match="known variants: heldout"):
        horizon_no_oracle.get_config("held_out")


def test_the_no_oracle_process_rewards_config_reads_no_oracle_in_training():
    from experiments.configs import process_rewards_no_oracle
    from rlagent.prm.config import PRMConfig

    config = process_rewards_no_oracle.get_config()
    labels = _labels("process_rewards", config)
    assert {"learned_centred/prm=progress", "learned_centred/prm=implicit"} <= labels
    assert not any("noisy_oracle" in label for label in labels)
    prm = PRMConfig.from_mapping({**dict(config.prm), "kind": "progress"})
    assert prm.prover_epsilon == 0.0 and prm.prover_best_of == 2
