r"""Writes a text run's policy as a Hugging Face folder (config.json, model.safetensors,
tokenizer files, chat template) that transformers loads.

  python -m experiments.export_hf runs/hf_agent --out=exported/hf_agent
  python -m experiments.export_hf runs/hf_agent@100 --out=exported/hf_agent_100

RUN_FOLDER is a folder `experiments.hf_agent` wrote; @STEP picks a checkpoint step (default
the newest; @0 is the checkpoint as loaded). The run's source checkpoint folder (named in
its provenance.json) must still be there: its config.json and tokenizer are copied
(`rlagent.text.export`). Exits with status 1 and a one-line error, before --out is
written, for a folder that is not a text run, a missing step, a source folder that is gone
or changed, and an --out that exists and is not empty.
"""

from __future__ import annotations

from absl import app
from absl import flags

from experiments import launch
from rlagent.text.export import export_hf

_OUT = flags.DEFINE_string("out", None, "The folder to write (new, or empty).", required=True)


def main(argv):
    if len(argv) != 2:
        raise app.UsageError("give one RUN_FOLDER[@STEP]")
    step = launch.run_reported(lambda: export_hf(argv[1], _OUT.value))
    print(f"wrote step {step} of {argv[1].partition('@')[0]} to {_OUT.value}")


if __name__ == "__main__":
    app.run(main, flags_parser=launch.parse_flags)
