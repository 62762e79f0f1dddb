"""BFCL multi-turn tasks as a text environment (a `rlagent.text.loop.TextEnvironment`;
docs/text_envs.md, "BFCL multi-turn").

The Berkeley Function Calling Leaderboard's package (`bfcl-eval`, Apache-2.0; install it
without its heavy dependencies: `pip install --no-deps bfcl-eval==2026.3.23`) ships the
multi-turn tasks (`data/BFCL_v4_multi_turn_<category>.json`), their ground truth
(`data/possible_answer/...`), the tools' docs (`data/multi_turn_func_doc/*.json`), the API
classes that run the calls (`eval_checker/multi_turn_eval/func_source_code/`) and the
checker (`eval_checker/multi_turn_eval/multi_turn_checker.py`).

One environment plays one task (`make_bfcl_text(task_id)`): its `tools` (the docs of its
involved classes as OpenAI-style schemas, the chat template's `tools`) differ between
tasks, and a `TextLoop` renders one tool set, so a batch is one task (a GRPO group) or
tasks of one tool set (`bfcl_task_ids`, `split_of`). `reset(seed)` loads the task's API
class instances from its `initial_config` (a BFCL task is deterministic: the seed is
not used) and returns the system message and the first user turn.

A step is one assistant message. Its tool calls (`rlagent.text.toolcalls`, the parser of
ToolWorld's text mode: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one or
more) run on the environment's instances, each result a `tool` message (BFCL's text of
it). A reply without a call ends the user turn: the environment then runs the turn's
ground-truth calls on instances of its own and checks, as BFCL's `multi_turn_checker`
does after each turn, that the model made calls, that the states match (`state_checker`)
and that the ground truth's results are among the model's (`response_checker`); then
comes the next user turn, or the end. Text that does not parse (or calls a tool the task
does not show) is a malformed step: nothing runs, the tool answers with the fault, the
user turn goes on. More than `max_steps` steps in one user turn end the episode failed
(BFCL's force-quit at `MAXIMUM_STEP_LIMIT`).

The calls run as methods of the instances, not through the package's
`execute_multi_turn_func_call`: that helper keeps the instances in its module's globals
(keyed by model name and task id, so a deep-copied environment would share them) and
`eval`s the call as Python text (model output would be code). The method lookup, the
instances' loading and the result's text are the helper's.

Signals: `outcome` (1 on the last step if the task passes the checker), `verdict` (on the
step that ends a user turn: +1 if the turn's check passes, -1 if not or force-quit; 0 on
other steps and for turns whose ground truth has no call, which BFCL does not check),
`efficiency` (-1 on each step past the shortest plan: per user turn one step with all of
its calls and one closing reply), `malformed`, `calls` (calls run by the step),
`call_errors` (of them, results that are errors), and `success` (= outcome).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import hashlib
import importlib
import inspect
import itertools
import json
import re
from typing import Any

import jax
import jax.numpy as jnp

from rlagent.text.chat import Message
from rlagent.text.toolcalls import ToolCall
from rlagent.text.toolcalls import parse_tool_calls

try:  # optional: rlagent works without it; BFCLText refuses to start.
    from bfcl_eval.constants import eval_config
    from bfcl_eval.constants.category_mapping import MULTI_TURN_CATEGORY
    from bfcl_eval.constants.category_mapping import VERSION_PREFIX
    from bfcl_eval.constants.default_prompts import (
        DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING,
    )
    from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT
    from bfcl_eval.constants.default_prompts import PROMPT_STYLE_TEMPLATES
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING
    from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import state_checker
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import is_empty_execute_response
    from bfcl_eval.utils import add_language_specific_hint_to_function_doc
except ImportError as error:  # bfcl_eval absent (or a module of it needs a missing package).
    _IMPORT_ERROR: ImportError | None = error
    MAXIMUM_STEP_LIMIT = 20
else:
    _IMPORT_ERROR = None

MALFORMED_SIGNAL = "malformed"
HELDOUT_PERCENT = 20  # share of task numbers held out (split_of).
SPLITS = ("train", "heldout", "all")
_SYSTEM = (
    "You are an agent that completes the user's requests with the tools you are given. "
    "Call a tool by writing "
    '<tool_call>{{"name": <tool name>, "arguments": {{<parameter>: <value>, ...}}}}</tool_call>'
    "; one reply may hold several calls, and each call's result comes back as a tool "
    "message. A reply without a tool call ends your turn. {behaviour}"
)
_ERROR_RESULT = re.compile(r'^(Error during execution|\{"error")')
_CHECK_RUNS = itertools.count()  # distinct model names for the package's checker runs.


@dataclasses.dataclass(frozen=True, eq=False)
class BFCLTask:
    """One multi-turn task of the package's data (read only)."""

    id: str
    category: str
    questions: tuple[tuple[Message, ...], ...]  # the user turns' messages.
    initial_config: dict
    involved_classes: tuple[str, ...]
    functions: tuple[dict, ...]  # the docs shown from the start (BFCL's entry["function"]).
    missed: dict[int, tuple[dict, ...]]  # miss_func: turn -> docs held out until then.
    ground_truth: tuple[tuple[str, ...], ...]  # per user turn: BFCL's call strings.


