"""`splash_tpu`: JAX's public Pallas TPU splash attention (block-sparse flash attention; "flash" on TPU),
adapted to the contract.

The kernel (jax.experimental.pallas.ops.tpu.splash_attention) takes one example at a time, heads first
([heads, len, head_dim]), grouped-query natively (k and v keep their kv heads: nothing is repeated),
segment ids masked inside the kernel, and a static mask (causal, full, or a local window: its LocalMask) from which
it precomputes which blocks hold any allowed pair: blocks above the causal diagonal, or wholly outside the window,
are neither fetched nor computed. It has
no scale argument, so queries are scaled before the call. This adapter transposes BTNH <-> BNTH, pads
lengths to a multiple of 128 (padding gets segment 0), vmaps the kernel over the batch, and zeroes
padding rows (the kernel lets padding tokens attend to each other). An attention-logit soft cap is the kernel's own
attn_logits_soft_cap, applied to the (pre-scaled) scores before its masks. Forward only. Must not reimplement
the kernel itself nor import private jax names. Why it is TPU's first flash kernel: benchmarks/RESULTS.md,
"TPU flash: splash attention".
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.interface import Implementation, missing_module, ops_module
from kernels.masking import zero_padding_rows
from kernels.tpu_layout import LENGTH_MULTIPLE, block, padded_segment_ids, round_up, to_bnth

NAME = "splash_tpu"
OPS_MODULE = "jax.experimental.pallas.ops.tpu.splash_attention"
BACKENDS = ("tpu",)
DTYPES = ("float32", "bfloat16")
LIMITS = ("TPU only; float32 or bfloat16; any length (padded to a multiple of "
          f"{LENGTH_MULTIPLE}); grouped-query without repeating kv heads; packed segment_ids masked "
          "inside the kernel; causal blocks above the diagonal skipped; local (sliding-window) attention, causal "
          "or both ways, blocks outside the window skipped; attention-logit soft cap; forward only")


def is_supported(*, dtype: str | None = None, **_) -> tuple[bool, str]:
    """The splash kernel's limits (checked only for the keys given): its dtypes. Any head_dim and
    grouping the contract allows, and q_len != kv_len without segment ids, run. And its JAX module's presence."""
    if (missing := missing_module(OPS_MODULE)) is not None:
        return False, missing
    if dtype is not None and dtype not in DTYPES:
        return False, f"dtype {dtype} is not supported (splash_tpu needs float32 or bfloat16)"
    return True, ""


def _splash():
    """JAX's splash attention module, imported when the kernel is built: its TPU lowering would add to the
    start of every command on hosts without a TPU."""
    return ops_module(OPS_MODULE)


def static_mask(splash, shape: tuple[int, int], causal: bool, window: int | None):
    """The kernel's mask for one head: causal (top-left aligned, as the contract's) or full, or with a local
    `window` (|i - j| < window, kernels/masking.py window_mask) splash's LocalMask, whose window_size (left, right)
    keeps q - left <= kv <= q + right, both ends inclusive: window - 1 keys before the query, and after it none
    (causal: LocalMask's right side 0 is the causal mask itself) or window - 1."""
    if window:
        reach = window - 1
        return splash.LocalMask(shape=shape, window_size=(reach, 0 if causal else reach), offset=0)
    return splash.CausalMask(shape=shape) if causal else splash.FullMask(shape)


def make_kernel(heads: int, q_pad: int, kv_pad: int, causal: bool, *, block_q: int | None = None,
                block_kv: int | None = None, soft_cap: float | None = None, window: int | None = None):
    """The splash kernel (a SplashAttentionKernel) for one example of [heads, q_pad, D] queries: static_mask's
    mask for every head, forward blocks only, scores capped at soft_cap (None: not capped). Built at trace time
    from static shapes."""
    splash = _splash()
    bq = block_q or block(q_pad)
    bkv = block_kv or block(kv_pad)
    mask = static_mask(splash, (q_pad, kv_pad), causal, window)
    blocks = splash.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv)
    return splash.make_splash_mha(mask=splash.MultiHeadMask(masks=(mask,) * heads), block_sizes=blocks,
                                  attn_logits_soft_cap=soft_cap, head_shards=1, q_seq_shards=1)


def splash_tpu_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                         segment_ids: jax.Array | None = None, causal: bool = False,
                         scale: float | None = None, block_q: int | None = None,
                         block_kv: int | None = None, batch_loop: bool = False,
                         soft_cap: float | None = None, window: int | None = None) -> jax.Array:
    """Contract attention (BTNH) through jax.experimental.pallas.ops.tpu.splash_attention. window: the contract's
    local window (|i - j| < window, with causal a sliding window), the kernel's own LocalMask.

    The kernel is vmapped over the batch (one pallas_call whose grid gains a batch dimension, as MaxText
    calls it). batch_loop=True runs it one example at a time (jax.lax.map) instead: for running inside
    jax.experimental.pallas.tpu.force_tpu_interpret_mode(), whose interpreter (jax 0.10) does not take a
    vmapped TPU kernel (its grid gains a dimension the kernel's dimension_semantics do not name)."""
    batch, q_len, heads, head_dim = q.shape
    kv_len = k.shape[1]
    scale = head_dim ** -0.5 if scale is None else scale
    q_pad, kv_pad = round_up(q_len), round_up(kv_len)
    qt = to_bnth((q.astype(jnp.float32) * scale).astype(q.dtype), q_pad)  # the kernel has no scale
    kt, vt = to_bnth(k, kv_pad), to_bnth(v, kv_pad)  # kv heads as they are: grouped-query is native

    splash = _splash()
    segments = None
    if segment_ids is not None or q_pad != q_len or kv_pad != kv_len:  # keep real queries off the padded keys
        segments = splash.SegmentIds(*padded_segment_ids(segment_ids, batch, q_len, kv_len))

    kernel = make_kernel(heads, q_pad, kv_pad, causal, block_q=block_q, block_kv=block_kv, soft_cap=soft_cap,
                         window=window)
    if segments is None:
        one = lambda args: kernel(*args)
        args = (qt, kt, vt)
    else:
        one = lambda args: kernel(*args[:3], segment_ids=splash.SegmentIds(*args[3:]))
        args = (qt, kt, vt, segments.q, segments.kv)
    out = jax.lax.map(one, args) if batch_loop else jax.vmap(one)(args)
    out = out.transpose(0, 2, 1, 3)[:, :q_len]
    if window and q_len >= kv_len + window - 1:  # queries past the last key's window see no key: the contract's 0
        out = out.at[:, kv_len + window - 1:].set(0)
    out = zero_padding_rows(out, segment_ids)  # padding tokens attended to each other inside the kernel
    return out.astype(q.dtype)


IMPLEMENTATION = Implementation(name=NAME, backends=BACKENDS, limits=LIMITS,
                                is_supported=is_supported, call=splash_tpu_attention, custom_call=True,
                                local_window=True, logit_soft_cap=True, score_block=(0, 0))
