"""What docscore's --dtype and --matmul_precision mean for matmul precision: float32 means true float32
matmuls on every backend (XLA's default on GPU may run float32 dots as TF32, on TPU as bfloat16 passes);
TF32 is offered only as a named choice (--matmul_precision tf32: float32 models on NVIDIA GPUs); bfloat16
runs at the backend's native precision. Pure functions only; the loader applies them where programs are
traced. Must not choose kernels or dtypes.

The model's dots name no precision of their own (no `precision=` argument), so this one is
what the dense layers, the LM head and the attention kernels' einsums run at; only the embedding pooling
(models/heads.py) stays at "highest", since an exact mean of the hidden states costs nothing.
"""
from __future__ import annotations

from typing import Any, Callable

import jax

# --dtype -> the name jax.default_matmul_precision takes ("highest": float32 inputs, float32 products).
MATMUL_PRECISION = {"float32": "highest", "bfloat16": "default"}

# --matmul_precision -> the name jax.default_matmul_precision takes. "float32" is --dtype float32's own
# default; "tf32" names jax's dot algorithm preset explicitly (TensorFloat-32 inputs: a 10-bit mantissa,
# float32 accumulation, one pass) rather than "tensorfloat32" (lax.Precision.HIGH), whose algorithm
# XLA chooses per backend.
CHOICES = {"float32": "highest", "tf32": "TF32_TF32_F32"}
# The dtype each choice applies to, and the backends that run it.
CHOICE_DTYPE = {"float32": "float32", "tf32": "float32"}
CHOICE_BACKENDS = {"float32": ("cpu", "gpu", "tpu"), "tf32": ("gpu",)}


def matmul_precision(dtype: str, choice: str | None = None) -> str:
    """The default matmul precision docscore traces a model of compute dtype `dtype` with, given the
    --matmul_precision `choice` (None: the dtype's own; check it first with choice_problem)."""
    if dtype not in MATMUL_PRECISION:
        raise ValueError(f"no matmul precision is defined for dtype {dtype!r}; use one of "
                         f"{sorted(MATMUL_PRECISION)}")
    if choice is None:
        return MATMUL_PRECISION[dtype]
    problem = choice_problem(dtype, choice)
    if problem:
        raise ValueError(problem)
    return CHOICES[choice]


def choice_problem(dtype: str, choice: str | None, backend: str | None = None) -> str | None:
    """Why --matmul_precision `choice` cannot run with --dtype `dtype` on `backend` (None: not checked),
    as a message naming the flag and the fix; None when it can (or when no choice is made)."""
    if choice is None:
        return None
    if choice not in CHOICES:
        return (f"--matmul_precision={choice} is not known; use one of {', '.join(CHOICES)} (tf32: --dtype "
                "float32 on a GPU only), or leave it out for --dtype's own precision")
    if dtype != CHOICE_DTYPE[choice]:
        return (f"--matmul_precision={choice} applies to --dtype {CHOICE_DTYPE[choice]} only; --dtype {dtype} "
                f"runs its matmuls at the backend's native precision: drop --matmul_precision, or use --dtype "
                f"{CHOICE_DTYPE[choice]}")
    if backend is not None and backend not in CHOICE_BACKENDS[choice]:
        return (f"--matmul_precision={choice} needs a GPU (TensorFloat-32 is an NVIDIA tensor-core format), "
                f"but inference runs on {backend}: drop --matmul_precision (float32 matmuls there are exact), "
                "or run it on GPU workers (--preset dataflow-gpu-l4, runners/DATAFLOW.md) or on a machine with a GPU")
    return None


def with_matmul_precision(fn: Callable[..., Any], precision: str) -> Callable[..., Any]:
    """`fn` traced under jax.default_matmul_precision(precision): wrap a function before jax.jit so
    every dot it traces without an explicit precision gets this one."""
    def traced(*args, **kwargs):
        with jax.default_matmul_precision(precision):
            return fn(*args, **kwargs)
    return traced
