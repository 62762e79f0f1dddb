"""Training a pretrained HF checkpoint on a text environment: the text loop plays a batch,
the text update trains on it, the host writes metrics and checkpoints (docs/text_training.md).

    tasks = toolworld_tasks(ToolWorldConfig(level=1))      # or bfcl_tasks(...)
    model = check_model("checkpoints/Qwen2.5-0.5B-Instruct", tasks.tools)
    rows = run_text(train_config("grpo", num_updates=50), TextConfig(...), tasks, model,
                    workdir="runs/hf_agent")

Every update u: `num_groups` tasks drawn with `np.random.default_rng([seed, u])`, each
played by `group_size` episodes (`rlagent.text.loop`, keys `fold_in(key(seed), u)`); the
reference's log-probs (the checkpoint as loaded, frozen) and the update
(`rlagent.text.update`: rewards, the project's estimators, PPO-clip, KL to the reference;
with a critic-based estimator, as PPO's default, a separate critic model of
`rlagent.text.critic` trained beside the policy); one metric row, and a checkpoint when
one is due (`host_loop.CheckpointConfig`).
Everything random is a function of (seed, update), so a resumed run (`--resume`: the
policy, critic and optimiser states of the newest checkpoint; the updates after it are
played again, their rows replaced) equals an uninterrupted one.
The run folder is the host loop's (`rlagent.host.loop.open_run`, `run_files`): a non-empty
folder refused without resume / overwrite, `provenance.json`, metrics.csv, Orbax
checkpoints (step 0, the start, and the newest `keep`, saved every `every` updates and
after the last, asynchronously: `host_loop.CheckpointConfig`), a non-finite loss stopping
the run with `Diverged`.

With a mesh (`run_text(mesh=...)`, `rlagent.models.sharding.fsdp_mesh`) the policy, the
reference and the optimiser state live in FSDP layout over its devices: the text loop's
jitted generation reads the sharded parameters (XLA gathers what a layer needs), the
update keeps its state sharded and splits the batch's episodes over every device.
A mesh may span several processes (`rlagent.parallel`, docs/distributed.md): each plays
its share of every batch (`parallel.share`) on its own copy of the policy
(`parallel.local_view`), the shares join into one batch over the mesh
(`sharding.shard_batch`) that the reference and the update read, and the row's metrics
are computed from the joined batch (process 0 writes the files).

An episode that outgrows the sampling sizes ends as truncated (`rlagent.text.loop`): the
run goes on and the row's `truncated` column counts such episodes.

`check_model` refuses, before anything is written and in this order, a folder that is no
checkpoint the loader reads (`rlagent.models.checkpoint.read_checkpoint`: config.json, its
architecture, the safetensors), a tokenizer the folder lacks or one without a usable chat
template (`rlagent.text.chat.make_chat`), and a vocabulary mismatch (`chat.check_vocab`).
Parameters and AdamW's moments are float32 and the compute bfloat16 unless the caller
asks otherwise (`check_dtypes`); the frozen reference is kept in the compute dtype.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlagent import losses
from rlagent import parallel
from rlagent.envs.toolworld.config import ToolWorldConfig
from rlagent.host import loop as host_loop
from rlagent.host import provenance
from rlagent.models import checkpoint
from rlagent.models import sharding
from rlagent.models.hf import CheckpointError
from rlagent.models.llama import parameter_count
from rlagent.preference.dpo import DPOConfig
from rlagent.preference.judges import judge_weights
from rlagent.preference.judges import make_judge
from rlagent.text import bfcl
from rlagent.text.chat import ChatFormat
from rlagent.text.chat import check_vocab
from rlagent.text.chat import load_tokenizer
from rlagent.text.chat import make_chat
from rlagent.text.critic import CheckedCritic
from rlagent.text.critic import CriticConfig
from rlagent.text.critic import check_critic
from rlagent.text.critic import load_critic
from rlagent.text.critic import provenance_record as critic_record
from rlagent.text.judge import QUESTION
from rlagent.text.judge import answer_ids
from rlagent.text.judge import make_lm_judge
from rlagent.text.judge import question_tokens
from rlagent.text.loop import TextConfig
from rlagent.text.loop import TextLoop
from rlagent.text.loop import make_text_loop
from rlagent.text.preference import make_text_dpo
from rlagent.text.score import make_text_score
from rlagent.text.score import make_text_values
from rlagent.text.toolworld import ToolWorldText
from rlagent.text.update import TextTrainState
from rlagent.text.update import check_config
from rlagent.text.update import make_text_update
from rlagent.train.config import TrainConfig
from rlagent.train.evaluation import EVAL_STREAM
from rlagent.train.evaluation import EvalConfig
from rlagent.train.ppo import NONFINITE_METRICS
from rlagent.train.ppo import episode_metrics
from rlagent.train.ppo import make_optimizer
from rlagent.train.rewards import check_forms
from rlagent.train.rewards import turn_rewards

# The update of each algorithm: TrainConfig fields a config leaves unset (None) take these.
# PPO is PPO-clip over several epochs of minibatches with token-level GAE from a separate
# critic model (`rlagent.text.critic`; estimator gae_turn / hierarchical read it too, and
# a critic-free estimator such as reinforce_pp runs PPO without one); GRPO is one
# on-policy step on group-relative advantages.
ALGORITHMS: dict[str, dict[str, Any]] = {
    "grpo": dict(estimator="grpo", num_epochs=1, num_minibatches=1),
    "ppo": dict(estimator="gae_token", num_epochs=2, num_minibatches=2),
    # Online DPO / RLAIF (`Preference`, rlagent.text.preference): the TrainConfig sizes the
    # batch (num_groups tasks x group_size episodes) and prices the judges' reward forms.
    "online_dpo": dict(estimator="grpo", num_epochs=1, num_minibatches=1),
}
DTYPES = ("float32", "bfloat16")
# `check_model(remat=None)` rematerialises the blocks of checkpoints with more parameters:
# a 0.5B model's update at BFCL lengths keeps every block's activations otherwise
# (docs/benchmarks.md, memory).
REMAT_ABOVE = 100_000_000
# and passes such a checkpoint's episodes through the update one per device at a time
# (`with_memory_defaults`: `train.micro_batch_size` unset), as the memory table does.
# Episode metrics of each evaluation mode (NaN when the environment does not report one).
EVAL_METRICS = ("success", "turns", "tokens", "malformed_rate")
EVAL_MODES = ("sampled", "greedy")  # the loop's temperature, then temperature 0.


class TaskSet(NamedTuple):
    """Where a run's tasks come from: a task drawn per group; each episode renders its own
    environment's tools (`rlagent.text.loop`)."""

    name: str  # the environment's name (the metric rows' `condition` is the algorithm).
    config: dict[str, Any]  # the resolved settings (provenance.json's `env`).
    tools: tuple[dict, ...] | None  # the first task's tool schemas: the template's probe.
    # pick(rng) -> (make_env: () -> a fresh environment of one task, its reset seed).
    pick: Callable[[np.random.Generator], tuple[Callable[[], Any], int]]
    # heldout() -> the TaskSet of tasks this one never draws; a ValueError naming the
    # field when this set is not a training split.
    heldout: Callable[[], TaskSet]
    # metrics(envs) -> metric columns of a batch's played environments (None: none).
    metrics: Callable[[list[Any]], dict[str, float]] | None = None


