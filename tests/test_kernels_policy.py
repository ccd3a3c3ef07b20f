"""The kernel selection policy (kernels/policy.py) for every backend, checked on CPU by passing
the backend explicitly: what native/flash/auto resolve to, what raises and with which message;
plus the entry point's named scopes, logging and input checks."""
from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
import kernels.policy
from kernels import KernelUnsupportedError, attention, available, other_choice, resolve, resolve_for
from kernels import table

CPU_LIMIT = table.AUTO_XLA_MAX_KV_LEN["cpu"]


@pytest.mark.parametrize("backend,flash", [("cpu", "blockwise"), ("gpu", "cudnn"),
                                           ("tpu", "splash_tpu")])
def test_native_and_flash_per_backend_without_shape_info(backend, flash):
    assert resolve("native", backend=backend) == "xla"
    assert resolve("flash", backend=backend) == flash
    assert resolve(flash, backend=backend) == flash
    assert resolve("blockwise", backend=backend) == "blockwise"


# On gpu, segment ids are packed unless the caller says packed=False (one segment per row then
# padding): cudnn takes only the latter (as lengths), pallas_gpu masks packed segments in its kernel.
@pytest.mark.parametrize("backend,info,expected", [
    ("cpu", {}, "xla"),
    ("cpu", dict(kv_len=CPU_LIMIT, q_len=CPU_LIMIT), "xla"),
    ("cpu", dict(kv_len=CPU_LIMIT + 1, q_len=CPU_LIMIT + 1), "blockwise"),
    ("gpu", dict(dtype="bfloat16", head_dim=64, kv_len=512, has_segments=True, packed=False), "cudnn"),
    ("gpu", dict(dtype="bfloat16", head_dim=64, kv_len=512, has_segments=True), "pallas_gpu"),
    ("gpu", dict(dtype="bfloat16", head_dim=64, kv_len=512, has_segments=True, packed=True),
     "pallas_gpu"),
    ("gpu", dict(dtype=jnp.float16, head_dim=32), "cudnn"),
    ("gpu", dict(dtype="float32", kv_len=512), "xla"),
    ("gpu", dict(dtype="float32", kv_len=32768), "blockwise"),
    ("gpu", dict(dtype="bfloat16", head_dim=256, kv_len=512), "xla"),
    # was blockwise while cudnn took segments as a dense [L, L] mask (refused from 16k)
    ("gpu", dict(dtype="bfloat16", kv_len=16384, has_segments=True), "pallas_gpu"),
    ("gpu", dict(dtype="bfloat16", kv_len=32768, q_len=32768, has_segments=True, packed=False),
     "cudnn"),
    ("gpu", dict(dtype="bfloat16", head_dim=100, kv_len=512), "pallas_gpu"),
    ("gpu", dict(dtype="bfloat16", head_dim=256, kv_len=16384), "blockwise"),
    ("gpu", dict(dtype="bfloat16", q_len=1, kv_len=64, causal=True), "xla"),
    ("tpu", dict(dtype="float32", head_dim=64, kv_len=4096, has_segments=True), "splash_tpu"),
    ("tpu", dict(dtype="bfloat16", heads=32, kv_heads=8, kv_len=32768, causal=True, has_segments=True),
     "splash_tpu"),
    # head_dim 192: the legacy pallas_tpu refuses it, splash_tpu takes it
    ("tpu", dict(dtype="bfloat16", head_dim=192, kv_len=512), "splash_tpu"),
    ("tpu", dict(dtype="float16", kv_len=512), "xla"),
    ("tpu", dict(dtype="float16", kv_len=65536), "blockwise"),
])
def test_auto_picks_first_supported_kernel(backend, info, expected):
    assert resolve("auto", backend=backend, **info) == expected


# table.py's gpu rows: flash before xla at every length (on the H200 it beat xla from 1k; see
# benchmarks/RESULTS.md, "GPU kernels"); xla only where both flash kernels refuse the inputs.
@pytest.mark.parametrize("length", [256, 1024, 2048, 4096, 8192, 16384, 32768])
@pytest.mark.parametrize("rows,expected", [
    (dict(), "cudnn"), (dict(has_segments=True, packed=False), "cudnn"),
    (dict(has_segments=True), "pallas_gpu"), (dict(has_segments=True, causal=True), "pallas_gpu")])
def test_auto_on_gpu_tries_flash_first_at_every_length(length, rows, expected):
    info = dict(dtype="bfloat16", heads=12, head_dim=64, q_len=length, kv_len=length, **rows)
    assert resolve("auto", backend="gpu", **info) == expected
    assert resolve("auto", backend="gpu", **info) == resolve("flash", backend="gpu", **info)


