"""Every attention implementation against the float64 NumPy reference (kernels/reference.py),
under jax.jit, on fresh random unit-normal inputs: padding, packed segments, causal, grouped-query.
The Pallas TPU kernels (splash_tpu and the legacy pallas_tpu) run here in TPU interpret mode and the Pallas GPU kernel in Pallas's
interpreter (mha(interpret=True)). cuDNN itself cannot run without a GPU: its adapter (segment ids
-> sequence lengths, padding rows, the one-segment promise) runs here through jax's XLA path of
jax.nn.dot_product_attention, and tests/test_kernels_gpu.py runs cuDNN on a GPU."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from kernels import attention, table
from kernels.blockwise import blockwise_attention
from kernels.cudnn import cudnn_attention, one_segment_lengths
from kernels.masking import causal_mask, segment_mask, window_mask
from kernels.pallas_gpu import pallas_gpu_attention
from kernels.pallas_tpu import pallas_tpu_attention
from kernels.splash_tpu import splash_tpu_attention
from kernels.reference import reference_attention

pytestmark = pytest.mark.integration  # README.md, "Development"

HEADS = 12
TOLERANCE = {"float32": 2e-5, "bfloat16": 2e-2}
LENGTHS = (1, 7, 128, 129, 300, 1000)
# every kernel that runs on CPU meets the reference cases below; the others have their interpreted cases further down
CPU_KERNELS = tuple(name for name, impl in table.IMPLEMENTATIONS.items() if "cpu" in impl.backends)


def segment_rows(length: int) -> np.ndarray:
    """Three rows: two packed segments then trailing padding; three packed segments filling the
    row; all padding (a batch filler row). With length 1 the first two rows are one real token."""
    a, b = max(1, length * 2 // 5), max(1, length * 3 // 4)
    seg = np.zeros((3, length), np.int32)
    seg[0, :a], seg[0, a:b] = 1, 2
    seg[1, :a], seg[1, a:b], seg[1, b:] = 1, 2, 3
    return seg


def one_segment_rows(length: int) -> np.ndarray:
    """Four rows of one segment then padding (what cudnn takes as lengths): the whole row; segment id
    3 over the first 2/5 then padding; one real token; all padding."""
    seg = np.zeros((4, length), np.int32)
    seg[0] = 1
    seg[1, :max(1, length * 2 // 5)] = 3
    seg[2, 0] = 1
    return seg


def make_inputs(seed: int, batch: int, q_len: int, kv_len: int, kv_heads: int, head_dim: int,
                dtype: str):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, q_len, HEADS, head_dim))
    k = rng.standard_normal((batch, kv_len, kv_heads, head_dim))
    v = rng.standard_normal((batch, kv_len, kv_heads, head_dim))
    return tuple(jnp.asarray(x, dtype) for x in (q, k, v))


def check_against_reference(call, *, length: int, kv_heads: int, causal: bool, segments: bool,
                            dtype: str = "float32", head_dim: int = 32, kv_len: int | None = None,
                            scale: float | None = None, seed: int = 0,
                            rows=segment_rows, soft_cap: float | None = None, window: int | None = None,
                            relative_bias: bool = False) -> None:
    kv_len = length if kv_len is None else kv_len
    seg = rows(length) if segments else None
    batch = 2 if seg is None else len(seg)
    q, k, v = make_inputs(seed, batch, length, kv_len, kv_heads, head_dim, dtype)
    seg_arg = None if seg is None else jnp.asarray(seg)
    capped = {} if soft_cap is None else {"soft_cap": soft_cap}  # only kernels that take a cap are given one
    if window is not None:  # likewise a local window
        capped["window"] = window
    bias = None
    if relative_bias:  # likewise a relative bias: a different value at every offset, about as large as the scores
        bias = (np.random.default_rng(seed + 1).standard_normal((HEADS, length + kv_len - 1)) * 2).astype(np.float32)
        capped["relative_bias"] = jnp.asarray(bias)
    out = jax.jit(lambda q, k, v, s: call(q, k, v, segment_ids=s, causal=causal, scale=scale, **capped))(
        q, k, v, seg_arg)
    assert out.shape == q.shape and out.dtype == q.dtype
    out = np.asarray(out.astype(jnp.float32), np.float64)
    # the reference sees exactly the (possibly bf16-rounded) inputs the kernel saw
    inputs = [np.asarray(x.astype(jnp.float32)) for x in (q, k, v)]
    ref = reference_attention(*inputs, segment_ids=seg, causal=causal, scale=scale, soft_cap=soft_cap, window=window,
                              relative_bias=bias)
    if bias is not None:  # a kernel that ignored the bias, or read it one offset off either way, would fail below
        for wrong in (None, np.roll(bias, 1, axis=1), np.roll(bias, -1, axis=1)):
            assert np.abs(ref - reference_attention(*inputs, segment_ids=seg, causal=causal, scale=scale,
                                                    window=window, relative_bias=wrong)).max() > 0.05
    if window is not None:  # the window hid keys: a kernel that ignored it would fail below
        assert np.abs(ref - reference_attention(*inputs, segment_ids=seg, causal=causal, scale=scale,
                                                soft_cap=soft_cap)).max() > 0.05
    if soft_cap is not None:  # the cap changed what was computed: a kernel that ignored it would fail below
        assert np.abs(ref - reference_attention(*inputs, segment_ids=seg, causal=causal, scale=scale)).max() > 0.05
    assert not np.isnan(out).any()
    error = np.abs(out - ref).max()
    assert error <= TOLERANCE[dtype], f"max abs error {error:.2e} > {TOLERANCE[dtype]:.0e}"
    if seg is not None:
        assert (out[seg == 0] == 0.0).all(), "padding rows must be exactly 0"


def attention_via(impl: str):
    return lambda q, k, v, **kw: attention(q, k, v, impl=impl, **kw)


# the CPU kernels (xla, blockwise) through the public entry point: every length, each with two of the four
# (causal, segments) settings so each setting meets several lengths; kv_heads cycle through
# 12/4/1 so both kernels meet every grouping. Length 1000 (slow in the float64 reference) only
# for blockwise, where it spans two key/value blocks with a ragged tail.
CASES = [(impl, length, causal, segments) for impl in CPU_KERNELS
         for i, length in enumerate(LENGTHS) if length < 1000 or impl == "blockwise"
         for causal, segments in (((False, False), (True, True)), ((False, True), (True, False)))[i % 2]
         if length < 1000 or causal]


@pytest.mark.parametrize("impl,length,causal,segments", CASES)
def test_matches_reference_float32(impl, length, causal, segments):
    kv_heads = (12, 4, 1)[CASES.index((impl, length, causal, segments)) % 3]
    check_against_reference(attention_via(impl), length=length, kv_heads=kv_heads,
                            causal=causal, segments=segments, seed=length)


@pytest.mark.parametrize("impl", CPU_KERNELS)
def test_multi_query_head_dim_64(impl):
    check_against_reference(attention_via(impl), length=129, kv_heads=1, causal=True,
                            segments=True, head_dim=64, seed=64)


@pytest.mark.parametrize("impl,length,causal", [
    ("xla", 7, True), ("xla", 300, False), ("blockwise", 129, False), ("blockwise", 1000, True)])
def test_matches_reference_bfloat16(impl, length, causal):
    check_against_reference(attention_via(impl), length=length, kv_heads=4, causal=causal,
                            segments=True, dtype="bfloat16", seed=length + 1)


@pytest.mark.parametrize("impl", CPU_KERNELS)
def test_cross_lengths_and_scale(impl):
    check_against_reference(attention_via(impl), length=300, kv_len=129, kv_heads=4,
                            causal=True, segments=False, scale=0.3, seed=300)


# blockwise with small, unequal blocks: many blocks, ragged tails, causal skipping across
# blocks that are not aligned with each other.
@pytest.mark.parametrize("block_q,block_k,causal", [(64, 128, False), (128, 64, True)])
def test_blockwise_many_blocks(block_q, block_k, causal):
    def call(q, k, v, **kw):
        return blockwise_attention(q, k, v, block_q=block_q, block_k=block_k, **kw)
    check_against_reference(call, length=300, kv_heads=4, causal=causal, segments=True,
                            seed=block_q + block_k)


def test_blockwise_skips_blocks_with_nothing_to_attend():
    """NaN values in keys nobody may attend to: a kernel that multiplies them by a zero weight
    returns NaN (0 * NaN); blockwise must skip those blocks entirely. Blocks of 64 over 300
    tokens: kv block 4 (256..319) is all padding, and under causal kv block 1 (64..127) is in
    the future of q block 0 (rows 0..63)."""
    q, k, v = make_inputs(5, 1, 300, 300, 4, 32, "float32")
    seg = np.zeros((1, 300), np.int32)
    seg[0, :256] = 1
    poisoned = v.at[:, 256:].set(jnp.nan)
    out = jax.jit(lambda q, k, v, s: blockwise_attention(q, k, v, segment_ids=s, block_q=64,
                                                         block_k=64))(q, k, poisoned, seg)
    assert not np.isnan(np.asarray(out)).any()
    ref = reference_attention(q, k, v, segment_ids=seg)
    assert np.abs(np.asarray(out) - ref).max() <= TOLERANCE["float32"]

    future_poisoned = v.at[:, 64:128].set(jnp.nan)
    out = jax.jit(lambda q, k, v: blockwise_attention(q, k, v, causal=True, block_q=64,
                                                      block_k=64))(q, k, future_poisoned)
    assert not np.isnan(np.asarray(out[:, :64])).any()
    assert np.isnan(np.asarray(out[:, 64:128])).all()  # these rows do attend to the poison
    ref = reference_attention(q[:, :64], k[:, :64], v[:, :64], causal=True)
    assert np.abs(np.asarray(out[:, :64]) - ref).max() <= TOLERANCE["float32"]


def pallas_interpreted(q, k, v, **kw):
    with pltpu.force_tpu_interpret_mode():
        return pallas_tpu_attention(q, k, v, **kw)


@pytest.mark.parametrize("length,kv_heads,causal,segments,dtype", [
    (7, 4, True, True, "float32"),
    (129, 1, False, False, "float32"),
    (7, 12, False, True, "bfloat16"),
])
def test_pallas_tpu_interpreted(length, kv_heads, causal, segments, dtype):
    check_against_reference(pallas_interpreted, length=length, kv_heads=kv_heads, causal=causal,
                            segments=segments, dtype=dtype, seed=length)


@pytest.mark.slow
@pytest.mark.parametrize("length", [300, 1000])
@pytest.mark.parametrize("causal", [False, True])
def test_pallas_tpu_interpreted_long(length, causal):
    check_against_reference(pallas_interpreted, length=length, kv_heads=4, causal=causal,
                            segments=True, seed=length)


def test_one_mask_definition():
    """kernels/masking.py is the contract's only statement of which pairs attend, shared by xla,
    blockwise and the reference, so it is checked here against pairs written out by hand."""
    seg = np.array([[1, 1, 2, 0]])
    assert segment_mask(seg, seg)[0].tolist() == [[True, True, False, False],
                                                  [True, True, False, False],
                                                  [False, False, True, False],
                                                  [False, False, False, False]]
    assert causal_mask(np.arange(3), np.arange(4)).tolist() == [[True, False, False, False],
                                                                [True, True, False, False],
                                                                [True, True, True, False]]



def test_local_window_mask_against_pairs_written_out():
    """The sliding window is checked against its own definition, not the reference (which calls the same
    causal_mask): with window w query i sees exactly the w keys i - w < j <= i, itself included, as transformers'
    sliding_window_overlay (kv_idx > q_idx - sliding_window) on its causal mask, for Mistral and Qwen2."""
    assert causal_mask(np.arange(5), np.arange(5), window=2).tolist() == [[True, False, False, False, False],
                                                                          [True, True, False, False, False],
                                                                          [False, True, True, False, False],
                                                                          [False, False, True, True, False],
                                                                          [False, False, False, True, True]]
    assert causal_mask(np.arange(4), np.arange(4), window=1).tolist() == np.eye(4, dtype=bool).tolist()
    q, kv = np.arange(9), np.arange(12)
    for window in range(1, 11):
        expected = [[i - window < j <= i for j in kv] for i in q]
        assert causal_mask(q, kv, window=window).tolist() == expected, window
        assert causal_mask(q, kv, window=window).sum(axis=1).tolist() == [min(i + 1, window) for i in q]


def test_symmetric_window_mask_against_pairs_written_out():
    """Without causal, a window is an encoder's local attention: query i sees keys |i - j| < w, w - 1 on each side
    and itself, which is transformers' sliding_window_bidirectional_overlay (abs(q_idx - kv_idx) <= sliding_window)
    with ModernBERT's sliding_window = local_attention // 2 = w - 1."""
    assert window_mask(np.arange(5), np.arange(5), 2).tolist() == [[True, True, False, False, False],
                                                                   [True, True, True, False, False],
                                                                   [False, True, True, True, False],
                                                                   [False, False, True, True, True],
                                                                   [False, False, False, True, True]]
    q, kv = np.arange(9), np.arange(12)
    for window in range(1, 11):
        assert window_mask(q, kv, window).tolist() == [[abs(i - j) <= window - 1 for j in kv] for i in q], window
        # under the causal mask the same window is the decoder's sliding window
        assert (causal_mask(q, kv) & window_mask(q, kv, window)).tolist() == causal_mask(q, kv, window=window).tolist()

