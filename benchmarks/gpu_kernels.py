"""cuDNN vs XLA attention on a GPU machine: parity in bfloat16, then timing at 1k-16k tokens.

Self-checking: exits non-zero when a parity check fails or when `flash` does not resolve to and
run cudnn on this machine. Needs a CUDA jaxlib (jax[cuda12]) and an NVIDIA GPU; refuses to run
elsewhere. Not part of CI. Run from the repository root:

  python benchmarks/gpu_kernels.py            # parity + timing
  python benchmarks/gpu_kernels.py --quick    # parity only, small shapes
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from kernels import KernelUnsupportedError, attention, resolve
from kernels.reference import reference_attention

BF16_TOLERANCE = 2e-2  # the contract's bfloat16 bound against the float64 reference
HEADS = 12


def segment_rows(batch: int, length: int) -> np.ndarray:
    """Row 0: two packed segments then padding; row 1: all padding; others: one full segment."""
    seg = np.ones((batch, length), np.int32)
    a, b = length * 2 // 5, length * 3 // 4
    seg[0, a:b], seg[0, b:] = 2, 0
    if batch > 1:
        seg[1] = 0
    return seg


def inputs(seed: int, batch: int, length: int, kv_heads: int, head_dim: int, dtype=jnp.bfloat16):
    keys = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(keys[0], (batch, length, HEADS, head_dim), jnp.float32).astype(dtype)
    k = jax.random.normal(keys[1], (batch, length, kv_heads, head_dim), jnp.float32).astype(dtype)
    v = jax.random.normal(keys[2], (batch, length, kv_heads, head_dim), jnp.float32).astype(dtype)
    return q, k, v


def check_parity() -> list[str]:
    """cudnn and xla against the float64 reference in bfloat16; returns the failures."""
    failures = []
    cases = [(length, kv_heads, head_dim, causal, segments)
             for length in (128, 1000) for kv_heads in (12, 4) for head_dim in (64, 128)
             for causal in (False, True) for segments in (False, True)]
    print("| length | kv_heads | head_dim | causal | segments | cudnn err | xla err | cudnn-xla |")
    print("|---|---|---|---|---|---|---|---|")
    for i, (length, kv_heads, head_dim, causal, segments) in enumerate(cases):
        q, k, v = inputs(i, 3, length, kv_heads, head_dim)
        seg = segment_rows(3, length) if segments else None
        seg_arg = None if seg is None else jnp.asarray(seg)
        outs = {}
        for impl in ("cudnn", "xla"):
            fn = jax.jit(lambda q, k, v, s, impl=impl: attention(q, k, v, segment_ids=s,
                                                                 causal=causal, impl=impl))
            outs[impl] = np.asarray(fn(q, k, v, seg_arg).astype(jnp.float32), np.float64)
        ref = reference_attention(*(np.asarray(x.astype(jnp.float32)) for x in (q, k, v)),
                                  segment_ids=seg, causal=causal)
        errs = {impl: float(np.abs(out - ref).max()) for impl, out in outs.items()}
        diff = float(np.abs(outs["cudnn"] - outs["xla"]).max())
        print(f"| {length} | {kv_heads} | {head_dim} | {causal} | {segments} | "
              f"{errs['cudnn']:.1e} | {errs['xla']:.1e} | {diff:.1e} |")
        name = f"length={length} kv_heads={kv_heads} head_dim={head_dim} causal={causal} segments={segments}"
        for impl, out in outs.items():
            if np.isnan(out).any():
                failures.append(f"{impl} NaN at {name}")
            if errs[impl] > BF16_TOLERANCE:
                failures.append(f"{impl} error {errs[impl]:.1e} > {BF16_TOLERANCE} at {name}")
            if seg is not None and not (out[seg == 0] == 0).all():
                failures.append(f"{impl} padding rows not 0 at {name}")
    return failures


def check_flash_is_cudnn() -> list[str]:
    """On this GPU, flash must resolve to cudnn for bf16 and the compiled program must call
    cuDNN's fused attention inside the attention/cudnn scope; float32 must be refused."""
    failures = []
    if resolve("flash", dtype="bfloat16", head_dim=64) != "cudnn":
        failures.append("flash does not resolve to cudnn on this machine")
    q, k, v = inputs(0, 1, 512, 12, 64)
    lowered = jax.jit(lambda q, k, v: attention(q, k, v, impl="flash")).lower(q, k, v)
    if "attention/cudnn" not in lowered.as_text(debug_info=True):
        failures.append("flash did not run inside the attention/cudnn scope")
    if "cudnn" not in lowered.compile().as_text().lower():
        failures.append("compiled flash program has no cuDNN call")
    try:
        resolve("cudnn", dtype="float32")
        failures.append("cudnn accepted float32")
    except KernelUnsupportedError as error:
        print(f"refused as expected: {error}")
    return failures


def timing(lengths: list[int], batch: int, head_dim: int, repeats: int) -> None:
    print(f"\n| length | xla ms | cudnn ms | blockwise ms | xla/cudnn | "
          f"(batch {batch}, {HEADS} heads, head_dim {head_dim}, bf16, padding mask) |")
    print("|---|---|---|---|---|---|")
    for length in lengths:
        q, k, v = inputs(1, batch, length, HEADS, head_dim)
        seg = jnp.ones((batch, length), jnp.int32)
        row = {}
        for impl in ("xla", "cudnn", "blockwise"):
            fn = jax.jit(lambda q, k, v, s, impl=impl: attention(q, k, v, segment_ids=s, impl=impl))
            try:
                fn(q, k, v, seg).block_until_ready()
            except (KernelUnsupportedError, RuntimeError, ValueError) as error:  # e.g. OOM
                row[impl] = None
                print(f"<!-- {impl} at {length}: {str(error)[:200]} -->")
                continue
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                fn(q, k, v, seg).block_until_ready()
                times.append(time.perf_counter() - start)
            row[impl] = statistics.median(times) * 1e3
        fmt = lambda x: "-" if x is None else f"{x:.2f}"
        ratio = (f"{row['xla'] / row['cudnn']:.2f}" if row.get("xla") and row.get("cudnn")
                 else "-")
        print(f"| {length} | {fmt(row['xla'])} | {fmt(row['cudnn'])} | "
              f"{fmt(row['blockwise'])} | {ratio} | |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="parity only")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    if jax.default_backend() != "gpu":
        print(f"needs a GPU backend (jax[cuda12]); this machine runs jax on "
              f"{jax.default_backend()}", file=sys.stderr)
        return 2
    device = jax.devices()[0]
    print(f"# jax {jax.__version__} on {device.device_kind} "
          f"(compute capability {getattr(device, 'compute_capability', '?')})")
    failures = check_flash_is_cudnn() + check_parity()
    if not args.quick:
        timing(args.lengths, args.batch, args.head_dim, args.repeats)
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    print("parity: " + ("FAILED" if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
