r"""GRPO or PPO training of a pretrained HF checkpoint on a text environment.

  python -m experiments.hf_agent --model_dir=checkpoints/Qwen2.5-0.5B-Instruct \
      --env=toolworld_text --workdir=runs/hf_agent
  python -m experiments.hf_agent --model_dir=... --env=bfcl --config.algorithm=ppo \
      --config.env.bfcl.category=multi_turn_base --config.env.bfcl.split=train

--model_dir is a local folder (config.json, safetensors, the tokenizer files with a chat
template: what `save_pretrained` or `huggingface-cli download` leaves); nothing is
downloaded. Config: experiments/configs/hf_agent.py (`--config.train.num_updates=...`,
`--config.sampling.max_new_tokens=...`, ...). Writes to --workdir: metrics.csv (one row
per update: success, return, malformed rate, tokens generated, sampling / update seconds,
KL to the reference, loss stats), provenance.json, TensorBoard events and Orbax
checkpoints (`rlagent.text.train`). A non-empty --workdir needs `--resume` (continue
exactly; the config must match) or `--overwrite`. Exits with status 1 and a one-line
error before anything is written on a bad --model_dir (the checkpoint loader's
refusals), a tokenizer without a chat template, a vocabulary mismatch, an unknown --env
or a bad config value, and when refused or diverged.
"""

from __future__ import annotations

from absl import app
from absl import flags

from experiments import launch
from experiments.studies import hf_agent

_FLAGS = launch.define_flags("hf_agent", multi_process=True)
_MODEL_DIR = flags.DEFINE_string(
    "model_dir", None, "Local HF checkpoint folder (config.json, safetensors, tokenizer)."
)
_ENV = flags.DEFINE_string("env", "toolworld_text", f"Text environment: {hf_agent.ENVS}.")


def main(argv):
    del argv
    launch.run_study(hf_agent.run, _FLAGS, model_dir=_MODEL_DIR.value or "", env=_ENV.value)


if __name__ == "__main__":
    app.run(main, flags_parser=launch.parse_flags)
