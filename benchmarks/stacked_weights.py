"""Blocks' weights stacked once at load (models/layers.py StackedBlocks, what LoadedModel's programs receive)
against the earlier program, which received them per block and stacked them inside every call before the
scan. Both programs are MiniLM embed_packed on the same weights (the per-block copy is sliced from the loaded
stacked one), compiled in one process under the pipeline's CPU tuning and called in alternation, so both see
the same moments of a shared machine. Prints per call time (median and best of --calls warm calls), the
compiled programs' memory_analysis() argument and temporary bytes, and stacked/per-block ratios; the two
outputs must be identical. Not a test.

    .venv/bin/python benchmarks/stacked_weights.py [--batch 16] [--length 256] [--calls 20] [--dtype float32]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()

    from pipeline.process_setup import CpuTuning, apply_cpu_tuning

    apply_cpu_tuning(CpuTuning(dtype=args.dtype, compilation_cache=False))
    import jax
    import numpy as np
    from flax import nnx

    import models
    from models.architecture import abstract_model
    from models.heads import segment_embeddings
    from models.layers import StackedBlocks, stack_blocks, unstack_params
    from models.precision import with_matmul_precision
    from benchmarks.kernel_in_model import packed_rows

    loaded = models.load(args.model, attention="native", dtype=args.dtype)
    assert isinstance(loaded.model.layers, StackedBlocks), "the model's blocks differ: nothing is stacked"
    # The earlier layout: one array per block parameter, stacked by the program on every call (then the same scan).
    graphdef, per_block = abstract_model(loaded.config, attention_impl=loaded.attention, dtype=args.dtype)
    nnx.replace_by_pure_dict(per_block, loaded.parallel.place(unstack_params(nnx.to_pure_dict(loaded._state))))

    def stacked_in_each_call(state, ids, seg, segments):
        return segment_embeddings(stack_blocks(nnx.merge(graphdef, state))(ids, seg), seg, segments)

    earlier = jax.jit(loaded.parallel.traced(with_matmul_precision(stacked_in_each_call, loaded.matmul_precision)),
                      static_argnums=3)
    ids, seg = packed_rows(args.batch, args.length)
    segments = int(seg.max())
    (ids, seg), _ = loaded.parallel.shard_rows(ids, seg)
    programs = {
        "stacked at load": (loaded._functions["embed_packed"].lower(loaded._state, ids, seg, segments).compile(),
                            loaded._state),
        "stacked per call": (earlier.lower(per_block, ids, seg, segments).compile(), per_block),
    }
    memory, outputs, seconds = {}, {}, {name: [] for name in programs}
    for name, (compiled, state) in programs.items():
        stats = compiled.memory_analysis()
        memory[name] = (stats.argument_size_in_bytes, stats.temp_size_in_bytes)
        outputs[name] = np.asarray(compiled(state, ids, seg))
        for _ in range(2):  # warm
            compiled(state, ids, seg).block_until_ready()
    for _ in range(args.calls):
        for name, (compiled, state) in programs.items():
            start = time.perf_counter()
            compiled(state, ids, seg).block_until_ready()
            seconds[name].append(time.perf_counter() - start)
    new, old = programs
    same = np.array_equal(outputs[new], outputs[old])
    weights = sum(leaf.nbytes for leaf in jax.tree.leaves(nnx.to_pure_dict(loaded._state)["layers"]))
    mib = lambda n: f"{n / 2**20:.1f}"
    print(f"{args.model} embed_packed {args.dtype}, {args.batch}x{args.length} tokens, {segments} segments per row max, "
          f"{jax.device_count()} {jax.default_backend()} device(s); median / best of {args.calls} warm calls, "
          f"in alternation; blocks' weights {mib(weights)} MiB; outputs identical: {same}")
    print("| program | ms per call (median) | best | argument MiB | temp MiB |")
    print("|---|---|---|---|---|")
    for name in programs:
        print(f"| {name} | {1e3 * statistics.median(seconds[name]):.1f} | {1e3 * min(seconds[name]):.1f} "
              f"| {mib(memory[name][0])} | {mib(memory[name][1])} |")
    print(f"| at load / per call | {statistics.median(seconds[new]) / statistics.median(seconds[old]):.3f} "
          f"| {min(seconds[new]) / min(seconds[old]):.3f} | {memory[new][0] / memory[old][0]:.3f} "
          f"| {memory[new][1] / memory[old][1]:.3f} |")
    if not same:
        raise SystemExit("the two programs' outputs differ")


if __name__ == "__main__":
    main()
