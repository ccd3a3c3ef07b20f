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


def record_stage_metrics(timings: dict[str, float]) -> None:
    """One Beam distribution per stage (microseconds: Beam distributions hold integers)."""
    for stage in STAGES:
        value = timings.get(stage_column(stage))
        if value is not None:
            beam.metrics.Metrics.distribution(METRICS_NAMESPACE, f"{stage}_us").update(int(round(value * 1000)))


def percentiles_from_quantiles(quantiles: Sequence[float]) -> dict[str, float]:
    """Beam's approximate quantiles, NUM_QUANTILES of them (q[i] = i-th percentile) -> {"p50": .., "p95": .., "p99": ..}."""
    if len(quantiles) != NUM_QUANTILES:
        raise ValueError(f"expected {NUM_QUANTILES} quantiles (0..100th percentile), got {len(quantiles)}")
    return {f"p{p}": float(quantiles[p]) for p in PERCENTILES}
