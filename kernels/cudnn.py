"""`cudnn`: cuDNN fused flash attention through jax.nn.dot_product_attention (GPU flash, first choice).

Never builds a mask: padding travels as per-row sequence lengths (query_seq_lengths /
key_value_seq_lengths), which only describe rows of one segment followed by padding. Packed segment
ids (several segments per row) are refused in `is_supported` unless the caller promises
packed=False (shape info; attention(..., packed=False)); pallas_gpu masks packed segments in its
kernel. A row that breaks the promise comes back NaN, never silently attending across segments.
States cuDNN's other limits too, so auto can fall back and an explicit choice is refused before
running. Must not call cuDNN any other way.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.interface import Implementation
from kernels.masking import zero_padding_rows

NAME = "cudnn"
BACKENDS = ("gpu",)
DTYPES = ("float16", "bfloat16")
MAX_HEAD_DIM = 128  # 256 on Hopper and newer; docscore states the limit every NVIDIA GPU meets
LIMITS = ("NVIDIA GPU with cuDNN >= 8.9 (Ampere or newer); float16 or bfloat16; head_dim a "
          f"multiple of 8 and <= {MAX_HEAD_DIM}; any length, memory linear in it; segment_ids only as "
          "one segment per row followed by padding (packed=False), passed as sequence lengths; "
          "causal needs q_len == kv_len")


def is_supported(*, dtype: str | None = None, head_dim: int | None = None,
                 q_len: int | None = None, kv_len: int | None = None, causal: bool | None = None,
                 has_segments: bool | None = None, packed: bool | None = None,
                 **_) -> tuple[bool, str]:
    """cuDNN flash attention's limits as reachable through jax.nn.dot_product_attention."""
    if dtype is not None and dtype not in DTYPES:
        return False, f"dtype {dtype} is not supported (cudnn needs float16 or bfloat16)"
    if head_dim is not None and (head_dim % 8 or head_dim > MAX_HEAD_DIM):
        return False, (f"head_dim {head_dim} is not supported (cudnn needs a multiple of 8, "
                       f"<= {MAX_HEAD_DIM})")
    if has_segments and packed is not False:
        return False, ("segment_ids that may pack several segments per row are not supported "
                       "(cudnn takes padding only as sequence lengths; packed=False promises one "
                       "segment per row followed by padding, which `docscore run`'s packed rows never are: "
                       "there flash on GPU is pallas_gpu)")
    if causal and q_len is not None and kv_len is not None and q_len != kv_len:
        return False, f"causal with q_len {q_len} != kv_len {kv_len} is not supported by cudnn here"
    return True, ""


def one_segment_lengths(segment_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(lengths [batch] int32, ok [batch] bool) of segment ids [batch, len]: a row is ok when it is one
    non-zero segment from position 0 followed only by padding, and its length is then its number of
    non-zero ids (all-padding rows are ok, length 0)."""
    real = segment_ids != 0
    lengths = jnp.sum(real, axis=1, dtype=jnp.int32)
    inside = jnp.arange(segment_ids.shape[1])[None, :] < lengths[:, None]
    ok = jnp.all(jnp.where(inside, segment_ids == segment_ids[:, :1], ~real), axis=1)
    return lengths, ok


def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                    segment_ids: jax.Array | None = None, causal: bool = False,
                    scale: float | None = None, implementation: str = "cudnn") -> jax.Array:
    """Contract attention (BTNH) through jax.nn.dot_product_attention(implementation="cudnn"), rows of
    one segment then padding. `implementation="xla"` runs the same adapter through jax's XLA path (the
    CPU tests check the lengths logic that way; the GPU tests check cuDNN itself)."""
    lengths = ok = None
    if segment_ids is not None:
        lengths, ok = one_segment_lengths(segment_ids)
    out = jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=causal,
                                       query_seq_lengths=lengths, key_value_seq_lengths=lengths,
                                       implementation=implementation)
    out = zero_padding_rows(out, segment_ids)  # padding rows come back undefined
    if segment_ids is not None:  # a broken promise (several segments in a row) comes back NaN
        out = jnp.where(ok[:, None, None, None], out, jnp.full((), jnp.nan, out.dtype))
    return out


IMPLEMENTATION = Implementation(name=NAME, backends=BACKENDS, limits=LIMITS,
                                is_supported=is_supported, call=cudnn_attention, custom_call=True,
                                min_gpu_capability=(8, 0), score_block=(0, 0))
