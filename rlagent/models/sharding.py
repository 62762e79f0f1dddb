"""FSDP over a device mesh for the parameters of every role (docs/models.md, "Sharding").

A role (policy, reference, critic) holds its parameters on a `jax.sharding.Mesh` with
axes `("data", "fsdp")`. Each parameter is split along its largest dimension divisible
by the `fsdp` axis size (fully sharded data parallel, ZeRO-3 style: every device stores
1 / n of each large matrix and XLA gathers a layer's weights where a matmul needs them);
small parameters (norm weights, biases) and those with no divisible dimension are
replicated. The rule reads shapes only, so the optimiser's moments (shaped like the
parameters) get the parameters' layout from the same rule. Batches are split along
their leading (episode) axis over both mesh axes, so every device scores its own rows.

Nothing here writes a collective: parameters are placed with `jax.device_put` and kept
in place inside a jitted program with `jax.lax.with_sharding_constraint`; XLA's SPMD
partitioner inserts the all-gathers and reduce-scatters (the JAX anchors are Tunix's
per-role meshes and MaxText's FSDP logical axes).

Roles may share one mesh (the default of `role_meshes`) or each get their own slice of
the devices; arrays move between role meshes with `jax.device_put` (e.g. the reference's
log-probs onto the policy's mesh), outside any one program. That host-level move between
disjoint meshes is one process's: across hosts it needs Pathways, so a multi-process run
refuses split role meshes and keeps every role on the policy's mesh (docs/distributed.md).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import NamedTuple

import jax
import numpy as np
from flax import nnx

DATA, FSDP = "data", "fsdp"
# Parameters with fewer elements than this are replicated: sharding a [896] norm weight
# saves nothing and costs a gather per use.
MIN_SHARD_SIZE = 1024


class RoleMeshes(NamedTuple):
    """The mesh of each role of an RL update (the same mesh, or disjoint device slices)."""

    policy: jax.sharding.Mesh
    reference: jax.sharding.Mesh
    critic: jax.sharding.Mesh


def fsdp_mesh(devices: Sequence[jax.Device] | None = None, *, data: int = 1) -> jax.sharding.Mesh:
    """A `("data", "fsdp")` mesh of `data` rows over `devices` (all devices by default).

    `jax.devices()` lists every process's devices once `jax.distributed.initialize` has
    run, ordered by process; with `data` = the number of processes each row is one host's
    devices, so FSDP's gathers stay on a host's fast links and only gradients of the data
    axis cross hosts.
    """
    devices = list(jax.devices() if devices is None else devices)
    if data < 1 or len(devices) % data:
        raise ValueError(f"data={data} does not divide {len(devices)} devices into mesh rows")
    grid = np.asarray(devices, dtype=object).reshape(data, len(devices) // data)
    return jax.sharding.Mesh(grid, (DATA, FSDP))


def role_meshes(devices: Sequence[jax.Device] | None = None, *, split: bool = False) -> RoleMeshes:
    """Meshes of the policy, reference and critic: one shared mesh over `devices`, or with
    `split` three disjoint FSDP meshes over consecutive thirds of them (Tunix's per-role
    meshes: the reference's forward runs on devices the policy's update does not use)."""
    devices = list(jax.devices() if devices is None else devices)
    if not split:
        mesh = fsdp_mesh(devices)
        return RoleMeshes(mesh, mesh, mesh)
    if jax.process_count() > 1:
        raise ValueError(
            "split role meshes move arrays between disjoint meshes with a host-level "
            f"jax.device_put, which {jax.process_count()} processes cannot do without "
            "Pathways; use one shared mesh (split=False)"
        )
    if len(devices) < 3 or len(devices) % 3:
        raise ValueError(f"split role meshes need a multiple of 3 devices, got {len(devices)}")
    third = len(devices) // 3
    return RoleMeshes(*(fsdp_mesh(devices[i * third : (i + 1) * third]) for i in range(3)))


def fsdp_spec(
    shape: Sequence[int], mesh: jax.sharding.Mesh, *, min_size: int = MIN_SHARD_SIZE
) -> jax.sharding.PartitionSpec:
    """The `PartitionSpec` of one parameter: its largest dimension divisible by the fsdp
    axis size split along `fsdp` (the first of equal ones), or replicated when it has
    fewer than `min_size` elements or no such dimension."""
    ways = mesh.shape[FSDP]
    spec = [None] * len(shape)
    if ways == 1 or int(np.prod(shape, dtype=np.int64)) < min_size:
        return jax.sharding.PartitionSpec(*spec)
    divisible = [axis for axis, size in enumerate(shape) if size % ways == 0]
    if divisible:
        spec[max(divisible, key=lambda axis: (shape[axis], -axis))] = FSDP
    return jax.sharding.PartitionSpec(*spec)


def param_shardings(tree: Any, mesh: jax.sharding.Mesh, *, min_size: int = MIN_SHARD_SIZE):
    """A `NamedSharding` per leaf of `tree` (arrays or `jax.ShapeDtypeStruct`s: an
    `nnx.State` of parameters, an optax state) by `fsdp_spec`."""
    return jax.tree.map(
        lambda leaf: jax.sharding.NamedSharding(
            mesh, fsdp_spec(leaf.shape, mesh, min_size=min_size)
        ),
        tree,
    )


def shard_params(tree: Any, mesh: jax.sharding.Mesh, *, min_size: int = MIN_SHARD_SIZE):
    """`tree` placed on `mesh` by `param_shardings` (parameters or optimiser state)."""
    return jax.device_put(tree, param_shardings(tree, mesh, min_size=min_size))


def init_sharded(
    build: Callable[[], nnx.Module], mesh: jax.sharding.Mesh, *, min_size: int = MIN_SHARD_SIZE
) -> tuple[nnx.GraphDef, nnx.State]:
    """`nnx.split(build())` with the parameters initialised straight into their shards:
    one jitted program whose outputs are laid out by `param_shardings`, so no device ever
    holds the whole model (a 0.5B model's float32 copy, say, on the default device)."""
    graphdef, abstract = nnx.split(nnx.eval_shape(build))
    shardings = param_shardings(abstract, mesh, min_size=min_size)
    return graphdef, jax.jit(lambda: nnx.split(build())[1], out_shardings=shardings)()


def constrain_params(tree: Any, mesh: jax.sharding.Mesh | None, *, min_size: int = MIN_SHARD_SIZE):
    """Inside a jitted program: `tree` kept in `param_shardings`' layout (identity
    without a mesh), so updated parameters leave the program sharded as they came."""
    if mesh is None:
        return tree
    return jax.lax.with_sharding_constraint(tree, param_shardings(tree, mesh, min_size=min_size))


def batch_sharding(mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
    """Leading (episode) axis over every device of the mesh, the rest replicated."""
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec((DATA, FSDP)))


def shard_batch(tree: Any, mesh: jax.sharding.Mesh) -> Any:
    """Every leaf of `tree` (a Trajectory, log-probs `[B, ...]`) split along its leading
    axis over the mesh's devices; B must be a multiple of their number. In a
    multi-process run each process passes its own rows (host data, each process's in
    order: `rlagent.parallel.share`) and gets the whole batch over the mesh
    (`jax.make_array_from_process_local_data`)."""
    processes = jax.process_count()
    _check_rows(tree, mesh, processes)
    if processes == 1:
        return jax.device_put(tree, batch_sharding(mesh))
    return jax.tree.map(
        lambda leaf: jax.make_array_from_process_local_data(
            batch_sharding(mesh), np.asarray(leaf), (leaf.shape[0] * processes, *leaf.shape[1:])
        ),
        tree,
    )


def constrain_batch(tree: Any, mesh: jax.sharding.Mesh | None) -> Any:
    """Inside a jitted program: the leading axis of every leaf laid over the mesh."""
    if mesh is None:
        return tree
    _check_rows(tree, mesh)
    return jax.lax.with_sharding_constraint(tree, batch_sharding(mesh))


def _check_rows(tree: Any, mesh: jax.sharding.Mesh, processes: int = 1) -> None:
    rows = {leaf.shape[0] * processes for leaf in jax.tree.leaves(tree)}
    bad = sorted(r for r in rows if r % mesh.size)
    if bad:
        raise ValueError(f"batch rows {bad} do not split over the mesh's {mesh.size} devices")
