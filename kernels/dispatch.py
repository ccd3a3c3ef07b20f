"""The one entry point: check the inputs against the contract, resolve the implementation, and
call it inside jax.named_scope("attention/<name>"); a custom-call kernel under a mesh of several
devices runs per shard (kernels/mesh.py). Must not hold kernel math or policy rules.
"""
from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from kernels import mesh, table
from kernels.interface import KernelUnsupportedError, effective_window, shape_info_of
from kernels.policy import resolve


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, segment_ids: jax.Array | None = None,
              causal: bool = False, scale: float | None = None, impl: str = "auto",
              packed: bool = True, window: int | None = None, soft_cap: float | None = None,
              relative_bias: jax.Array | None = None) -> jax.Array:
    """Scaled dot-product attention, BTNH: q [B, Lq, H, D], k/v [B, Lkv, KH, D], H % KH == 0.

    segment_ids int32 [B, L] (needs Lq == Lkv): 0 = padding, tokens attend only within their own
    non-zero segment, padding rows are 0. causal: query i sees keys <= i. scale: default D**-0.5.
    impl: "auto" | "native" | "flash" | an implementation name (kernels/table.py IMPLEMENTATIONS).
    packed: False promises every row of segment_ids is one segment followed by padding, which lets
    kernels that take lengths instead of segments run (cudnn); a row breaking it comes back NaN there.
    window: query i sees only keys less than `window` positions away, |i - j| < window: with causal,
    i - window < j <= i (a sliding-window decoder: Mistral, Qwen2), without it i - window < j < i + window (an
    encoder's local attention: ModernBERT); kernels without it (Implementation.local_window) are refused, unless
    the window is at least the rows' length: it then masks nothing and is dropped (interface.effective_window).
    soft_cap: the scaled scores become tanh(scores / soft_cap) * soft_cap before the mask and softmax (Gemma 2's
    attention-logit soft-capping); kernels without it (Implementation.logit_soft_cap) are refused. None: no cap.
    relative_bias: float [H, Lq + Lkv - 1], a bias by key-query offset: relative_bias[h, j - i + Lq - 1] is added to
    head h's scaled score of query i and key j before the mask and softmax (MPNet's and T5's bucketed relative position
    bias, looked up per offset by the model). Indexed by offset, it holds O(length) values, and kernels that never hold
    [Lq, Lkv] scores (blockwise) gather it a block at a time. Offsets are of row indices: a document packed after
    others in a row has the same offsets between its tokens as alone, and other segments are masked. It is refused
    beside soft_cap (no model docscore reads has both, and whether it is added inside or outside the cap's tanh is
    the model's to say); kernels without it (Implementation.relative_position_bias) are refused. None: no bias.
    Under a mesh of several devices in context (jax.sharding.get_abstract_mesh(); models trace under
    theirs) a custom-call kernel (Pallas, cuDNN) runs under jax.shard_map: batch on "data", heads on
    "model" (kernels/mesh.py says how grouped-query and axes that do not divide are split).
    """
    check_inputs(q, k, v, segment_ids, relative_bias)
    check_static_arguments(causal, scale, window, soft_cap)
    window = effective_window(window, q.shape[1], k.shape[1])
    soft_cap = None if soft_cap is None else float(soft_cap)
    name = resolve_for(q, k, segment_ids=segment_ids, causal=causal, impl=impl, packed=packed, window=window,
                       soft_cap=soft_cap, relative_bias=relative_bias)
    local = {"window": window} if window else {}  # only kernels with local_window take it
    if soft_cap is not None:  # only kernels with logit_soft_cap take it
        local["soft_cap"] = soft_cap
    if relative_bias is not None:  # only kernels with relative_position_bias take it
        local["relative_bias"] = relative_bias
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    implementation = table.IMPLEMENTATIONS[name]
    with jax.named_scope(f"attention/{name}"):
        if implementation.custom_call:
            return mesh.call_per_shard(implementation.call, q, k, v, segment_ids=segment_ids,
                                       causal=causal, scale=scale, name=name, **local)
        return implementation.call(q, k, v, segment_ids=segment_ids, causal=causal, scale=scale, **local)


def resolve_for(q: jax.Array, k: jax.Array, *, segment_ids: jax.Array | None = None,
                causal: bool = False, impl: str = "auto", backend: str | None = None,
                packed: bool = True, window: int | None = None, soft_cap: float | None = None,
                relative_bias: jax.Array | None = None) -> str:
    """The implementation name attention() runs for these arrays (for callers to record). A refusal speaks of
    the `impl=` argument (policy's messages name the command's --attention flag)."""
    check_inputs(q, k, k, segment_ids, relative_bias)
    if soft_cap is not None and relative_bias is not None:  # here, so no kernel is named for what attention refuses
        raise ValueError("attention takes a soft_cap or a relative_bias, not both: no model docscore reads has both, "
                         "and whether the bias is added inside or outside the cap is the model's choice")
    try:
        return resolve(impl, backend, **shape_info_of(q, k, segment_ids, causal, packed, window, soft_cap,
                                                      relative_bias))
    except KernelUnsupportedError as e:
        raise KernelUnsupportedError(str(e).replace("--attention=", "impl=")) from None