def test_auto_on_gpu_reaches_xla_only_for_what_flash_refuses():
    gpu = table.AUTO["gpu"]
    assert set(gpu[:gpu.index("xla")]) == set(table.FLASH["gpu"])
    assert resolve("auto", backend="gpu", dtype="float32", kv_len=1024) == "xla"
    assert resolve("auto", backend="gpu", dtype="bfloat16", head_dim=256, kv_len=1024) == "xla"
    limit = table.AUTO_XLA_MAX_KV_LEN["gpu"]
    assert resolve("auto", backend="gpu", dtype="float32", kv_len=limit + 1) == "blockwise"


@pytest.mark.parametrize("impl,backend,info,message", [
    ("pallas_tpu", "cpu", {},
     "--attention=pallas_tpu cannot run on cpu: it needs a TPU; "
     "use --attention=flash (blockwise on cpu) or native"),
    ("cudnn", "cpu", {},
     "--attention=cudnn cannot run on cpu: it needs a GPU; "
     "use --attention=flash (blockwise on cpu) or native"),
    ("pallas_tpu", "gpu", dict(dtype="bfloat16"),
     "--attention=pallas_tpu cannot run on gpu: it needs a TPU; "
     "use --attention=flash (cudnn on gpu) or native"),
    ("cudnn", "tpu", dict(dtype="float32"),
     "--attention=cudnn cannot run on tpu: it needs a GPU; "
     "use --attention=flash (splash_tpu on tpu) or native"),
    ("cudnn", "gpu", dict(dtype="float32"),
     "--attention=cudnn cannot run on gpu: dtype float32 is not supported (cudnn needs float16 "
     "or bfloat16); use --attention=native or auto (picks a kernel that supports these inputs)"),
    ("cudnn", "gpu", dict(dtype="bfloat16", head_dim=96 + 4),
     "--attention=cudnn cannot run on gpu: head_dim 100 is not supported (cudnn needs a multiple "
     "of 8, <= 128); use --attention=flash (pallas_gpu on gpu) or native or auto (picks a kernel "
     "that supports these inputs)"),
    ("flash", "gpu", dict(dtype="bfloat16", head_dim=256),
     "--attention=flash (cudnn or pallas_gpu on gpu) cannot run on gpu: cudnn: head_dim 256 is not "
     "supported (cudnn needs a multiple of 8, <= 128); pallas_gpu: head_dim 256 is not supported "
     "(pallas_gpu needs <= 128); use --attention=native or auto (picks a kernel that supports "
     "these inputs)"),
    ("flash", "gpu", dict(dtype="float32", kv_len=16384, has_segments=True),
     "--attention=flash (cudnn or pallas_gpu on gpu) cannot run on gpu: cudnn: dtype float32 is "
     "not supported (cudnn needs float16 or bfloat16); pallas_gpu: dtype float32 is not supported "
     "(pallas_gpu needs float16 or bfloat16); use --attention=native or auto (picks a kernel that "
     "supports these inputs)"),
    ("cudnn", "gpu", dict(dtype="bfloat16", kv_len=16384, has_segments=True),
     "--attention=cudnn cannot run on gpu: segment_ids that may pack several segments per row are "
     "not supported (cudnn takes padding only as sequence lengths; packed=False promises one "
     "segment per row followed by padding, which `docscore run`'s packed rows never are: there flash on GPU "
     "is pallas_gpu); use --attention=flash (pallas_gpu on gpu) or native "
     "or auto (picks a kernel that supports these inputs)"),
    ("pallas_gpu", "cpu", {},
     "--attention=pallas_gpu cannot run on cpu: it needs a GPU; "
     "use --attention=flash (blockwise on cpu) or native"),
    ("pallas_gpu", "gpu", dict(dtype="bfloat16", q_len=1, kv_len=64),
     "--attention=pallas_gpu cannot run on gpu: q_len 1 != kv_len 64 is not supported (pallas_gpu pads queries "
     "and keys to one length and masks them with one set of segment ids: self-attention only); use --attention=flash (cudnn on gpu) or native or "
     "auto (picks a kernel that supports these inputs)"),
    ("flash", "tpu", dict(dtype="float16"),
     "--attention=flash (splash_tpu or pallas_tpu on tpu) cannot run on tpu: splash_tpu: dtype "
     "float16 is not supported (splash_tpu needs float32 or bfloat16); pallas_tpu: dtype float16 is "
     "not supported (pallas_tpu needs float32 or bfloat16); use --attention=native or auto (picks a "
     "kernel that supports these inputs)"),
    ("pallas_tpu", "tpu", dict(head_dim=192),
     "--attention=pallas_tpu cannot run on tpu: head_dim 192 is not supported (pallas_tpu needs "
     "<= 128 or a multiple of 128); use --attention=flash (splash_tpu on tpu) or native or auto "
     "(picks a kernel that supports these inputs)"),
    ("splash_tpu", "cpu", {},
     "--attention=splash_tpu cannot run on cpu: it needs a TPU; "
     "use --attention=flash (blockwise on cpu) or native"),
])
def test_explicit_choice_that_cannot_run_raises_with_reason_and_alternatives(
        impl, backend, info, message):
    with pytest.raises(KernelUnsupportedError) as raised:
        resolve(impl, backend=backend, **info)
    assert str(raised.value) == message