class Preference(NamedTuple):
    """Online DPO / RLAIF settings of `config.algorithm='online_dpo'`."""

    config: DPOConfig  # its num_groups x group_size are the TrainConfig's.
    judge: str = "lm"  # 'lm' (rlagent.text.judge) or a judge of rlagent.preference.judges.
    accuracy: float = 1.0  # probability that the judge keeps a pair's true order.
    question: str = QUESTION  # what the LM judge is asked after each transcript.


class AgentModel(NamedTuple):
    """A checked checkpoint folder and its chat format (`check_model`)."""

    model_dir: str
    chat: ChatFormat
    checkpoint: checkpoint.Checkpoint  # its PolicyConfig carries the dtypes and pad_id.
    config_sha256: str  # of config.json: a resumed run must read the same model.


def train_config(algorithm: str, **fields: Any) -> TrainConfig:
    """The `TrainConfig` of `algorithm` (`ALGORITHMS`): `fields` that are None take the
    algorithm's value; entropy_coef defaults to 0 (the text update scores sampled ids)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"config.algorithm must be one of {tuple(ALGORITHMS)}, got {algorithm!r}")
    preset = {"entropy_coef": 0.0, **ALGORITHMS[algorithm]}
    values = {**preset, **{k: v for k, v in fields.items() if v is not None}}
    config = TrainConfig(**values)
    # What a text batch cannot serve (an entropy bonus, ...); a critic comes with an
    # estimator that reads values (`rlagent.text.critic`).
    check_config(config, critic=config.uses_critic)
    return config


def toolworld_tasks(config: ToolWorldConfig) -> TaskSet:
    """ToolWorld in text mode: a task is a world seed (`ToolWorldText.reset`)."""
    tools = ToolWorldText(config).tools  # refuses guardrail='mask'.

    def pick(rng: np.random.Generator):
        return functools.partial(ToolWorldText, config), int(rng.integers(2**31 - 1))

    def heldout() -> TaskSet:
        if config.task_split != "train":
            raise ValueError(
                "held-out tasks need a training set that never draws them: set "
                f"config.env.toolworld_text.task_split='train' (got {config.task_split!r})"
            )
        return toolworld_tasks(dataclasses.replace(config, task_split="heldout"))

    return TaskSet("toolworld_text", dataclasses.asdict(config), tools, pick, heldout)


def bfcl_tasks(
    category: str = "multi_turn_base", split: str = "train", task: str = "", **options: Any
) -> TaskSet:
    """BFCL multi-turn tasks: every task of the split of `category` (several categories
    separated by commas), or only `task` when set; each episode renders its own task's
    tools. `options`: max_turns, max_steps (`bfcl.BFCLText`). The batch metric
    `bfcl_accuracy` is the leaderboard's multi-turn accuracy: the share of episodes whose
    whole task the package's checker passes (`bfcl.package_check`)."""
    categories = tuple(name.strip() for name in category.split(",") if name.strip())
    if not categories:
        raise ValueError("config.env.bfcl.category names no BFCL multi-turn category")
    ids = tuple(i for name in categories for i in bfcl.bfcl_task_ids(name, split))
    if task and task not in ids:
        raise ValueError(
            f"config.env.bfcl.task={task!r} is not in the {split!r} split of {category!r}"
        )
    pool = (task,) if task else ids
    tools = bfcl.make_bfcl_text(pool[0], **options).tools

    def pick(rng: np.random.Generator):
        task_id = pool[int(rng.integers(len(pool)))]
        return functools.partial(bfcl.make_bfcl_text, task_id, **options), 0

    def heldout() -> TaskSet:
        if split != "train":
            raise ValueError(
                "held-out tasks need a training set that never draws them: set "
                f"config.env.bfcl.split='train' (got {split!r})"
            )
        return bfcl_tasks(category, "heldout", **options)

    settings = dict(category=category, split=split, task=task, tasks=list(pool), **options)
    return TaskSet("bfcl", settings, tools, pick, heldout, metrics=_bfcl_metrics)