def pallas_gpu_interpreted(q, k, v, **kw):
    return pallas_gpu_attention(q, k, v, interpret=True, **kw)


# Interpreted Pallas kernels, each on the same cases: lengths below one block, one block plus a ragged tail
# (129) and several blocks (300); kv heads 12/4/1 with 12 query heads; pallas_gpu pads head_dim 48 to 64
# (splash takes the models' own 32 and 64).
INTERPRETED_CASES = [
    (7, 4, True, True, "float32", 32),
    (129, 1, False, False, "float32", 32),
    (300, 12, True, True, "float32", 48),
    (129, 4, False, True, "bfloat16", 64),
    (300, 4, True, False, "bfloat16", 32),
]


@pytest.mark.parametrize("length,kv_heads,causal,segments,dtype,head_dim", INTERPRETED_CASES)
def test_pallas_gpu_interpreted(length, kv_heads, causal, segments, dtype, head_dim):
    check_against_reference(pallas_gpu_interpreted, length=length, kv_heads=kv_heads, causal=causal,
                            segments=segments, dtype=dtype, head_dim=head_dim, seed=length)


@pytest.mark.parametrize("block_q,block_k", [(64, 32), (32, 64)])
def test_pallas_gpu_unequal_blocks(block_q, block_k):
    """Many blocks of unequal sizes: causal's per-block upper bound and the ragged padded tail."""
    def call(q, k, v, **kw):
        return pallas_gpu_attention(q, k, v, block_q=block_q, block_k=block_k, interpret=True, **kw)
    check_against_reference(call, length=300, kv_heads=4, causal=True, segments=True,
                            seed=block_q + block_k)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_pallas_gpu_interpreted_long(causal):
    check_against_reference(pallas_gpu_interpreted, length=1000, kv_heads=4, causal=causal,
                            segments=True, seed=1000)