def test_a_refusal_through_kernels_attention_speaks_of_its_impl_argument():
    """A library caller passes impl=, not the command's --attention flag the policy's messages name."""
    import jax.numpy as jnp

    import kernels

    q = jnp.zeros((1, 8, 2, 16), jnp.float32)
    with pytest.raises(KernelUnsupportedError) as raised:
        kernels.attention(q, q, q, impl="pallas_gpu")
    assert str(raised.value) == ("impl=pallas_gpu cannot run on cpu: it needs a GPU; use impl=flash (blockwise on cpu) "
                                 "or native")
    with pytest.raises(KernelUnsupportedError, match="^impl=nope is not a known"):
        kernels.resolve_for(q, q, impl="nope")


@pytest.mark.parametrize("impl,backend,info,instead_of,suggestion", [
    ("cudnn", "cpu", {}, "xla", "use --attention=flash (blockwise on cpu)"),
    ("cudnn", "cpu", {}, "blockwise", "use --attention=native"),
    # bfloat16 head_dim 256 on a GPU: neither flash kernel takes it, and the caller already runs xla
    ("cudnn", "gpu", dict(dtype="bfloat16", head_dim=256), "xla", "use --attention=blockwise"),
])
def test_a_refusal_does_not_suggest_the_kernel_the_caller_already_runs(impl, backend, info, instead_of, suggestion):
    """A shadow kernel's refusal (instead_of: the primary kernel) suggests another kernel, never the primary."""
    with pytest.raises(KernelUnsupportedError) as raised:
        resolve(impl, backend=backend, instead_of=instead_of, **info)
    message = str(raised.value)
    assert message.endswith(suggestion), message
    assert "auto" not in message.split("; use ")[-1]


def test_explicit_choice_is_never_swapped():
    # auto would leave xla above the cpu limit; an explicit xla is still honoured
    assert resolve("xla", backend="cpu", kv_len=100_000, q_len=100_000) == "xla"
    assert resolve("native", backend="gpu", dtype="float32", kv_len=100_000) == "xla"
    assert resolve("cudnn", backend="gpu", dtype="bfloat16", head_dim=64) == "cudnn"
    # flash on gpu chooses among its own kernels only, never xla or blockwise
    assert resolve("flash", backend="gpu", dtype="bfloat16", has_segments=True) == "pallas_gpu"
    assert resolve("flash", backend="gpu", dtype="bfloat16", has_segments=True,
                   packed=False) == "cudnn"
    assert resolve("pallas_gpu", backend="gpu", dtype="bfloat16", head_dim=64) == "pallas_gpu"


def test_unknown_names_are_refused_with_the_choices():
    with pytest.raises(KernelUnsupportedError, match="--attention=splash is not a known attention "
                       "implementation; use one of auto, native, flash, xla, blockwise, "
                       "pallas_tpu, splash_tpu, cudnn, pallas_gpu"):
        resolve("splash", backend="cpu")
    with pytest.raises(KernelUnsupportedError, match="backend 'metal' is unknown"):
        resolve("native", backend="metal")
    with pytest.raises(TypeError, match="unknown shape info"):
        resolve("auto", backend="cpu", seq_len=5)


def test_backend_defaults_to_jax_and_cuda_means_gpu():
    assert jax.default_backend() == "cpu"
    assert resolve("flash") == "blockwise"
    assert resolve("flash", backend="cuda") == "cudnn"
    assert resolve("native", backend="ROCm") == "xla"  # JAX_PLATFORMS's other GPU name, in any case


def test_auto_logs_each_choice_once(caplog, monkeypatch):
    monkeypatch.setattr(kernels.policy, "_logged_choices", set())  # forget earlier tests' logs
    caplog.set_level(logging.INFO, logger="kernels.policy")
    for kv_len in (12345, 12345, 23456):
        resolve("auto", backend="tpu", dtype="float16", kv_len=kv_len)
    resolve("auto", backend="tpu", dtype="float16", kv_len=64)
    assert [r.getMessage() for r in caplog.records] == [
        "--attention=auto chose blockwise on tpu (skipped splash_tpu: dtype float16 is not "
        "supported (splash_tpu needs float32 or bfloat16); pallas_tpu: dtype float16 is not "
        "supported (pallas_tpu needs float32 or bfloat16); xla: kv_len 12345 > 4096 (auto's xla "
        "limit on tpu))",
        "--attention=auto chose xla on tpu (skipped splash_tpu: dtype float16 is not supported "
        "(splash_tpu needs float32 or bfloat16); pallas_tpu: dtype float16 is not supported "
        "(pallas_tpu needs float32 or bfloat16))"]


