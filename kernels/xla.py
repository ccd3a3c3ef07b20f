"""`xla`: plain attention written as einsums that XLA compiles on every backend ("native").

Materialises the [q_len, kv_len] score matrix per head (memory grows with L^2); softmax in
float32. Must stay the simple, always-available reference path: no blocking, no backend tricks.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.interface import Implementation
from kernels.masking import allowed

NAME = "xla"
BACKENDS = ("cpu", "gpu", "tpu")
LIMITS = ("any shape and dtype; materialises the full [q_len, kv_len] score matrix per head, "
          "so memory grows as batch*heads*q_len*kv_len*4 bytes")


def is_supported(**shape_info) -> tuple[bool, str]:
    """xla runs every input the contract allows."""
    return True, ""


def xla_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, segment_ids: jax.Array | None = None,
                  causal: bool = False, scale: float | None = None) -> jax.Array:
    """Contract attention (BTNH, grouped-query by reshaping, never repeating K/V)."""
    batch, q_len, heads, head_dim = q.shape
    kv_len, kv_heads = k.shape[1], k.shape[2]
    groups = heads // kv_heads
    scale = head_dim ** -0.5 if scale is None else scale
    qg = q.reshape(batch, q_len, kv_heads, groups, head_dim)
    scores = jnp.einsum("bqhgd,bkhd->bhgqk", qg, k, preferred_element_type=jnp.float32) * scale
    mask = allowed(segment_ids, segment_ids, jnp.arange(q_len), jnp.arange(kv_len), causal)
    if mask is None:
        probs = jax.nn.softmax(scores, axis=-1)
    else:
        mask = mask[:, None, None]  # [b, 1, 1, q, kv]
        scores = jnp.where(mask, scores, -jnp.inf)
        row_max = jnp.max(scores, axis=-1, keepdims=True)
        row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)  # fully masked rows
        weights = jnp.where(mask, jnp.exp(scores - row_max), 0.0)
        total = jnp.sum(weights, axis=-1, keepdims=True)
        probs = weights / jnp.where(total == 0.0, 1.0, total)  # fully masked rows -> 0, not NaN
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return out.reshape(batch, q_len, heads, head_dim).astype(q.dtype)


IMPLEMENTATION = Implementation(name=NAME, backends=BACKENDS, limits=LIMITS,
                                is_supported=is_supported, call=xla_attention)