def cudnn_adapter_on_xla(q, k, v, **kw):
    return cudnn_attention(q, k, v, implementation="xla", **kw)


@pytest.mark.parametrize("length,kv_heads,causal,segments,dtype", [
    (1, 4, True, True, "float32"),
    (129, 1, False, True, "float32"),
    (300, 4, True, True, "float32"),
    (300, 12, False, False, "float32"),
    (129, 4, True, True, "bfloat16"),
])
def test_cudnn_adapter_one_segment_rows(length, kv_heads, causal, segments, dtype):
    check_against_reference(cudnn_adapter_on_xla, length=length, kv_heads=kv_heads, causal=causal,
                            segments=segments, dtype=dtype, seed=length, rows=one_segment_rows)


def test_cudnn_rows_that_break_the_one_segment_promise_come_back_nan():
    """Packed rows (or left padding) cannot travel as lengths: those rows are NaN, never attention
    across segments; the rows that keep the promise are still right."""
    seg = np.array([[1, 1, 1, 0], [1, 1, 2, 2], [0, 1, 1, 1], [5, 5, 0, 0], [0, 0, 0, 0],
                    [1, 0, 1, 0]], np.int32)
    lengths, ok = one_segment_lengths(jnp.asarray(seg))
    assert lengths.tolist() == [3, 4, 3, 2, 0, 2] and ok.tolist() == [True, False, False, True, True,
                                                                       False]
    q, k, v = make_inputs(9, 6, 4, 4, 2, 16, "float32")
    out = np.asarray(cudnn_adapter_on_xla(q, k, v, segment_ids=jnp.asarray(seg), causal=False))
    assert np.isnan(out[[1, 2, 5]]).all() and not np.isnan(out[[0, 3, 4]]).any()
    ref = reference_attention(q, k, v, segment_ids=seg)
    assert np.abs(out[[0, 3, 4]] - ref[[0, 3, 4]]).max() <= TOLERANCE["float32"]


