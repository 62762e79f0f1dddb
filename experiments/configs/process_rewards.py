"""Process rewards without hand labels: defaults of experiments/process_rewards.py.

Usage:
  python -m experiments.process_rewards --workdir=runs/process_rewards
  python -m experiments.process_rewards --config.seeds=2 --config.train.num_updates=20

Sized for the 2-core CPU (about 20 minutes in all before the epsilon = 0 anchor and the
held-out evaluation were added, not remeasured since: the label study, then every PRM kind's
PPO run); experiments/configs/process_rewards_accel.py is the accelerator's size. The
`env`, `model`, `rollout` and `train` sections are the main experiment's
(experiments/configs/sparse_vs_dense.py), so conditions compare with its results.
"""

import ml_collections

from experiments.configs import sparse_vs_dense

# The three ways a PRM's scores p_s enter the reward (rlagent.train.rewards).
FORMS = ("learned_sum", "learned_min", "learned_potential")


def conditions(kinds, noise_levels, *, noise_forms=("learned_sum",)) -> str:
    """The comma-separated conditions: the oracle baselines, the noisy oracle at each
    level in `noise_forms`, and every PRM kind of `kinds` in all three forms."""
    names = ["outcome", "process", "potential"]
    names += [f"{form}/prm=noisy_oracle@{eps:g}" for eps in noise_levels for form in noise_forms]
    names += [f"{form}/prm={kind}" for kind in kinds for form in FORMS]
    return ",".join(names)


def get_config() -> ml_collections.ConfigDict:
    config = sparse_vs_dense.get_config()
    # Conditions, comma-separated: a reward form (rlagent.train.config.REWARDS), trained
    # without a PRM, or `form/prm=<kind>` (rlagent.prm.PRMS), `form/prm=noisy_oracle@<eps>`
    # (each verdict label flipped with probability eps). Conditions of one PRM kind (and
    # noise) share one compiled program; learned_* forms need a PRM.
    # The noisy oracle in all three forms (data of one program per noise level).
    # epsilon = 0 is the noisy oracle's own anchor: the oracle's labels, scored as the
    # noisy ones are (binary, neutral steps 1/2).
    config.conditions = conditions(
        ("completion", "progress", "implicit"), (0.0, 0.1, 0.25, 0.4), noise_forms=FORMS
    )
    config.seeds = 5
    config.chunk_size = 10
    config.train.num_updates = 100
    # Held-out evaluation after the last update (64 fixed episodes, sampled and greedy).
    config.eval.every = config.train.num_updates
    # PRM settings (rlagent.prm.PRMConfig fields; `kind` and `noise` are set per condition;
    # `prover_epsilon`, the oracle's share of the PAV prover's continuations, is 0.5 by
    # default: --config.prm.prover_epsilon=0 makes the prover the policy alone).
    config.prm.label_episodes = 8  # of the 64 episodes per update, labelled by MC.
    config.prm.label_samples = 4  # N continuations per label.

    # The label-quality study (experiments.studies.label_quality), run after training.
    labels = ml_collections.ConfigDict()
    # Behaviour policies whose turns are labelled: environment-level ('random',
    # 'prover_<eps>': per turn the oracle with probability eps, else random) or 'ppo_<k>'
    # (the policy LM after k PPO updates of `labels.ppo`; early LMs make almost only
    # mistakes on level 2, leaving the AUROC undefined).
    labels.behaviours = "prover_0.5"
    # Completers (completion labels) = provers (progress labels): 'policy' (the behaviour
    # itself), 'policy+oracle_<eps>' (a continuation is the oracle's with probability eps),
    # 'random', 'prover_<eps>', 'oracle'.
    labels.completers = "random,policy,policy+oracle_0.5,prover_0.9,oracle"
    labels.samples = "1,2,4,8,16"  # N continuations per label.
    labels.seeds = 3
    labels.first_seed = 0
    labels.num_episodes = 32  # behaviour episodes per seed.
    labels.chunk_size = 4096  # continuations played at once (memory bound).
    labels.horizon = 0  # 0: the experiment's env; h > 0: rlagent.envs.horizon_config(h).
    labels.model = config.model
    labels.rollout = config.rollout
    labels.ppo = ml_collections.ConfigDict(  # the run behind 'ppo_<k>' (TrainConfig fields).
        dict(estimator="gae_turn", reward="potential", learning_rate=1e-3)
    )
    config.labels = labels
    return config
