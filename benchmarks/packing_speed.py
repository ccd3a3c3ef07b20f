"""The cost of a packing plan: pipeline/stages/packing.py plan_rows (what the runner uses: the cheaper of
pack_windows' plan and filling the longest rows), pack_windows alone (best-fit decreasing with open rows bucketed by
free room) and the first-fit decreasing it replaced (the tests' reference copy, tests/test_packing.py, whose cost
grows as windows x open rows), on --windows seeded window lengths in four mixes: paragraphs (20-150 tokens, one in
ten a full 256), short windows (3-20 tokens, where segment slots fill rows before tokens do), and the windows of
text chunked to 32, 64 and 128 tokens (34, 66 and 130 with [CLS]/[SEP]: just over half a row). Rows of
row_lengths(256).
Best of --rounds each; also rows and padding efficiency (window tokens / row tokens).
--model_loop: also MiniLM float32 (native attention, batch 16) on 1,200 windows of each chunked mix, the runner's
loop (run_model) with pack_windows' plan and with plan_rows: seconds (best of 3), padding efficiency, the ratio,
and the largest difference between the two plans' outputs.
Not a test. Goal: < 0.3 s for 40,000 windows.

    .venv/bin/python benchmarks/packing_speed.py [--windows 40000] [--rounds 3] [--model_loop]
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from pipeline.stages.packing import PackedRow, pack_windows, plan_rows, row_lengths  # noqa: E402
from tests.test_packing import first_fit_decreasing  # noqa: E402  the packer it replaced, kept as the tests' reference


def mixes(n: int, seed: int) -> dict[str, list[int]]:
    rng = np.random.default_rng(seed)
    paragraphs = np.where(rng.random(n) < 0.1, 256, rng.integers(20, 151, size=n))
    return {"paragraphs 20-150 + 10% 256": [int(x) for x in paragraphs],
            "short 3-20": [int(x) for x in rng.integers(3, 21, size=n)],
            "chunks of 32 tokens (34)": [34] * n,
            "chunks of 64 tokens (66)": [66] * n,
            "chunks of 128 tokens (130)": [130] * n}


def best_of(fn, rounds: int) -> tuple[float, list[PackedRow]]:
    times, rows = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        rows = fn()
        times.append(time.perf_counter() - start)
    return min(times), rows


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}
        name = fields["Model name"]
        if "CPU family" in fields:  # a VM may name only the vendor ("AMD EPYC"); family and model say which
            name += f" (family {fields['CPU family']}, model {fields.get('Model', '?')})"
    except (OSError, subprocess.SubprocessError, KeyError):
        name = platform.processor() or platform.machine()
    return f"{name}, {os.cpu_count()} cpus"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model_loop", action="store_true")
    args = parser.parse_args()

    row_lens = row_lengths(256)
    print(f"cpu: {cpu_model()}; python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}")
    print(f"{args.windows:,} windows, rows of {row_lens}, best of {args.rounds}, seed {args.seed}")
    print("| mix | tokens | plan_rows s | pack_windows s | first fit s | rows plan_rows / pack_windows / first fit | "
          "efficiency plan_rows / pack_windows / first fit |")
    print("|---|---|---|---|---|---|---|")
    for name, lengths in mixes(args.windows, args.seed).items():
        plan_s, plan = best_of(lambda: plan_rows(lengths, row_lens), args.rounds)
        best_s, best = best_of(lambda: pack_windows(lengths, row_lens), args.rounds)
        first_s, first = best_of(lambda: first_fit_decreasing(lengths, row_lens), args.rounds)
        tokens = sum(lengths)
        eff = [tokens / sum(row.row_len for row in rows) for rows in (plan, best, first)]
        print(f"| {name} | {tokens:,} | {plan_s:.3f} | {best_s:.3f} | {first_s:.3f} | "
              f"{len(plan):,} / {len(best):,} / {len(first):,} | {eff[0]:.4f} / {eff[1]:.4f} / {eff[2]:.4f} |")
    if args.model_loop:
        model_loop(args.rounds, args.seed)


def model_loop(rounds: int, seed: int) -> None:
    """run_model's time on chunked windows with each plan (module-level plan_rows swapped for pack_windows)."""
    from pipeline.stages import packing
    from pipeline.stages.inference import ModelSpec, shared_model

    model = shared_model(ModelSpec("minilm-l6", attention="native"))
    rng = np.random.default_rng(seed)
    planner = packing.plan_rows
    print("| windows | pack_windows s (efficiency) | plan_rows s (efficiency) | pack_windows / plan_rows | max abs diff |")
    print("|---|---|---|---|---|")
    for tokens in (34, 66, 130):
        windows = [np.concatenate([[101], rng.integers(1000, 20000, tokens - 2), [102]]).astype(np.int32)
                   for _ in range(1200)]
        runs = {}
        for name, plan in (("pack_windows", packing.pack_windows), ("plan_rows", planner)):
            packing.plan_rows = plan
            try:
                packing.run_model(model, windows[:64], max_len=256, batch_size=16)  # compiles
                runs[name] = best_of(lambda: packing.run_model(model, windows, max_len=256, batch_size=16), rounds)
            finally:
                packing.plan_rows = planner
        (old_s, (old, _, old_totals)), (new_s, (new, _, new_totals)) = runs["pack_windows"], runs["plan_rows"]
        efficiency = [t["real_tokens"] / t["computed_tokens"] for t in (old_totals, new_totals)]
        diff = max(float(np.abs(a - b).max()) for a, b in zip(old, new))
        print(f"| 1,200 x {tokens} | {old_s:.2f} ({efficiency[0]:.3f}) | {new_s:.2f} ({efficiency[1]:.3f}) | "
              f"{old_s / new_s:.2f}x | {diff:.1e} |")


if __name__ == "__main__":
    main()
