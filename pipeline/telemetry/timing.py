"""Per-stage timing: the stage names, Beam Metrics distributions per stage, and percentile helpers.

Every scored row carries read_ms, tokenize_ms, infer_ms (its share of the batch) and postprocess_ms;
this module names them in one place. Must not measure anything itself beyond recording values.
"""
from __future__ import annotations

from collections.abc import Sequence

import apache_beam as beam

from pipeline.records import TIMING_COLUMNS

STAGES = tuple(column[: -len("_ms")] for column in TIMING_COLUMNS)  # read, tokenize, infer, postprocess
METRICS_NAMESPACE = "docscore_timing"
PERCENTILES = (50, 95, 99)
NUM_QUANTILES = 101  # approximate quantiles computed per stage: q[i] = the i-th percentile


def stage_column(stage: str) -> str:
    return f"{stage}_ms"


class StageMetrics:
    """One Beam distribution per stage (microseconds: Beam distributions hold integers), made once by the
    DoFn that records them rather than looked up again for every document."""

    def __init__(self):
        self._distributions = {stage_column(stage): beam.metrics.Metrics.distribution(METRICS_NAMESPACE, f"{stage}_us")
                               for stage in STAGES}

    def record(self, timings: dict[str, float]) -> None:
        for column, distribution in self._distributions.items():
            value = timings.get(column)
            if value is not None:
                distribution.update(int(round(value * 1000)))


def percentiles_from_quantiles(quantiles: Sequence[float]) -> dict[str, float]:
    """Beam's approximate quantiles, NUM_QUANTILES of them (q[i] = i-th percentile) -> {"p50": .., "p95": .., "p99": ..}."""
    if len(quantiles) != NUM_QUANTILES:
        raise ValueError(f"expected {NUM_QUANTILES} quantiles (0..100th percentile), got {len(quantiles)}")
    return {f"p{p}": float(quantiles[p]) for p in PERCENTILES}
