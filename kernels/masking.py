"""Which (query, key) pairs may attend: the contract's segment and causal masks, written once, and the
finite fill kernels give masked scores. Used by xla, blockwise and the float64 reference (pure array expressions,
so they run on NumPy and JAX arrays alike); the zeroing of padding rows the custom-call kernels need, and the
attention-logit soft cap and the relative position bias xla and blockwise apply to scores before these masks; no
kernel choice and no softmax here.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

# The fill for masked float32 scores where a kernel wants one fused pass (no -inf): exp(MASKED_SCORE - row max)
# is exactly 0 whenever the row attends to anything; a row that attends to nothing must be zeroed by the kernel.
MASKED_SCORE = -1e30


def segment_mask(q_segments, kv_segments):
    """[..., q, kv] booleans from segment ids [..., q] and [..., kv]: a query attends only to keys of its
    own segment, and a query in segment 0 (padding) attends to nothing."""
    q_segments = q_segments[..., :, None]
    return (q_segments == kv_segments[..., None, :]) & (q_segments != 0)


def causal_mask(q_positions, kv_positions, window: int | None = None):
    """[q, kv] booleans: a query at position i sees keys at positions <= i (top-left aligned); with a local
    `window` only the last `window` of them, i - window < j <= i (Mistral's and Qwen2's sliding window)."""
    sees = q_positions[:, None] >= kv_positions[None, :]
    if window:
        sees = sees & window_mask(q_positions, kv_positions, window)
    return sees


def window_mask(q_positions, kv_positions, window: int):
    """[q, kv] booleans: a query at position i sees keys less than `window` positions away, |i - j| < window.
    Under causal_mask that is a decoder's sliding window (the last `window` keys, itself included); alone, an
    encoder's local attention (window - 1 keys on each side: ModernBERT's local layers keep |i - j| <=
    local_attention // 2, so window = local_attention // 2 + 1)."""
    distance = q_positions[:, None] - kv_positions[None, :]
    return (distance < window) & (-distance < window)


def allowed(q_segments: jax.Array | None, kv_segments: jax.Array | None,
            q_positions: jax.Array, kv_positions: jax.Array, causal: bool,
            window: int | None = None) -> jax.Array | None:
    """Boolean mask [batch or 1, q, kv] of segment_mask, (when causal) causal_mask and (with a local `window`)
    window_mask; None when every pair may attend."""
    mask = None
    if q_segments is not None:
        mask = segment_mask(q_segments, kv_segments)
    if causal or window:
        pairs = (causal_mask(q_positions, kv_positions, window) if causal
                 else window_mask(q_positions, kv_positions, window))[None]
        mask = pairs if mask is None else mask & pairs
    return mask



def soft_capped(scores: jax.Array, cap: float) -> jax.Array:
    """tanh(scores / cap) * cap: scores squashed into (-cap, cap), as Gemma 2 caps its attention logits before the mask
    and the softmax (xla and blockwise; the float64 reference writes it out for itself) and its final logits
    (models/llama.py)."""
    return jnp.tanh(scores / cap) * cap


def relative_bias_scores(relative_bias, q_positions, kv_positions, q_len: int):
    """[heads, q, kv]: the contract's relative_bias ([heads, q_len + kv_len - 1]) at each pair, entry j - i + q_len - 1
    for query position i and key position j, so every pair at one offset reads one entry (xla, blockwise and the float64
    reference). Positions past the rows (a block's padding, masked anyway) read the nearest end instead of past it."""
    index = kv_positions[None, :] - q_positions[:, None] + (q_len - 1)
    return relative_bias[:, index.clip(0, relative_bias.shape[1] - 1)]


def zero_padding_rows(out, segment_ids):
    """out [B, L, H, D] with the rows of padding tokens (segment 0) set to 0, as the contract says; for the
    kernels that compute something there (custom calls attend padding to padding, or leave it undefined)."""
    if segment_ids is None:
        return out
    return jnp.where((segment_ids != 0)[:, :, None, None], out, jnp.zeros((), out.dtype))
