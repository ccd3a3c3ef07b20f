"""Dots in or out of YNNPACK on this CPU, float32 and bfloat16: the measurement behind docscore's XLA flags
(pipeline/process_setup.py, ynn_dots_pay_off). Not a test.

XLA flags act only in a fresh process, so each variant runs in its own subprocess, and the variants take
turns for --rounds rounds (the machine is shared). Variants, each in float32 and bfloat16:
  default          no XLA flag (jaxlib's own choice: dots go to YNNPACK)
  individual_dot   --xla_cpu_experimental_ynn_fusion_type=individual_dot (docscore's choice where YNNPACK pays
                   off: float32 on AVX-512, bfloat16 with bfloat16 instructions, CPUs not measured)
  ynn_off          --xla_cpu_experimental_ynn_fusion_type= (no YNN fusion: docscore's choice on x86 elsewhere;
                   pipeline/process_setup.py ynn_dots_pay_off)
Each process times one [4096, 384] x [384, 1536] dot (a full call's FFN up-projection, float32 accumulation)
and MiniLM's whole forward on packed [16, 256] and [32, 128] rows (docscore's malloc tuning on in all).
Prints best-of-rounds milliseconds and each variant's time relative to float32 individual_dot.

    .venv/bin/python benchmarks/bfloat16_cpu.py [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from micro_costs import best_and_median  # noqa: E402

from pipeline.process_setup import YNN_INDIVIDUAL_DOT, YNN_OFF  # noqa: E402

VARIANTS = {"default": None, "individual_dot": YNN_INDIVIDUAL_DOT, "ynn_off": YNN_OFF}
SHAPES = ((16, 256), (32, 128))


def best_ms(fn, repeats: int) -> float:
    fn()  # compile
    return 1000 * best_and_median(fn, repeats)[0]


def child(dtype: str, repeats: int) -> dict[str, float]:
    from pipeline.process_setup import CpuTuning, apply_cpu_tuning

    apply_cpu_tuning(CpuTuning(dtype=dtype, xla_flags=False))  # the parent set XLA_FLAGS
    import jax
    import jax.numpy as jnp
    import numpy as np

    import models
    from pipeline.stages.packing import max_segments_for

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(4096, 384)), dtype)
    w = jnp.asarray(rng.normal(size=(384, 1536)), dtype)
    dot = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
    result = {"dot": best_ms(lambda: dot(x, w).block_until_ready(), repeats * 3)}
    model = models.load("minilm-l6", attention="native", dtype=dtype)
    for shape in SHAPES:
        ids = rng.integers(1000, 20000, shape).astype(np.int32)
        segments = np.ones(shape, np.int32)
        result[f"model {shape[0]}x{shape[1]}"] = best_ms(
            lambda: np.asarray(model.embed_packed(ids, segments, max_segments_for(shape[1]))), repeats)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=4, help="timed calls per process (best counts)")
    parser.add_argument("--child", nargs=2, metavar=("DTYPE", "REPEATS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]))))
        return
    from pipeline.process_setup import cpu_features, describe_cpu_choice

    best: dict[tuple[str, str], dict[str, float]] = {}
    for _ in range(args.rounds):
        for dtype in ("float32", "bfloat16"):
            for name, flag in VARIANTS.items():
                env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
                env["JAX_PLATFORMS"] = "cpu"
                if flag is not None:
                    env["XLA_FLAGS"] = flag
                done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", dtype, str(args.repeats)],
                                      env=env, cwd=ROOT, capture_output=True, text=True, check=True)
                times = json.loads(done.stdout.strip().splitlines()[-1])
                seen = best.setdefault((dtype, name), times)
                best[(dtype, name)] = {k: min(v, seen[k]) for k, v in times.items()}
    print(f"CPU: {describe_cpu_choice(cpu_features())}")
    print(f"Best of {args.rounds} rounds, ms (in brackets: time / float32 individual_dot's):")
    base = best[("float32", "individual_dot")]
    for (dtype, name), times in best.items():
        print(f"  {dtype:8} {name:15} " + "  ".join(f"{k} {v:7.1f} [{v / base[k]:.2f}]" for k, v in times.items()))


if __name__ == "__main__":
    main()
