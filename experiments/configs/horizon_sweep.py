"""The long-horizon study on the 2-core CPU (defaults of experiments/horizon_sweep.py).

Usage:
  python -m experiments.horizon_sweep --workdir=runs/horizon_sweep
  python -m experiments.horizon_sweep --config.horizons=3,8,16 --config.seeds=3

Budget: the reward-form comparison (outcome, clean process verdict, potential shaping,
and the implicit PRM's learned potential; gae_turn) at every horizon 3, 5, 8, 12, 16, and
the estimator comparison (gae_token with lambda 0.9, grpo, gigpo, hierarchical, each
against gae_turn) under the process verdict at horizons 8 and 12; 5 seeds, 60 updates
of 8 x 8 episodes, each horizon warm-started on its own tasks. Measured: 26 min 34 s
on the 2-core CPU with nothing else running, and 39 min 52 s while another job shared
the two cores (2,434 CPU-seconds). One program per horizon, estimator and PRM kind (18).

A tiny model does not learn an 8-turn plan from scratch in that budget (0 successes in 60
updates at h = 8, 2 seeds per reward form), so every condition of a horizon starts from
the same warm start per seed: 200 steps of behaviour cloning of oracle demonstrations
(`warm_start`; steps=0 turns it off). With `warm_start_horizons='same'` each horizon
clones its own tasks (sampled first-batch success 0.78-0.96 at every horizon), so no
horizon is further from its demonstrations than another; `'3,5,7'` clones short tasks
only for every horizon (the first study: success 0.97 within them, 0.14 at h = 8, 0 at
12 and 16), where the horizon is confounded with the distance from the demonstrations.
"""

import ml_collections

from experiments.configs import sparse_vs_dense
from experiments.studies.sections import section
from rlagent.pipeline.warm_start import WarmStartConfig


def get_config() -> ml_collections.ConfigDict:
    main = sparse_vs_dense.get_config()
    config = ml_collections.ConfigDict()
    # Shortest plans in turns (rlagent.envs.horizon_config: level-4 exchanges, distractors).
    config.horizons = "3,5,8,12,16"
    config.slack = 2  # turns allowed beyond the shortest plan: max_turns = h + slack.
    # Conditions, each with train.estimator at every horizon: reward forms
    # (rlagent.train.config.REWARDS), or a learned form with its process reward model
    # (`form/prm=<kind>`, rlagent.prm.PRMS; one compiled program per PRM kind).
    config.conditions = "outcome,process,potential,learned_potential/prm=implicit"
    # Estimator comparison: estimator_reward with each of these (`name@lam` sets GAE's
    # lambda) at estimator_horizons, against its train.estimator run ('' = none).
    config.estimators = "gae_token@0.9,grpo,gigpo,hierarchical"
    config.estimator_reward = "process"
    config.estimator_horizons = "8,12"
    # The report pairs every condition with the reference (the first condition with
    # train.estimator) at its horizon over seeds; these conditions are references too.
    config.paired_to = ""
    config.seeds = 5  # per condition and horizon, trained in parallel under vmap.
    config.first_seed = 0
    config.chunk_size = 10  # updates per jitted call between metric writes / checkpoints.
    # Warm start (rlagent.pipeline.warm_start): behaviour cloning of oracle episodes, per seed,
    # shared by every condition of a horizon. warm_start_horizons: 'same' (each horizon
    # clones its own tasks) or fixed horizons shared by the sweep (e.g. '3,5,7').
    config.warm_start = section(WarmStartConfig, steps=200, batch_size=16)
    config.warm_start_horizons = "same"
    config.model = main.model  # the main experiment's tiny Llama (PolicyConfig fields).
    config.rollout = main.rollout
    config.train = main.train  # TrainConfig fields.
    config.train.num_updates = 60
    # PRMConfig fields; `kind` and `noise` are set per condition (`form/prm=<kind>`).
    config.prm = main.prm
    # Held-out evaluation after the last update (64 fixed episodes, sampled and greedy;
    # EvalConfig fields).
    config.eval = main.eval
    config.eval.every = 60
    config.eval.episodes = 64
    # Credit accuracy along the run (rlagent.credit.probe ProbeConfig fields) at updates
    # 1, 31: the estimator's credit on 4 episodes vs Monte-Carlo advantages from 4
    # continuations (off in the runs with a PRM).
    config.probe = main.probe
    config.probe.every = 30
    config.probe.episodes = 4
    config.probe.samples = 4
    return config