def _bfcl_metrics(envs: list[bfcl.BFCLText]) -> dict[str, float]:
    """`bfcl_accuracy`: the share of the episodes whose task BFCL's checker passes."""
    return {"bfcl_accuracy": float(np.mean([bfcl.package_check(env)["valid"] for env in envs]))}


def check_model(
    model_dir: str, tools: tuple[dict, ...] | None, *, dtype: str = "bfloat16",
    param_dtype: str = "float32", end_token: str | None = None, pad_token: str | None = None,
    remat: bool | None = None, enable_thinking: bool | None = None,
) -> AgentModel:  # fmt: skip
    """Checks a local HF checkpoint folder without reading a tensor, in the order a reader
    expects: the folder, config.json and its architecture, the safetensors, then the
    tokenizer, its chat template and the vocabulary; one-line `ValueError`s name the fault.

    `dtype` is the compute dtype (activations, matmuls, the sampler's KV cache) and
    `param_dtype` the trained parameters' and AdamW moments' (`check_dtypes`): by default
    float32 master weights with bfloat16 compute. `remat` None: rematerialise the decoder
    blocks of a model above `REMAT_ABOVE` parameters."""
    check_dtypes(dtype, param_dtype)
    if not os.path.isdir(model_dir):
        raise CheckpointError(f"--model_dir={model_dir!r} is not a folder")
    found = checkpoint.read_checkpoint(
        model_dir, param_dtype=param_dtype, dtype=dtype, remat=bool(remat)
    )
    chat = make_chat(
        load_tokenizer(model_dir), tools=tools, end_token=end_token, pad_token=pad_token,
        enable_thinking=enable_thinking,
    )  # fmt: skip
    if remat is None:
        remat = parameter_count(found.config) > REMAT_ABOVE
    config = dataclasses.replace(found.config, pad_id=chat.pad_id, remat=bool(remat))
    found = dataclasses.replace(found, config=config)
    check_vocab(chat, found.config)
    digest = provenance.file_sha256(os.path.join(model_dir, "config.json"))
    return AgentModel(os.path.abspath(model_dir), chat, found, digest)


