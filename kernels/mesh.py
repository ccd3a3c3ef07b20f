"""Custom-call attention kernels under a device mesh: each device runs the kernel on its own shard.

XLA's SPMD partitioner cannot split a Pallas kernel (pallas_tpu, splash_tpu, pallas_gpu) or cuDNN's fused
attention: under a mesh of several devices such a call may fail to compile, or gather its inputs onto every
device and compute the whole batch there. As MaxText and axlearn do, dispatch runs these kernels (the
implementations marked `custom_call`) under jax.shard_map over the mesh in context
(jax.sharding.get_abstract_mesh(): models trace under their mesh, models/sharding.py MeshLayout.traced;
other callers enter one with jax.set_mesh or jax.sharding.use_abstract_mesh). No mesh in context, or one
whose usable axes hold a single device, and the kernel is called as it is. Pure-JAX kernels (xla,
blockwise) never come here: XLA partitions them itself.

How one call is split (`plan`), with the mesh axes named as models/sharding.py names them:
- batch (q, k, v, segment ids and the output, first axis) over "data", when the batch divides it;
- query heads over "model", when the heads divide it;
- key/value heads over "model" alongside: directly when kv_heads divide it; otherwise (grouped-query with
  fewer kv heads than model shards, or a count that does not divide) k and v are first repeated the fewest
  times r = model / gcd(kv_heads, model) that makes them divide. r always divides the group size when the
  query heads divide the model axis, so query head h still meets kv head h // groups, and each device holds
  kv_heads / gcd(kv_heads, model) kv heads: never more than the whole kv (replicating it), and never
  refused;
- query heads that do not divide the model axis are not split over it: the batch is split over data and
  model together when it divides both, else each model shard computes all heads of its rows (the same
  result on each; logged once, logger "kernels.mesh", as the redundant work it is);
- an axis nothing divides is left whole (every device of it computes the same thing), never gathered
  silently by the partitioner. Axes that are already manual (inside the caller's own shard_map) are not
  touched; any other axis of the mesh leaves the kernel's inputs whole (logged). Under Explicit mesh axes
  (jax.make_mesh's default) the inputs are resharded to these specs first (jax.sharding.reshard); under Auto
  axes (models/sharding.py's mesh) shard_map's in_specs place them.
Must not choose kernels (kernels/policy.py) nor compute attention.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from kernels.interface import AttentionCall

DATA_AXIS = "data"  # the mesh's axis names (models/sharding.py builds it): rows split on data, heads on model
MODEL_AXIS = "model"

log = logging.getLogger(__name__)
_logged: set[str] = set()


@dataclasses.dataclass(frozen=True)
class Split:
    """How one attention call is laid out over the mesh: the mesh axes its batch is split over, the axis its
    heads are split over (or None), how many times k and v are repeated on their heads axis first, and why
    some devices compute the same shard (empty when none do)."""

    batch: tuple[str, ...]
    heads: str | None
    kv_repeat: int = 1
    note: str = ""

    def specs(self) -> tuple[P, P]:
        """(the spec of q, k, v and the output [B, L, N, H], the spec of segment ids [B, L])."""
        batch = (self.batch[0] if len(self.batch) == 1 else self.batch) if self.batch else None
        return P(batch, None, self.heads, None), P(batch, None)


def usable_mesh(mesh: Any = None) -> Any | None:
    """The mesh a custom-call kernel must be split over: `mesh` (a Mesh or AbstractMesh), else the abstract
    mesh in context; None when there is none or its axes that are not already manual hold one device."""
    mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh
    if mesh is None or mesh.empty:
        return None
    manual = set(getattr(mesh, "manual_axes", ()) or ())
    free = [name for name in mesh.axis_names if name not in manual]
    if math.prod(int(mesh.shape[name]) for name in free) <= 1:
        return None
    return mesh


def plan(axis_sizes: dict[str, int], batch: int, heads: int, kv_heads: int) -> Split:
    """The Split of a [batch, L, heads, D] query / [batch, L, kv_heads, D] key call over a mesh whose usable
    (not manual) axes have `axis_sizes` (see the module docstring)."""
    data = axis_sizes.get(DATA_AXIS, 1)
    model = axis_sizes.get(MODEL_AXIS, 1)
    notes = []
    batch_axes: tuple[str, ...] = ()
    if data > 1:
        if batch % data == 0:
            batch_axes = (DATA_AXIS,)
        else:
            notes.append(f"batch {batch} does not divide the data axis ({data}): its devices compute the same rows")
    head_axis, kv_repeat = None, 1
    if model > 1:
        if heads % model == 0:
            head_axis = MODEL_AXIS
            if kv_heads % model:
                kv_repeat = model // math.gcd(kv_heads, model)
        elif batch % (math.prod(axis_sizes[a] for a in batch_axes) * model) == 0:
            batch_axes = batch_axes + (MODEL_AXIS,)  # heads cannot split: the rows split further instead
        else:
            notes.append(f"{heads} heads do not divide the model axis ({model}) nor does the batch: every model "
                         "shard computes all heads of its rows")
    others = sorted(a for a, n in axis_sizes.items() if a not in (DATA_AXIS, MODEL_AXIS) and n > 1)
    if others:
        notes.append(f"mesh axes {others} are neither {DATA_AXIS} nor {MODEL_AXIS}: their devices compute the same "
                     "shard")
    return Split(batch=batch_axes, heads=head_axis, kv_repeat=kv_repeat, note="; ".join(notes))


def call_per_shard(call: AttentionCall, q: jax.Array, k: jax.Array, v: jax.Array, *,
                   segment_ids: jax.Array | None, causal: bool, scale: float, name: str = "",
                   mesh: Any = None, **options: Any) -> jax.Array:
    """`call(q, k, v, segment_ids=..., causal=..., scale=...)` (contract layout BTNH) run under jax.shard_map
    over `mesh` (default: the mesh in context) as `plan` splits it; called as it is without a mesh of
    several devices. `name` is the kernel's, for the log; `options` (window=...) go to `call` as they are."""
    mesh = usable_mesh(mesh)
    if mesh is None:
        return call(q, k, v, segment_ids=segment_ids, causal=causal, scale=scale, **options)
    manual = set(getattr(mesh, "manual_axes", ()) or ())
    sizes = {a: int(mesh.shape[a]) for a in mesh.axis_names if a not in manual}
    split = plan(sizes, q.shape[0], q.shape[2], k.shape[2])
    if split.note:
        _log_once(name, sizes, q.shape, k.shape, split.note)
    if split.kv_repeat > 1:  # kv head j // r is the original head: query head h still meets kv head h // groups
        k = jnp.repeat(k, split.kv_repeat, axis=2)
        v = jnp.repeat(v, split.kv_repeat, axis=2)
    qkv, seg_spec = split.specs()

    def one_shard(q, k, v, *segments):
        return call(q, k, v, segment_ids=segments[0] if segments else None, causal=causal, scale=scale, **options)

    args = (q, k, v) if segment_ids is None else (q, k, v, segment_ids)
    in_specs = (qkv,) * 3 + ((seg_spec,) if segment_ids is not None else ())
    if set(getattr(mesh, "explicit_axes", ()) or ()) & set(sizes):  # explicit axes: inputs must carry the specs
        args = tuple(jax.sharding.reshard(x, spec) for x, spec in zip(args, in_specs))
    mapped = jax.shard_map(one_shard, mesh=mesh, in_specs=in_specs, out_specs=qkv,
                           axis_names=frozenset(sizes), check_vma=False)
    return mapped(*args)


def _log_once(name: str, sizes: dict[str, int], q_shape: tuple, k_shape: tuple, note: str) -> None:
    key = f"{name}:{sorted(sizes.items())}:{q_shape[0]}:{q_shape[2]}:{k_shape[2]}"
    if key not in _logged:
        _logged.add(key)
        log.warning(f"attention {name or 'kernel'} under mesh {sizes}, q {tuple(q_shape)}, k {tuple(k_shape)}: "
                    f"{note}")
