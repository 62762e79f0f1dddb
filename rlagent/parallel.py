"""Mesh and multi-process helpers (jax.sharding, jax.distributed).

Training lays the episodes of a batch along one `data` axis of a `jax.sharding.Mesh`;
the same program runs on one CPU, several host devices, a GPU or a TPU slice, and on
several processes (hosts) at once once `jax.distributed` is initialised
(docs/distributed.md).

`initialize_distributed` is the one way a process joins a multi-process run: from the
flags of `define_distributed_flags` (every launcher has them) or, with `--distributed`,
from the cluster's environment (`jax.distributed.initialize()` reads SLURM, Open MPI,
Cloud TPU and GKE's variables). Every process then runs the same program on meshes of
the global `jax.devices()`; `is_primary` names the one process that writes files,
`sync` and `broadcast` keep the processes in step, and `fetch` brings any array (one
sharded over other processes' devices too) to the host.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from absl import flags
from jax.experimental import multihost_utils
from orbax.checkpoint import multihost as ocp_multihost

_FLAGS = ("coordinator_address", "num_processes", "process_id", "distributed")


def data_mesh(num_devices: int | None = None, axis: str = "data") -> jax.sharding.Mesh:
    """A one-axis mesh over the first `num_devices` devices (all by default)."""
    devices = jax.devices()
    if num_devices is not None:
        if not 1 <= num_devices <= len(devices):
            raise ValueError(f"num_devices={num_devices}, but {len(devices)} devices exist.")
        devices = devices[:num_devices]
    return jax.sharding.Mesh(np.asarray(devices), (axis,))


def define_distributed_flags() -> None:
    """The flags of `initialize_distributed` (a no-op when none is given); defined once
    per process, so launchers imported together share them."""
    if _FLAGS[0] in flags.FLAGS:
        return
    flags.DEFINE_string(
        "coordinator_address", None, "host:port of process 0's coordinator (multi-process)."
    )
    flags.DEFINE_integer("num_processes", None, "Number of processes of the run (multi-process).")
    flags.DEFINE_integer("process_id", None, "Index of this process, 0..num_processes-1.")
    flags.DEFINE_bool(
        "distributed",
        False,
        "Join a multi-process run from the cluster's environment (SLURM, Open MPI, Cloud TPU, "
        "GKE: jax.distributed.initialize() detects it); the flags above override what it reads.",
    )


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    from_environment: bool = False,
) -> None:
    """Joins a multi-process run (`jax.distributed.initialize`) before anything touches a
    device: with the three settings, or with `from_environment` from the cluster's
    variables (any setting given overrides what it reads); nothing without either, or
    when this process has joined already. Bad settings are refused naming the flag."""
    given = {
        "--coordinator_address": coordinator_address,
        "--num_processes": num_processes,
        "--process_id": process_id,
    }
    if jax.distributed.is_initialized() or not (from_environment or any(
        value is not None for value in given.values()
    )):  # fmt: skip
        return
    missing = [name for name, value in given.items() if value is None]
    if missing and not from_environment:
        raise ValueError(
            f"a multi-process run needs {', '.join(missing)} as well (or --distributed to "
            "read them from the cluster's environment)."
        )
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"--num_processes must be >= 1, got {num_processes}.")
    if process_id is not None and process_id < 0:
        raise ValueError(f"--process_id must be >= 0, got {process_id}.")
    if None not in (process_id, num_processes) and process_id >= num_processes:
        raise ValueError(
            f"--process_id must be in 0..{num_processes - 1} (--num_processes={num_processes}), "
            f"got {process_id}."
        )
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
    )


def maybe_initialize_distributed() -> None:
    """`initialize_distributed` from the parsed flags of `define_distributed_flags`
    (nothing before the flags are parsed: a study called from Python runs in one process)."""
    values = flags.FLAGS
    if not values.is_parsed():
        return
    initialize_distributed(
        values.coordinator_address,
        values.num_processes,
        values.process_id,
        from_environment=values.distributed,
    )


def is_primary() -> bool:
    """Whether this process writes the run's files (process 0; the only one of a
    single-process run)."""
    return jax.process_index() == 0


def sync(name: str) -> None:
    """Waits until every process has reached `sync(name)` (nothing in one process, or in
    process 0 alone inside `primary_decides`): a barrier of the coordination service,
    which waits without spinning a device."""
    if not _solo():
        _client().wait_at_barrier(_unique(name), WAIT_S * 1000)


def broadcast(value: Any) -> Any:
    """Process 0's `value` (anything `json` writes) on every process, through the
    coordination service's key-value store (the others block on it without spinning);
    `value` itself in a single-process run (or in process 0 alone, `primary_decides`)."""
    if _solo():
        return value
    key, client = _unique("broadcast"), _client()
    if is_primary():
        client.key_value_set(key, json.dumps(value, default=_plain))
        return value
    return json.loads(client.blocking_key_value_get(key, WAIT_S * 1000))


# How long a process waits for process 0 (a report of a large study, a slow disk).
WAIT_S = 6 * 3600
_calls = itertools.count()
# Non-empty while process 0 runs a `primary_decides` alone (the others wait for it).
_alone: list[bool] = []


def _solo() -> bool:
    """No other process to talk to: one process, or process 0 alone inside
    `primary_decides`."""
    return jax.process_count() == 1 or bool(_alone)


def _unique(name: str) -> str:
    """`name` made unique per call; every process makes its calls in one order."""
    return f"rlagent/{name}/{next(_calls)}"


def _client() -> Any:
    """The coordination service's client of this process (`jax.distributed`)."""
    return ocp_multihost.get_jax_distributed_client()