def test_available_lists_every_kernel_with_backends_and_limits():
    listing = available()
    assert set(listing) == {"xla", "blockwise", "pallas_tpu", "splash_tpu", "cudnn", "pallas_gpu"}
    assert listing["pallas_tpu"]["backends"] == ["tpu"] and listing["pallas_tpu"]["flash_on"] == ["tpu"]
    assert listing["splash_tpu"]["backends"] == ["tpu"] and listing["splash_tpu"]["flash_on"] == ["tpu"]
    assert "grouped-query without repeating" in listing["splash_tpu"]["limits"]
    assert listing["cudnn"]["backends"] == ["gpu"] and "bfloat16" in listing["cudnn"]["limits"]
    assert listing["blockwise"]["flash_on"] == ["cpu"]
    assert listing["cudnn"]["flash_on"] == ["gpu"] and listing["pallas_gpu"]["flash_on"] == ["gpu"]
    assert listing["pallas_gpu"]["backends"] == ["gpu"] and "packed" in listing["pallas_gpu"]["limits"]
    assert all(entry["limits"] for entry in listing.values())
    assert kernels.SHAPE_KEYS == ("q_len", "kv_len", "heads", "kv_heads", "head_dim", "dtype",
                                  "causal", "has_segments", "packed", "window", "soft_cap", "relative_bias")
    assert {name for name, entry in listing.items() if entry["local_window"]} == {"xla", "blockwise", "splash_tpu"}
    assert {name for name, entry in listing.items() if entry["logit_soft_cap"]} == {"xla", "blockwise", "splash_tpu"}
    assert {name for name, entry in listing.items() if entry["relative_position_bias"]} == {"xla", "blockwise"}


@pytest.mark.parametrize("backend", ["cpu", "gpu", "tpu"])
def test_a_soft_cap_is_refused_by_kernels_without_one_before_any_data(backend):
    """Gemma 2's attention-logit soft cap: shape info alone (what validation has before data is read) refuses every
    kernel without one (cudnn, pallas_gpu, the legacy pallas_tpu) by name and reason, where the same inputs without a
    cap run; flash runs the backend's flash kernel that takes it (blockwise, splash_tpu) and is refused on GPU, whose
    flash kernels both lack it; auto passes them by."""
    info = dict(heads=8, kv_heads=4, head_dim=128, dtype="bfloat16", causal=True, has_segments=True, packed=False,
                q_len=1024, kv_len=1024)
    for name, impl in table.IMPLEMENTATIONS.items():
        if backend not in impl.backends:
            continue
        assert resolve(name, backend, **info) == name
        if impl.logit_soft_cap:
            assert resolve(name, backend, **info, soft_cap=50.0) == name
            continue
        with pytest.raises(KernelUnsupportedError, match=f"--attention={name} cannot run on {backend}: it has no "
                                                         "attention-logit soft-capping .*cap of 50 needs"):
            resolve(name, backend, **info, soft_cap=50.0)
    flash = {"cpu": "blockwise", "tpu": "splash_tpu"}.get(backend)
    if flash:
        assert resolve("flash", backend, **info, soft_cap=50.0) == flash
    else:
        with pytest.raises(KernelUnsupportedError, match="--attention=flash .cudnn or pallas_gpu on gpu. cannot run on "
                                                         "gpu: cudnn: it has no attention-logit soft-capping.*; "
                                                         "pallas_gpu: it has no attention-logit soft-capping.*use "
                                                         "--attention=native or auto"):
            resolve("flash", backend, **info, soft_cap=50.0)
    assert resolve("auto", backend, **info, soft_cap=50.0) == ("splash_tpu" if backend == "tpu" else "xla")
    long = {**info, "q_len": 8192, "kv_len": 8192}
    assert resolve("auto", backend, **long, soft_cap=50.0) == ("splash_tpu" if backend == "tpu" else "blockwise")
    assert resolve("native", backend, **info, soft_cap=50.0) == "xla"
    for bad in (0, -1.0, float("nan"), float("inf"), True, "50"):
        with pytest.raises(TypeError, match="soft_cap"):
            resolve("auto", backend, soft_cap=bad)


@pytest.mark.parametrize("backend", ["cpu", "gpu", "tpu"])
def test_a_relative_bias_is_refused_by_kernels_without_one_before_any_data(backend):
    """MPNet's relative position bias: shape info alone (what validation has before data is read) refuses every kernel
    without one (cudnn, pallas_gpu, splash_tpu, pallas_tpu) by name and reason, where the same inputs without it run;
    flash is blockwise on CPU and refused on GPU and TPU, whose flash kernels all lack it; auto passes them by for xla,
    or blockwise past xla's length."""
    info = dict(heads=12, kv_heads=12, head_dim=64, dtype="bfloat16", causal=False, has_segments=True, packed=False,
                q_len=384, kv_len=384)
    for name, impl in table.IMPLEMENTATIONS.items():
        if backend not in impl.backends:
            continue
        assert resolve(name, backend, **info) == resolve(name, backend, **info, relative_bias=False) == name
        if impl.relative_position_bias:
            assert resolve(name, backend, **info, relative_bias=True) == name
            continue
        with pytest.raises(KernelUnsupportedError, match=f"--attention={name} cannot run on {backend}: it has no "
                                                         "relative position bias .*MPNet's and T5's relative_attention_bias"):
            resolve(name, backend, **info, relative_bias=True)
    if backend == "cpu":
        assert resolve("flash", backend, **info, relative_bias=True) == "blockwise"
    else:
        with pytest.raises(KernelUnsupportedError, match=f"--attention=flash .* cannot run on {backend}: .*it has no "
                                                         "relative position bias.*use --attention=native or auto"):
            resolve("flash", backend, **info, relative_bias=True)
    assert resolve("auto", backend, **info, relative_bias=True) == "xla"
    assert resolve("auto", backend, **{**info, "q_len": 8192, "kv_len": 8192}, relative_bias=True) == "blockwise"
    assert resolve("native", backend, **info, relative_bias=True) == "xla"
    with pytest.raises(TypeError, match="relative_bias .*give True or False"):
        resolve("auto", backend, relative_bias=np.zeros((12, 767)))


