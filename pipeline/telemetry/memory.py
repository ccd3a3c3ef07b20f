"""Memory: before a run, whether one model call of --batch_size rows fits the memory there is (a pure
estimate from the model's sizes, and the room: available RAM or the accelerator's allocator limit); during
it, host RSS (psutil) and accelerator memory (jax Device.memory_stats(), on backends that have them)
sampled once per inference batch into Beam metrics, and the summary's memory section.

Holds the estimate and the room (validate.py turns a call that cannot fit into a configuration error),
the sampling, the per-batch recorder a DoFn calls, and the pure summary of the metrics. Must not keep
samples itself (Beam aggregates them) nor act on what it sees during a run.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import threading
from typing import Any

import apache_beam as beam

from models.memory_room import MemoryRoom, format_bytes, host_memory_room, smallest_free

NAMESPACE = "docscore_memory"
WARMUP_BATCHES = 20  # batches after which memory should be flat: compiles, caches and pools are warm
MB = 10**6  # the unit of every *_mb figure, as labelled (not MiB)


@dataclasses.dataclass(frozen=True)
class MemorySample:
    """One reading: this process's resident set and, where the backend reports them, the bytes in use on
    its local accelerators (summed) and their peak so far."""

    rss_mb: float
    device_in_use_mb: float | None = None
    device_peak_mb: float | None = None
    high_water_mb: float | None = None  # the process's largest RSS so far, between samples too (the kernel's count)


def high_water_mb() -> float | None:
    """The largest resident set this process has had (getrusage's ru_maxrss: KiB on Linux, bytes on macOS)."""
    try:
        import resource
    except ImportError:  # not a Unix
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak * (1 if sys.platform == "darwin" else 1024) / MB


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
    return MemorySample(rss, in_use, peak, high_water_mb())


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
        if reading.high_water_mb is not None:
            beam.metrics.Metrics.distribution(NAMESPACE, "rss_high_water_mb").update(int(round(reading.high_water_mb)))
        if reading.device_in_use_mb is not None:
            in_use = int(round(reading.device_in_use_mb))
            beam.metrics.Metrics.distribution(NAMESPACE, "device_in_use_mb").update(in_use)
            beam.metrics.Metrics.distribution(NAMESPACE, "device_peak_mb").update(int(round(reading.device_peak_mb or 0)))
            beam.metrics.Metrics.gauge(NAMESPACE, "device_in_use_mb_end").set(in_use)
        return reading


def summarize(metrics: dict[str, Any]) -> dict[str, Any]:
    """The summary's memory section from pipeline.telemetry.progress.metric_values(result, "docscore") (keys NAMESPACE/name):
    start (first batch), warm (batch WARMUP_BATCHES; None in shorter runs), peak, end (the latest sample),
    growth after warm-up in percent, and device memory where the backend reports it. peak is the process's
    high-water mark at its last sample (a call's peak between samples included), or the largest sample where
    there is none. With several workers, start/warm/peak are the largest worker's and end is whichever worker
    sampled last."""
    def get(name: str) -> Any:
        return metrics.get(f"{NAMESPACE}/{name}")

    rss, start, warm, end = get("rss_mb") or {}, get("rss_mb_start") or {}, get("rss_mb_warm") or {}, get("rss_mb_end")
    peaks = [value for value in (rss.get("max"), (get("rss_high_water_mb") or {}).get("max")) if value is not None]
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
        "peak_rss_mb": max(peaks) if peaks else None,
        "end_rss_mb": end,
        "mean_rss_mb": (rss["sum"] / rss["count"]) if rss.get("count") else None,
        "growth_after_warmup_pct": growth,
        "device": device,
    }


# ---- before the run: does one model call of --batch_size rows fit? ------------------------------------

ACTIVATION_BYTES = 4  # the layers compute and return float32 whatever --dtype (bfloat16 only casts matmul inputs)
HEADROOM = 2  # a suggested --batch_size leaves half the room to everything else (Beam, tokenizer, outputs)


@dataclasses.dataclass(frozen=True)
class CallEstimate:
    """Bytes one model call needs: the parameters (float32, resident while the model is loaded) and the
    call's activations at their peak (the largest of one layer's intermediates and the output head's)."""

    parameters: int
    activations: int

    @property
    def total(self) -> int:
        return self.parameters + self.activations


def parameter_count(config) -> int:
    """Parameters of a models.ModelConfig, counted from the shapes its family's module holds
    (models/architecture.py every_param_shape, no weights made: two layers traced), as the loader checks a
    checkpoint against them."""
    from models.architecture import every_param_shape

    return sum(math.prod(leaf.shape) for leaf in every_param_shape(config).values())


def score_block(attention: str) -> tuple[int, int] | None:
    """The kernel's `score_block` (kernels/interface.py); a name the table does not hold is taken as XLA's."""
    from kernels import table

    impl = table.IMPLEMENTATIONS.get(attention)
    return impl.score_block if impl is not None else None


