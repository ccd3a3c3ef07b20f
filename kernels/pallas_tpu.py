"""`pallas_tpu`: JAX's public Pallas TPU flash attention ("flash" on TPU), adapted to the contract.

Adapts layout (BTNH <-> BNTH), pads lengths to multiples of 128 and slices back, passes
segment ids as its SegmentIds, repeats kv heads for grouped-query, and zeroes padding rows (the
kernel lets padding tokens attend to each other). Must not reimplement the kernel itself.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.interface import Implementation, missing_module, ops_module
from kernels.masking import zero_padding_rows
from kernels.tpu_layout import LENGTH_MULTIPLE, block, padded_segment_ids, round_up, to_bnth

NAME = "pallas_tpu"
OPS_MODULE = "jax.experimental.pallas.ops.tpu.flash_attention"
BACKENDS = ("tpu",)
DTYPES = ("float32", "bfloat16")
LIMITS = ("TPU only; float32 or bfloat16; head_dim <= 128 or a multiple of 128; any length "
          f"(padded to a multiple of {LENGTH_MULTIPLE}); kv heads are repeated for grouped-query")


def is_supported(*, dtype: str | None = None, head_dim: int | None = None, **_) -> tuple[bool, str]:
    """The Pallas TPU kernel's own limits (checked only for the keys given), and its JAX module's presence."""
    if (missing := missing_module(OPS_MODULE)) is not None:
        return False, missing
    if dtype is not None and dtype not in DTYPES:
        return False, f"dtype {dtype} is not supported (pallas_tpu needs float32 or bfloat16)"
    if head_dim is not None and head_dim > 128 and head_dim % 128:
        return False, f"head_dim {head_dim} is not supported (pallas_tpu needs <= 128 or a multiple of 128)"
    return True, ""


def pallas_tpu_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                         segment_ids: jax.Array | None = None, causal: bool = False,
                         scale: float | None = None) -> jax.Array:
    """Contract attention (BTNH) through jax.experimental.pallas.ops.tpu.flash_attention."""
    tpu_flash = ops_module(OPS_MODULE)  # imported when traced: its TPU lowering would slow every command's start

    batch, q_len, heads, head_dim = q.shape
    kv_len, kv_heads = k.shape[1], k.shape[2]
    scale = head_dim ** -0.5 if scale is None else scale
    q_pad, kv_pad = round_up(q_len), round_up(kv_len)
    qt = to_bnth(q, q_pad)
    kt = to_bnth(jnp.repeat(k, heads // kv_heads, axis=2), kv_pad)
    vt = to_bnth(jnp.repeat(v, heads // kv_heads, axis=2), kv_pad)

    segments = None
    if segment_ids is not None or kv_pad != kv_len:  # without segment ids: keep real queries off the padded keys
        segments = tpu_flash.SegmentIds(*padded_segment_ids(segment_ids, batch, q_len, kv_len))

    bq, bk = block(q_pad), block(kv_pad)
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
                                is_supported=is_supported, call=pallas_tpu_attention, custom_call=True,
                                score_block=(0, 0))
