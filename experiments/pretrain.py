r"""Pretrains a small Qwen2-shaped model on the environments' text and writes it as a
Hugging Face folder that `experiments.hf_agent` trains further (docs/pretrain.md).

  python -m experiments.pretrain --workdir=runs/pretrain
  python -m experiments.hf_agent --model_dir=runs/pretrain/model --env=toolworld_text \
      --workdir=runs/hf_agent_pretrained

Every field of `rlagent.text.pretrain.PretrainConfig` is a flag of the same name (sizes:
--d_model, --num_layers, ...; data: --episodes, --levels, --noise; schedule: --steps,
--batch_size, --learning_rate; stop rule: --eval_every, --eval_episodes, --eval_level,
--band_low, --band_high; --seed). Writes to --workdir (new, or empty): model/ (config.json,
model.safetensors, tokenizer files, chat template), eval_curve.csv / eval_curve.json and
provenance.json. Exits with status 1 and a one-line error naming the flag, before
anything is written, on a bad value or a non-empty --workdir.
"""

from __future__ import annotations

import dataclasses
import sys

from absl import app
from absl import flags

from experiments import launch
from rlagent.text.pretrain import PretrainConfig
from rlagent.text.pretrain import pretrain


def define_flags(values: flags.FlagValues = flags.FLAGS) -> None:
    """The command's flags, defined in `values` when it runs (not on import: tests import
    this module beside launchers whose flags share these names)."""
    flags.DEFINE_string("workdir", None, "A new or empty folder to write.", flag_values=values)
    for field in dataclasses.fields(PretrainConfig):
        help_text = f"PretrainConfig.{field.name} (rlagent.text.pretrain)."
        if isinstance(field.default, tuple):
            define, default = flags.DEFINE_list, [str(v) for v in field.default]
        elif isinstance(field.default, str):
            define, default = flags.DEFINE_string, field.default
        elif isinstance(field.default, float):
            define, default = flags.DEFINE_float, field.default
        else:
            define, default = flags.DEFINE_integer, field.default
        define(field.name, default, help_text, flag_values=values)


def config_from_flags(values: flags.FlagValues) -> PretrainConfig:
    """The PretrainConfig of the parsed flags; a bad value is refused naming its flag."""
    fields = {}
    for field in dataclasses.fields(PretrainConfig):
        value = values[field.name].value
        if isinstance(field.default, tuple):
            kind = type(field.default[0])
            try:
                value = tuple(kind(item) for item in value)
            except ValueError:
                raise ValueError(f"--{field.name} must be a list of {kind.__name__}s, got "
                                 f"{','.join(value)!r}") from None  # fmt: skip
        fields[field.name] = value
    return PretrainConfig(**fields)


def main(argv):
    if len(argv) != 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    workdir = flags.FLAGS.workdir
    if not workdir:
        sys.exit("error: --workdir is required")

    def run():  # pretrain refuses a non-empty workdir before anything else.
        return pretrain(config_from_flags(flags.FLAGS), workdir)

    result = launch.run_reported(run)
    print(f"wrote {workdir}/model: {result['parameters']} parameters, stopped at step "
          f"{result['steps']} ({result['stop']}) after {result['seconds']:.0f} s")  # fmt: skip


if __name__ == "__main__":
    define_flags()
    app.run(main, flags_parser=launch.parse_flags)
