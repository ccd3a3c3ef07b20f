"""Memory watch: host RSS (psutil) and accelerator memory (jax Device.memory_stats(), on backends that
have them) sampled once per inference batch into Beam metrics, and the summary's memory section.

Holds the sampling, the per-batch recorder a DoFn calls, and the pure summary of the metrics. Must not
keep samples itself (Beam aggregates them) nor act on what it sees.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any

import apache_beam as beam

NAMESPACE = "docscore_memory"
WARMUP_BATCHES = 20  # batches after which memory should be flat: compiles, caches and pools are warm
MB = 2**20


@dataclasses.dataclass(frozen=True)
class MemorySample:
    """One reading: this process's resident set and, where the backend reports them, the bytes in use on
    its local accelerators (summed) and their peak so far."""

    rss_mb: float
    device_in_use_mb: float | None = None
    device_peak_mb: float | None = None


def sample() -> MemorySample:
    import psutil

    rss = psutil.Process().memory_info().rss / MB
    in_use = peak = None
    try:
        import jax

        stats = [d.memory_stats() for d in jax.local_devices()]
    except Exception:  # no jax, or a backend without an allocator to ask
        stats = []
    stats = [s for s in stats if s]  # CPU devices answer None
    if stats:
        in_use = sum(s.get("bytes_in_use", 0) for s in stats) / MB
        peak = sum(s.get("peak_bytes_in_use", 0) for s in stats) / MB
    return MemorySample(rss, in_use, peak)


class MemoryWatch:
    """Call record_batch() after each inference batch. Beam metrics (namespace docscore_memory):
    rss_mb (distribution over batches), rss_mb_end (gauge: the latest), rss_mb_start (the first batch),
    rss_mb_warm (batch WARMUP_BATCHES), and device_in_use_mb / device_peak_mb / device_in_use_mb_end
    where the backend has memory stats. One watch per DoFn instance: start/warm are per worker."""

    def __init__(self):
        self._batches = 0
        self._lock = threading.Lock()

    def __getstate__(self):  # pickled with the ModelHandler (a lock cannot be): a fresh count on every worker
        return {"batches": 0}

    def __setstate__(self, _state):
        self.__init__()

    def record_batch(self) -> MemorySample:
        reading = sample()
        with self._lock:
            self._batches += 1
            batch = self._batches
        rss = int(round(reading.rss_mb))
        beam.metrics.Metrics.distribution(NAMESPACE, "rss_mb").update(rss)
        beam.metrics.Metrics.gauge(NAMESPACE, "rss_mb_end").set(rss)
        if batch == 1:
            beam.metrics.Metrics.distribution(NAMESPACE, "rss_mb_start").update(rss)
        if batch == WARMUP_BATCHES:
            beam.metrics.Metrics.distribution(NAMESPACE, "rss_mb_warm").update(rss)
        if reading.device_in_use_mb is not None:
            in_use = int(round(reading.device_in_use_mb))
            beam.metrics.Metrics.distribution(NAMESPACE, "device_in_use_mb").update(in_use)
            beam.metrics.Metrics.distribution(NAMESPACE, "device_peak_mb").update(int(round(reading.device_peak_mb or 0)))
            beam.metrics.Metrics.gauge(NAMESPACE, "device_in_use_mb_end").set(in_use)
        return reading


def summarize(metrics: dict[str, Any]) -> dict[str, Any]:
    """The summary's memory section from run.metric_values(result, "docscore") (keys NAMESPACE/name):
    start (first batch), warm (batch WARMUP_BATCHES; None in shorter runs), peak, end (the latest sample),
    growth after warm-up in percent, and device memory where the backend reports it. With several
    workers, start/warm/peak are the largest worker's and end is whichever worker sampled last."""
    def get(name: str) -> Any:
        return metrics.get(f"{NAMESPACE}/{name}")

    rss, start, warm, end = get("rss_mb") or {}, get("rss_mb_start") or {}, get("rss_mb_warm") or {}, get("rss_mb_end")
    warm_mb = warm.get("max")
    growth = 100.0 * (end - warm_mb) / warm_mb if warm_mb and end is not None else None
    device = None
    if get("device_in_use_mb"):
        device = {
            "peak_in_use_mb": get("device_in_use_mb")["max"],
            "end_in_use_mb": get("device_in_use_mb_end"),
            "allocator_peak_mb": get("device_peak_mb")["max"],
        }
    return {
        "batches": rss.get("count", 0),
        "start_rss_mb": start.get("max"),
        "warm_rss_mb": warm_mb,
        "peak_rss_mb": rss.get("max"),
        "end_rss_mb": end,
        "mean_rss_mb": (rss["sum"] / rss["count"]) if rss.get("count") else None,
        "growth_after_warmup_pct": growth,
        "device": device,
    }
