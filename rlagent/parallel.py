"""Mesh and multi-host helpers (jax.sharding).

Training lays the episodes of a batch along one `data` axis of a `jax.sharding.Mesh`;
the same program runs on one CPU, several host devices, a GPU or a TPU slice.
"""

from __future__ import annotations

import jax
import numpy as np
from absl import flags


def data_mesh(num_devices: int | None = None, axis: str = "data") -> jax.sharding.Mesh:
    """A one-axis mesh over the first `num_devices` devices (all by default)."""
    devices = jax.devices()
    if num_devices is not None:
        if not 1 <= num_devices <= len(devices):
            raise ValueError(f"num_devices={num_devices}, but {len(devices)} devices exist.")
        devices = devices[:num_devices]
    return jax.sharding.Mesh(np.asarray(devices), (axis,))


def define_distributed_flags() -> None:
    """Flags for `jax.distributed.initialize` on multi-host runs (no-op when unset)."""
    flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-host).")
    flags.DEFINE_integer("num_processes", None, "Number of processes (multi-host).")
    flags.DEFINE_integer("process_id", None, "Index of this process (multi-host).")
    flags.DEFINE_integer("num_devices", None, "Shard episodes over this many devices.")


def maybe_initialize_distributed() -> None:
    """Calls `jax.distributed.initialize` when the multi-host flags are given."""
    values = flags.FLAGS
    if values.coordinator_address:
        jax.distributed.initialize(
            coordinator_address=values.coordinator_address,
            num_processes=values.num_processes,
            process_id=values.process_id,
        )