@dataclasses.dataclass
class _State:
    """The mutable part of an episode (deep-copied by a fork)."""

    model: dict[str, Any]  # class name -> the instance the model's calls run on.
    truth: dict[str, Any]  # class name -> the instance the ground truth runs on.
    methods: dict[str, str]  # method name -> class name (BFCL's mapping: the last wins).
    turn: int = 0  # the user turn.
    steps: int = 0  # assistant messages of the episode.
    turn_steps: int = 0  # steps with calls or malformed in the current user turn.
    decoded: list[list[list[str]]] = dataclasses.field(default_factory=lambda: [[]])
    results: list[str] = dataclasses.field(default_factory=list)  # every model result.
    verdicts: list[float] = dataclasses.field(default_factory=list)  # per closed user turn.
    done: bool = False


class BFCLText:
    """One BFCL multi-turn task as a text environment (module docstring); a fork is a
    `copy.deepcopy` (the task is shared, the instances and the record are copied)."""

    signal_names = ("outcome", "verdict", "efficiency", MALFORMED_SIGNAL, "calls", "call_errors")
    reward_components = ("outcome", "process", "efficiency", MALFORMED_SIGNAL)

    def __init__(self, task: BFCLTask, *, max_turns: int = 32, max_steps: int = MAXIMUM_STEP_LIMIT):
        if max_turns < 1 or max_steps < 1:
            raise ValueError(
                f"BFCLText needs max_turns, max_steps >= 1, got {max_turns}, {max_steps}"
            )
        self.task, self.max_turns, self.max_steps = task, max_turns, max_steps
        self.tools = tuple(_tool_schema(doc) for doc in task.functions)
        # The shortest plan: per user turn one step with all its calls, then the reply.
        self.plan_steps = sum(2 if calls else 1 for calls in task.ground_truth)
        self.state: _State | None = None

    def __deepcopy__(self, memo):
        clone = copy.copy(self)
        clone.state = copy.deepcopy(self.state, memo)
        return clone

    def reset(self, seed: int) -> list[Message]:
        """The system message and the first user turn (the seed is not used)."""
        del seed
        task = self.task
        model, truth = _instances(task), _instances(task)
        self.state = _State(model=model, truth=truth, methods=_methods(model))
        behaviour = PROMPT_STYLE_TEMPLATES["classic"]["multiturn_behavior"]
        system = {"role": "system", "content": _SYSTEM.format(behaviour=behaviour)}
        return [system, *self._user_turn(0)]

    def step(self, text: str) -> tuple[list[Message], dict[str, float], bool]:
        """Plays one assistant message; malformed text is a step, never an exception."""
        state = self.state
        if state is None:
            raise RuntimeError("BFCLText.step before reset")
        if state.done:
            raise RuntimeError("BFCLText.step after the episode ended")
        signals = dict.fromkeys((*self.signal_names, "success"), 0.0)
        state.steps += 1
        signals["efficiency"] = -1.0 if state.steps > self.plan_steps else 0.0
        parsed = parse_tool_calls(text)
        unknown = [c.name for c in parsed.calls if c.name not in state.methods]
        if parsed.error is None and not unknown and not parsed.calls:
            return self._close_turn(signals)
        state.turn_steps += 1
        if parsed.error is not None or unknown:
            error = parsed.error or (
                f"unknown tool(s) {[n[:40] for n in unknown]}; the tools are "
                f"{[t['function']['name'] for t in self.tools]}"
            )
            signals[MALFORMED_SIGNAL] = 1.0
            reply = [{"role": "tool", "content": json.dumps({"error": f"malformed turn: {error}"})}]
        else:
            results = [_execute(state.model, state.methods, call) for call in parsed.calls]
            state.decoded[state.turn].append([_call_string(call) for call in parsed.calls])
            state.results += results
            signals["calls"] = float(len(results))
            signals["call_errors"] = float(sum(bool(_ERROR_RESULT.match(r)) for r in results))
            reply = [{"role": "tool", "content": result} for result in results]
        if state.turn_steps > self.max_steps:  # BFCL's force-quit: the task fails.
            state.done = True
            state.verdicts.append(-1.0)
            signals["verdict"] = -1.0
        return reply, signals, state.done

    def ground_truth_calls(self, turn: int) -> list[ToolCall]:
        """The ground truth's calls of a user turn as tool calls (arguments by name)."""
        state = self.state
        return [
            _parse_call(text, state.model, state.methods) for text in self.task.ground_truth[turn]
        ]

    def episode_metrics(
        self, signals: dict[str, jax.Array], turn_mask: jax.Array, action_tokens: jax.Array
    ) -> dict[str, jax.Array]:
        """Batch metrics (float32 scalars) of `[B, S]` signals (0 off `turn_mask`)."""
        del action_tokens
        valid = turn_mask.astype(jnp.float32)
        checked = jnp.sum((signals["verdict"] != 0) * valid)
        calls = jnp.sum(signals["calls"] * valid)
        return {
            "outcome": jnp.mean(jnp.sum(signals["outcome"] * valid, axis=1)),
            "turn_pass_rate": jnp.sum((signals["verdict"] > 0) * valid) / jnp.maximum(checked, 1),
            "steps_over_plan": jnp.mean(-jnp.sum(signals["efficiency"] * valid, axis=1)),
            "malformed_rate": jnp.sum(signals[MALFORMED_SIGNAL] * valid)
            / jnp.maximum(jnp.sum(valid), 1),
            "calls": jnp.mean(jnp.sum(signals["calls"] * valid, axis=1)),
            "call_error_rate": jnp.sum(signals["call_errors"] * valid) / jnp.maximum(calls, 1),
        }

    def _close_turn(
        self, signals: dict[str, float]
    ) -> tuple[list[Message], dict[str, float], bool]:
        """Ends the user turn: the ground truth's turn runs, the checks give the verdict."""
        state, turn = self.state, self.state.turn
        truth_calls = [
            _parse_call(text, state.truth, state.methods) for text in self.task.ground_truth[turn]
        ]
        truth_results = [_execute(state.truth, state.methods, call) for call in truth_calls]
        verdict = 0.0
        if truth_calls:  # BFCL checks only the turns whose ground truth has calls.
            passed = (
                not is_empty_execute_response(state.decoded[turn])
                and state_checker(state.model, state.truth)["valid"]
                and response_checker(state.results, truth_results, turn)["valid"]
            )
            verdict = 1.0 if passed else -1.0
        state.verdicts.append(verdict)
        signals["verdict"] = verdict
        state.turn, state.turn_steps = turn + 1, 0
        if state.turn == len(self.task.questions):
            state.done = True
            signals["outcome"] = signals["success"] = float(min(state.verdicts) >= 0)
            return [], signals, True
        state.decoded.append([])
        return self._user_turn(state.turn), signals, False

    def _user_turn(self, turn: int) -> list[Message]:
        """The messages of a user turn; a miss_func turn adds its held-out tools."""
        if turn not in self.task.missed:
            return [dict(m) for m in self.task.questions[turn]]
        docs = list(self.task.missed[turn])
        content = DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=docs)
        return [{"role": "user", "content": content}]


