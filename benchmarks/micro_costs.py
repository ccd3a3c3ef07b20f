"""Two small costs behind two choices in docscore, each measured against the alternative. Not a test.

1. GELU (models/layers.py gelu_erf): x * 0.5 * (1 + erf(x / sqrt 2)) against jax.nn.gelu(approximate=False),
   which XLA:CPU lowers through erfc. Alone, on the [4096, 1536] float32 activation of a full call; then
   inside MiniLM's whole forward on the pipeline's full-call shapes, the two models loaded in one process
   and called in alternation (kernel_in_model.alternated_calls), so both see the same moments of the machine.
2. The scores.embedding column (pipeline/stages/scoring.py score_embed): rows holding float32 arrays against
   lists of Python floats (tolist), each then converted to list<float32> with pa.array, as Beam's Parquet
   sink converts each batch of rows; --docs rows of 384 values.

    .venv/bin/python benchmarks/micro_costs.py [--dtype bfloat16] [--rounds 12] [--docs 1891]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def best_and_median(fn, rounds: int) -> tuple[float, float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def activation_alone(rounds: int) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from models.layers import gelu_erf

    x = jnp.asarray(np.random.default_rng(0).normal(0.0, 2.0, (4096, 1536)).astype(np.float32))
    variants = {"jax.nn.gelu (erfc)": lambda v: jax.nn.gelu(v, approximate=False), "gelu_erf": gelu_erf}
    print("GELU alone, [4096, 1536] float32 -> bfloat16, best / median ms:")
    for name, act in variants.items():
        fn = jax.jit(lambda v, act=act: act(v).astype(jnp.bfloat16))
        fn(x).block_until_ready()
        best, median = best_and_median(lambda: fn(x).block_until_ready(), rounds * 3)
        print(f"  {name:20s} {best * 1e3:6.2f} / {median * 1e3:6.2f}")


def activation_in_model(dtype: str, rounds: int) -> None:
    import jax
    import numpy as np

    import models
    import models.layers as layers
    from kernel_in_model import alternated_calls, packed_rows
    from pipeline.stages.packing import max_segments_for, rows_per_call, row_lengths

    shapes = [(rows_per_call(length, 256, 16)[0], length) for length in row_lengths(256)]
    inputs = {shape: packed_rows(*shape) for shape in shapes}
    ours = models.load("minilm-l6", attention="native", dtype=dtype)
    for shape in shapes:  # each model's programs are traced (and its activation read) at its first call
        ours.embed_packed(*inputs[shape], max_segments_for(shape[1]))
    kept = layers.ACTIVATIONS["gelu"]
    layers.ACTIVATIONS["gelu"] = lambda v: jax.nn.gelu(v, approximate=False)
    try:
        erfc = models.load("minilm-l6", attention="native", dtype=dtype)
        for shape in shapes:
            erfc.embed_packed(*inputs[shape], max_segments_for(shape[1]))
    finally:
        layers.ACTIVATIONS["gelu"] = kept
    print(f"MiniLM {dtype} forward, native attention, gelu_erf against jax.nn.gelu, {rounds} alternated calls:")
    print("| shape | erfc/erf time, best | erfc/erf time, median | max abs diff |")
    print("|---|---|---|---|")
    for shape in shapes:
        outputs, times = alternated_calls({"ours": ours, "erfc": erfc}, *inputs[shape],
                                          max_segments_for(shape[1]), rounds)
        best = min(times["erfc"]) / min(times["ours"])
        median = statistics.median(times["erfc"]) / statistics.median(times["ours"])
        diff = float(np.max(np.abs(outputs["ours"] - outputs["erfc"])))
        print(f"| {shape[0]}x{shape[1]} | {best:.3f} | {median:.3f} | {diff:.1e} |")


def embedding_column(docs: int, rounds: int) -> None:
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=384).astype(np.float32) for _ in range(docs)]
    column = pa.list_(pa.float32())
    pa.array(arrays[:1], column)  # pyarrow's first conversion in a process imports pandas (~0.2 s)
    print(f"scores.embedding column of {docs} rows x 384, rows made and converted with pa.array, best / median ms:")
    variants = {"float32 arrays": lambda: pa.array(arrays, column),
                "lists (tolist + pa.array)": lambda: pa.array([a.tolist() for a in arrays], column)}
    for name, fn in variants.items():
        best, median = best_and_median(fn, rounds)
        print(f"  {name:26s} {best * 1e3:8.2f} / {median * 1e3:8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--docs", type=int, default=1891)
    args = parser.parse_args()

    from pipeline.process_setup import CpuTuning, apply_cpu_tuning

    apply_cpu_tuning(CpuTuning(dtype=args.dtype))
    activation_alone(args.rounds)
    activation_in_model(args.dtype, args.rounds)
    embedding_column(args.docs, args.rounds)


if __name__ == "__main__":
    main()
