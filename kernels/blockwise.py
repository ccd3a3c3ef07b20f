"""`blockwise`: the flash-attention algorithm in plain JAX ("flash" on CPU, portable anywhere).

Online softmax over key/value blocks inside a loop over query blocks: never materialises the
[q_len, kv_len] scores (memory grows linearly with length). Pads to block multiples and slices
back; skips blocks with nothing to attend to (causal upper triangle, outside a local window, padding,
other segments); grouped-query by reshaping q, never repeating K/V. A length that fits one block runs that block
without a loop (it compiles faster), and keys that fit one block take one plain softmax
step instead of the online update. A relative position bias is gathered per block ([heads, block_q, block_k], as
the block's scores), so it too never holds [q_len, kv_len]. Must not branch in Python on traced values.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from kernels.interface import Implementation
from kernels.masking import MASKED_SCORE, causal_mask, relative_bias_scores, segment_mask, soft_capped, window_mask

NAME = "blockwise"
BACKENDS = ("cpu", "gpu", "tpu")
BLOCK_Q = 256  # the fastest block shape measured at 2k tokens (benchmarks/README.md, "Attention kernels")
BLOCK_K = 512
LIMITS = (f"any shape, any floating dtype; scores live one block at a time ({BLOCK_Q}x{BLOCK_K} per head), "
          "so memory grows linearly with length; inference only (not tuned for gradients)")


def is_supported(**shape_info) -> tuple[bool, str]:
    """blockwise runs every input the contract allows."""
    return True, ""


def _block(length: int, block: int) -> int:
    """Block size for a length: `block`, or the length rounded up to 8 when it is shorter."""
    return min(block, -(-length // 8) * 8)


def _pad(x: jax.Array, axis: int, size: int) -> jax.Array:
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, pad)


def blockwise_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                        segment_ids: jax.Array | None = None, causal: bool = False,
                        scale: float | None = None, window: int | None = None, block_q: int = BLOCK_Q,
                        block_k: int = BLOCK_K, soft_cap: float | None = None,
                        relative_bias: jax.Array | None = None) -> jax.Array:
    """Contract attention (BTNH) computed block by block with an online softmax; with soft_cap each block's scaled
    scores are capped, tanh(scores / soft_cap) * soft_cap, and with relative_bias [heads, q_len + kv_len - 1] its
    entries at the block's offsets added to them, before its mask (the contract takes one or the other)."""
    batch, q_len, heads, head_dim = q.shape
    kv_len, kv_heads = k.shape[1], k.shape[2]
    groups = heads // kv_heads
    scale = head_dim ** -0.5 if scale is None else scale
    bq, bk = _block(q_len, block_q), _block(kv_len, block_k)
    nq, nk = -(-q_len // bq), -(-kv_len // bk)

    # Segments drive all masking: padding added here gets segment 0 and so attends to nothing.
    if segment_ids is None:
        q_seg = jnp.ones((batch, q_len), jnp.int32)
        kv_seg = jnp.ones((batch, kv_len), jnp.int32)
    else:
        q_seg = kv_seg = segment_ids.astype(jnp.int32)
    q_seg = _pad(q_seg, 1, nq * bq).reshape(batch, nq, bq).transpose(1, 0, 2)
    kv_seg = _pad(kv_seg, 1, nk * bk).reshape(batch, nk, bk).transpose(1, 0, 2)

    # q -> [nq, B, KH, G, bq, D]; k, v -> [nk, B, KH, bk, D]
    qb = _pad(q, 1, nq * bq)
    qb = qb.reshape(batch, nq, bq, kv_heads, groups, head_dim).transpose(1, 0, 3, 4, 2, 5)
    kb = _pad(k, 1, nk * bk).reshape(batch, nk, bk, kv_heads, head_dim).transpose(1, 0, 3, 2, 4)
    vb = _pad(v, 1, nk * bk).reshape(batch, nk, bk, kv_heads, head_dim).transpose(1, 0, 3, 2, 4)

    def kv_mask(q_index, q_seg_blk, kv_index, kv_seg_blk):
        mask = segment_mask(q_seg_blk, kv_seg_blk)
        q_positions, kv_positions = q_index * bq + jnp.arange(bq), kv_index * bk + jnp.arange(bk)
        if causal:  # static flag: Python branch on configuration, not on traced values
            mask &= causal_mask(q_positions, kv_positions, window)[None]
        elif window:  # an encoder's local attention: key blocks wholly outside it are skipped as causal's are
            mask &= window_mask(q_positions, kv_positions, window)[None]
        return mask

    bias = None if relative_bias is None else relative_bias.astype(jnp.float32)

    def bias_at(q_index, kv_index):
        """What _block_scores gathers a block's relative bias from (None without one): inside lax.cond, so a block
        skipped for having nothing to attend to gathers none."""
        if bias is None:
            return None
        return bias, q_index * bq + jnp.arange(bq), kv_index * bk + jnp.arange(bk), q_len

    def one_q_block(args):
        q_index, q_blk, q_seg_blk = args
        if nk == 1:  # static: all keys fit one block, so one plain softmax step; no running max, no scan
            return _single_block(q_blk, kb[0], vb[0], kv_mask(q_index, q_seg_blk, 0, kv_seg[0]), scale, soft_cap,
                                 bias_at(q_index, 0))

        def one_kv_block(carry, kv_args):
            kv_index, k_blk, v_blk, kv_seg_blk = kv_args
            mask = kv_mask(q_index, q_seg_blk, kv_index, kv_seg_blk)
            return lax.cond(jnp.any(mask), _update, lambda c, *_: c,
                            carry, q_blk, k_blk, v_blk, mask, scale, soft_cap, bias_at(q_index, kv_index)), None

        init = (jnp.full((batch, kv_heads, groups, bq), -jnp.inf, jnp.float32),
                jnp.zeros((batch, kv_heads, groups, bq), jnp.float32),
                jnp.zeros((batch, kv_heads, groups, bq, head_dim), jnp.float32))
        (_, total, acc), _ = lax.scan(one_kv_block, init, (jnp.arange(nk), kb, vb, kv_seg))
        return acc / jnp.where(total == 0.0, 1.0, total)[..., None]  # nothing to attend -> 0

    if nq == 1:  # static: rows that fit one query block (short rows) run it directly, not in a loop
        out = one_q_block((0, qb[0], q_seg[0]))[None]
    else:
        out = lax.map(one_q_block, (jnp.arange(nq), qb, q_seg))  # [nq, B, KH, G, bq, D]
    out = out.transpose(1, 0, 4, 2, 3, 5).reshape(batch, nq * bq, heads, head_dim)
    return out[:, :q_len].astype(q.dtype)


def _block_scores(q_blk, k_blk, mask, scale, fill, soft_cap, bias_at=None):
    """Scaled (and, with soft_cap, capped; with bias_at, its relative bias added) q.k scores of one block in float32
    (as xla computes them), `fill` where mask is False. bias_at: (the [heads, q_len + kv_len - 1] bias, the block's
    query and key positions, q_len)."""
    scores = jnp.einsum("bhgqd,bhkd->bhgqk", q_blk, k_blk, preferred_element_type=jnp.float32) * scale
    if soft_cap is not None:
        scores = soft_capped(scores, soft_cap)
    if bias_at is not None:
        bias = relative_bias_scores(*bias_at)  # [heads, bq, bk]; the block's padded positions read an end, masked
        scores = scores + bias.reshape(*scores.shape[1:3], *bias.shape[1:])[None]
    return jnp.where(mask, scores, fill)


def _single_block(q_blk, k_blk, v_blk, mask, scale, soft_cap, bias_at=None):
    """All keys in one block: the online softmax's first step without its rescaling, normalised after the
    weighted sum (as every block is). A finite fill keeps one fused pass over the scores; rows with nothing
    to attend to (padding) are zeroed at the end. It makes flash as fast as native inside the whole model at the
    pipeline's row shapes (benchmarks/kernel_in_model.py)."""
    mask = mask[:, None, None]  # [B, 1, 1, bq, bk]
    scores = _block_scores(q_blk, k_blk, mask, scale, MASKED_SCORE, soft_cap, bias_at)
    weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
    total = jnp.sum(weights, axis=-1)
    acc = jnp.einsum("bhgqk,bhkd->bhgqd", weights.astype(v_blk.dtype), v_blk, preferred_element_type=jnp.float32)
    attends = jnp.any(mask, axis=-1)
    return jnp.where(attends[..., None], acc / total[..., None], 0.0)


def _update(carry, q_blk, k_blk, v_blk, mask, scale, soft_cap, bias_at=None):
    """One online-softmax step: fold a key/value block into (running max, running sum, acc)."""
    run_max, run_sum, acc = carry
    mask = mask[:, None, None]  # [B, 1, 1, bq, bk]
    scores = _block_scores(q_blk, k_blk, mask, scale, -jnp.inf, soft_cap, bias_at)
    new_max = jnp.maximum(run_max, jnp.max(scores, axis=-1))
    safe_max = jnp.where(jnp.isfinite(new_max), new_max, 0.0)  # rows with nothing seen yet
    weights = jnp.where(mask, jnp.exp(scores - safe_max[..., None]), 0.0)
    correction = jnp.exp(run_max - safe_max)  # exp(-inf) = 0 for rows that saw nothing before
    run_sum = run_sum * correction + jnp.sum(weights, axis=-1)
    acc = acc * correction[..., None] + jnp.einsum(
        "bhgqk,bhkd->bhgqd", weights.astype(v_blk.dtype), v_blk, preferred_element_type=jnp.float32)
    return new_max, run_sum, acc


IMPLEMENTATION = Implementation(name=NAME, backends=BACKENDS, limits=LIMITS,
                                is_supported=is_supported, call=blockwise_attention, local_window=True,
                                logit_soft_cap=True, relative_position_bias=True, score_block=(BLOCK_Q, BLOCK_K))