def test_attention_checks_a_relative_bias_shape_and_refuses_it_beside_a_soft_cap():
    """The bias is one value per query head and key-query offset, [heads, q_len + kv_len - 1] (a per-pair [L, L]
    bias, or one of kv heads, is refused with the shape wanted); with a soft cap it is refused, since where it goes
    relative to the cap is the model's to say; a kernel named explicitly that lacks it is refused by attention too."""
    q = jnp.ones((1, 5, 4, 8))
    k = jnp.ones((1, 3, 2, 8))
    assert attention(q, k, k, relative_bias=jnp.zeros((4, 7))).shape == q.shape
    for bad in (jnp.zeros((4, 5, 3)), jnp.zeros((2, 7)), jnp.zeros((4, 8)), jnp.zeros((4, 7), jnp.int32)):
        with pytest.raises(ValueError, match=r"relative_bias must be floating point \[heads, q_len \+ kv_len - 1\] = "
                                             r"\[4, 7\]"):
            attention(q, k, k, relative_bias=bad)
    with pytest.raises(ValueError, match="a soft_cap or a relative_bias, not both"):
        attention(q, k, k, relative_bias=jnp.zeros((4, 7)), soft_cap=50.0)
    with pytest.raises(ValueError, match="a soft_cap or a relative_bias, not both"):  # no kernel named for it either
        resolve_for(q, k, relative_bias=jnp.zeros((4, 7)), soft_cap=50.0)
    with pytest.raises(KernelUnsupportedError, match="impl=pallas_gpu cannot run on gpu: it has no relative position"):
        resolve_for(q, k, impl="pallas_gpu", backend="gpu", relative_bias=jnp.zeros((4, 7)))


@pytest.mark.parametrize("backend,choice", [("gpu", "flash"), ("tpu", "pallas_tpu")])
def test_a_window_as_long_as_the_rows_masks_nothing_so_kernels_without_one_run_it(backend, choice):
    """A sliding-window model converted at its window (docscore convert's default) never runs a row longer than the
    window, so the window hides no key: kernels without a local window (flash on GPU, the legacy pallas_tpu) run it.
    A window shorter than the rows is still refused there, and CPU's kernels give the same output with or without
    it."""
    info = dict(heads=4, kv_heads=2, head_dim=64, dtype="bfloat16", causal=True, has_segments=True,
                q_len=1024, kv_len=1024)
    plain = resolve(choice, backend, **info)
    assert resolve(choice, backend, **info, window=1024) == resolve(choice, backend, **info, window=4096) == plain
    with pytest.raises(KernelUnsupportedError, match="sliding-window"):
        resolve(choice, backend, **info, window=1023)
    q = jax.random.normal(jax.random.key(0), (2, 48, 4, 16), jnp.float32)
    segments = jnp.asarray([[1] * 30 + [2] * 18, [1] * 40 + [0] * 8], jnp.int32)
    for name in ("xla", "blockwise"):  # the kernels themselves, given the window attention() drops
        call = table.IMPLEMENTATIONS[name].call
        windowed = call(q, q, q, segment_ids=segments, causal=True, scale=0.25, window=48)
        assert jnp.allclose(windowed, call(q, q, q, segment_ids=segments, causal=True, scale=0.25), atol=1e-6)
        assert not jnp.allclose(windowed, call(q, q, q, segment_ids=segments, causal=True, scale=0.25, window=20),
                                atol=1e-3)  # a window shorter than the rows does hide keys