def call_estimate(config, *, batch_size: int, seq_len: int, dtype: str, attention: str,
                  per_token: bool | None = None) -> CallEstimate:
    """The memory one model call of batch_size rows x seq_len tokens needs (a models.ModelConfig; the
    resolved kernel name). Activations are one layer's at a time, since inference keeps none across layers:
    four [rows, L, hidden] float32 tensors (the stream, q/k/v, attention output), one [rows, L,
    intermediate] (three in a gated MLP, ModelConfig.gated_mlp: gate(x), up(x) and their product;
    tests/test_batch_memory.py measures both), and the attention scores and probabilities,
    [rows, heads, L, L] float32 each, or one block's, or none, as the kernel's `score_block` says; bfloat16 adds
    a copy of the layer's weights.
    Or the output head's when larger: a decoder's logits twice (log-softmax) for one block of positions
    (models/heads.py logits_block_positions; all of them for a small vocabulary or call) when the call scores
    tokens (`per_token`; None: a decoder's calls do), else the pooling's segment one-hot. Within 0.9-1.3x of what XLA's compiled programs report for MiniLM and GPT-2 on CPU
    (tests/test_batch_memory.py); calls of shorter packed rows hold the same tokens and fewer scores."""
    from models.heads import logits_block_positions
    from pipeline.stages.packing import max_segments_for

    rows, length = int(batch_size), int(seq_len)
    tokens = rows * length
    h, i = config.hidden_size, config.intermediate_size
    gated = config.gated_mlp
    block_q, block_k = score_block(attention) or (length, length)
    scores = 2 * rows * config.num_heads * min(length, block_q) * min(length, block_k)
    layer = (4 * tokens * h + (3 if gated else 1) * tokens * i + scores) * ACTIVATION_BYTES
    if dtype == "bfloat16":
        layer += 2 * (4 * h * h + (3 if gated else 2) * h * i)
    if not (per_token if per_token is not None else not config.is_encoder):
        head = (tokens * h + tokens * max_segments_for(length)) * ACTIVATION_BYTES  # the pooling's segment one-hot
    else:
        block = logits_block_positions(rows, max(length - 1, 1), config.vocab_size)
        head = (tokens * h + 2 * rows * block * config.vocab_size) * ACTIVATION_BYTES
    inputs = 2 * tokens * 4  # int32 ids and segment ids
    return CallEstimate(parameters=parameter_count(config) * 4, activations=max(layer, head) + inputs)


def device_memory_room(devices) -> MemoryRoom | None:
    """The smallest bytes_limit - bytes_in_use of the devices' memory_stats() (the loaded model's parameters
    are already in use there); None when a device reports no limit (CPU, some backends)."""
    free = smallest_free(devices)
    if free is None:
        return None
    room, device = free
    return MemoryRoom(room, f"free on {device.platform}:{device.id} (memory_stats bytes_limit - bytes_in_use)",
                      per_device=True)


def local_memory_room(backend: str) -> MemoryRoom | None:
    """The room on this process's `backend`: the host's for cpu, the devices' allocator for gpu/tpu (None
    when they report no limit: nothing is checked then)."""
    if backend == "cpu":
        return host_memory_room()
    import jax

    return device_memory_room(jax.local_devices(backend=backend))


def batch_size_problem(config, *, batch_size: int, seq_len: int, dtype: str, attention: str, room: MemoryRoom,
                       devices: int = 1, concurrent_calls: int = 1, model_copies: int = 0,
                       per_token: bool | None = None) -> str | None:
    """Why one model call of batch_size rows x seq_len tokens cannot fit `room`, naming --batch_size, the
    estimate, the limit and a value that fits (with room to spare); None when it fits. On an accelerator
    (room.per_device) each of `devices` holds its share of the rows. `concurrent_calls` calls may run at
    once (worker threads or processes) and `model_copies` more copies of the parameters are loaded
    (worker processes) beside the one already in memory."""
    share = -(-batch_size // devices) if room.per_device else batch_size

    def needed(rows: int) -> int:
        estimate = call_estimate(config, batch_size=rows, seq_len=seq_len, dtype=dtype, attention=attention,
                                 per_token=per_token)
        return concurrent_calls * estimate.activations + model_copies * estimate.parameters

    if needed(share) <= room.bytes:
        return None
    per_row = (needed(2) - needed(1)) // max(1, concurrent_calls)  # one call's row (the estimate grows linearly in rows)
    fits = 0
    while needed((2 * fits or 1)) <= room.bytes // HEADROOM:  # the largest power of two with room to spare
        fits = 2 * fits or 1
    where = f" per device ({devices} devices share a call's rows)" if room.per_device and devices > 1 else ""
    if not fits and (concurrent_calls > 1 or model_copies > 1):  # the workers, not the batch, are what does not fit
        return (f"--direct_num_workers: {concurrent_calls} model calls at once of --batch_size={batch_size} rows x "
                f"{seq_len} tokens (and {model_copies} more copies of the model) need about "
                f"{format_bytes(needed(share))}{where}, more than the {format_bytes(room.bytes)} {room.source}; use fewer "
                "--direct_num_workers (or a smaller --batch_size, a shorter --max_seq_len)")
    workers = f" for {concurrent_calls} calls at once (--direct_num_workers)" if concurrent_calls > 1 else ""
    if fits:
        fix = f"use --batch_size={fits * (devices if room.per_device else 1)} or less"
    else:
        fix = (f"even --batch_size={devices if room.per_device else 1} does not fit: use a shorter --max_seq_len"
               + (" or --attention=flash (no [L, L] scores)" if score_block(attention) is None else ""))
    return (f"--batch_size={batch_size}: a model call of {batch_size} rows x {seq_len} tokens needs about "
            f"{format_bytes(needed(share))}{where}{workers} ({attention} attention, {dtype}: {format_bytes(per_row)} per row), more "
            f"than the {format_bytes(room.bytes)} {room.source}; {fix}")