def _plain(value: Any) -> Any:
    """NumPy scalars and arrays as the Python numbers and lists `json` writes."""
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def primary_decides(decide: Any, *, errors: tuple[type[Exception], ...] = ()) -> Any:
    """`decide()` run by process 0 alone and its result (anything `json` writes) returned
    on every process, the others waiting for it. When it raises, process 0 raises its
    error and every other process the same type (the first of `errors` it is an instance
    of; RuntimeError otherwise) with the same message. In one process: `decide()`.
    Inside `decide` process 0 is alone: a `primary_decides`, `broadcast` or `sync` there
    (a study that prepares its own workdir, run by process 0 for all) talks to no other
    process."""
    if _solo():
        return decide()
    outcome, raised = None, None
    if is_primary():
        try:
            _alone.append(True)
            try:
                outcome = {"value": decide()}
            finally:
                _alone.pop()
            json.dumps(outcome, default=_plain)  # a value `broadcast` cannot send fails here.
        except Exception as error:  # noqa: BLE001 - raised again below, on every process.
            kinds = [i for i, kind in enumerate(errors) if isinstance(error, kind)]
            outcome, raised = {"error": kinds[0] if kinds else -1, "message": str(error)}, error
    outcome = broadcast(outcome)
    if raised is not None:
        raise raised
    if "error" in outcome:
        kind = errors[outcome["error"]] if outcome["error"] >= 0 else RuntimeError
        raise kind(outcome["message"])
    return outcome["value"]


def replicate(tree: Any, mesh: jax.sharding.Mesh) -> Any:
    """Every array of `tree` (the same values on every process) whole on every device of
    `mesh`, which may span processes: a program over the mesh then takes it as it is."""
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.tree.map(
        lambda leaf: jax.make_array_from_process_local_data(sharding, np.asarray(leaf)), tree
    )


def gather(value: Any) -> list[Any]:
    """Every process's `value` (anything `json` writes), in process order, on every process
    (through the coordination service's key-value store); `[value]` in one process, or in
    process 0 alone inside `primary_decides`."""
    if _solo():
        return [value]
    key, client = _unique("gather"), _client()
    client.key_value_set(f"{key}/{jax.process_index()}", json.dumps(value, default=_plain))
    return [
        json.loads(client.blocking_key_value_get(f"{key}/{i}", WAIT_S * 1000))
        for i in range(jax.process_count())
    ]