# splash_tpu (TPU flash, kernels/splash_tpu.py) in TPU interpret mode, one example at a time
# (batch_loop=True: the interpreter does not take the vmapped kernel; test_splash_tpu_lowers_for_tpu
# checks that the vmapped one lowers for a TPU). Lengths below one 128-token block, one block plus a
# ragged tail (129 -> 256), several blocks (300 -> 384: three blocks of 128); kv heads 12/4/1 with 12
# query heads, never repeated; head_dim 32 and 64 (the models' own, below the kernel's 128 lanes).
def splash_interpreted(q, k, v, **kw):
    with pltpu.force_tpu_interpret_mode():
        return splash_tpu_attention(q, k, v, batch_loop=True, **kw)


@pytest.mark.parametrize("length,kv_heads,causal,segments,dtype,head_dim", INTERPRETED_CASES)
def test_splash_tpu_interpreted(length, kv_heads, causal, segments, dtype, head_dim):
    head_dim = 64 if head_dim == 48 else head_dim  # the models' head sizes; padding is pallas_gpu's case
    check_against_reference(splash_interpreted, length=length, kv_heads=kv_heads, causal=causal,
                            segments=segments, dtype=dtype, head_dim=head_dim, seed=length)


def test_splash_tpu_cross_lengths_and_scale():
    """q_len != kv_len (no segment ids: the contract ties them to q_len == kv_len), causal top-left
    aligned as the contract's, an explicit scale (the kernel has none: queries are scaled first)."""
    check_against_reference(splash_interpreted, length=300, kv_len=129, kv_heads=4, causal=True,
                            segments=False, scale=0.3, seed=301)