def with_memory_defaults(
    config: TrainConfig, model: AgentModel, mesh: jax.sharding.Mesh | None = None
) -> TrainConfig:
    """`config` with `micro_batch_size` set to one episode per device (the mesh's size, 1
    without one) when it is unset and the checkpoint has more than `REMAT_ABOVE`
    parameters: the update and the reference pass then hold one episode's activations per
    device (docs/benchmarks.md, memory); a small model keeps whole minibatches."""
    if config.micro_batch_size is not None:
        return config
    if parameter_count(model.checkpoint.config) <= REMAT_ABOVE:
        return config
    return dataclasses.replace(config, micro_batch_size=1 if mesh is None else mesh.size)


def check_dtypes(dtype: str, param_dtype: str) -> None:
    """Refuses a precision the trainer does not offer. float32 parameters with bfloat16
    compute (the default) keep master weights and AdamW's moments in float32, so that a
    step smaller than a weight's bfloat16 spacing (about weight / 256) is not rounded
    away; bfloat16 parameters halve the states' memory but lose such steps; float32 both
    is the exact reference. bfloat16 parameters with float32 compute would round the
    weights for no saving in the update, and are refused."""
    for field, value in (("dtype", dtype), ("param_dtype", param_dtype)):
        if value not in DTYPES:
            raise ValueError(f"config.model.{field} must be one of {DTYPES}, got {value!r}")
    if param_dtype == "bfloat16" and dtype == "float32":
        raise ValueError(
            "config.model.param_dtype='bfloat16' needs config.model.dtype='bfloat16' "
            "(float32 compute of bfloat16 parameters saves nothing); use param_dtype='float32'"
        )


def run_text(
    config: TrainConfig, text_config: TextConfig, tasks: TaskSet, model: AgentModel, *,
    workdir: str, seed: int = 0, algorithm: str = "", resume: bool = False,
    overwrite: bool = False, tensorboard: bool = True, progress: bool = True,
    evaluation: EvalConfig = EvalConfig(), preference: Preference | None = None,
    mesh: jax.sharding.Mesh | None = None, critic: CriticConfig = CriticConfig(),
    checkpoints: host_loop.CheckpointConfig = host_loop.CheckpointConfig(),
) -> list[dict[str, Any]]:  # fmt: skip
    """Trains `config.num_updates` updates (module docstring); returns every metric row.

    With `mesh` (a `("data", "fsdp")` mesh, `sharding.fsdp_mesh`) parameters and
    optimiser state are sharded over its devices (module docstring); the batch's episodes
    must divide over them, and online DPO is refused (its program runs on one device).

    With `evaluation.every` > 0, every `every` updates and after the last one the policy
    plays `evaluation.episodes` fixed episodes (`eval_task_list`: the training tasks or
    the held-out ones, sampled and greedy); their metrics are the row's `eval_*` columns
    (NaN on the other rows). With `preference` (algorithm 'online_dpo') every update is
    one online DPO iteration on the played batch (`rlagent.text.preference`); its rows
    hold the DPO loss, the pairs and the judge's scores instead of the PPO loss stats.

    Rows: `condition` (the algorithm), `seed`, `update`, success, return (mean episode
    return), malformed_rate and the environment's metrics, `truncated` (the share of the
    batch's episodes that ended past the sampling sizes, `rlagent.text.loop`), the task
    set's metrics (`TaskSet.metrics`: BFCL's `bfcl_accuracy`), tokens_generated,
    sample_s / update_s / time_s, kl_ref (the sampled estimate of `config.kl_kind` between
    the behaviour policy and the reference, per generated token), the update's loss stats.
    """
    config = with_memory_defaults(config, model, mesh)
    eval_tasks, checked = _check_run(
        config, text_config, tasks, model, evaluation=evaluation, mesh=mesh, critic=critic,
        preference=preference,
    )  # fmt: skip
    resolved = provenance.resolved(
        train=config, sampling=text_config, env={"kind": tasks.name, **tasks.config},
        evaluation=evaluation, preference=_preference_record(preference, config),
        model=dict(model_dir=model.model_dir, config_sha256=model.config_sha256,
                   policy=dataclasses.asdict(model.checkpoint.config),
                   chat_template=model.chat.template_name,
                   enable_thinking=model.chat.enable_thinking),
        seed=int(seed), algorithm=algorithm,
        mesh=None if mesh is None else dict(mesh.shape),
        critic=None if checked is None else critic_record(checked), checkpoint=checkpoints,
    )  # fmt: skip
    resume, record = host_loop.open_run(
        workdir, resolved, lr_schedule=config.lr_schedule, resume=resume, overwrite=overwrite
    )
    run, params = make_text_run(
        config, text_config, tasks, model, seed=seed, preference=preference, mesh=mesh,
        critic=critic,
    )  # fmt: skip
    runs = [(algorithm or config.estimator, int(seed))]
    with host_loop.run_files(
        workdir, run.init(params), runs, resume=resume, tensorboard=tensorboard,
        checkpoints=checkpoints,
    ) as files:  # fmt: skip
        state, rows = files.state, list(files.rows)
        for update in range(files.done, config.num_updates):
            state, row = _one_update(run, state, update)
            row = {"condition": runs[0][0], "update": update + 1, "seed": int(seed), **row}
            due = evaluation.every and (
                (update + 1) % evaluation.every == 0 or update + 1 == config.num_updates
            )
            if evaluation.every:
                row |= evaluate_text(run, state.params, eval_tasks) if due else _no_eval()
            files.writer.write([row])
            rows.append(row)
            flags = {name: np.asarray([[row[name]]]) for name in NONFINITE_METRICS}
            host_loop.check_finite(flags, update, runs, files.manager, rows)
            if checkpoints.due(update + 1, config.num_updates):
                host_loop.save_state(files.manager, update + 1, state)
            if progress and parallel.is_primary():
                print(_progress_line(row, config.num_updates), flush=True)
        host_loop.wait_for_saves(files.manager)
        updates = [files.done, max(files.done, config.num_updates)]
        provenance.write(workdir, provenance.finish({**record, "updates": updates}))
    return rows


