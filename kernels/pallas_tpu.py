"""`pallas_tpu`: JAX's public Pallas TPU flash attention ("flash" on TPU), adapted to the contract.

Adapts layout (BTNH <-> BNTH), pads lengths to multiples of 128 and slices back, passes
segment ids as its SegmentIds, repeats kv heads for grouped-query, and zeroes padding rows (the
kernel lets padding tokens attend to each other). Must not reimplement the kernel itself.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.interface import Implementation
from kernels.masking import zero_padding_rows

NAME = "pallas_tpu"
BACKENDS = ("tpu",)
DTYPES = ("float32", "bfloat16")
LENGTH_MULTIPLE = 128  # the kernel's minimum block; lengths are padded up to it
LIMITS = ("TPU only; float32 or bfloat16; head_dim <= 128 or a multiple of 128; any length "
          f"(padded to a multiple of {LENGTH_MULTIPLE}); kv heads are repeated for grouped-query")


def is_supported(*, dtype: str | None = None, head_dim: int | None = None, **_) -> tuple[bool, str]:
    """The Pallas TPU kernel's own limits (checked only for the keys given)."""
    if dtype is not None and dtype not in DTYPES:
        return False, f"dtype {dtype} is not supported (pallas_tpu needs float32 or bfloat16)"
    if head_dim is not None and head_dim > 128 and head_dim % 128:
        return False, f"head_dim {head_dim} is not supported (pallas_tpu needs <= 128 or a multiple of 128)"
    return True, ""


def _round_up(length: int) -> int:
    return -(-length // LENGTH_MULTIPLE) * LENGTH_MULTIPLE


def _block(padded_length: int) -> int:
    return next(b for b in (512, 256, 128) if padded_length % b == 0)


def pallas_tpu_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                         segment_ids: jax.Array | None = None, causal: bool = False,
                         scale: float | None = None) -> jax.Array:
    """Contract attention (BTNH) through jax.experimental.pallas.ops.tpu.flash_attention."""
    # Imported when traced: the TPU lowering would add to the start of every command on hosts without a TPU.
    from jax.experimental.pallas.ops.tpu import flash_attention as tpu_flash

    batch, q_len, heads, head_dim = q.shape
    kv_len, kv_heads = k.shape[1], k.shape[2]
    scale = head_dim ** -0.5 if scale is None else scale
    q_pad, kv_pad = _round_up(q_len), _round_up(kv_len)

    def to_bnth(x: jax.Array, padded: int) -> jax.Array:
        x = jnp.pad(x, ((0, 0), (0, padded - x.shape[1]), (0, 0), (0, 0)))
        return x.transpose(0, 2, 1, 3)

    qt = to_bnth(q, q_pad)
    kt = to_bnth(jnp.repeat(k, heads // kv_heads, axis=2), kv_pad)
    vt = to_bnth(jnp.repeat(v, heads // kv_heads, axis=2), kv_pad)

    segments = None
    if segment_ids is not None:
        seg = segment_ids.astype(jnp.int32)
        segments = tpu_flash.SegmentIds(q=jnp.pad(seg, ((0, 0), (0, q_pad - q_len))),
                                        kv=jnp.pad(seg, ((0, 0), (0, kv_pad - kv_len))))
    elif kv_pad != kv_len:  # keep real queries off the padded keys
        segments = tpu_flash.SegmentIds(
            q=jnp.pad(jnp.ones((batch, q_len), jnp.int32), ((0, 0), (0, q_pad - q_len))),
            kv=jnp.pad(jnp.ones((batch, kv_len), jnp.int32), ((0, 0), (0, kv_pad - kv_len))))

    bq, bk = _block(q_pad), _block(kv_pad)
    blocks = tpu_flash.BlockSizes(
        block_q=bq, block_k_major=bk, block_k=bk, block_b=1,
        block_q_major_dkv=bq, block_k_major_dkv=bk, block_k_dkv=bk, block_q_dkv=bq,
        block_k_major_dq=bk, block_k_dq=bk, block_q_dq=bq)
    out = tpu_flash.flash_attention(qt, kt, vt, segment_ids=segments, causal=causal,
                                    sm_scale=float(scale), block_sizes=blocks)
    out = out.transpose(0, 2, 1, 3)[:, :q_len]
    out = zero_padding_rows(out, segment_ids)  # padding tokens attended to each other inside the kernel
    return out.astype(q.dtype)


IMPLEMENTATION = Implementation(name=NAME, backends=BACKENDS, limits=LIMITS,
                                is_supported=is_supported, call=pallas_tpu_attention, custom_call=True)
