"""The cost of a packing plan (pipeline/stages/packing.py pack_windows, best-fit decreasing with open rows bucketed
by free room) against the first-fit decreasing it replaced (the tests' reference copy, tests/test_packing.py, whose
cost grows as windows x open rows), on --windows seeded window lengths in two mixes: paragraphs (20-150 tokens, one in
ten a full 256) and short windows (3-20 tokens, where segment slots fill rows before tokens do). Rows of
row_lengths(256). Best of --rounds each; also rows and padding efficiency (window tokens / row tokens).
Not a test. Goal: < 0.3 s for 40,000 windows.

    .venv/bin/python benchmarks/packing_speed.py [--windows 40000] [--rounds 3]
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

from pipeline.stages.packing import PackedRow, pack_windows, row_lengths  # noqa: E402
from tests.test_packing import first_fit_decreasing  # noqa: E402  the packer it replaced, kept as the tests' reference


def mixes(n: int, seed: int) -> dict[str, list[int]]:
    rng = np.random.default_rng(seed)
    paragraphs = np.where(rng.random(n) < 0.1, 256, rng.integers(20, 151, size=n))
    return {"paragraphs 20-150 + 10% 256": [int(x) for x in paragraphs],
            "short 3-20": [int(x) for x in rng.integers(3, 21, size=n)]}


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
    args = parser.parse_args()

    row_lens = row_lengths(256)
    print(f"cpu: {cpu_model()}; python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}")
    print(f"{args.windows:,} windows, rows of {row_lens}, best of {args.rounds}, seed {args.seed}")
    print("| mix | tokens | best fit s | first fit s | first/best | rows best / first | efficiency best / first |")
    print("|---|---|---|---|---|---|---|")
    for name, lengths in mixes(args.windows, args.seed).items():
        new_s, new_rows = best_of(lambda: pack_windows(lengths, row_lens), args.rounds)
        old_s, old_rows = best_of(lambda: first_fit_decreasing(lengths, row_lens), args.rounds)
        tokens = sum(lengths)
        new_eff = tokens / sum(row.row_len for row in new_rows)
        old_eff = tokens / sum(row.row_len for row in old_rows)
        print(f"| {name} | {tokens:,} | {new_s:.3f} | {old_s:.3f} | {old_s / new_s:.0f}x | "
              f"{len(new_rows):,} / {len(old_rows):,} | {new_eff:.4f} / {old_eff:.4f} |")


if __name__ == "__main__":
    main()