@pytest.mark.parametrize("backend", ["cpu", "gpu", "tpu"])
def test_an_encoders_local_window_is_refused_by_kernels_without_one_before_any_data(backend):
    """ModernBERT's local layers (a window without causal, |i - j| < window): shape info alone (what validation has
    before data is read) refuses every kernel without a local window by name and reason, auto passes them for xla
    (or blockwise past xla's length; splash_tpu, which has one, on TPU), and a window as long as the rows is dropped
    as a decoder's is."""
    info = dict(heads=12, kv_heads=12, head_dim=64, dtype="bfloat16", causal=False, has_segments=True,
                q_len=1024, kv_len=1024)
    tpu = backend == "tpu"
    assert resolve("auto", backend, **info, window=65) == ("splash_tpu" if tpu else "xla")
    assert resolve("auto", backend, **{**info, "q_len": 8192, "kv_len": 8192}, window=65) == (
        "splash_tpu" if tpu else "blockwise")
    assert resolve("native", backend, **info, window=65) == "xla"
    assert resolve("blockwise", backend, **info, window=65) == "blockwise"
    for name in table.IMPLEMENTATIONS:
        if table.IMPLEMENTATIONS[name].local_window or backend not in table.IMPLEMENTATIONS[name].backends:
            continue
        with pytest.raises(KernelUnsupportedError, match=f"--attention={name} cannot run on {backend}: it has no "
                                                         "local .sliding-window. attention, which this model's window "
                                                         "of 64 positions each way needs in rows of 1024 tokens .rows of at most 65 tokens"):
            resolve(name, backend, **info, window=65)
        # a window as long as the rows is dropped: the kernel then answers as for the same rows without a window
        outcomes = []
        for window in (1024, None):
            try:
                outcomes.append(resolve(name, backend, **info, window=window))
            except KernelUnsupportedError as refusal:
                outcomes.append(str(refusal))
        assert outcomes[0] == outcomes[1] and "sliding-window" not in outcomes[0]
    if backend == "gpu":
        with pytest.raises(KernelUnsupportedError, match="--attention=flash .* cannot run on .*sliding-window"):
            resolve("flash", backend, **info, window=65)


@pytest.mark.parametrize("causal,window", [(True, 4096), (False, 65)])
def test_splash_tpu_runs_local_windows_on_tpu(causal, window):
    """Local layers shorter than their rows (Mistral's 4096-token sliding window in rows of 8192, Gemma 2's with its
    soft cap; ModernBERT's 64 positions each way): TPU's flash kernel splash_tpu takes them, so flash, auto and the
    name itself run it there and only the legacy pallas_tpu, without a window, is refused before any data."""
    info = dict(heads=32, kv_heads=8, head_dim=128, dtype="bfloat16", causal=causal, has_segments=True,
                q_len=8192, kv_len=8192, window=window)
    for choice in ("flash", "auto", "splash_tpu"):
        assert resolve(choice, "tpu", **info) == "splash_tpu"
        assert resolve(choice, "tpu", **info, soft_cap=50.0) == "splash_tpu"
    with pytest.raises(KernelUnsupportedError, match="--attention=pallas_tpu cannot run on tpu: it has no local "
                                                     ".sliding-window. attention"):
        resolve("pallas_tpu", "tpu", **info)
    for backend in ("cpu", "gpu"):  # no TPU: refused by the backend, not the window
        with pytest.raises(KernelUnsupportedError, match="--attention=splash_tpu cannot run on .*: it needs a TPU"):
            resolve("splash_tpu", backend, **info)


@pytest.mark.parametrize("impl,length,expected", [
    ("auto", 16, "xla"), ("auto", CPU_LIMIT + 8, "blockwise"), ("native", 16, "xla"),
    ("flash", 16, "blockwise"),
])
def test_attention_runs_the_resolved_kernel_inside_its_named_scope(impl, length, expected):
    q = jnp.ones((1, length, 2, 8), jnp.float32)
    assert resolve_for(q, q, impl=impl) == expected
    text = jax.jit(lambda q: attention(q, q, q, impl=impl)).lower(q).as_text(debug_info=True)
    assert f"attention/{expected}/" in text
    assert {"xla", "blockwise"} - {expected} <= {n for n in ("xla", "blockwise")
                                               if f"attention/{n}/" not in text}


def test_attention_states_packed_segments_to_the_policy():
    """Segment values are data, so attention() passes the caller's `packed` to resolve: by default
    segment ids may be packed (pallas_gpu on gpu); packed=False lets cudnn take them as lengths."""
    q = jnp.ones((2, 64, 4, 32), jnp.bfloat16)
    seg = jnp.ones((2, 64), jnp.int32)
    assert resolve_for(q, q, impl="flash", backend="gpu") == "cudnn"
    assert resolve_for(q, q, segment_ids=seg, impl="flash", backend="gpu") == "pallas_gpu"
    assert resolve_for(q, q, segment_ids=seg, impl="flash", backend="gpu", packed=False) == "cudnn"
    assert resolve_for(q, q, segment_ids=seg, impl="auto", backend="gpu", packed=False) == "cudnn"
    with pytest.raises(KernelUnsupportedError, match="may pack several segments"):
        resolve_for(q, q, segment_ids=seg, impl="cudnn", backend="gpu")
    out = attention(q, q, q, segment_ids=seg, impl="native", packed=False)  # a promise, not a change
    assert out.shape == q.shape


