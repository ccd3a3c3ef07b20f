"""What is read off a model's output per segment: sentence embeddings (mean pool over real tokens, or the
first or last token's hidden state (CLS or last-token pooling), then L2 normalise, as sentence-transformers) and
next-token log-probabilities.

Pure jax functions of arrays; must not know about modules, kernels or tokenizers.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def l2_normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
    """x / max(||x||, eps) along the last axis (torch.nn.functional.normalize); zeros stay zeros."""
    norm = jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))
    return x / jnp.maximum(norm, eps)


# How a segment's hidden states become its embedding (sentence-transformers' Pooling pooling_mode): "mean" over
# its tokens, "cls", its first token's (each window starts with the tokenizer's specials: [CLS], <s>), or
# "lasttoken", its last token's (a decoder embedder's: the one token that has read the whole window, often the EOS
# its tokenizer appends).
POOLINGS = ("mean", "cls", "lasttoken")


def segment_embeddings(hidden: jax.Array, segment_ids: jax.Array, max_segments: int,
                       pooling: str = "mean", dense: Callable[[jax.Array], jax.Array] | None = None) -> jax.Array:
    """[B, L, D] -> [B, max_segments, D']: slot s = segment s + 1, `pooling` (POOLINGS) of its tokens' hidden
    states, then `dense` (a sentence-transformers model's Dense modules: D -> D'), L2-normalised; zeros where a
    segment is absent."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
    slots = jnp.arange(1, max_segments + 1, dtype=segment_ids.dtype)
    member = (segment_ids[:, :, None] == slots[None, None, :]).astype(jnp.float32)  # [B, L, S]
    if pooling == "cls":  # the same sum over one token per segment: its first (a running count of its tokens is 1)
        member = member * (jnp.cumsum(member, axis=1) == 1)
    elif pooling == "lasttoken":  # ... or its last (the count from the row's end is 1)
        member = member * (jnp.cumsum(member[:, ::-1], axis=1)[:, ::-1] == 1)
    total = jnp.einsum("bls,bld->bsd", member, hidden.astype(jnp.float32),
                       precision=jax.lax.Precision.HIGHEST)
    count = jnp.sum(member, axis=1)[:, :, None]
    pooled = total / jnp.maximum(count, 1e-9)
    if dense is not None:
        pooled = jnp.where(count > 0, dense(pooled), 0.0)  # an absent segment stays zeros, not the bias's direction
    return l2_normalize(pooled)


# The largest [rows, positions, vocab] float32 logits block one log-softmax step holds: a decoder's logits for a
# whole call (Qwen2's 152k vocabulary x 8k tokens is 5 GB) are computed a block of positions at a time instead.
LOGITS_BLOCK_BYTES = 512 * 2**20


def logits_block_positions(rows: int, positions: int, vocab: int) -> int:
    """Positions per log-softmax block: all of them when their logits fit LOGITS_BLOCK_BYTES, else as many
    as fit (at least one)."""
    return max(1, min(positions, LOGITS_BLOCK_BYTES // (4 * vocab * max(rows, 1))))


def next_token_logprobs(hidden: jax.Array, to_logits: Callable[[jax.Array], jax.Array], input_ids: jax.Array,
                        segment_ids: jax.Array) -> jax.Array:
    """Final hidden states [B, L, D] -> [B, L]: at t, log p(input_ids[t+1] | tokens <= t of the same segment);
    0 where t+1 is padding, another segment, or past the row. `to_logits` maps [B, n, D] to [B, n, V] logits;
    it runs on blocks of positions (logits_block_positions), so the whole [B, L, V] is never held at once."""
    rows, length, _ = hidden.shape
    following = input_ids[:, 1:]
    positions = length - 1
    probe = jax.eval_shape(to_logits, jax.ShapeDtypeStruct((rows, 1, hidden.shape[-1]), hidden.dtype))
    block = logits_block_positions(rows, positions, probe.shape[-1])

    def block_logprobs(hidden_block: jax.Array, following_block: jax.Array) -> jax.Array:
        logits = to_logits(hidden_block).astype(jnp.float32)
        picked = jnp.take_along_axis(logits, following_block[:, :, None], axis=-1)[:, :, 0]
        return picked - jax.nn.logsumexp(logits, axis=-1)

    if block >= positions:
        logprob = block_logprobs(hidden[:, :-1], following)
    else:
        blocks = -(-positions // block)
        pad = blocks * block - positions
        h = jnp.pad(hidden[:, :-1], ((0, 0), (0, pad), (0, 0))).reshape(rows, blocks, block, -1).swapaxes(0, 1)
        f = jnp.pad(following, ((0, 0), (0, pad))).reshape(rows, blocks, block).swapaxes(0, 1)
        logprob = jax.lax.map(lambda hf: block_logprobs(*hf), (h, f)).swapaxes(0, 1).reshape(rows, -1)[:, :positions]
    same_segment = (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] > 0)
    logprob = jnp.where(same_segment, logprob, 0.0)
    return jnp.pad(logprob, ((0, 0), (0, 1)))
