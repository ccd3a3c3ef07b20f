"""`pallas_gpu`: JAX's public Pallas GPU (Triton) flash attention, adapted to the contract (GPU flash for
packed segments, where cudnn cannot take them without a dense mask).

The kernel (jax.experimental.pallas.ops.gpu.attention.mha) masks segment ids block by block inside
the kernel, so memory stays linear in length. This adapter pads lengths to its block size (padding
gets segment 0), pads head_dim to a power of two with zeros, repeats kv heads for grouped-query,
and zeroes padding rows (the kernel lets padding tokens attend to each other). Forward only. Must not
reimplement the kernel itself nor import private jax names.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.interface import Implementation, missing_module, ops_module
from kernels.masking import zero_padding_rows

NAME = "pallas_gpu"
OPS_MODULE = "jax.experimental.pallas.ops.gpu.attention"
BACKENDS = ("gpu",)
DTYPES = ("float16", "bfloat16")
MAX_HEAD_DIM = 128  # the kernel sizes its warps for head_dim <= 64 and <= 128 (4 or 8 warps)
MIN_BLOCK = 16  # Triton's smallest dot: head_dim and short rows are padded up to it (powers of two)
BLOCK_Q = BLOCK_K = 128  # the kernel's default tiles; longer rows are padded to a multiple of them
LIMITS = (f"NVIDIA GPU (Triton); float16 or bfloat16; head_dim <= {MAX_HEAD_DIM} (padded to a power of "
          f"two >= {MIN_BLOCK}); q_len == kv_len; any length (padded to a multiple of {BLOCK_Q}), "
          "memory linear in it; packed segment_ids masked inside the kernel; kv heads are repeated "
          "for grouped-query; forward only")


def is_supported(*, dtype: str | None = None, head_dim: int | None = None,
                 q_len: int | None = None, kv_len: int | None = None, **_) -> tuple[bool, str]:
    """The Pallas GPU kernel's limits (checked only for the keys given), and its JAX module's presence."""
    if (missing := missing_module(OPS_MODULE)) is not None:
        return False, missing
    if dtype is not None and dtype not in DTYPES:
        return False, f"dtype {dtype} is not supported (pallas_gpu needs float16 or bfloat16)"
    if head_dim is not None and head_dim > MAX_HEAD_DIM:
        return False, f"head_dim {head_dim} is not supported (pallas_gpu needs <= {MAX_HEAD_DIM})"
    if q_len is not None and kv_len is not None and q_len != kv_len:
        return False, (f"q_len {q_len} != kv_len {kv_len} is not supported (pallas_gpu pads queries and keys "
                       "to one length and masks them with one set of segment ids: self-attention only)")
    return True, ""


def _gpu_attention():
    """JAX's Pallas GPU attention module (its Triton lowering adds ~0.3 s to an import)."""
    return ops_module(OPS_MODULE)


def _blocks(length: int, block_q: int, block_k: int) -> tuple[int, int, int]:
    """(padded length, block_q, block_k): a row shorter than a block runs in one power-of-two block
    (>= MIN_BLOCK); longer rows are padded to a multiple of both blocks (powers of two)."""
    size = max(MIN_BLOCK, 1 << (length - 1).bit_length())
    bq, bk = min(block_q, size), min(block_k, size)
    step = max(bq, bk)
    return -(-length // step) * step, bq, bk


def pallas_gpu_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                         segment_ids: jax.Array | None = None, causal: bool = False,
                         scale: float | None = None, block_q: int = BLOCK_Q, block_k: int = BLOCK_K,
                         num_warps: int | None = None, num_stages: int = 2,
                         interpret: bool = False) -> jax.Array:
    """Contract attention (BTNH) through jax.experimental.pallas.ops.gpu.attention.mha.
    `interpret=True` runs the kernel in Pallas's interpreter (any backend; the CPU tests)."""
    batch, length, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    scale = head_dim ** -0.5 if scale is None else scale
    padded, bq, bk = _blocks(length, block_q, block_k)
    dim = max(MIN_BLOCK, 1 << (head_dim - 1).bit_length())

    def pad(x: jax.Array) -> jax.Array:
        return jnp.pad(x, ((0, 0), (0, padded - length), (0, 0), (0, dim - head_dim)))

    groups = heads // kv_heads
    qp = pad(q)
    kp = pad(jnp.repeat(k, groups, axis=2) if groups > 1 else k)
    vp = pad(jnp.repeat(v, groups, axis=2) if groups > 1 else v)

    segments = None
    if segment_ids is not None:
        segments = jnp.pad(segment_ids.astype(jnp.int32), ((0, 0), (0, padded - length)))
    elif padded != length:  # keep real queries off the padded keys
        segments = jnp.pad(jnp.ones((batch, length), jnp.int32), ((0, 0), (0, padded - length)))

    gpu_attention = _gpu_attention()
    out = gpu_attention.mha(qp, kp, vp, segments, sm_scale=float(scale), causal=causal,
                            block_sizes=gpu_attention.BlockSizes(block_q=bq, block_k=bk),
                            num_warps=num_warps, num_stages=num_stages, interpret=interpret)
    out = out[:, :length, :, :head_dim]
    out = zero_padding_rows(out, segment_ids)  # padding tokens attended to each other inside the kernel
    return out.astype(q.dtype)


IMPLEMENTATION = Implementation(name=NAME, backends=BACKENDS, limits=LIMITS,
                                is_supported=is_supported, call=pallas_gpu_attention, custom_call=True,
                                min_gpu_capability=(8, 0), score_block=(0, 0))
