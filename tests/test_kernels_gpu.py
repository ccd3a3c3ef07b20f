"""The GPU kernels on a GPU: cudnn, pallas_gpu, xla and blockwise through attention() against the float64
reference (padding, packed segments, causal, grouped-query), what flash compiles to, and float32 at
precision "highest". Skipped without a GPU; test_kernels_parity.py covers the same kernels' logic on CPU
(Pallas interpreted, cudnn's adapter on jax's XLA path). benchmarks/gpu_kernels.py adds long rows,
timing and memory."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import KernelUnsupportedError, attention, resolve_for
from test_kernels_parity import check_against_reference, make_inputs, one_segment_rows, segment_rows

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "gpu",
    reason=f"needs a GPU (jax[cuda]); jax runs on {jax.default_backend()} here - "
           "tests/test_kernels_parity.py checks these kernels' logic on CPU")


def via(impl: str, packed: bool = True):
    return lambda q, k, v, **kw: attention(q, k, v, impl=impl, packed=packed, **kw)


# (length, kv_heads, causal, head_dim): one block and less, ragged multi-block rows, MiniLM's
# head_dim 32, GPT-2's 64, 128; kv heads 12 / 4 / 1.
SHAPES = [(7, 4, True, 64), (129, 12, False, 32), (300, 1, True, 64), (1000, 4, False, 128),
          (1000, 12, True, 32)]


@pytest.mark.parametrize("length,kv_heads,causal,head_dim", SHAPES)
@pytest.mark.parametrize("impl", ["pallas_gpu", "xla", "blockwise"])
def test_packed_rows_bfloat16(impl, length, kv_heads, causal, head_dim):
    check_against_reference(via(impl), length=length, kv_heads=kv_heads, causal=causal, segments=True,
                            dtype="bfloat16", head_dim=head_dim, seed=length)


@pytest.mark.parametrize("length,kv_heads,causal,head_dim", SHAPES)
@pytest.mark.parametrize("impl", ["cudnn", "pallas_gpu"])
def test_one_segment_rows_bfloat16(impl, length, kv_heads, causal, head_dim):
    check_against_reference(via(impl, packed=False), length=length, kv_heads=kv_heads, causal=causal,
                            segments=True, dtype="bfloat16", head_dim=head_dim, seed=length,
                            rows=one_segment_rows)


@pytest.mark.parametrize("impl", ["cudnn", "pallas_gpu"])
@pytest.mark.parametrize("causal", [False, True])
def test_no_segment_ids_bfloat16(impl, causal):
    check_against_reference(via(impl), length=300, kv_heads=4, causal=causal, segments=False,
                            dtype="bfloat16", seed=3)


@pytest.mark.parametrize("packed", [True, False])
def test_flash_runs_a_window_as_long_as_the_rows(packed):
    """A sliding-window model converted at its window: its window masks nothing in rows that long, so flash
    runs it on the GPU (cudnn or pallas_gpu) and matches the reference; a shorter window is refused."""
    length = 300
    q, k, v = make_inputs(0, 1, length, length, 4, 64, "bfloat16")
    segments = jnp.ones((1, length), jnp.int32)
    assert resolve_for(q, k, segment_ids=segments, causal=True, impl="flash", packed=packed,
                       window=length) in ("cudnn", "pallas_gpu")
    check_against_reference(lambda q, k, v, **kw: attention(q, k, v, impl="flash", packed=packed, window=length, **kw),
                            length=length, kv_heads=4, causal=True, segments=True, dtype="bfloat16", head_dim=64,
                            seed=5, rows=segment_rows if packed else one_segment_rows)
    with pytest.raises(KernelUnsupportedError, match="sliding-window"):
        attention(q, k, v, segment_ids=segments, impl="flash", causal=True, window=length - 1)


def test_cudnn_long_padded_rows_without_a_dense_mask():
    """16k tokens with padding: refused before (a [B, 1, L, L] mask); now lengths, checked against
    pallas_gpu (both on the GPU; the float64 reference would be slow here)."""
    q, k, v = make_inputs(16, 1, 16384, 16384, 4, 64, "bfloat16")
    seg = np.zeros((1, 16384), np.int32)
    seg[0, :12000] = 1
    seg = jnp.asarray(seg)
    assert resolve_for(q, k, segment_ids=seg, impl="flash", packed=False) == "cudnn"
    cudnn = jax.jit(via("cudnn", packed=False))(q, k, v, segment_ids=seg)
    pallas = jax.jit(via("pallas_gpu"))(q, k, v, segment_ids=seg)
    diff = np.abs(np.asarray(cudnn, np.float32) - np.asarray(pallas, np.float32)).max()
    assert diff <= 2e-2 and (np.asarray(cudnn[0, 12000:], np.float32) == 0).all()


@pytest.mark.parametrize("packed,kernel,call", [(False, "cudnn", "cudnn"), (True, "pallas_gpu", "triton")])
def test_flash_compiles_to_the_kernel_it_names(packed, kernel, call):
    q, k, v = make_inputs(0, 2, 512, 512, 4, 64, "bfloat16")
    seg = jnp.asarray(one_segment_rows(512)[:2])
    fn = jax.jit(lambda q, k, v, s: attention(q, k, v, segment_ids=s, impl="flash", packed=packed))
    lowered = fn.lower(q, k, v, seg)
    assert f"attention/{kernel}/" in lowered.as_text(debug_info=True)
    assert call in lowered.compile().as_text().lower()


def test_cudnn_rows_that_break_the_one_segment_promise_come_back_nan():
    q, k, v = make_inputs(1, 2, 64, 64, 4, 64, "bfloat16")
    seg = np.ones((2, 64), np.int32)
    seg[1, 32:] = 2  # packed, though packed=False says otherwise
    out = np.asarray(jax.jit(via("cudnn", packed=False))(q, k, v, segment_ids=jnp.asarray(seg)),
                     np.float32)
    assert not np.isnan(out[0]).any() and np.isnan(out[1]).all()


@pytest.mark.parametrize("impl", ["xla", "blockwise"])
def test_float32_at_highest_precision(impl):
    """float32 means float32: at precision "highest" (what LoadedModel traces float32 models under,
    models/precision.py) the float32 bound holds on the GPU, where the default may be TF32."""
    with jax.default_matmul_precision("highest"):
        check_against_reference(via(impl), length=300, kv_heads=4, causal=True, segments=True,
                                dtype="float32", head_dim=64, seed=32)


def test_tf32_choice_runs_tf32_on_the_gpu():
    """--matmul_precision tf32 (models/precision.py: jax's TF32_TF32_F32 preset) compiles on the GPU, names
    TF32 in the compiled program and is measurably less exact than "highest" (so TF32 really ran) while
    staying within the bfloat16 bound; "highest" holds the float32 one."""
    from kernels.reference import reference_attention
    from models.precision import matmul_precision, with_matmul_precision

    q, k, v = make_inputs(64, 2, 512, 512, 12, 64, "float32")
    exact = reference_attention(q, k, v)
    errors = {}
    for choice in ("float32", "tf32"):
        fn = jax.jit(with_matmul_precision(lambda q, k, v: attention(q, k, v, impl="xla"),
                                           matmul_precision("float32", choice)))
        if choice == "tf32":
            assert "tf32" in fn.lower(q, k, v).compile().as_text().lower()
        errors[choice] = float(np.abs(np.asarray(fn(q, k, v), np.float64) - exact).max())
    assert errors["float32"] <= 2e-5 < errors["tf32"] <= 2e-2, errors


def test_this_gpus_compute_capability_is_read_and_decides_the_flash_kernels():
    """The capability the policy reads off the real device (kernels/policy.py local_gpu_capability)."""
    from kernels.policy import local_gpu_capability, resolve

    kind, capability = local_gpu_capability()
    assert kind == jax.local_devices()[0].device_kind and capability >= (5, 0)
    if capability >= (8, 0):
        assert resolve("flash", dtype="bfloat16") == "cudnn"
    else:
        with pytest.raises(KernelUnsupportedError, match="needs an Ampere or newer GPU"):
            resolve("flash", dtype="bfloat16")
