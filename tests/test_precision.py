"""--dtype -> matmul precision (models/precision.py): float32 means true float32 dots, also in the
programs a LoadedModel lowers (XLA's GPU default may run float32 dots as TF32); bfloat16 stays native."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.precision import matmul_precision, with_matmul_precision


def test_dtype_to_precision():
    assert matmul_precision("float32") == "highest"
    assert matmul_precision("bfloat16") == "default"
    with pytest.raises(ValueError, match="no matmul precision is defined for dtype 'tf32'"):
        matmul_precision("tf32")


def test_dots_without_their_own_precision_trace_under_it():
    x = jnp.ones((4, 4), jnp.float32)
    dot = lambda a, b: a @ b
    assert "HIGHEST" in str(jax.make_jaxpr(with_matmul_precision(dot, "highest"))(x, x))
    assert "HIGHEST" not in str(jax.make_jaxpr(with_matmul_precision(dot, "default"))(x, x))
    # an explicit precision is still the dot's own
    explicit = lambda a, b: jnp.matmul(a, b, precision=jax.lax.Precision.DEFAULT)
    assert "HIGHEST" not in str(jax.make_jaxpr(with_matmul_precision(explicit, "highest"))(x, x))


def test_float32_model_lowers_every_dot_at_highest(minilm):
    """The whole float32 embed program, attention kernel included (its einsums name no precision)."""
    assert minilm.dtype == "float32" and minilm.matmul_precision == "highest"
    ids, seg = np.ones((2, 16), np.int32), np.ones((2, 16), np.int32)
    # the program _run compiles (private: the lowered text is the only place precision shows)
    text = minilm._functions["embed_packed"].lower(minilm._state, ids, seg, 1).as_text()
    dots = re.findall(r"stablehlo\.dot_general.*", text)
    assert dots and all("HIGHEST" in line for line in dots), [d for d in dots if "HIGHEST" not in d][:2]