def _check_run(
    config: TrainConfig, text_config: TextConfig, tasks: TaskSet, model: AgentModel, *,
    evaluation: EvalConfig, mesh: jax.sharding.Mesh | None, critic: CriticConfig,
    preference: Preference | None,
) -> tuple[list, CheckedCritic | None]:  # fmt: skip
    """`run_text`'s refusals, before anything is written: `(evaluation tasks, the checked
    critic)`."""
    make_env, env_seed = tasks.pick(np.random.default_rng(0))
    first = make_env()
    check_forms(first, config, [config.reward], "config.train.reward")
    # A first prompt the sizes cannot hold is refused here (`TextLoop.start` renders it;
    # no model is needed for that). Later episodes past the sizes end truncated.
    opening = TextLoop(model.chat, text_config, sample=None).start(first, env_seed)
    if opening.truncated:
        raise ValueError(f"the first task's prompt does not fit: {opening.truncated}")
    eval_tasks = eval_task_list(tasks, evaluation)
    check_mesh(mesh, config, preference)
    if mesh is not None and evaluation.every and evaluation.episodes % mesh.size:
        raise ValueError(
            f"config.eval.episodes = {evaluation.episodes} must be a multiple of the mesh's "
            f"{mesh.size} devices (each plays its share of them)."
        )
    checked = critic_of(config, critic, model, preference)
    if preference is not None and preference.judge == "lm":  # the same for the LM judge.
        answer_ids(model.chat, "Yes", "No")
        question_tokens(model.chat, preference.question)
    return eval_tasks, checked


class TextRun(NamedTuple):
    """The programs and settings of a text training run (`make_text_run`)."""

    loop: Any  # rlagent.text.loop.TextLoop
    greedy: Any  # the same loop at temperature 0 (evaluation).
    program: Any  # rlagent.text.update.TextUpdate, or rlagent.text.preference.TextDPO.
    reference: Any  # the frozen reference's parameters (the checkpoint as loaded).
    config: TrainConfig
    tasks: TaskSet
    seed: int
    preference: Preference | None = None
    ref_score: Any = None  # jitted (params, trajectory) -> [B, S, L] log pi (online DPO).
    critic: Any = None  # the critic's initial parameters (a critic-based estimator's).
    mesh: Any = None  # the policy's mesh (None: one device).

    def init(self, params: nnx.State) -> Any:
        """The trained state of the initial parameters (and the run's critic)."""
        if self.preference is None:
            return self.program.init(params, self.critic)
        return self.program.init(params, jax.random.key(self.seed))


