"""The layout both Pallas TPU kernels (pallas_tpu, splash_tpu) take: lengths padded to a multiple of the
TPU's 128 lanes, heads first ([batch, heads, len, head_dim]), and segment ids over the padded lengths in
which padding is segment 0, so no real query attends to it. Must not choose kernels.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

LENGTH_MULTIPLE = 128  # the lane width: the kernels' blocks are multiples of it
BLOCKS = (512, 256, 128)  # the largest that divides the padded length is used (512: MaxText's default)


def round_up(length: int) -> int:
    return -(-length // LENGTH_MULTIPLE) * LENGTH_MULTIPLE


def block(padded_length: int) -> int:
    return next(b for b in BLOCKS if padded_length % b == 0)


def to_bnth(x: jax.Array, padded: int) -> jax.Array:
    """[B, T, N, H] -> [B, N, padded, H], zeros after the real length."""
    x = jnp.pad(x, ((0, 0), (0, padded - x.shape[1]), (0, 0), (0, 0)))
    return x.transpose(0, 2, 1, 3)


def padded_segment_ids(segment_ids: jax.Array | None, batch: int, q_len: int, kv_len: int
                       ) -> tuple[jax.Array, jax.Array]:
    """(q, kv) int32 segment ids over the padded lengths: the contract's segment ids, or 1 for every real
    token where there are none; 0 on the padding."""
    if segment_ids is None:
        q_seg, kv_seg = jnp.ones((batch, q_len), jnp.int32), jnp.ones((batch, kv_len), jnp.int32)
    else:
        q_seg = kv_seg = segment_ids.astype(jnp.int32)
    return (jnp.pad(q_seg, ((0, 0), (0, round_up(q_len) - q_len))),
            jnp.pad(kv_seg, ((0, 0), (0, round_up(kv_len) - kv_len))))