def test_attention_refuses_an_impossible_choice_at_trace_time():
    q = jnp.ones((1, 8, 2, 8), jnp.float32)
    with pytest.raises(KernelUnsupportedError, match="pallas_tpu cannot run on cpu: it needs a TPU"):
        jax.jit(lambda q: attention(q, q, q, impl="pallas_tpu"))(q)


@pytest.mark.parametrize("shapes,segments,message", [
    (((1, 8, 6, 8), (1, 8, 4, 8)), None, "heads \\(6\\) to be a multiple of kv_heads \\(4\\)"),
    (((1, 8, 4, 8), (1, 8, 4, 16)), None, "same batch and head_dim"),
    (((1, 8, 4, 8), (1, 9, 4, 8)), (1, 8), "segment_ids need q_len == kv_len"),
    (((1, 8, 4, 8), (1, 8, 4, 8)), (1, 9), "segment_ids must be \\[batch, len\\]"),
    (((8, 4, 8), (8, 4, 8)), None, "\\[batch, len, heads, head_dim\\]"),
    (((1, 4, 2, 8), (1, 0, 2, 8)), None, "every dimension of q and k at least 1"),  # flash divided by a 0 block
    (((1, 4, 2, 8), (1, 4, 0, 8)), None, "every dimension of q and k at least 1"),  # kv_heads 0: a modulo by 0
    (((1, 4, 2, 0), (1, 4, 2, 0)), None, "every dimension of q and k at least 1"),
])
@pytest.mark.parametrize("impl", ["native", "flash"])
def test_inputs_outside_the_contract_are_refused(shapes, segments, message, impl):
    q, k = (jnp.ones(s) for s in shapes)
    seg = None if segments is None else jnp.ones(segments, jnp.int32)
    with pytest.raises(ValueError, match=message):
        attention(q, k, k, segment_ids=seg, impl=impl)


@pytest.mark.parametrize("impl", ["native", "flash"])
def test_integer_inputs_are_refused(impl):
    """xla truncated the probabilities to 0 and blockwise did not: the two answered 0 and 1 for the same input."""
    x = jnp.ones((1, 3, 2, 8), jnp.int32)
    with pytest.raises(ValueError, match="floating-point q, k, v; got int32"):
        attention(x, x, x, impl=impl)


@pytest.mark.parametrize("ids", [[[1.2, 1.2, 1.7, 1.7]], [[0.5, 0.5, 1.0, 1.0]]])
@pytest.mark.parametrize("impl", ["native", "flash"])
def test_segment_ids_that_are_not_integers_are_refused(ids, impl):
    """xla compared the float ids as written and blockwise cut them to int32: 1.2 and 1.7 were two segments for
    one and one for the other, and 0.5 became padding for blockwise alone (answers 1.95 apart, no error)."""
    q = jax.random.normal(jax.random.PRNGKey(0), (1, 4, 2, 8))
    with pytest.raises(ValueError, match="segment_ids must be integers of at most 32 bits \\(int32\\); got float32"):
        attention(q, q, q, segment_ids=jnp.asarray(ids), impl=impl)
    for dtype in (jnp.int32, jnp.int8, jnp.uint16, jnp.bool_):  # what every kernel reads alike
        native, flash = (attention(q, q, q, segment_ids=jnp.asarray([[1, 1, 0, 0]], dtype), impl=i)
                         for i in ("native", "flash"))
        np.testing.assert_allclose(native, flash, atol=1e-5)


@pytest.mark.parametrize("impl", ["native", "flash"])
def test_q_k_v_of_different_dtypes_are_refused(impl):
    """The policy chose by q's dtype alone: on a GPU, bfloat16 q with float32 k/v got cudnn, which refuses the mix."""
    q = jnp.ones((1, 4, 2, 8), jnp.bfloat16)
    with pytest.raises(ValueError, match="q, k, v of one dtype; got bfloat16, float32, float32"):
        attention(q, q.astype(jnp.float32), q.astype(jnp.float32), impl=impl)


def test_arguments_that_choose_the_kernel_must_be_static_values():
    q = jnp.ones((1, 4, 2, 8))
    with pytest.raises(TypeError, match="q as an array \\(jax or numpy\\); got list"):
        attention(q.tolist(), q, q)
    with pytest.raises(ValueError, match="causal must be True or False"):
        attention(q, q, q, causal="no")  # was taken as causal for being truthy
    with pytest.raises(ValueError, match="scale must be None or a static number, not a traced value"):
        jax.jit(lambda q, s: attention(q, q, q, scale=s))(q, 0.5)
    with pytest.raises(ValueError, match="window must be None or a static whole number"):
        jax.jit(lambda q, w: attention(q, q, q, causal=True, window=w))(q, 2)
    with pytest.raises(ValueError, match="soft_cap must be None or a static number, not a traced value"):
        jax.jit(lambda q, c: attention(q, q, q, soft_cap=c))(q, 50.0)
    for bad in (0, -1.0, float("nan"), float("inf"), True, "50"):  # NaN scores, flipped signs, or not a number
        with pytest.raises(ValueError, match="soft_cap must be None or a positive, finite number"):
            attention(q, q, q, soft_cap=bad)
    assert attention(q, q, q, soft_cap=jnp.float32(50.0)).shape == q.shape
    assert attention(q, q, q, scale=jnp.float32(0.5)).shape == q.shape  # a concrete array is a number
    with pytest.raises(TypeError, match="dtype 'bf16', which is not a dtype"):
        resolve("auto", backend="cpu", dtype="bf16")
    with pytest.raises(KernelUnsupportedError, match="'nonsense' is not an attention implementation"):
        other_choice("nonsense", "cpu")