def make_bfcl_text(task_id: str, **options: Any) -> BFCLText:
    """The environment of one task (`options`: max_turns, max_steps)."""
    return BFCLText(load_task(task_id), **options)


def load_task(task_id: str) -> BFCLTask:
    """A task by id (`multi_turn_base_12`); refuses an unknown category or id."""
    category = task_id.rsplit("_", 1)[0]
    tasks = load_tasks(category)
    if task_id not in tasks:
        raise ValueError(
            f"no task {task_id!r} in BFCL category {category!r} (its ids run from "
            f"{next(iter(tasks))!r} to {next(reversed(tasks))!r})"
        )
    return tasks[task_id]


def bfcl_task_ids(category: str = "multi_turn_base", split: str = "train") -> tuple[str, ...]:
    """The ids of a category's tasks in a split ('train', 'heldout' or 'all')."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; the splits are {SPLITS}")
    ids = tuple(load_tasks(category))
    return ids if split == "all" else tuple(i for i in ids if split_of(i) == split)


def split_of(task_id: str) -> str:
    """'heldout' for HELDOUT_PERCENT % of the task numbers (by SHA-256 of the number,
    so a scenario's variants in every category, which share its number, share its
    split), 'train' for the rest."""
    number = task_id.rsplit("_", 1)[1]
    digest = int(hashlib.sha256(number.encode()).hexdigest()[:8], 16)
    return "heldout" if digest % 100 < HELDOUT_PERCENT else "train"


@functools.cache
def load_tasks(category: str) -> dict[str, BFCLTask]:
    """`{id: task}` of a multi-turn category, from the installed package's data files."""
    _require_bfcl()
    if category not in MULTI_TURN_CATEGORY:
        raise ValueError(
            f"unknown BFCL multi-turn category {category!r}; the categories are "
            f"{list(MULTI_TURN_CATEGORY)}"
        )
    # Read as the package's load_dataset_entry does, without its file locks (which write
    # lock files beside the installed package).
    name = f"{VERSION_PREFIX}_{category}.json"
    entries = _json_lines(eval_config.PROMPT_PATH / name)
    answers = {
        e["id"]: e["ground_truth"] for e in _json_lines(eval_config.POSSIBLE_ANSWER_PATH / name)
    }
    for entry in entries:
        docs = [copy.deepcopy(d) for c in entry["involved_classes"] for d in _func_docs(c)]
        missed = {}
        for turn, names in entry.get("missed_function", {}).items():
            missed[int(turn)] = tuple(d for d in docs if d["name"] in names)
            docs = [d for d in docs if d["name"] not in names]
        entry["function"], entry["missed"] = docs, missed
    add_language_specific_hint_to_function_doc(entries)  # BFCL's hint, shown tools only.
    return {
        e["id"]: BFCLTask(
            id=e["id"], category=category,
            questions=tuple(tuple(turn) for turn in e["question"]),
            initial_config=e["initial_config"], involved_classes=tuple(e["involved_classes"]),
            functions=tuple(e["function"]), missed=e["missed"],
            ground_truth=tuple(tuple(turn) for turn in answers[e["id"]]),
        )
        for e in entries
    }  # fmt: skip


