"""Attention kernels behind one contract (see docs/DESIGN.md, "kernels").

`attention(q, k, v, *, segment_ids=None, causal=False, window=None, scale=None, impl="auto", packed=True,
soft_cap=None, relative_bias=None)` runs
the kernel `resolve(impl, backend, **shape_info)` names; `resolve_for(q, k, ...)` names it from the arrays
themselves (for callers to record); `available()` lists the kernels and their limits; `other_choice(kernel, ...)`
is another choice that runs the same inputs (what a shadow kernel uses).
"""
from kernels.dispatch import attention, resolve_for
from kernels.interface import SHAPE_KEYS, KernelUnsupportedError
from kernels.policy import available, other_choice, resolve

__all__ = ["attention", "resolve", "resolve_for", "available", "other_choice", "KernelUnsupportedError", "SHAPE_KEYS"]