def make_text_run(
    config: TrainConfig, text_config: TextConfig, tasks: TaskSet, model: AgentModel, *,
    seed: int = 0, preference: Preference | None = None, mesh: jax.sharding.Mesh | None = None,
    critic: CriticConfig = CriticConfig(),
) -> tuple[TextRun, nnx.State]:  # fmt: skip
    """Loads the checked model: `(its TextRun, the initial policy parameters)`; with `mesh`
    the parameters in FSDP layout over it (`check_mesh`); with a critic-based estimator
    the critic of `critic` too (`rlagent.text.critic`, held by the TextRun)."""
    check_mesh(mesh, config, preference)
    checked = critic_of(config, critic, model, preference)
    wanted = model.checkpoint.config
    llama, policy_config = checkpoint.load_pretrained(
        model.model_dir, dtype=wanted.param_dtype, compute_dtype=wanted.dtype,
        pad_id=model.chat.pad_id, remat=wanted.remat,
    )  # fmt: skip
    graphdef, params = nnx.split(llama)
    if mesh is not None:
        params = sharding.shard_params(params, mesh)
    score = make_text_score(model.chat, graphdef, policy_config, text_config)
    critic_params = None
    if preference is None:
        program, critic_params = _update_program(config, text_config, score, model, checked, mesh)
    else:
        preference = _sized(preference, config)
        program = _dpo_program(config, score, model, (graphdef, policy_config), preference)
    # The loops run in each process alone, on its own rows of the mesh (`play_share`).
    play_mesh = None if mesh is None else parallel.local_mesh(mesh)
    run = TextRun(
        loop=make_text_loop(model.chat, graphdef, policy_config, text_config, mesh=play_mesh),
        greedy=make_text_loop(
            model.chat, graphdef, policy_config, dataclasses.replace(text_config, temperature=0.0),
            mesh=play_mesh,
        ),
        program=program,
        reference=frozen_copy(params, policy_config.dtype),
        config=config, tasks=tasks, seed=int(seed), preference=preference,
        ref_score=None if preference is None else score, critic=critic_params, mesh=mesh,
    )  # fmt: skip
    return run, params


def frozen_copy(params: nnx.State, dtype: str) -> nnx.State:
    """A copy of `params` in the compute dtype `dtype`: the frozen reference. The forward
    pass casts every parameter to that dtype where it is used, so a reference stored in
    it scores as the float32 master weights do, in half their memory under bfloat16
    compute; a copy, since the update donates the policy's state."""

    def copy(leaf):
        floating = jnp.issubdtype(leaf.dtype, jnp.floating)
        return jnp.array(leaf, dtype=dtype if floating else leaf.dtype)

    return jax.tree.map(copy, params)


def critic_of(
    config: TrainConfig, critic: CriticConfig, model: AgentModel, preference: Preference | None
) -> CheckedCritic | None:
    """The checked critic of a critic-based estimator (None for a critic-free one); refuses
    critic settings a run would not read, and online DPO with a critic."""
    if not config.uses_critic:
        if critic != CriticConfig():
            raise ValueError(
                f"config.critic is set but TrainConfig.estimator={config.estimator!r} reads no "
                "values (no critic is trained); leave config.critic at its defaults"
            )
        return None
    if preference is not None:
        raise ValueError("online DPO trains no critic: use a critic-free estimator (grpo)")
    return check_critic(critic, model)


def _update_program(
    config, text_config, score, model: AgentModel, critic: CheckedCritic | None, mesh
):
    """`(TextUpdate, the critic's initial parameters or None)` of a PPO / GRPO run."""
    if critic is None:
        return make_text_update(config, score, mesh=mesh), None
    graphdef, params = load_critic(critic)
    if mesh is not None:
        params = sharding.shard_params(params, mesh)
    learning_rate = critic.config.learning_rate or config.learning_rate
    program = make_text_update(
        config, score, values=make_text_values(model.chat, graphdef, text_config),
        critic_optimizer=make_optimizer(config, learning_rate),
        critic_warmup=critic.config.warmup_updates, mesh=mesh,
    )  # fmt: skip
    return program, params


