"""Data parallel over all local devices through jax.sharding: a 1-D mesh whose one axis ("batch")
spans jax.local_devices(); model inputs are split on their first axis, parameters replicated.

Holds the mesh, the two shardings and the row padding to a multiple of the device count. Must not
choose shapes, batch documents or know about models (models/loader.py uses it).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

BATCH_AXIS = "batch"


@dataclasses.dataclass(frozen=True)
class DataParallel:
    """Rows of a batch spread evenly over the mesh's devices; everything else copied to each."""

    mesh: Mesh

    @property
    def n_devices(self) -> int:
        return int(self.mesh.devices.size)

    @property
    def rows(self) -> NamedSharding:
        """Split the first (batch) axis over the devices."""
        return NamedSharding(self.mesh, PartitionSpec(BATCH_AXIS))

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    def padded_rows(self, n_rows: int) -> int:
        """n_rows rounded up to a multiple of the device count (at least one row per device)."""
        return max(1, -(-n_rows // self.n_devices)) * self.n_devices

    def replicate(self, tree: Any) -> Any:
        """A pytree of arrays (the model parameters) with a full copy on every device."""
        return jax.device_put(tree, self.replicated)

    def shard_rows(self, *arrays: np.ndarray) -> tuple[list[jax.Array], int]:
        """Arrays with the same first dimension n -> (arrays padded with zero rows to a multiple of the
        device count and split over the devices on that axis, n). Zero rows are padding (segment id 0):
        callers drop their outputs with [:n]."""
        n = int(arrays[0].shape[0])
        if any(int(a.shape[0]) != n for a in arrays):
            raise ValueError(f"all batch arrays need the same number of rows; got {[a.shape for a in arrays]}")
        total = self.padded_rows(n)
        padded = [np.concatenate([a, np.zeros((total - n, *a.shape[1:]), a.dtype)]) if total > n else a
                  for a in arrays]
        return [jax.device_put(a, self.rows) for a in padded], n


def local_data_parallel(devices: Sequence[jax.Device] | None = None) -> DataParallel:
    """Data parallel over `devices` (default: every local device: a TPU host's chips, the GPUs of a
    machine, or the CPU devices of --xla_force_host_platform_device_count)."""
    devices = list(devices) if devices is not None else jax.local_devices()
    return DataParallel(Mesh(np.array(devices), (BATCH_AXIS,)))
