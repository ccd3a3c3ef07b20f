"""`xla`: plain attention written as einsums that XLA compiles on every backend ("native").

Materialises the [q_len, kv_len] score matrix per head (memory grows with L^2); softmax in
float32. Must stay the simple, always-available reference path: no blocking, no backend tricks.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.interface import Implementation
from kernels.masking import MASKED_SCORE, allowed, relative_bias_scores, soft_capped

NAME = "xla"
BACKENDS = ("cpu", "gpu", "tpu")
LIMITS = ("any shape, any floating dtype; materialises the full [q_len, kv_len] score matrix per head, "
          "so memory grows as batch*heads*q_len*kv_len*4 bytes")


def is_supported(**shape_info) -> tuple[bool, str]:
    """xla runs every input the contract allows."""
    return True, ""


def xla_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, segment_ids: jax.Array | None = None,
                  causal: bool = False, scale: float | None = None, window: int | None = None,
                  soft_cap: float | None = None, relative_bias: jax.Array | None = None) -> jax.Array:
    """Contract attention (BTNH, grouped-query by reshaping, never repeating K/V); with soft_cap the scaled scores
    are capped, tanh(scores / soft_cap) * soft_cap, and with relative_bias [heads, q_len + kv_len - 1] its entry
    j - i + q_len - 1 is added to them, before the mask and softmax (the contract takes one or the other)."""
    batch, q_len, heads, head_dim = q.shape
    kv_len, kv_heads = k.shape[1], k.shape[2]
    groups = heads // kv_heads
    scale = head_dim ** -0.5 if scale is None else scale
    # Heads-major layout before the matmuls: XLA:CPU runs these faster than einsums that leave the
    # transposes to it (benchmarks/PERF_NOTES.md).
    qt = q.reshape(batch, q_len, kv_heads, groups, head_dim).transpose(0, 2, 3, 1, 4)
    kt = k.transpose(0, 2, 3, 1)  # [b, kv_heads, d, kv]
    vt = v.transpose(0, 2, 1, 3)  # [b, kv_heads, kv, d]
    scores = jnp.einsum("bhgqd,bhdk->bhgqk", qt, kt, preferred_element_type=jnp.float32) * scale
    if soft_cap is not None:
        scores = soft_capped(scores, soft_cap)
    if relative_bias is not None:  # one [heads, q, kv] for the whole batch, as the scores are per head
        bias = relative_bias_scores(relative_bias.astype(jnp.float32), jnp.arange(q_len), jnp.arange(kv_len), q_len)
        scores = scores + bias.reshape(kv_heads, groups, q_len, kv_len)[None]
    mask = allowed(segment_ids, segment_ids, jnp.arange(q_len), jnp.arange(kv_len), causal, window)
    if mask is not None:
        # A finite fill keeps one fused pass over the scores (an -inf fill needs extra passes
        # to avoid NaN); rows with nothing to attend to are zeroed after the weighted sum.
        scores = jnp.where(mask[:, None, None], scores, MASKED_SCORE)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhgqk,bhkd->bhgqd", probs.astype(v.dtype), vt,
                     preferred_element_type=jnp.float32)
    if mask is not None:
        attends = jnp.any(mask, axis=-1)  # [b or 1, q]: False for padding / fully masked rows
        out = jnp.where(attends[:, None, None, :, None], out, 0.0)
    out = out.transpose(0, 3, 1, 2, 4).reshape(batch, q_len, heads, head_dim)
    return out.astype(q.dtype)

IMPLEMENTATION = Implementation(name=NAME, backends=BACKENDS, limits=LIMITS,
                                is_supported=is_supported, call=xla_attention, local_window=True,
                                logit_soft_cap=True, relative_position_bias=True)
