"""Which (query, key) pairs may attend: the segment/padding/causal mask shared by the plain-JAX
kernels (xla, blockwise), and the finite fill they give masked scores. Pure functions on static shapes;
no kernel choice and no softmax here.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

# The fill for masked float32 scores where a kernel wants one fused pass (no -inf): exp(MASKED_SCORE - row max)
# is exactly 0 whenever the row attends to anything; a row that attends to nothing must be zeroed by the kernel.
MASKED_SCORE = -1e30


def allowed(q_segments: jax.Array | None, kv_segments: jax.Array | None,
            q_positions: jax.Array, kv_positions: jax.Array, causal: bool) -> jax.Array | None:
    """Boolean mask [batch or 1, q, kv]; None when every pair may attend.

    Segments: 0 is padding; a query attends only to keys of its own non-zero segment.
    Causal: a query at position i sees keys at positions <= i (top-left aligned).
    """
    mask = None
    if q_segments is not None:
        mask = (q_segments[:, :, None] == kv_segments[:, None, :]) & (q_segments[:, :, None] != 0)
    if causal:
        causal_mask = (q_positions[:, None] >= kv_positions[None, :])[None]
        mask = causal_mask if mask is None else mask & causal_mask
    return mask