def check_inputs(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array | None,
                 relative_bias: jax.Array | None = None) -> None:
    """Refuse inputs outside the contract with a message that says what shape was expected."""
    arrays = {"q": q, "k": k, "v": v} | ({} if segment_ids is None else {"segment_ids": segment_ids})
    arrays |= {} if relative_bias is None else {"relative_bias": relative_bias}
    for name, x in arrays.items():
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise TypeError(f"attention wants {name} as an array (jax or numpy); got {type(x).__name__}")
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"attention wants q, k, v as [batch, len, heads, head_dim]; got shapes "
                         f"{q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape:
        raise ValueError(f"attention wants k and v of the same shape; got {k.shape} and {v.shape}")
    if 0 in q.shape or 0 in k.shape:  # no query, key, head or feature to attend with: every kernel would differ
        raise ValueError(f"attention wants every dimension of q and k at least 1; got {q.shape} and {k.shape}")
    if not all(jnp.issubdtype(x.dtype, jnp.floating) for x in (q, k, v)):
        raise ValueError(f"attention wants floating-point q, k, v; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.dtype == k.dtype == v.dtype:  # kernels differ in what they would promote to (cuDNN refuses a mix)
        raise ValueError(f"attention wants q, k, v of one dtype; got {q.dtype}, {k.dtype}, {v.dtype} "
                         "(cast them: k.astype(q.dtype))")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"attention wants q and k with the same batch and head_dim; got "
                         f"{q.shape} and {k.shape}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"attention wants heads ({q.shape[2]}) to be a multiple of kv_heads "
                         f"({k.shape[2]})")
    if segment_ids is not None:
        if q.shape[1] != k.shape[1]:
            raise ValueError(f"segment_ids need q_len == kv_len; got {q.shape[1]} and {k.shape[1]}")
        if segment_ids.shape != q.shape[:2]:
            raise ValueError(f"segment_ids must be [batch, len] = {q.shape[:2]}; got "
                             f"{segment_ids.shape}")
        # ids are compared as int32 by every kernel: a float or a 64-bit id would be cut there and not in others
        dtype = jnp.dtype(segment_ids.dtype)
        if not (dtype == jnp.bool_ or jnp.issubdtype(dtype, jnp.integer) and dtype.itemsize <= 4):
            raise ValueError(f"segment_ids must be integers of at most 32 bits (int32); got {dtype} "
                             "(cast them: segment_ids.astype(jnp.int32))")
    if relative_bias is not None:
        offsets = (q.shape[2], q.shape[1] + k.shape[1] - 1)
        if tuple(relative_bias.shape) != offsets or not jnp.issubdtype(relative_bias.dtype, jnp.floating):
            raise ValueError(f"relative_bias must be floating point [heads, q_len + kv_len - 1] = {list(offsets)}, one "
                             f"value per head and key-query offset; got {relative_bias.dtype}"
                             f"{list(relative_bias.shape)}")


def check_static_arguments(causal: bool, scale: float | None, window: int | None,
                           soft_cap: float | None = None) -> None:
    """Refuse a causal, scale, window or soft cap that is not a plain Python value: they choose the kernel and its
    masks when the call is traced, so they cannot be traced values (jax.jit's static_argnames can pass them)."""
    if not isinstance(causal, (bool, np.bool_)):
        raise ValueError(f"attention's causal must be True or False, a static Python bool; got {causal!r}")
    if scale is not None:
        try:
            float(scale)
        except (TypeError, jax.errors.ConcretizationTypeError):
            raise ValueError(f"attention's scale must be None or a static number, not a traced value; got "
                             f"{type(scale).__name__} (a learned temperature can multiply q instead)") from None
    if window is not None and (isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1):
        raise ValueError(f"attention's window must be None or a static whole number of positions >= 1; got {window!r}")
    if soft_cap is not None:
        try:
            cap = math.nan if isinstance(soft_cap, (bool, np.bool_, str, bytes)) else float(soft_cap)
        except (TypeError, jax.errors.ConcretizationTypeError):
            raise ValueError(f"attention's soft_cap must be None or a static number, not a traced value; got "
                             f"{type(soft_cap).__name__}") from None
        if not 0 < cap < math.inf:  # 0, a negative cap or NaN would make every score NaN or flip its sign
            raise ValueError(f"attention's soft_cap must be None or a positive, finite number; got {soft_cap!r}")
