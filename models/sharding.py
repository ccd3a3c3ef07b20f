"""Models over all local devices through jax.sharding: a 2-D mesh ("data", "model") spanning
jax.local_devices(). Model inputs are split on their first axis over "data"; weight matrices are split over
"model" on their heads / MLP / vocabulary dimension (Megatron's layout, as MaxText and Levanter shard),
everything else is copied to each device. The model axis is as small as lets each device hold its share of
the parameters: 1 (plain data parallel) whenever the whole model fits one device.

Holds the mesh, the parameter partition rules, the choice of the mesh from the parameters' bytes and the
devices' memory, the row padding to a multiple of the data axis, and the activation constraint the model's
blocks apply. Must not choose shapes, batch documents or know about model families beyond parameter names
(models/loader.py uses it).
"""
from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from kernels.mesh import DATA_AXIS, MODEL_AXIS  # the kernels' shard_map names the same axes
from models.memory_room import format_bytes, host_memory_room, smallest_free

# Per-device memory budget in bytes; overrides what the devices report (CPU devices report nothing).
BUDGET_ENV = "DOCSCORE_DEVICE_MEMORY_BYTES"
# A device's share of the parameters may take this much of its room; the rest is for a call's activations,
# which the --batch_size check (pipeline/telemetry/memory.py) then measures against what is left.
PARAM_SHARE = 0.9

# Parameter path (models' nnx names) -> the dimensions that may be split over the model axis, in order of
# preference. q/k/v and the MLP's up/gate split their output columns (heads, mlp) and the attention output and
# MLP down their input rows, so a block's matmuls need one reduction after attention and one after the MLP;
# token tables and LM heads split their vocabulary (the logits stay split up to the log-softmax), or their
# hidden dimension when the vocabulary does not divide. Anything unnamed (norms, position tables, output biases)
# is copied.
PARTITION_RULES: tuple[tuple[str, tuple[int, ...]], ...] = (
    (r"/(query|key|value)/kernel$", (1,)),
    (r"/(query|key|value)/bias$", (0,)),
    (r"/attention/output/kernel$", (0,)),
    (r"/feed_forward/(up|gate)/kernel$", (1,)),
    (r"/feed_forward/(up|gate)/bias$", (0,)),
    (r"/feed_forward/down/kernel$", (0,)),
    (r"^(embeddings/word|token_embedding)/embedding$", (0, 1)),
    (r"^lm_head/kernel$", (1, 0)),
)

# A path component whose parameters carry a leading layer axis (models/layers.py StackedBlocks: layers/stacked/...,
# or layers/<run>/stacked/<position>/... for a repeating period of blocks of several structures): that axis is never
# split, the rest is laid out as one block's parameter of the same name.
STACKED = "stacked"


class ModelDoesNotFit(ValueError):
    """The parameters cannot be held by this host's devices, even split over all of them."""


def path_name(path: tuple[Any, ...]) -> str:
    """'layers/0/attention/query/kernel' of a jax tree path (nnx.State or a pure dict of one)."""
    parts = []
    for key in path:
        if isinstance(key, jax.tree_util.DictKey):
            parts.append(str(key.key))
        elif isinstance(key, jax.tree_util.SequenceKey):
            parts.append(str(key.idx))
    return "/".join(parts)


def partition_spec(name: str, shape: Sequence[int], model_size: int) -> PartitionSpec:
    """How the parameter `name` of `shape` is laid out over a model axis of `model_size` devices: split on
    the first of its rule's dimensions that divides evenly, else copied. A stacked parameter (STACKED in its
    path) keeps its leading layer axis whole and lays out the rest as one block's."""
    parts = name.split("/")
    if STACKED in parts:
        block = partition_spec("/".join(p for p in parts if p != STACKED), shape[1:], model_size)
        return PartitionSpec(None, *block) if block != PartitionSpec() else PartitionSpec()
    if model_size > 1:
        for pattern, dims in PARTITION_RULES:
            if re.search(pattern, name):
                for dim in dims:
                    if dim < len(shape) and shape[dim] % model_size == 0:
                        return PartitionSpec(*[MODEL_AXIS if d == dim else None for d in range(len(shape))])
                break
    return PartitionSpec()