def check_mesh(
    mesh: jax.sharding.Mesh | None, config: TrainConfig, preference: Preference | None
) -> None:
    """Refuses a mesh the run cannot use: online DPO (one device), or a batch whose
    episodes (and minibatches) do not divide over the mesh's devices."""
    if mesh is None:
        return
    if preference is not None:
        raise ValueError("config.mesh: online DPO trains on one device (no mesh); set devices=0.")
    rows = config.batch_size // config.num_minibatches
    if rows % mesh.size:
        raise ValueError(
            f"config.mesh: {mesh.size} devices do not divide a minibatch of {rows} episodes "
            f"(train.num_groups x group_size / num_minibatches = {config.num_groups} x "
            f"{config.group_size} / {config.num_minibatches})."
        )
    if config.micro_batch_size is not None and config.micro_batch_size % mesh.size:
        raise ValueError(
            f"config.mesh: {mesh.size} devices do not divide a micro-batch of "
            f"train.micro_batch_size = {config.micro_batch_size} episodes."
        )


def _sized(preference: Preference, config: TrainConfig) -> Preference:
    """The preference with its DPOConfig batch set to the TrainConfig's (the played one)."""
    dpo = dataclasses.replace(
        preference.config, num_groups=config.num_groups, group_size=config.group_size
    )
    return preference._replace(config=dpo)


def _preference_record(preference: Preference | None, config: TrainConfig):
    """provenance.json's `preference`: the judge and the DPOConfig fields text mode reads."""
    if preference is None:
        return None
    preference = _sized(preference, config)
    unused = ("num_updates", "pairs_per_step", "pairs")  # offline / fork settings.
    dpo = {k: v for k, v in dataclasses.asdict(preference.config).items() if k not in unused}
    return {**preference._asdict(), "config": dpo}


def _dpo_program(config, score, model: AgentModel, lm, preference: Preference):
    """`make_text_dpo` with the preference's judge (`lm`: the policy's graphdef and config,
    which the LM judge reads with)."""
    weights = None
    if preference.judge == "lm":
        judge = make_lm_judge(model.chat, *lm, question=preference.question)
    else:
        judge, weights = make_judge(config), judge_weights(config, preference.judge)
    return make_text_dpo(
        preference.config, score, judge, weights=weights, accuracy=preference.accuracy
    )


def play_batch(run: TextRun, params: nnx.State, update: int) -> tuple[list, Any]:
    """`(episodes, Trajectory)` of update `update` (0-based): `num_groups` tasks drawn with
    `default_rng([seed, update])`, `group_size` episodes each, keys from (seed, update)
    (`play_share`: this process's episodes, the whole batch's trajectory)."""
    config = run.config
    rng = np.random.default_rng([run.seed, update])
    tasks = []
    for _ in range(config.num_groups):  # a group: group_size episodes of one task.
        tasks += [run.tasks.pick(rng)] * config.group_size
    keys = jax.random.split(jax.random.fold_in(jax.random.key(run.seed), update), len(tasks))
    return play_share(run, run.loop, params, tasks, keys)


def play_share(
    run: TextRun, loop: TextLoop, params: nnx.State, tasks: list, keys: jax.Array
) -> tuple[list, Any]:
    """Plays a batch of `(make_env, seed)` tasks with `keys`: `(this process's episodes,
    the batch's Trajectory)`. With the run's mesh each process plays its share
    (`parallel.share`) on its copy of the policy and the trajectory holds every process's
    rows over the mesh (`sharding.shard_batch`); without, one process plays them all."""
    mine = parallel.share(len(tasks)) if run.mesh is not None else slice(None)
    episodes = [loop.start(make_env(), env_seed) for make_env, env_seed in tasks[mine]]
    local = params if run.mesh is None else parallel.local_view(params, run.mesh)
    loop.play(local, episodes, keys[mine])
    trajectory = loop.trajectory(episodes)
    if run.mesh is not None:
        trajectory = sharding.shard_batch(trajectory, run.mesh)
    return episodes, trajectory