def package_check(env: BFCLText) -> dict:
    """The package's own `multi_turn_checker` on the calls the episode ran (its result
    dict, `valid` first): it runs them again, and the ground truth, in fresh instances
    through `execute_multi_turn_func_call` (the model name is fresh per run, the instances
    it leaves in that module's globals are removed afterwards). An episode that did not
    reach the end fails as BFCL fails a force-terminated one."""
    task, state = env.task, env.state
    if state is None or len(state.decoded) != len(task.ground_truth) or state.turn_steps:
        return {"valid": False, "error_type": "multi_turn:force_terminated"}
    name = f"rlagent_check_{next(_CHECK_RUNS)}"
    entry = {"id": task.id, "initial_config": task.initial_config,
             "involved_classes": list(task.involved_classes)}  # fmt: skip
    try:
        truth = [list(calls) for calls in task.ground_truth]
        return multi_turn_checker(copy.deepcopy(state.decoded), truth, entry, task.category, name)
    finally:
        names = multi_turn_utils.__dict__
        for key in [k for k in names if k.startswith(f"{name}_")]:
            del names[key]


def _require_bfcl() -> None:
    if _IMPORT_ERROR is not None:
        raise ImportError(
            "the BFCL environment needs the bfcl_eval package (Apache-2.0), installed without "
            "its heavy dependencies: pip install --no-deps 'bfcl-eval==2026.3.23' "
            f"({_IMPORT_ERROR})"
        ) from _IMPORT_ERROR


