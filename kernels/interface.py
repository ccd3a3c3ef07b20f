"""The one small interface every attention implementation exposes, and the error for refusals.

Holds only the `Implementation` record, `KernelUnsupportedError` and the shape-info helpers;
it must not choose between implementations (that is kernels/policy.py).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import warnings
from types import ModuleType
from typing import Any, Callable, Protocol

import jax
import jax.numpy as jnp

# Shape-info keys understood by `is_supported` and `resolve` (all optional; a check whose key
# is missing is skipped, so `resolve(impl, backend=...)` works before any data is read).
# packed: whether segment ids may hold several segments per row. Segment values are data, not
# shape, so a kernel cannot see this at trace time: the caller states it. Missing, it follows
# has_segments (segment ids may be packed); False promises one segment per row followed by padding.
# soft_cap: the attention-logit soft cap (Gemma 2's attn_logit_softcapping), or missing / None for none.
# relative_bias: whether the call adds a relative position bias to its scores (MPNet's); missing / None / False: none.
SHAPE_KEYS = ("q_len", "kv_len", "heads", "kv_heads", "head_dim", "dtype", "causal", "has_segments",
              "packed", "window", "soft_cap", "relative_bias")


class KernelUnsupportedError(ValueError):
    """An explicitly requested attention implementation cannot run here; the message says why
    and which --attention values can."""


class AttentionCall(Protocol):
    def __call__(self, q: jax.Array, k: jax.Array, v: jax.Array, *, segment_ids: jax.Array | None,
                 causal: bool, scale: float) -> jax.Array: ...


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One attention kernel: its name, the backends it runs on, its limits in words,
    `is_supported(**shape_info) -> (ok, reason)` and the call itself (contract layout BTNH).
    custom_call: the kernel is a custom call XLA's SPMD partitioner cannot split (Pallas, cuDNN), so
    under a mesh of several devices dispatch runs it per shard (kernels/mesh.py)."""

    name: str
    backends: tuple[str, ...]
    limits: str
    is_supported: Callable[..., tuple[bool, str]]
    call: AttentionCall
    custom_call: bool = False
    # takes window= (|i - j| < window): a sliding-window decoder's, with causal, and an encoder's local attention
    # (ModernBERT), without; a kernel that could take only one of them refuses the other in is_supported
    local_window: bool = False
    # takes soft_cap= (scores = tanh(scores / soft_cap) * soft_cap after the scale, before the mask and softmax: Gemma
    # 2's attention-logit soft-capping); the policy refuses a kernel without it for inputs that have one
    logit_soft_cap: bool = False
    # takes relative_bias= ([heads, q_len + kv_len - 1], entry j - i + q_len - 1 added to the scaled score of query i and
    # key j: MPNet's bucketed relative position bias); the policy refuses a kernel without it for inputs that have one
    relative_position_bias: bool = False
    # The oldest NVIDIA GPU it compiles for, as (major, minor) compute capability; the policy refuses it on an older
    # local GPU before any data is read (cuDNN's fused attention and Pallas' Triton need Ampere, 8.0).
    min_gpu_capability: tuple[int, int] | None = None
    # The attention scores it holds in device memory at once, per row and head, for the --batch_size memory check:
    # None, all [L, L] of them (scores and probabilities, as XLA's attention); (q, k), one block of at most q x k;
    # (0, 0), none (a flash kernel keeps its tiles on chip).
    score_block: tuple[int, int] | None = None


def ops_module(name: str) -> ModuleType:
    """A kernel's JAX ops module (jax.experimental.pallas.ops...), imported when the kernel is first traced: its
    lowering would add to the start of every command on hosts that never run it. jax warns of the GPU one's
    deprecation (in favour of tokamax, not a dependency); missing_module checks it exists before data is read."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(name)


@functools.cache
def missing_module(name: str) -> str | None:
    """Why the installed jax cannot import the ops module `name`, or None. A kernel's is_supported refuses with it,
    so a jax upgrade that moved or removed the module refuses the kernel before any data is read (explicit
    choices) or passes to the next kernel (flash, auto), instead of failing on the workers mid-job."""
    try:
        ops_module(name)
    except ImportError as e:
        return (f"the installed jax {jax.__version__} cannot import {name} ({type(e).__name__}: {str(e)[:200]}); "
                "install the jax version docscore pins (setup.py)")
    return None


def dtype_name(dtype: Any) -> str:
    """'float32', 'bfloat16', ... for a dtype object, a string or None (-> '')."""
    return "" if dtype is None else jnp.dtype(dtype).name


def effective_window(window: int | None, q_len: int | None, kv_len: int | None = None) -> int | None:
    """`window`, or None where it cannot hide a key: query i sees keys with |i - j| < window (causal or not), so a
    window at least as long as the rows masks nothing (a sliding-window model converted at its window, `docscore convert`'s
    default, has windows no longer than that), and every kernel can then run it, local window or not."""
    longest = max(q_len or 0, kv_len or 0)
    return None if window and longest and window >= longest else window


def shape_info_of(q: jax.Array, k: jax.Array, segment_ids: jax.Array | None, causal: bool,
                  packed: bool = True, window: int | None = None, soft_cap: float | None = None,
                  relative_bias: jax.Array | None = None) -> dict:
    """The shape info of one attention call (static under jit); `packed` as the caller states it."""
    return dict(q_len=q.shape[1], kv_len=k.shape[1], heads=q.shape[2], kv_heads=k.shape[2],
                head_dim=q.shape[3], dtype=dtype_name(q.dtype), causal=bool(causal),
                has_segments=segment_ids is not None, packed=segment_ids is not None and bool(packed),
                window=window or None, soft_cap=soft_cap, relative_bias=relative_bias is not None)