def _one_update(run: TextRun, state: TextTrainState, update: int):
    """Plays the batch of `update` (0-based) and trains on it: `(state, metric row)`."""
    config, began = run.config, time.perf_counter()
    episodes, trajectory = play_batch(run, state.params, update)
    played = _played(episodes, trajectory)
    local = {"truncated": float(np.mean([bool(e.truncated) for e in episodes]))}
    if run.tasks.metrics is not None:
        local |= run.tasks.metrics([e.env for e in episodes])
    played |= parallel.process_mean(local)  # means of the processes' equal shares.
    sampled = time.perf_counter()
    if run.preference is None:
        ref_logp = run.program.reference(run.reference, trajectory)
    else:
        ref_logp = run.ref_score(run.reference, trajectory)
    kl = losses.kl_penalty(trajectory.logp, ref_logp, kind=config.kl_kind)
    mask = trajectory.loss_mask
    kl_ref = float(parallel.fetch(jnp.sum(kl * mask) / jnp.maximum(jnp.sum(mask), 1)))
    if run.preference is None:
        state, stats = run.program.update(state, trajectory, ref_logp)
    else:  # the judge's and the pairs' randomness, from (seed, update) as the sampling's.
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(run.seed), update), 1)
        state, stats = run.program.update(state, trajectory, key)
        stats["reward"] = jnp.mean(jnp.sum(turn_rewards(trajectory, config), axis=1))
        stats["tokens"] = jnp.sum(trajectory.loss_mask).astype(jnp.float32)
    stats = {k: float(v) for k, v in parallel.fetch(stats).items()}
    done = time.perf_counter()
    return state, {
        "success": played.pop("success"), "return": stats.pop("reward"),
        "malformed_rate": played.pop("malformed_rate", float("nan")),
        "tokens_generated": stats.pop("tokens"), "tokens_per_episode": played.pop("tokens"),
        "kl_ref": kl_ref, **played, **stats, "sample_s": sampled - began,
        "update_s": done - sampled, "time_s": done - began,
    }  # fmt: skip


def eval_task_list(tasks: TaskSet, evaluation: EvalConfig) -> list[tuple[Callable[[], Any], int]]:
    """The `evaluation.episodes` (make_env, seed) pairs every evaluation plays: drawn from
    the training tasks (`tasks='same'`) or the held-out ones (`'heldout'`, `tasks.heldout()`)
    with `default_rng(EVAL_STREAM)`, the same for every seed and run; [] when off."""
    if not evaluation.every:
        return []
    source = tasks.heldout() if evaluation.tasks == "heldout" else tasks
    rng = np.random.default_rng(EVAL_STREAM)
    return [source.pick(rng) for _ in range(evaluation.episodes)]


def evaluate_text(run: TextRun, params: nnx.State, eval_tasks: list) -> dict[str, float]:
    """Plays the evaluation episodes sampled (the loop's temperature) and greedy, on keys
    from `key(EVAL_STREAM)` (the same at every evaluation): the `eval_*` columns."""
    row, began = {}, time.perf_counter()
    keys = jax.random.split(jax.random.key(EVAL_STREAM), len(eval_tasks))
    for mode, loop in zip(EVAL_MODES, (run.loop, run.greedy), strict=True):
        episodes, trajectory = play_share(run, loop, params, list(eval_tasks), keys)
        played = _played(episodes, trajectory)
        for name in EVAL_METRICS:
            row[f"eval_{mode}_{name}"] = played.get(name, float("nan"))
        if mode == "sampled":  # mean -log pi of the sampled ids: the policy's entropy.
            mask = trajectory.loss_mask
            row["eval_sampled_entropy"] = float(
                parallel.fetch(-jnp.sum(trajectory.logp * mask) / jnp.maximum(jnp.sum(mask), 1))
            )
    row["eval_s"] = time.perf_counter() - began
    return row


def _played(episodes: list, trajectory: Any) -> dict[str, float]:
    """`episode_metrics` of a played batch's trajectory (every process's rows) as floats."""
    metrics = parallel.fetch(episode_metrics(episodes[0].env, trajectory))
    return {name: float(value) for name, value in metrics.items()}


def _no_eval() -> dict[str, float]:
    """The `eval_*` columns of a row without evaluation (NaN: not measured)."""
    names = [f"eval_{mode}_{m}" for mode in EVAL_MODES for m in EVAL_METRICS]
    return dict.fromkeys([*names, "eval_sampled_entropy", "eval_s"], float("nan"))


def _progress_line(row: dict[str, Any], total: int) -> str:
    return (
        f"update {row['update']}/{total}: success {row['success']:.3f}, return "
        f"{row['return']:.3f}, malformed {row['malformed_rate']:.3f}, kl_ref "
        f"{row['kl_ref']:.4f}, {row['tokens_generated']:.0f} tokens, sample "
        f"{row['sample_s']:.1f} s, update {row['update_s']:.1f} s"
    ) + _eval_part(row)


def _eval_part(row: dict[str, Any]) -> str:
    if not np.isfinite(row.get("eval_s", float("nan"))):
        return ""
    return (
        f"; eval success {row['eval_sampled_success']:.3f} sampled, "
        f"{row['eval_greedy_success']:.3f} greedy ({row['eval_s']:.1f} s)"
    )
