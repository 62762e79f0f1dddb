"""Training strategies compared on ToolWorld level 2: PPO, GRPO, offline DPO, online DPO.

Usage:
  python -m experiments.strategies --workdir=runs/strategies
  python -m experiments.strategies --config.seeds=20 --config.online.num_updates=300

The defaults (3 seeds) took 226 s on the quiet 2-core AMD EPYC machine at 1d7a7ff, the
compilation cache off (docs/results/strategies_amd), and 1,024 s on a shared Intel Xeon
one at 7f6b8e0 (docs/results/strategies); every strategy gets a similar budget of
environment turns (`docs/preference.md` lists them).
A killed run continues with `--resume` (the config must not change).
"""

import ml_collections

from experiments.studies.envs import env_section
from experiments.studies.sections import section
from rlagent.envs.toolworld import dsl
from rlagent.models import PolicyConfig
from rlagent.preference.dpo import DPOConfig
from rlagent.rollout import RolloutConfig
from rlagent.train.config import TrainConfig


def get_config(kind: str = "") -> ml_collections.ConfigDict:
    """The study on ToolWorld level 2; `kind` (`--config=<this file>:<kind>`, e.g.
    `:dialogue`; experiments.studies.envs.KINDS): on that environment's defaults, the
    model reading its vocabulary, everything else as here."""
    config = ml_collections.ConfigDict()
    config.seeds = 3  # seeds per condition, trained side by side under vmap.
    config.first_seed = 0
    config.eval_every = 20  # online iterations between held-out evaluations (PPO: scaled).
    config.eval_episodes = 64  # held-out episodes per evaluation (sampled and greedy).
    # 'same': fresh keys of the training tasks; 'heldout': tasks training never draws (needs
    # a split, e.g. --config.env.task_split=train on ToolWorld; EvalConfig.tasks).
    config.eval_tasks = "same"
    # The groups of runs trained and reported (experiments.studies.strategies.GROUPS), each
    # one program and one folder of the workdir: a subset reruns part of the study.
    config.groups = "ppo,grpo,online_dpo,fork_dpo,online_dpo_prm,offline_dpo"

    config.env = env_section("toolworld", level=2)
    # The policy LM of experiments/configs/sparse_vs_dense.py, reading its full context
    # (every turn of the episode, S = 5) without a summary: the same information as a
    # window of 1 with a summary, in programs that compile about 3x faster on a CPU.
    config.model = section(
        PolicyConfig, vocab_size=dsl.VOCAB_SIZE, d_model=32, num_layers=1, num_heads=2,
        num_kv_heads=1, mlp_dim=64, summary_dim=32, num_summary_slots=0, copy_prior=3.0,
    )  # fmt: skip
    config.rollout = section(RolloutConfig, window=None, constrained=True)

    # PPO and GRPO with the outcome reward (TrainConfig fields; GRPO sets its estimator).
    config.ppo = section(
        TrainConfig, num_updates=40, num_groups=8, group_size=8, reward="outcome",
        estimator="gae_turn", learning_rate=1e-3,
    )  # fmt: skip
    config.grpo_estimator = "grpo"

    # Online DPO / RLAIF (DPOConfig fields): 8 tasks x 4 episodes per iteration.
    config.online = section(
        DPOConfig, num_updates=80, num_groups=8, group_size=4, beta=0.1, learning_rate=1e-3
    )
    # Judges of the online runs with trajectory pairs: `judge[@accuracy]`
    # (rlagent.preference.judges: outcome, guardrail, or a reward form; accuracy < 1 is
    # the noisy judge). They differ in data only and train in one program.
    config.judges = "outcome,guardrail,process,process@0.9,process@0.75,process@0.6"
    # Judges of the fork-pair runs (same DPOConfig, pairs='fork', segment level).
    config.fork_judges = "outcome,process"
    # The PRM judge: rlagent.prm kind (implicit: trained on episode outcomes only).
    config.prm_kind = "implicit"
    # Append every online iteration's judged pairs to <group>/pairs.jsonl as they come
    # (rlagent.preference.data records: the policy version, the judge and its scores).
    config.log_pairs = False

    # Offline DPO on logs of a behaviour policy (an environment-level policy of
    # experiments.studies.common.env_policy), ranked by `offline_judge`.
    config.behaviour = "prover_0.5"
    config.offline_judge = "outcome"
    config.data_sizes = "32,128,512"  # pairs: the data-size curve (one program).
    config.offline = section(DPOConfig, num_updates=200, pairs_per_step=32, beta=0.1,
                             learning_rate=1e-3, level="segment")  # fmt: skip
    # offline_sft_dpo's SFT steps on the chosen sides before its trajectory DPO (the
    # groups offline_dpo_trajectory / offline_sft / offline_sft_dpo: strategies.offline_arms).
    config.sft_dpo_steps = 100
    if kind:  # another environment, on its defaults; the model takes its vocabulary.
        config.env = env_section(kind, **({"level": 2} if kind == "toolworld" else {}))
        config.model.vocab_size = None
    return config