def test_splash_tpu_cross_lengths_with_a_window():
    """q_len > kv_len with a local window: queries from kv_len + window - 1 on have no key within the window, and
    their rows are 0 as the reference's (the kernel itself leaves something there), both ways and causal."""
    for causal in (True, False):
        check_against_reference(splash_interpreted, length=140, kv_len=7, kv_heads=4, causal=causal,
                                segments=False, window=20, seed=141)


def test_splash_tpu_skips_causal_blocks_above_the_diagonal():
    """Causal block skipping, seen through its effect: NaN values in the keys' values of block 1 (tokens
    128..255) are never read by the queries of block 0 (rows 0..127), for which the whole block is in the
    future; a kernel that masked that block after computing it would give NaN there (0 * NaN)."""
    q, k, v = make_inputs(7, 1, 384, 384, 4, 32, "float32")
    poisoned = v.at[:, 128:256].set(jnp.nan)
    out = np.asarray(jax.jit(lambda q, k, v: splash_interpreted(q, k, v, causal=True, scale=None))(
        q, k, poisoned))
    assert not np.isnan(out[:, :128]).any()
    assert np.isnan(out[:, 128:]).all()  # these rows do attend to the poison
    ref = reference_attention(q[:, :128], k[:, :128], v[:, :128], causal=True)
    assert np.abs(out[:, :128] - ref).max() <= TOLERANCE["float32"]


