"""What docscore's --dtype means for matmul precision: float32 means true float32 matmuls on every
backend (XLA's default on GPU may run float32 dots as TF32, on TPU as bfloat16 passes); bfloat16 runs
at the backend's native precision. Pure functions only; the loader applies them where programs are
traced. Must not choose kernels or dtypes.

models/layers.matmul_precision already pins the dense layers and the LM head; this precision is the
default for every other dot traced in a program (the attention kernels' einsums included).
"""
from __future__ import annotations

from typing import Any, Callable

import jax

# --dtype -> the name jax.default_matmul_precision takes ("highest": float32 inputs, float32 products).
MATMUL_PRECISION = {"float32": "highest", "bfloat16": "default"}


def matmul_precision(dtype: str) -> str:
    """The default matmul precision docscore traces a model of compute dtype `dtype` with."""
    if dtype not in MATMUL_PRECISION:
        raise ValueError(f"no matmul precision is defined for dtype {dtype!r}; use one of "
                         f"{sorted(MATMUL_PRECISION)}")
    return MATMUL_PRECISION[dtype]


def with_matmul_precision(fn: Callable[..., Any], precision: str) -> Callable[..., Any]:
    """`fn` traced under jax.default_matmul_precision(precision): wrap a function before jax.jit so
    every dot it traces without an explicit precision gets this one."""
    def traced(*args, **kwargs):
        with jax.default_matmul_precision(precision):
            return fn(*args, **kwargs)
    return traced