def bytes_per_device(params: Any, model_size: int) -> int:
    """Bytes of the parameters (any pytree of arrays or ShapeDtypeStructs) one device holds when the model
    axis has `model_size` devices."""
    total = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        nbytes = int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize
        split = partition_spec(path_name(path), leaf.shape, model_size) != PartitionSpec()
        total += nbytes // model_size if split else nbytes
    return total


@dataclasses.dataclass(frozen=True)
class MeshLayout:
    """Rows of a batch spread evenly over the data axis; parameters split over the model axis by
    PARTITION_RULES (copied to every device when it has one device); `reason` says why this mesh."""

    mesh: Mesh
    reason: str = ""

    @property
    def data_size(self) -> int:
        return int(self.mesh.shape[DATA_AXIS])

    @property
    def model_size(self) -> int:
        return int(self.mesh.shape[MODEL_AXIS])

    @property
    def rows(self) -> NamedSharding:
        """Split the first (batch) axis over the data axis (each row copied over the model axis)."""
        return NamedSharding(self.mesh, PartitionSpec(DATA_AXIS))

    def padded_rows(self, n_rows: int) -> int:
        """n_rows rounded up to a multiple of the data axis (at least one row per data shard)."""
        return max(1, -(-n_rows // self.data_size)) * self.data_size

    def param_sharding(self, name: str, shape: Sequence[int]) -> NamedSharding:
        return NamedSharding(self.mesh, partition_spec(name, shape, self.model_size))

    def place(self, params: Any) -> Any:
        """A pytree of parameters (nnx.State or its pure dict) on the mesh, each laid out by its name."""
        return jax.tree_util.tree_map_with_path(
            lambda path, leaf: jax.device_put(leaf, self.param_sharding(path_name(path), leaf.shape)), params)

    def shard_rows(self, *arrays: np.ndarray) -> tuple[list[jax.Array], int]:
        """Arrays with the same first dimension n -> (arrays padded with zero rows to a multiple of the data
        axis and split over it on that axis, n). Zero rows are padding (segment id 0): callers drop their
        outputs with [:n]."""
        n = int(arrays[0].shape[0])
        if any(int(a.shape[0]) != n for a in arrays):
            raise ValueError(f"all batch arrays need the same number of rows; got {[a.shape for a in arrays]}")
        total = self.padded_rows(n)
        padded = [np.concatenate([a, np.zeros((total - n, *a.shape[1:]), a.dtype)]) if total > n else a
                  for a in arrays]
        return [jax.device_put(a, self.rows) for a in padded], n

    def traced(self, fn: Any) -> Any:
        """`fn` traced with this mesh as the abstract mesh, so constrain_rows in the model's blocks applies."""
        def with_mesh(*args, **kwargs):
            with jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh):
                return fn(*args, **kwargs)
        return with_mesh

    def summary(self) -> dict[str, Any]:
        """summary.json's model.sharding."""
        return {"mesh": {DATA_AXIS: self.data_size, MODEL_AXIS: self.model_size},
                "devices": [str(d) for d in self.mesh.devices.flat], "reason": self.reason}


def constrain_rows(x: jax.Array) -> jax.Array:
    """x [B, ...] kept split by rows over the data axis and whole on each model shard, when traced under a
    mesh with a data axis (MeshLayout.traced); unchanged otherwise. Keeps the compiler from carrying a block's
    output split on hidden or heads into the next block."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or DATA_AXIS not in mesh.axis_names:
        return x
    return jax.lax.with_sharding_constraint(x, PartitionSpec(DATA_AXIS))


def layout(devices: Sequence[jax.Device], model_size: int = 1, reason: str = "") -> MeshLayout:
    """A mesh of `devices` as (len / model_size) x model_size; neighbouring devices share a model shard."""
    devices = list(devices)
    if model_size < 1 or len(devices) % model_size:
        raise ValueError(f"model axis {model_size} does not divide {len(devices)} devices")
    grid = np.array(devices, dtype=object).reshape(len(devices) // model_size, model_size)
    return MeshLayout(Mesh(grid, (DATA_AXIS, MODEL_AXIS)), reason)


def local_data_parallel(devices: Sequence[jax.Device] | None = None) -> MeshLayout:
    """Data parallel over `devices` (default: every local device: a TPU host's chips, the GPUs of a
    machine, or the CPU devices of --xla_force_host_platform_device_count), parameters copied to each."""
    devices = list(devices) if devices is not None else jax.local_devices()
    return layout(devices, 1, "data parallel: parameters copied to every device")


def parses_as_bytes(text: str) -> bool:
    """Whether BUDGET_ENV's value is a positive, finite number of bytes (16e9 or 16000000000)."""
    try:
        value = float(text)
    except ValueError:
        return False
    return 0 < value < float("inf")


def device_room(devices: Sequence[jax.Device]) -> tuple[int, str]:
    """(bytes each device can give the parameters, where that number comes from): BUDGET_ENV when set, else
    the smallest bytes_limit - bytes_in_use of memory_stats(), else (CPU devices, which report none) the
    host's available RAM shared by the devices."""
    budget = os.environ.get(BUDGET_ENV)
    if budget:
        if not parses_as_bytes(budget):
            raise ModelDoesNotFit(f"{BUDGET_ENV}={budget!r} is not a number of bytes per device; set it to one (e.g. "
                                  "16e9) or unset it")
        return int(float(budget)), f"the {BUDGET_ENV} budget"
    free = smallest_free(devices)
    if free is not None:
        room, device = free
        return room, f"free on {device.platform}:{device.id} (memory_stats)"
    host = host_memory_room()
    return host.bytes // max(1, len(devices)), f"the host's {host.source}, shared by {len(devices)} {devices[0].platform} device(s)"


def choose_layout(params: Any, devices: Sequence[jax.Device] | None = None) -> MeshLayout:
    """The mesh for parameters `params` (a pytree of ShapeDtypeStructs or arrays) on `devices` (default: every
    local device): the smallest model axis (a divisor of the device count) at which each device's share fits
    PARAM_SHARE of its room; the rest of the devices split rows. Raises ModelDoesNotFit when even all devices
    together cannot hold the parameters."""
    devices = list(devices) if devices is not None else jax.local_devices()
    room, source = device_room(devices)
    total = bytes_per_device(params, 1)
    n = len(devices)
    if devices[0].platform != "cpu" and not os.environ.get(BUDGET_ENV):
        host = host_memory_room()
        if total > host.bytes:  # the checkpoint is read into host RAM before it is placed on the devices
            raise ModelDoesNotFit(f"the model's parameters ({format_bytes(total)}) cannot fit this host: they are read into "
                                  f"host RAM first, which has {format_bytes(host.bytes)} ({host.source}); use a machine with more RAM")
    for model_size in (m for m in range(1, n + 1) if n % m == 0):
        share = bytes_per_device(params, model_size)
        if share <= PARAM_SHARE * room:
            if model_size == 1:
                why = (f"parameters ({format_bytes(total)}) fit one device ({format_bytes(room)}, {source}): copied to each of "
                       f"{n} device(s), rows split over them")
            else:
                why = (f"parameters ({format_bytes(total)}) exceed one device's room ({format_bytes(room)}, {source}): split over "
                       f"{model_size} devices ({format_bytes(share)} each), rows over {n // model_size}")
            return layout(devices, model_size, why)
    raise ModelDoesNotFit(
        f"the model's parameters ({format_bytes(total)}) cannot fit this host: split over all {n} "
        f"{devices[0].platform} device(s) each would hold {format_bytes(bytes_per_device(params, n))}, more than "
        f"{PARAM_SHARE:.0%} of the {format_bytes(room)} per device ({source}); run on a machine with more or larger "
        "devices (more accelerators, or more RAM for CPU workers)"
        + (f", or raise {BUDGET_ENV}" if os.environ.get(BUDGET_ENV) else ""))