def _kernel_operand_shapes(jaxpr) -> list[tuple[tuple[int, ...], ...]]:
    """The operand shapes of every pallas_call in a jaxpr, nested jaxprs included (jit, custom_vjp)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            found.append(tuple(tuple(x.aval.shape) for x in eqn.invars))
        for param in eqn.params.values():
            for sub in (param if isinstance(param, (tuple, list)) else (param,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _kernel_operand_shapes(inner)
    return found


def test_splash_tpu_takes_grouped_query_without_repeating_kv_heads():
    """12 query heads over 2 kv heads: the splash kernel's keys and values are [batch, 2, len, D], while the
    legacy pallas_tpu kernel is handed keys repeated to 12 heads (6x the key/value bytes it reads)."""
    q = jnp.ones((2, 256, 12, 64), jnp.bfloat16)
    k = jnp.ones((2, 256, 2, 64), jnp.bfloat16)
    seg = jnp.ones((2, 256), jnp.int32)

    def shapes(call):
        jaxpr = jax.make_jaxpr(lambda q, k, v, s: call(q, k, v, segment_ids=s, causal=True))(q, k, k, seg)
        return _kernel_operand_shapes(jaxpr.jaxpr)

    splash_shapes, legacy_shapes = shapes(splash_tpu_attention), shapes(pallas_tpu_attention)
    assert splash_shapes and legacy_shapes
    assert (2, 12, 256, 64) in splash_shapes[0] and (2, 2, 256, 64) in splash_shapes[0]
    assert sum(s == (2, 2, 256, 64) for s in splash_shapes[0]) == 2  # k and v, unrepeated
    assert (2, 2, 256, 64) not in legacy_shapes[0] and sum(s == (2, 12, 256, 64) for s in legacy_shapes[0]) == 3


@pytest.mark.parametrize("causal,segments,soft_cap,window", [(True, True, None, None), (False, False, None, None),
                                                            (True, True, 50.0, None), (False, True, None, 17)])
def test_splash_tpu_lowers_for_tpu(causal, segments, soft_cap, window):
    """The vmapped kernel (what runs on a TPU) lowers for the TPU backend from this CPU machine: one Mosaic
    kernel for the whole batch (the batch is a grid dimension), head_dim 32, a ragged length; Gemma 2's soft cap
    and a local window inside that one kernel."""
    q = jax.ShapeDtypeStruct((4, 300, 12, 32), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((4, 300, 4, 32), jnp.bfloat16)
    seg = jax.ShapeDtypeStruct((4, 300), jnp.int32) if segments else None
    call = lambda q, k, v, s: splash_tpu_attention(q, k, v, segment_ids=s, causal=causal, soft_cap=soft_cap,
                                                   window=window)
    text = jax.jit(call).trace(q, k, k, seg).lower(lowering_platforms=("tpu",)).as_text()
    assert text.count("tpu_custom_call") == 1


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_splash_tpu_interpreted_long(causal):
    """1000 tokens -> 1024: blocks of 512 (the kernel's largest here), packed segments, grouped-query."""
    check_against_reference(splash_interpreted, length=1000, kv_heads=4, causal=causal, segments=True,
                            seed=1000)


@pytest.mark.parametrize("impl", CPU_KERNELS)
@pytest.mark.parametrize("window", [1, 17, 40])
@pytest.mark.parametrize("causal", [True, False])
def test_local_window_matches_reference_with_packing_and_grouped_query(impl, window, causal):
    """A sliding window (Mistral, Qwen2; causal): query i sees keys i - window < j <= i of its own segment; an
    encoder's local window (ModernBERT; not causal) keys i - window < j < i + window. Blockwise at 700 tokens spans
    several key blocks, so whole blocks fall outside the window and are skipped."""
    def windowed(q, k, v, **kw):
        return attention(q, k, v, impl=impl, window=window, **kw)

    def reference(q, k, v, **kw):
        return reference_attention(q, k, v, window=window, **kw)

    length = 700 if impl == "blockwise" else 200
    seg = segment_rows(length)
    q, k, v = make_inputs(3, len(seg), length, length, 4, 32, "float32")
    out = np.asarray(jax.jit(lambda q, k, v, s: windowed(q, k, v, segment_ids=s, causal=causal))(q, k, v, jnp.asarray(seg)))
    ref = reference(*(np.asarray(x) for x in (q, k, v)), segment_ids=seg, causal=causal)
    assert np.abs(out - ref).max() <= TOLERANCE["float32"]
    assert (out[seg == 0] == 0.0).all()
    full = reference_attention(*(np.asarray(x) for x in (q, k, v)), segment_ids=seg, causal=causal)
    assert np.abs(ref - full).max() > 1e-3  # the window changed what was attended to
    for bad in (0, -3, 2.5, True):  # a window that bounds nothing, or no position count: refused, never all zeros
        with pytest.raises(ValueError, match="window must be None or a static whole number"):
            attention(q, k, v, impl=impl, window=bad, causal=True)


# Attention-logit soft-capping (Gemma 2: scores = tanh(scores / cap) * cap after the scale, before the mask): every
# kernel that takes a cap (Implementation.logit_soft_cap) against the reference's. Unit-normal q and k at scale 1 give
# scores of about +-6 (head_dim 32), which a cap of 2 squashes hard; padding, packing, grouped-query, bfloat16.
SOFT_CAP_CASES = [  # (length, kv_heads, causal, segments, dtype)
    (129, 4, True, True, "float32"),
    (300, 1, False, True, "float32"),
    (7, 12, True, False, "bfloat16"),
]


@pytest.mark.parametrize("impl", CPU_KERNELS)
@pytest.mark.parametrize("length,kv_heads,causal,segments,dtype", SOFT_CAP_CASES)
def test_soft_cap_matches_reference(impl, length, kv_heads, causal, segments, dtype):
    check_against_reference(attention_via(impl), length=length, kv_heads=kv_heads, causal=causal, segments=segments,
                            dtype=dtype, scale=1.0, soft_cap=2.0, seed=length + 2)


def test_blockwise_soft_cap_across_many_blocks_and_a_window():
    """The cap inside the online softmax over several key blocks (and a sliding window: Gemma 2's local layers),
    where a block's running maximum is of capped scores."""
    def call(q, k, v, **kw):
        return blockwise_attention(q, k, v, block_q=64, block_k=64, window=40, **kw)

    def windowed(q, k, v, **kw):
        return reference_attention(q, k, v, window=40, **kw)

    q, k, v = make_inputs(11, 3, 300, 300, 4, 32, "float32")
    seg = segment_rows(300)
    out = jax.jit(lambda q, k, v, s: call(q, k, v, segment_ids=s, causal=True, scale=1.0, soft_cap=2.0))(
        q, k, v, jnp.asarray(seg))
    ref = windowed(*(np.asarray(x) for x in (q, k, v)), segment_ids=seg, causal=True, scale=1.0, soft_cap=2.0)
    assert np.abs(np.asarray(out) - ref).max() <= TOLERANCE["float32"]
    assert (np.asarray(out)[seg == 0] == 0.0).all()


@pytest.mark.parametrize("length,kv_heads,causal,segments,dtype", SOFT_CAP_CASES)
def test_splash_tpu_soft_cap_interpreted(length, kv_heads, causal, segments, dtype):
    """splash_tpu takes the cap as its kernel's own attn_logits_soft_cap, applied to the scores of queries scaled
    before the call, as the contract's (scale, then cap)."""
    check_against_reference(splash_interpreted, length=length, kv_heads=kv_heads, causal=causal, segments=segments,
                            dtype=dtype, scale=1.0, soft_cap=2.0, seed=length + 2)


# splash_tpu's local window (its LocalMask) against the float64 reference's window_mask, in TPU interpret mode: a
# decoder's sliding window (causal) and an encoder's both ways, over packed segments with padding (segment_rows) and
# over lengths padded to 128 without segment ids; windows that divide neither the length nor the 128-token blocks, so
# some blocks are partly in the window and (300 -> 384, three blocks) one lies wholly outside it and is skipped.
SPLASH_WINDOW_CASES = [  # (length, window, causal, segments)
    (300, 40, True, True),
    (129, 17, False, True),
    (200, 33, True, False),
    (7, 1, False, True),
]


@pytest.mark.parametrize("length,window,causal,segments", SPLASH_WINDOW_CASES)
def test_splash_tpu_local_window_interpreted(length, window, causal, segments):
    check_against_reference(splash_interpreted, length=length, kv_heads=4, causal=causal, segments=segments,
                            window=window, seed=length + window)


def test_splash_tpu_skips_blocks_outside_the_window():
    """Window block skipping, seen through its effect: with a sliding window of 40, the queries of block 2 (rows
    256..383) see keys from 217 on, so NaN values in block 0 (tokens 0..127) are never read for them and they match
    the reference; the earlier rows, whose blocks hold in-window pairs with block 0, do read it."""
    q, k, v = make_inputs(9, 1, 384, 384, 4, 32, "float32")
    poisoned = v.at[:, :128].set(jnp.nan)
    out = np.asarray(jax.jit(lambda q, k, v: splash_interpreted(q, k, v, causal=True, scale=None, window=40))(
        q, k, poisoned))
    assert not np.isnan(out[:, 256:]).any()
    assert np.isnan(out[:, :128]).all()
    ref = reference_attention(*(np.asarray(x) for x in (q, k, v)), causal=True, window=40)
    assert np.abs(out[:, 256:] - ref[:, 256:]).max() <= TOLERANCE["float32"]


def test_every_kernel_that_takes_a_local_window_has_window_parity_cases_here():
    """A kernel that says it takes a local window (Implementation.local_window) meets the reference with one here: the
    CPU kernels through test_local_window_matches_reference_with_packing_and_grouped_query, any other through a
    local-window test named for it."""
    windowed = {name for name, impl in table.IMPLEMENTATIONS.items() if impl.local_window}
    named = {name for name in windowed if any(name in test and "local_window" in test for test in globals())}
    assert windowed - set(CPU_KERNELS) - named == set()
    assert windowed == {"xla", "blockwise", "splash_tpu"}


def test_every_kernel_that_takes_a_soft_cap_has_capped_parity_cases_here():
    """A kernel that says it takes an attention-logit soft cap (Implementation.logit_soft_cap) meets the reference
    with one here: the CPU kernels through test_soft_cap_matches_reference, any other through a soft-cap test named
    for it."""
    capped = {name for name, impl in table.IMPLEMENTATIONS.items() if impl.logit_soft_cap}
    named = {name for name in capped if any(name in test and "soft_cap" in test for test in globals())}
    assert capped - set(CPU_KERNELS) - named == set()
    assert capped == {"xla", "blockwise", "splash_tpu"}


# A relative position bias (MPNet's: relative_bias[h, j - i + q_len - 1] added to the scaled scores before the mask)
# in every kernel that takes one (Implementation.relative_position_bias) against the reference's: packed segments with
# padding, rows without segments, grouped-query, bfloat16, q_len != kv_len, and lengths that divide none of
# blockwise's blocks (300: two query blocks of 256, one key block; 129, 7: one block of each).
RELATIVE_BIAS_CASES = [  # (length, kv_len, kv_heads, causal, segments, dtype)
    (300, 300, 4, False, True, "float32"),
    (129, 129, 12, False, False, "float32"),
    (7, 7, 1, True, True, "bfloat16"),
    (129, 300, 4, True, False, "float32"),
]


@pytest.mark.parametrize("impl", CPU_KERNELS)
@pytest.mark.parametrize("length,kv_len,kv_heads,causal,segments,dtype", RELATIVE_BIAS_CASES)
def test_relative_bias_matches_reference(impl, length, kv_len, kv_heads, causal, segments, dtype):
    check_against_reference(attention_via(impl), length=length, kv_len=kv_len, kv_heads=kv_heads, causal=causal,
                            segments=segments, dtype=dtype, relative_bias=True, seed=length + kv_len)


def test_blockwise_relative_bias_across_many_blocks():
    """The bias gathered block by block inside the online softmax: blocks of 64 queries and 48 keys over 300 tokens
    (a ragged tail in each), so every block pair reads its own stretch of offsets, and blocks of other segments or
    padding are skipped without reading any."""
    def call(q, k, v, **kw):
        return blockwise_attention(q, k, v, block_q=64, block_k=48, **kw)
    check_against_reference(call, length=300, kv_heads=4, causal=False, segments=True, relative_bias=True, seed=348)


@pytest.mark.parametrize("impl", CPU_KERNELS)
def test_relative_bias_of_a_packed_document_is_its_bias_alone_in_a_row(impl):
    """Offsets are of row indices, so a document packed after others in a row sees between its own tokens the offsets
    it would see alone in an unpadded row of its length (transformers' MPNet), and nothing of the other segments: the
    packed output of each segment equals that segment run alone, with the bias cut to its own offsets."""
    length = 120
    q, k, v = make_inputs(21, 1, length, length, 4, 32, "float32")
    bias = jnp.asarray(np.random.default_rng(22).standard_normal((HEADS, 2 * length - 1)) * 2, jnp.float32)
    seg = np.repeat(np.array([[1, 2, 3, 0]], np.int32), [45, 50, 15, 10], axis=1)
    call = jax.jit(lambda q, k, v, bias, seg=None: attention(q, k, v, segment_ids=seg, relative_bias=bias, impl=impl))
    packed = np.asarray(call(q, k, v, bias, jnp.asarray(seg)))
    for segment in (1, 2, 3):
        where = np.flatnonzero(seg[0] == segment)
        n = len(where)
        own = bias[:, length - n:length + n - 1]  # offsets -(n - 1) .. n - 1 of a row of n tokens
        alone = call(q[:, where], k[:, where], v[:, where], own)
        assert np.abs(packed[:, where] - np.asarray(alone)).max() <= TOLERANCE["float32"], segment
    assert (packed[:, seg[0] == 0] == 0.0).all()


def test_every_kernel_that_takes_a_relative_bias_has_parity_cases_here():
    """A kernel that says it takes a relative position bias (Implementation.relative_position_bias) meets the
    reference with one here: the CPU kernels through test_relative_bias_matches_reference, any other through a
    relative-bias test named for it."""
    biased = {name for name, impl in table.IMPLEMENTATIONS.items() if impl.relative_position_bias}
    named = {name for name in biased if any(name in test and "relative_bias" in test for test in globals())}
    assert biased - set(CPU_KERNELS) - named == set()
    assert biased == {"xla", "blockwise"}


def test_every_kernel_in_the_table_has_parity_cases_here():
    """A kernel added to kernels/table.py meets the float64 reference in this file: a CPU kernel through CPU_KERNELS,
    any other through its own interpreted cases (a test named for it)."""
    named = {name for name in table.IMPLEMENTATIONS if any(name in test for test in globals() if test.startswith("test_"))}
    missing = sorted(set(table.IMPLEMENTATIONS) - set(CPU_KERNELS) - named)
    assert missing == [], f"tests/test_kernels_parity.py has no parity test for {missing}: add interpreted cases"