@functools.cache
def _func_docs(class_name: str) -> tuple[dict, ...]:
    path = eval_config.MULTI_TURN_FUNC_DOC_PATH / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    return tuple(_json_lines(path))


def _json_lines(path) -> list[dict]:
    with open(path) as file:
        return [json.loads(line) for line in file if line.strip()]


def _tool_schema(doc: dict) -> dict:
    """A BFCL function doc as an OpenAI-style tool schema (BFCL's type names mapped as its
    `GORILLA_TO_OPENAPI` maps them; the doc's `response` is left out)."""
    parameters = _openapi(doc["parameters"])
    parameters["type"] = "object"
    function = {"name": doc["name"], "description": doc["description"], "parameters": parameters}
    return {"type": "function", "function": function}


def _openapi(schema: dict) -> dict:
    out = dict(schema)
    if "type" in out:
        out["type"] = GORILLA_TO_OPENAPI.get(out["type"], "string")
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _openapi(v) for k, v in out["properties"].items()}
    if isinstance(out.get("items"), dict):
        out["items"] = _openapi(out["items"])
    return out


def _instances(task: BFCLTask) -> dict[str, Any]:
    """The task's API class instances, loaded as `execute_multi_turn_func_call` loads them."""
    long_context = "long_context" in task.category or "composite" in task.category
    instances = {}
    for class_name in task.involved_classes:
        module = importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name])
        instance = getattr(module, class_name)()
        if class_name not in STATELESS_CLASSES:
            config = copy.deepcopy(task.initial_config.get(class_name, {}))
            instance._load_scenario(config, long_context=long_context)
        instances[class_name] = instance
    return instances


def _methods(instances: dict[str, Any]) -> dict[str, str]:
    """`{method: class}` of the instances' public methods, as BFCL's helper maps them (a
    name in two classes goes to the later one)."""
    methods = {}
    for class_name, instance in instances.items():
        for name, _ in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not name.startswith("_"):
                methods[name] = class_name
    return methods


def _execute(instances: dict[str, Any], methods: dict[str, str], call: ToolCall) -> str:
    """The call run on its instance; the result's text as BFCL's helper makes it."""
    try:
        result = getattr(instances[methods[call.name]], call.name)(**call.arguments)
    except Exception as error:  # as BFCL: any failure of the call is its result.
        return f"Error during execution: {error}"
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


def _parse_call(text: str, instances: dict[str, Any], methods: dict[str, str]) -> ToolCall:
    """A ground-truth call string (`cd(folder='document')`, `sort('a.pdf')`) as a tool
    call, positional arguments named by the method's signature (never `eval`ed)."""
    node = ast.parse(text, mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a ground-truth call: {text!r}")
    args = [ast.literal_eval(a) for a in node.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    method = getattr(instances[methods[node.func.id]], node.func.id)
    bound = inspect.signature(method).bind(*args, **kwargs)
    return ToolCall(node.func.id, dict(bound.arguments))


def _call_string(call: ToolCall) -> str:
    """A call as BFCL's decoded Python text (`name(a=1, b='x')`), for its checker."""
    arguments = ", ".join(f"{key}={value!r}" for key, value in call.arguments.items())
    return f"{call.name}({arguments})"