class _LocalGpu:
    """What jax.local_devices(backend="gpu") holds on a machine with this NVIDIA GPU."""

    platform = "gpu"

    def __init__(self, kind: str, capability: str):
        self.device_kind, self.compute_capability = kind, capability


@pytest.mark.parametrize("kind, capability, flash", [("Tesla T4", "7.5", None), ("Tesla V100-SXM2-16GB", "7.0", None),
                                                    ("NVIDIA A100-SXM4-40GB", "8.0", "cudnn"),
                                                    ("NVIDIA H200", "9.0", "cudnn")])
def test_a_local_gpu_older_than_ampere_gets_no_flash_kernel_before_any_data_is_read(monkeypatch, kind, capability, flash):
    """cuDNN's fused attention and Pallas' Triton need compute capability 8.0: on an older local GPU (a T4, a V100)
    flash and the kernels' names are refused naming the GPU, and auto runs xla, instead of a job that fails at its
    first model call; resolving for a named backend (remote workers) leaves this machine's GPU out."""
    real = jax.local_devices
    monkeypatch.setattr(jax, "local_devices", lambda backend=None, **kw: [_LocalGpu(kind, capability)]
                        if backend == "gpu" else real(backend=backend, **kw))
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # this process runs on that GPU
    info = dict(dtype="bfloat16", head_dim=64, q_len=256, kv_len=256, has_segments=True, packed=True)
    assert resolve("auto", **info) == (flash and "pallas_gpu" or "xla")
    # a named backend may be another machine's (Dataflow workers' L4s, launched from here): this GPU does not count,
    # the workers' GPU when the caller names it does
    assert resolve("auto", backend="gpu", **info) == "pallas_gpu"
    workers = (kind, tuple(int(part) for part in capability.split(".")))
    assert resolve("auto", backend="gpu", gpu=workers, **info) == (flash and "pallas_gpu" or "xla")
    assert resolve("auto", backend="gpu", gpu=("nvidia-l4", (8, 9)), **info) == "pallas_gpu"
    assert resolve("flash", backend="gpu", dtype="bfloat16") == "cudnn"
    if flash:
        assert resolve("flash") == flash
        return
    for choice in ("flash", "cudnn", "pallas_gpu"):
        with pytest.raises(KernelUnsupportedError) as refused:
            resolve(choice, **info)
        message = str(refused.value)
        assert f"needs an Ampere or newer GPU (compute capability 8.0), but the GPU it would run on is {kind} " \
               f"(compute capability {capability})" in message, message
        assert "use --attention=native" in message, message


def test_without_a_local_gpu_the_gpu_kernels_are_checked_by_shape_only():
    """A launch for remote GPU workers from a CPU machine: no local GPU to read, so the capability is not checked
    here (pipeline/dataflow_checks.py checks the workers' GPU kind)."""
    assert kernels.policy.local_gpu_capability() is None
    assert resolve("flash", backend="gpu", dtype="bfloat16") == "cudnn"


@pytest.mark.parametrize("impl,backend", [("pallas_gpu", "gpu"), ("splash_tpu", "tpu"), ("pallas_tpu", "tpu")])
def test_a_kernel_whose_jax_module_is_gone_is_refused_before_data(monkeypatch, impl, backend):
    """The Pallas kernels import their JAX ops module when first traced; a jax upgrade that moved or removed it
    refuses the kernel when the run is resolved (naming jax's version), and flash/auto pass to the next kernel,
    instead of an ImportError on the workers mid-job."""
    import sys

    import jax

    from kernels import table
    from kernels.interface import missing_module

    module = sys.modules[table.IMPLEMENTATIONS[impl].call.__module__].OPS_MODULE
    info = {"dtype": "bfloat16", "has_segments": True}
    assert resolve(impl, backend=backend, **info) == impl
    missing_module.cache_clear()
    monkeypatch.setitem(sys.modules, module, None)  # `import` of it now raises ImportError, as for a module jax dropped
    try:
        with pytest.raises(KernelUnsupportedError, match=f"jax {jax.__version__} cannot import {module}"):
            resolve(impl, backend=backend, **info)
        try:  # flash: the backend's other flash kernel, or a refusal that names the missing module
            assert resolve("flash", backend=backend, **info) != impl
        except KernelUnsupportedError as e:
            assert module in str(e)
        assert resolve("auto", backend=backend, **info) not in (impl, None)
    finally:
        missing_module.cache_clear()
