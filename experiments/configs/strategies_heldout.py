"""The strategies study at 20 seeds, evaluated on held-out *tasks*.

Usage:
  python -m experiments.strategies \
      --config=experiments/configs/strategies_heldout.py --workdir=runs/strategies_heldout

The defaults (experiments/configs/strategies.py) at the 20 seeds of the committed
`docs/results/strategies_20/` run, with ToolWorld's task split: training episodes, the
judges' candidates and the offline DPO logs never hold one of the held-out quarter of the
(intent, order, item, address) cells, and every evaluation plays 64 episodes that each
hold at least one (`env.task_split='train'`, `eval_tasks='heldout'`), where that run
evaluated fresh keys of the training tasks. Expected time: that run's, 591 s on the quiet
2-core AMD EPYC.
"""

import ml_collections

from experiments.configs import strategies


def get_config() -> ml_collections.ConfigDict:
    config = strategies.get_config()
    config.seeds = 20
    config.env.task_split = "train"
    config.eval_tasks = "heldout"
    return config
