"""What is read off a model's output per segment: sentence embeddings (mean pool over real tokens +
L2 normalise, as sentence-transformers) and next-token log-probabilities.

Pure jax functions of arrays; must not know about modules, kernels or tokenizers.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def l2_normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
    """x / max(||x||, eps) along the last axis (torch.nn.functional.normalize); zeros stay zeros."""
    norm = jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))
    return x / jnp.maximum(norm, eps)


def segment_embeddings(hidden: jax.Array, segment_ids: jax.Array, max_segments: int) -> jax.Array:
    """[B, L, D] -> [B, max_segments, D]: slot s = segment s + 1; zeros where a segment is absent."""
    slots = jnp.arange(1, max_segments + 1, dtype=segment_ids.dtype)
    member = (segment_ids[:, :, None] == slots[None, None, :]).astype(jnp.float32)  # [B, L, S]
    total = jnp.einsum("bls,bld->bsd", member, hidden.astype(jnp.float32),
                       precision=jax.lax.Precision.HIGHEST)
    count = jnp.sum(member, axis=1)[:, :, None]
    return l2_normalize(total / jnp.maximum(count, 1e-9))


def next_token_logprobs(logits: jax.Array, input_ids: jax.Array, segment_ids: jax.Array) -> jax.Array:
    """[B, L, V] logits -> [B, L]: at t, log p(input_ids[t+1] | tokens <= t of the same segment);
    0 where t+1 is padding, another segment, or past the row."""
    logits = logits[:, :-1].astype(jnp.float32)
    following = input_ids[:, 1:]
    picked = jnp.take_along_axis(logits, following[:, :, None], axis=-1)[:, :, 0]
    logprob = picked - jax.nn.logsumexp(logits, axis=-1)
    same_segment = (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] > 0)
    logprob = jnp.where(same_segment, logprob, 0.0)
    return jnp.pad(logprob, ((0, 0), (0, 1)))
