"""Peak memory and time of xla vs blockwise attention, each case in a fresh subprocess.

Not a test (nothing here is asserted by CI): prints a markdown table with blockwise/xla ratios
measured side by side in one run, plus the environment. Results and the command live in
benchmarks/README.md. Cases whose estimated memory exceeds --max-gb are skipped, not run.

  .venv/bin/python benchmarks/attention_memory.py                       # memory table
  .venv/bin/python benchmarks/attention_memory.py --batches 1 2 4 8 \\
      --lengths 128 256 512 1024 2048 4096 8192                          # auto's cpu threshold
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

HEADS, HEAD_DIM = 12, 32
TIME_BUDGET_S = 10.0  # per case: stop repeating once this much was spent (at least 2 runs)
IMPLS = ("xla", "blockwise")


def estimated_gb(impl: str, batch: int, length: int) -> float:
    """Rough peak: inputs/outputs, plus for xla three float32 [B, H, L, L] buffers (measured:
    batch 1 at 8192 tokens added 9.3 GB = 3.0 x B*H*L*L*4)."""
    io = 4 * batch * length * HEADS * HEAD_DIM * 4
    scores = 3 * batch * HEADS * length * length * 4 if impl == "xla" else 0
    return (io + scores) / 2**30


def run_case(impl: str, batch: int, length: int, repeats: int, causal: bool) -> dict:
    """Child process: build inputs, compile, run; report time and peak RSS (MB)."""
    import jax
    import jax.numpy as jnp

    from kernels import attention

    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, (batch, length, HEADS, HEAD_DIM), jnp.float32)
               for key in keys)
    segment_ids = jnp.ones((batch, length), jnp.int32)  # the model always passes its padding mask
    jax.block_until_ready((q, k, v, segment_ids))
    base_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    fn = jax.jit(lambda q, k, v, s: attention(q, k, v, segment_ids=s, causal=causal, impl=impl))
    start = time.perf_counter()
    compiled = fn.lower(q, k, v, segment_ids).compile()
    compile_s = time.perf_counter() - start
    compiled(q, k, v, segment_ids).block_until_ready()  # warm-up
    times = []
    while len(times) < repeats and (len(times) < 2 or sum(times) < TIME_BUDGET_S):
        start = time.perf_counter()
        compiled(q, k, v, segment_ids).block_until_ready()
        times.append(time.perf_counter() - start)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # best of the runs: on a shared machine other processes only ever add time
    return dict(impl=impl, batch=batch, length=length, seconds=min(times), runs=len(times),
                compile_s=compile_s, peak_mb=peak_mb, added_mb=peak_mb - base_mb)


def run_in_subprocess(impl: str, batch: int, length: int, repeats: int, causal: bool) -> dict:
    command = [sys.executable, __file__, "--child", impl, str(batch), str(length),
               "--repeats", str(repeats)] + (["--causal"] if causal else [])
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        return dict(impl=impl, batch=batch, length=length, error=done.stderr.strip()[-300:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def environment() -> str:
    import jax
    return (f"jax {jax.__version__}, {platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f}, "
            f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+",
                        default=[512, 1024, 2048, 4096, 8192, 16384, 32768])
    parser.add_argument("--batches", type=int, nargs="+", default=[1])
    parser.add_argument("--repeats", type=int, default=5, help="at most; best run is reported")
    parser.add_argument("--max-gb", type=float, default=16.0)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--child", nargs=3, metavar=("IMPL", "BATCH", "LENGTH"))
    args = parser.parse_args()
    if args.child:
        impl, batch, length = args.child[0], int(args.child[1]), int(args.child[2])
        print(json.dumps(run_case(impl, batch, length, args.repeats, args.causal)))
        return

    print(f"# attention memory/time: batch {args.batches}, {HEADS} heads, head_dim {HEAD_DIM}, "
          f"float32, causal={args.causal}; {environment()}")
    print("| batch | length | xla s (best) | blockwise s (best) | time bw/xla | xla peak MB (+added) "
          "| blockwise peak MB (+added) | added mem bw/xla | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for batch in args.batches:
        for length in args.lengths:
            row = {}
            for impl in IMPLS:
                if estimated_gb(impl, batch, length) > args.max_gb:
                    row[impl] = None
                    continue
                row[impl] = run_in_subprocess(impl, batch, length, args.repeats, args.causal)
                if "error" in row[impl]:
                    print(f"<!-- {impl} {batch}x{length} failed: {row[impl]['error']} -->")
                    row[impl] = None
            print(format_row(batch, length, row["xla"], row["blockwise"]), flush=True)


def format_row(batch: int, length: int, xla: dict | None, bw: dict | None) -> str:
    def secs(r):
        return "skipped (> max-gb)" if r is None else f"{r['seconds']:.3f}"

    def mem(r):
        return "-" if r is None else f"{r['peak_mb']:.0f} (+{r['added_mb']:.0f})"

    both = xla is not None and bw is not None
    time_ratio = f"{bw['seconds'] / xla['seconds']:.2f}" if both else "-"
    mem_ratio = f"{bw['added_mb'] / max(xla['added_mb'], 1):.3f}" if both else "-"
    return (f"| {batch} | {length} | {secs(xla)} | {secs(bw)} | {time_ratio} | {mem(xla)} "
            f"| {mem(bw)} | {mem_ratio} | {os.getloadavg()[0]:.1f} |")


if __name__ == "__main__":
    main()
