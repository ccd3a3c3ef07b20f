"""Cold compile time of models whose blocks are of several structures, their blocks stacked by repeating runs
(models/layers.py block_runs, stack_blocks: what LoadedModel's programs receive) against the same blocks as a list
run one after another (what such models ran as before). Two random models of released layer patterns in a small
width: a Gemma 3 (26 layers as gemma-3-1b, 5 local then 1 global, a local window of 64 at rows of 256) through
LoadedModel's token_logprobs program, and a ModernBERT (22 layers as ModernBERT-base, every third global, a local
window of 64 each way) through its embed_packed program. Each program is traced, lowered and compiled from a fresh
jax.jit with the persistent compilation cache off (the pipeline's CPU tuning otherwise), the two layouts in
alternation for --rounds rounds; prints seconds to lower (trace included) and to compile, the lowered program's
lines, the median of --calls warm calls of the last round's programs (in alternation), and the outputs' largest
difference on the same packed rows. Not a test.

    .venv/bin/python benchmarks/stacked_periods.py [--batch 4] [--length 256] [--hidden 256] [--heads 4] [--rounds 3]
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

VOCAB = 8192


def model_configs(hidden: int, heads: int, window: int) -> dict[str, dict]:
    """config.json of each model, as the hub's checkpoints spell them, in `hidden` dimensions."""
    head_dim = hidden // heads
    return {
        "gemma3 (26 layers)": {
            "model_type": "gemma3_text", "vocab_size": VOCAB, "hidden_size": hidden, "intermediate_size": 4 * hidden,
            "num_hidden_layers": 26, "num_attention_heads": heads, "num_key_value_heads": 1, "head_dim": head_dim,
            "max_position_embeddings": 32768, "sliding_window": window, "sliding_window_pattern": 6,
            "query_pre_attn_scalar": head_dim, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0},
        "modernbert (22 layers)": {
            "model_type": "modernbert", "vocab_size": VOCAB, "hidden_size": hidden, "intermediate_size": 3 * hidden // 2,
            "num_hidden_layers": 22, "num_attention_heads": heads, "hidden_activation": "gelu",
            "max_position_embeddings": 8192, "norm_eps": 1e-5, "norm_bias": False, "global_rope_theta": 160_000.0,
            "local_rope_theta": 10_000.0, "local_attention": 2 * window, "global_attn_every_n_layers": 3,
            "attention_bias": False, "mlp_bias": False},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()

    from pipeline.process_setup import CpuTuning, apply_cpu_tuning

    apply_cpu_tuning(CpuTuning(dtype=args.dtype, compilation_cache=False))
    import jax
    import numpy as np
    from flax import nnx

    from benchmarks.kernel_in_model import packed_rows
    from benchmarks.packing_speed import cpu_model
    from models.architecture import MODULES
    from models.config import config_from_hf
    from models.layers import stack_blocks, stacked_runs
    from models.loader import embed_packed_program, token_logprobs_program
    from models.precision import matmul_precision, with_matmul_precision

    ids, seg = packed_rows(args.batch, args.length)
    ids = ids % VOCAB
    segments = int(seg.max())
    precision = matmul_precision(args.dtype)
    jax.jit(lambda x: x + 1).lower(np.ones(4)).compile()  # the backend's one-off start, outside every timing

    print(f"cpu: {cpu_model()}; jax {jax.__version__}, load average {os.getloadavg()[0]:.1f}; {args.dtype}, rows "
          f"{args.batch}x{args.length} ({segments} segments max), hidden {args.hidden}, {args.heads} heads, local window "
          f"{args.window}; persistent compilation cache off; best of {args.rounds} rounds in alternation")
    print("| model | blocks as | runs (period x count) | lower s (trace included) | compile s | lowered lines | "
          "warm ms per call | max abs diff vs list (largest output) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, hf in model_configs(args.hidden, args.heads, args.window).items():
        config = config_from_hf(hf)
        model = MODULES[config.family](config, attention_impl="xla", dtype=args.dtype, rngs=nnx.Rngs(0))
        layouts = {"list": nnx.split(model)}
        layouts["stacked"] = nnx.split(stack_blocks(nnx.merge(*layouts["list"])))
        runs = stacked_runs(nnx.to_pure_dict(layouts["stacked"][1])["layers"])
        described = {"list": f"{config.num_layers} blocks",
                     "stacked": " + ".join(f"{run.period}x{run.count}" for run, _ in runs)}
        program = (functools.partial(embed_packed_program, max_segments=segments, pooling="mean") if config.is_encoder
                   else token_logprobs_program)
        times = {layout: [] for layout in layouts}
        lines, outputs, programs, calls = {}, {}, {}, {layout: [] for layout in layouts}
        for _ in range(args.rounds):
            for layout, (graphdef, state) in layouts.items():
                # a fresh jit each round: nothing traced or compiled is reused
                fn = jax.jit(with_matmul_precision(functools.partial(program, graphdef), precision))
                start = time.perf_counter()
                lowered = fn.lower(state, ids, seg)
                lowered_at = time.perf_counter()
                compiled = lowered.compile()
                times[layout].append((lowered_at - start, time.perf_counter() - lowered_at))
                lines[layout] = lowered.as_text().count("\n")
                outputs[layout] = np.asarray(compiled(state, ids, seg))
                programs[layout] = compiled
        for _ in range(args.calls):
            for layout, (_, state) in layouts.items():
                start = time.perf_counter()
                programs[layout](state, ids, seg).block_until_ready()
                calls[layout].append(time.perf_counter() - start)
        largest = float(np.abs(outputs["list"]).max())
        for layout in layouts:
            lower_s, compile_s = min(t[0] for t in times[layout]), min(t[1] for t in times[layout])
            diff = float(np.abs(outputs[layout] - outputs["list"]).max())
            print(f"| {name} | {layout} | {described[layout]} | {lower_s:.2f} | {compile_s:.2f} | {lines[layout]} | "
                  f"{1e3 * statistics.median(calls[layout]):.1f} | {diff:.2e} ({largest:.2f}) |")
        best = {layout: min(sum(t) for t in times[layout]) for layout in layouts}
        per_call = statistics.median(calls["stacked"]) / statistics.median(calls["list"])
        print(f"| {name} | stacked / list | | lower + compile {best['stacked'] / best['list']:.3f} | | "
              f"{lines['stacked'] / lines['list']:.3f} | {per_call:.3f} | |")


if __name__ == "__main__":
    main()
