"""The flash kernel against native inside the whole model: MiniLM forward on the packed row shapes the
pipeline runs (pipeline/stages/packing.py shapes_for), both kernels loaded in one process (on CPU they get the
same XLA flags) and called in alternation, so both see the same moments of a shared machine. Prints
tokens/s per kernel (best and median of --rounds calls) and flash/native. Not a test.

    .venv/bin/python benchmarks/kernel_in_model.py [--dtype bfloat16] [--rounds 12] [--shapes 16x256 32x128]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def packed_rows(batch: int, length: int, seed: int = 0):
    """Token ids and segment ids of rows packed with windows of 20..length tokens, ~95% full."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 20000, (batch, length)).astype(np.int32)
    seg = np.zeros((batch, length), np.int32)
    for row in range(batch):
        pos, segment = 0, 1
        while pos < length * 0.95:
            n = min(int(rng.integers(20, length + 1)), length - pos)
            seg[row, pos:pos + n] = segment
            pos, segment = pos + n, segment + 1
    return ids, seg


def alternated_calls(loaded: dict, ids, seg, segments: int, rounds: int) -> tuple[dict, dict]:
    """Call each loaded model's embed_packed once (compiling) and then `rounds` times in alternation, so
    all see the same moments of the machine. Returns ({name: first output}, {name: [seconds per call]})."""
    import numpy as np

    first = {name: np.asarray(m.embed_packed(ids, seg, segments)) for name, m in loaded.items()}
    times: dict[str, list[float]] = {name: [] for name in loaded}
    for _ in range(rounds):
        for name, m in loaded.items():
            start = time.perf_counter()
            np.asarray(m.embed_packed(ids, seg, segments))
            times[name].append(time.perf_counter() - start)
    return first, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--shapes", nargs="*", help="BATCHxLENGTH; default: the pipeline's shapes at batch 16")
    args = parser.parse_args()

    from pipeline.process_setup import CpuTuning, apply_cpu_tuning

    apply_cpu_tuning(CpuTuning())  # the same flags for every kernel
    import numpy as np

    import models
    from pipeline.stages.packing import max_segments_for, shapes_for

    shapes = ([tuple(map(int, s.split("x"))) for s in args.shapes] if args.shapes
              else sorted(shapes_for(256, 16), key=lambda s: (s[1], s[0])))
    loaded = {a: models.load("minilm-l6", attention=a, dtype=args.dtype) for a in ("native", "flash")}
    print(f"MiniLM {args.dtype}, kernels {', '.join(f'{a}={m.attention}' for a, m in loaded.items())}, "
          f"best / median of {args.rounds} calls")
    print("| shape | native tok/s | flash tok/s | flash/native best | flash/native median | max abs diff |")
    print("|---|---|---|---|---|---|")
    for batch, length in shapes:
        ids, seg = packed_rows(batch, length)
        segments = max_segments_for(length)
        first, times = alternated_calls(loaded, ids, seg, segments, args.rounds)
        best = {a: batch * length / min(t) for a, t in times.items()}
        median = {a: batch * length / statistics.median(t) for a, t in times.items()}
        diff = float(np.abs(first["flash"] - first["native"]).max())
        print(f"| {batch}x{length} | {best['native']:.0f} | {best['flash']:.0f} | {best['flash'] / best['native']:.2f} | "
              f"{median['flash'] / median['native']:.2f} | {diff:.2g} |", flush=True)


if __name__ == "__main__":
    main()
