r"""RL from the locally pretrained ToolWorld model over seeds, against its start.

  python -m experiments.pretrained_rl --workdir=runs/pretrained_rl
  python -m experiments.pretrained_rl --workdir=W --config.seeds=1,3,5,7,9 --resume

Config: experiments/configs/pretrained_rl.py (`--config.seeds`, `--config.model_dir`,
`--config.agent.<hf_agent field>`). Writes start.json, seed_<s>/ (an experiments.hf_agent
run each), summary.json, summary.md, eval.csv, curves.png and provenance.json
(experiments/studies/pretrained_rl.py). A non-empty --workdir needs --resume (finished
seeds are kept, a partial one goes on exactly) or --overwrite.
"""

from __future__ import annotations

from absl import app

from experiments import launch
from experiments.studies import pretrained_rl

_FLAGS = launch.define_flags("pretrained_rl")


def main(argv):
    del argv
    launch.run_study(pretrained_rl.run, _FLAGS)


if __name__ == "__main__":
    app.run(main, flags_parser=launch.parse_flags)
