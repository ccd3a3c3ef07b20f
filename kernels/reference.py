"""The float64 NumPy definition of the attention contract, for parity tests and benchmarks.

Written for clarity, not speed: one mask (kernels/masking.py, the contract's one definition of
which pairs attend), one softmax, plain float64 matmuls. It is not an implementation in the table
and must never be called from the model path.
"""
from __future__ import annotations

import numpy as np

from kernels.masking import causal_mask, segment_mask, window_mask


def reference_attention(q, k, v, *, segment_ids=None, causal: bool = False,
                        scale: float | None = None, window: int | None = None,
                        soft_cap: float | None = None, relative_bias=None) -> np.ndarray:
    """Contract attention in float64: q [B, Lq, H, D], k/v [B, Lkv, KH, D]; returns float64. soft_cap: the scaled
    scores become tanh(scores / soft_cap) * soft_cap before the mask (Gemma 2's attention-logit soft-capping).
    relative_bias [H, Lq + Lkv - 1]: its entry j - i + Lq - 1 is added to the scaled score of query i and key j
    before the mask (MPNet's relative position bias); the contract takes it or soft_cap, never both."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    batch, q_len, heads, head_dim = q.shape
    kv_len, kv_heads = k.shape[1], k.shape[2]
    scale = head_dim ** -0.5 if scale is None else scale
    k = np.repeat(k, heads // kv_heads, axis=2)  # kv head h // groups serves query head h
    v = np.repeat(v, heads // kv_heads, axis=2)
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))  # [B, H, L, D] for BLAS matmuls
    scores = (q @ k.transpose(0, 1, 3, 2)) * scale
    if soft_cap is not None:
        scores = np.tanh(scores / soft_cap) * soft_cap
    if relative_bias is not None:  # written out here, apart from the kernels' masking.relative_bias_scores
        offsets = np.subtract.outer(np.arange(kv_len), np.arange(q_len)).T  # [q, kv]: j - i
        scores = scores + np.asarray(relative_bias, np.float64)[:, offsets + q_len - 1][None]
    mask = np.ones((batch, q_len, kv_len), dtype=bool)
    if segment_ids is not None:
        seg = np.asarray(segment_ids)
        mask &= segment_mask(seg, seg)
    if causal:
        mask &= causal_mask(np.arange(q_len), np.arange(kv_len), window)
    elif window:  # an encoder's local attention: |i - j| < window on both sides
        mask &= window_mask(np.arange(q_len), np.arange(kv_len), window)
    mask = mask[:, None]
    scores = np.where(mask, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    weights = np.where(mask, np.exp(scores - row_max), 0.0)
    total = weights.sum(axis=-1, keepdims=True)
    probs = weights / np.where(total == 0.0, 1.0, total)  # a row with nothing to attend to -> 0
    return (probs @ v).transpose(0, 2, 1, 3)
