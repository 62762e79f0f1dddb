"""Rejection sampling -> SFT -> RL: the committed run's config (docs/results/rs_sft/).

  python -m experiments.pipeline --config=experiments/configs/rs_sft_full.py \
      --config.envs=l2 --workdir=docs/results/rs_sft/l2

One family per invocation (l2, l3, l4, h10), 4 seeds, N in {4, 16}, accepted by the
outcome (solved) or the oracle process verdict sum >= 1 (a privileged judge).
"""

from experiments.configs import rs_sft


def get_config():
    config = rs_sft.get_config()
    config.envs = "l2"
    config.samples = "4,16"
    config.thresholds = "outcome@1,process@1"
    config.seeds = 4
    config.sft.steps = 15
    config.rejection.tasks = 8
    config.train.num_updates = 40
    config.eval.every = 20
    config.eval.episodes = 64
    return config
