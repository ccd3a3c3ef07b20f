"""`cudnn`: cuDNN fused flash attention through jax.nn.dot_product_attention ("flash" on GPU).

States cuDNN's limits in `is_supported` (dtype, head_dim, segment mask size, causal alignment)
so auto can fall back and an explicit choice is refused before running. Segment ids are passed
as a dense boolean mask; padding rows are zeroed afterwards. Must not call cuDNN any other way.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.interface import Implementation

NAME = "cudnn"
BACKENDS = ("gpu",)
DTYPES = ("float16", "bfloat16")
MAX_HEAD_DIM = 128  # 256 on Hopper and newer; docscore states the limit every NVIDIA GPU meets
MAX_SEGMENT_LEN = 8192  # segments travel as a dense [B, 1, L, L] mask: 128 MiB per row at 8k
LIMITS = ("NVIDIA GPU with cuDNN >= 8.9 (Ampere or newer); float16 or bfloat16; head_dim a "
          f"multiple of 8 and <= {MAX_HEAD_DIM}; segment_ids (packing/padding) become a dense "
          f"[batch, 1, L, L] mask, so only up to L = {MAX_SEGMENT_LEN}; causal needs q_len == kv_len")


def is_supported(*, dtype: str | None = None, head_dim: int | None = None,
                 q_len: int | None = None, kv_len: int | None = None, causal: bool | None = None,
                 has_segments: bool | None = None, **_) -> tuple[bool, str]:
    """cuDNN flash attention's limits as reachable through jax.nn.dot_product_attention."""
    if dtype is not None and dtype not in DTYPES:
        return False, f"dtype {dtype} is not supported (cudnn needs float16 or bfloat16)"
    if head_dim is not None and (head_dim % 8 or head_dim > MAX_HEAD_DIM):
        return False, (f"head_dim {head_dim} is not supported (cudnn needs a multiple of 8, "
                       f"<= {MAX_HEAD_DIM})")
    if has_segments and kv_len is not None and kv_len > MAX_SEGMENT_LEN:
        return False, (f"segment_ids at length {kv_len} would need a dense {kv_len}x{kv_len} "
                       f"mask (cudnn takes segments only as a mask; limit {MAX_SEGMENT_LEN})")
    if causal and q_len is not None and kv_len is not None and q_len != kv_len:
        return False, f"causal with q_len {q_len} != kv_len {kv_len} is not supported by cudnn here"
    return True, ""


def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                    segment_ids: jax.Array | None = None, causal: bool = False,
                    scale: float | None = None) -> jax.Array:
    """Contract attention (BTNH) through jax.nn.dot_product_attention(implementation="cudnn")."""
    mask = None
    if segment_ids is not None:
        seg = segment_ids
        mask = ((seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] != 0))[:, None]
    out = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, is_causal=causal,
                                       implementation="cudnn")
    if segment_ids is not None:  # fully masked (padding) rows come back as an average
        out = jnp.where((segment_ids != 0)[:, :, None, None], out, jnp.zeros((), out.dtype))
    return out


IMPLEMENTATION = Implementation(name=NAME, backends=BACKENDS, limits=LIMITS,
                                is_supported=is_supported, call=cudnn_attention)