def gather_items(mine: Mapping[int, Any], items: Iterable[int]) -> list[Any]:
    """The value of every item of `items`, in their order, from the `{item: value}` of
    every process (its `split` share; values anything `json` writes)."""
    joined = {int(item): value for share in gather(dict(mine)) for item, value in share.items()}
    return [joined[item] for item in items]


def split(items: Sequence[Any]) -> list[Any]:
    """This process's items of `items` (every process-count-th, from its index): work
    that `gather` joins; all of them in one process, or in process 0 alone."""
    if _solo():
        return list(items)
    return list(items)[jax.process_index() :: jax.process_count()]


def share(count: int) -> slice:
    """This process's rows of a batch of `count` (process p: the p-th of equal parts)."""
    processes, index = jax.process_count(), jax.process_index()
    if count % processes:
        raise ValueError(f"{count} episodes do not split over {processes} processes")
    size = count // processes
    return slice(index * size, (index + 1) * size)


def process_mean(values: dict[str, float]) -> dict[str, float]:
    """The mean over processes of each value (each process's over its equal share of a
    batch: the batch's mean); `values` itself in one process."""
    if jax.process_count() == 1:
        return values
    names = sorted(values)
    local = np.asarray([[values[name] for name in names]], np.float64)
    every = np.asarray(multihost_utils.process_allgather(local, tiled=True))
    return {name: float(value) for name, value in zip(names, every.mean(axis=0), strict=True)}


def local_mesh(mesh: jax.sharding.Mesh) -> jax.sharding.Mesh:
    """The rows of `mesh` (its leading axis) whose devices are all this process's: the
    mesh a program that runs in this process only (its episodes' generation) lays its
    arrays on. With one process, `mesh` itself."""
    if jax.process_count() == 1:
        return mesh
    rows = [
        i for i, row in enumerate(mesh.devices)
        if all(device.process_index == jax.process_index() for device in row.flat)
    ]  # fmt: skip
    return jax.sharding.Mesh(mesh.devices[rows], mesh.axis_names)


def local_view(tree: Any, mesh: jax.sharding.Mesh) -> Any:
    """This process's own whole copy of every array of `tree` laid out on `mesh`, an array
    over its devices alone (no copy). Each of the mesh's leading rows must be one
    process's devices and the arrays replicated along that axis (an FSDP mesh of
    `data` = a multiple of the process count): a program that reads them then runs in
    this process only, e.g. generation of this process's episodes. Arrays this process
    holds whole already are returned as they are."""
    own = local_mesh(mesh)

    def view(leaf: Any) -> Any:
        if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
            return leaf
        spec = leaf.sharding.spec
        if spec and mesh.axis_names[0] in jax.tree.leaves(tuple(spec)):
            raise ValueError(f"local_view: an array sharded along {mesh.axis_names[0]!r}")
        local = jax.sharding.NamedSharding(own, spec)
        shards = {shard.device: shard.data for shard in leaf.addressable_shards}
        devices = local.addressable_devices_indices_map(leaf.shape)
        return jax.make_array_from_single_device_arrays(
            leaf.shape, local, [shards[device] for device in devices]
        )

    return jax.tree.map(view, tree)


def fetch(tree: Any) -> Any:
    """Every array of `tree` as NumPy on this host: one this process holds whole as it is,
    a replicated one from its local copy, one sharded over other processes' devices
    gathered from them (every process must then call `fetch` alike)."""

    def host(leaf: Any) -> Any:
        if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
            return np.asarray(jax.device_get(leaf))
        if leaf.is_fully_replicated:
            return np.asarray(leaf.addressable_data(0))
        return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))

    return jax.tree.map(host, tree)
