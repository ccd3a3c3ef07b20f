"""The run summary (summary.json) as a dict, in three pure steps: the launcher's facts (config,
versions, backend, kernel, model, start time), completed inside the job from the in-pipeline run
stats and the finish time, and optionally enriched by a waiting launcher with Beam metrics.
Must not read or write files, nor run anything (pipeline/runs/publish.py does that).
"""
from __future__ import annotations

import datetime
import platform
from importlib import metadata
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pipeline.telemetry.progress import LOCAL_RUNNERS, direct_workers, runner_name

if TYPE_CHECKING:  # the job's Publish step imports this module: keep it light
    from pipeline.options import EvalOptions
    from pipeline.validate import RunPlan

VERSIONED = ("docscore", "apache-beam", "jax", "jaxlib", "flax", "orbax-checkpoint", "numpy", "pyarrow", "tokenizers", "fsspec", "gcsfs")
RUNNER_KEYS = ("direct_running_mode", "direct_num_workers")  # beside a DirectRunner's name


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def _utc(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).isoformat()


def runner_facts(options: dict[str, Any]) -> dict[str, Any]:
    """The runner's class name, with the DirectRunner's own options beside it: Beam gives every run their defaults,
    and a Dataflow run's report said 'direct_running_mode=in_memory, direct_num_workers=1'."""
    name = runner_name(options.get("runner"))
    direct = name.endswith("DirectRunner")
    return {"runner": name, **{k: v for k, v in options.items() if direct and k in RUNNER_KEYS and v is not None}}


def launch_facts(eo: EvalOptions, plan: RunPlan, started: float) -> dict[str, Any]:
    """What the launcher knows before the job starts (plain JSON values: it travels inside the job)."""
    import jax

    from models.precision import matmul_precision

    config = {k: v for k, v in eo.get_all_options(current_only=True).items() if k not in ("config",)}
    config["labels"] = plan.labels
    config.pop("classify_labels", None)
    return {
        "run_id": eo.run_id,
        "task": eo.task,
        "started": started,
        "config": config,
        # Beam's class name whichever spelling was given (no --runner: DirectRunner), so the history table's
        # runner column says one name for one runner
        "runner": runner_facts(eo.get_all_options()),
        "versions": versions(),
        "backend": {
            "target": plan.target_backend,
            "launcher": jax.default_backend(),
            "launcher_devices": [str(d) for d in jax.devices()],
        },
        "kernel": {"requested": eo.attention, "resolved": plan.kernel},
        "model": {
            "name": eo.model,
            "family": plan.model_family,
            "model_id": plan.model_id,
            "fingerprint": plan.fingerprint,
            "dtype": eo.dtype,
            # what the workers' LoadedModel traces with: the same function of the ModelSpec they load
            "matmul_precision": matmul_precision(plan.model_spec.dtype, plan.model_spec.matmul_precision),
            "max_seq_len": plan.window_spec.max_len,
            "pooling": plan.pooling,  # mean, cls or lasttoken (the model directory's); null for a per-token task
            "prompts": plan.prompts,  # {"document": ..., "query": ...}: the texts put before them ({}: none)
            # {"mesh": {"data": d, "model": m}, "devices", "reason"}: parameters split over m devices per row shard
            "sharding": plan.sharding,
        },
        "shadow": plan.shadow.summary() if plan.shadow else None,
        "notices": list(plan.notices),
        "batching": plan.batch.summary(plan.window_spec.max_len),
    }


# What the summary's figures mean (docs/summary.md, "Older runs"): raised when a figure's definition changes, so
# compare does not set figures of two definitions against each other. A summary without it is from before 1.
FORMAT_VERSION = 1


def summary_from_stats(facts: dict[str, Any], stats: dict[str, Any], finished: float) -> dict[str, Any]:
    """The summary the job publishes: launch facts + run stats (pipeline/telemetry/stats.py) + wall time.
    What only Beam metrics know (compiles, memory, shadow cost) stays null until add_metrics."""
    wall_s = max(finished - facts["started"], 1e-9)
    summary = {
        "run_id": facts["run_id"],
        "task": facts["task"],
        "format_version": FORMAT_VERSION,
        "started_at": _utc(facts["started"]),
        "finished_at": _utc(finished),
        "wall_s": wall_s,
        "config": facts["config"],
        "runner": facts["runner"],
        "versions": facts["versions"],
        "backend": {**facts["backend"], "workers": stats.get("worker_backend", [])},
        "kernel": {**facts["kernel"], "in_rows": stats.get("attention_impl", [])},
        "model": facts["model"],
        "notices": facts["notices"],  # what validation noted about the configuration (pipeline/validate.py)
        "counts": stats["counts"],
        "timing": {"stages": stats["stages"], "wall_s": wall_s},
        "throughput": {
            "docs_per_s": stats["counts"]["scored"] / wall_s,
            "tokens_per_s": stats["tokens"]["model_tokens"] / wall_s,  # what the model ran: not text cut by --max_chunks
        },
        "tokens": stats["tokens"],
        "batching": facts.get("batching"),
        "compile": {"count": None, "time_ms": None, "model_calls": None, "cached_count": None, "cached_ms": None,
                    "cold_count": None, "cold_ms": None},
        "device": {"busy_s": None, "busy_processes": None, "busy_fraction": None, "host_us_per_doc": None},
        "memory": {"peak_rss_mb": None, "start_rss_mb": None},
        "task_metrics": stats.get("task_metrics", {}),
        "metrics": {},
    }
    if facts.get("shadow") is not None:
        summary["shadow"] = {**facts["shadow"], **stats.get("shadow", {}), "batches": None, "time_ms": None}
    return summary


def with_launcher_compiles(metrics: dict[str, Any], kernel: str, compiles: Sequence[float]) -> dict[str, Any]:
    """The job's Beam metrics plus what the launcher compiled for the run before it (validation's label
    embeddings, LoadedModel.compiles_by_this_thread's [count, seconds, cached count, seconds]), under the names
    the workers count theirs, so the summary's `compile` holds every compile of the command."""
    count, seconds, cached, cached_seconds = compiles
    if not count:
        return metrics
    namespace = f"docscore_inference_{kernel}/"
    added = dict(metrics)
    for name, value in (("compiles", int(count)), ("compile_ms", int(round(seconds * 1000))),
                        ("compiles_cached", int(cached)), ("compile_cached_ms", int(round(cached_seconds * 1000)))):
        added[namespace + name] = added.get(namespace + name, 0) + value
    return added


def add_metrics(summary: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    """A new summary with the Beam metrics a waiting launcher read from the job (pipeline.telemetry.progress.metric_values):
    compiles, model calls, worker memory, shadow cost, and every docscore metric under "metrics"."""
    if not metrics:
        return summary
    from pipeline.telemetry import memory

    infer_ns = f"docscore_inference_{summary['kernel']['resolved']}/"
    counters = {k[len(infer_ns):]: v for k, v in metrics.items() if k.startswith(infer_ns)}
    count, time_ms = int(counters.get("compiles", 0)), int(counters.get("compile_ms", 0))
    cached_count, cached_ms = int(counters.get("compiles_cached", 0)), int(counters.get("compile_cached_ms", 0))
    enriched = {
        **summary,
        "compile": {  # cached: read from the persistent compilation cache; cold: compiled by XLA
            "count": count,
            "time_ms": time_ms,
            "model_calls": int(counters.get("model_calls", 0)),
            "cached_count": cached_count,
            "cached_ms": cached_ms,
            "cold_count": count - cached_count,
            "cold_ms": time_ms - cached_ms,
        },
        "device": device_time(summary, metrics.get("docscore/device_busy_us", 0) / 1e6),
        "memory": memory.summarize(metrics),
        "metrics": metrics,
    }
    if "shadow" in summary:
        shadow_us = counters.get("shadow_batch_us") or {}
        enriched["shadow"] = {
            **summary["shadow"],
            "batches": int(counters.get("shadow_batches", 0)),
            "time_ms": (shadow_us.get("sum") or 0) / 1000.0,
        }
    return enriched


def device_time(summary: dict[str, Any], busy_s: float) -> dict[str, Any]:
    """How busy the model kept its device: busy_s (wall time with a model batch in flight, per process, summed
    over worker processes), its fraction of the pipeline's wall time, and the host's time per scored document
    (pipeline wall minus busy time, over documents): what the chip waited on. The fraction and the host time
    are given for one process only: a sum over processes (a multi_processing run's workers sharing one chip, or
    a remote runner's workers) can exceed the wall time and says nothing of one chip's idle time."""
    wall, scored = summary["wall_s"], summary["counts"]["scored"]
    processes = busy_processes(summary.get("runner") or {})
    one = processes == 1
    return {
        "busy_s": busy_s,
        "busy_processes": processes,
        "busy_fraction": busy_s / wall if one and wall > 0 else None,
        "host_us_per_doc": max(wall - busy_s, 0.0) / scored * 1e6 if one and scored else None,
    }


def busy_processes(runner: dict[str, Any]) -> int | None:
    """How many processes a run's device busy time is summed over: 1 for a local run in the launcher's process
    (threads share one busy clock), --direct_num_workers for local multi_processing, None (not known to the
    launcher) for a remote runner's workers."""
    if runner_name(runner.get("runner")) not in LOCAL_RUNNERS:
        return None
    if runner.get("direct_running_mode") == "multi_processing":
        return direct_workers(runner.get("direct_num_workers"))
    return 1


# The phases of a `docscore run` command, in order: the interpreter and docscore's imports; options, tuning, JAX's
# start, the model's load and the checks; the run's lease and the Beam graph; the Beam job (its workers' set-up,
# the pipeline, its tables committed); the launcher's additions to the committed summary (Beam metrics, gates).
COMMAND_PHASES = ("start", "validate", "prepare", "job", "launcher")


def with_command_wall(summary: dict[str, Any], phase_starts: dict[str, float], now: float) -> dict[str, Any]:
    """The summary with command_wall_s, the whole `docscore run` command (start-up, model load, Beam set-up and
    the job) until its tables were published (wall_s is the pipeline's part), and command_phases_s, the seconds
    of each of COMMAND_PHASES the launcher marked (phase_starts: when each began, time.monotonic(); "start" is the
    process's start), so a slow start-up says where it went."""
    marked = [(phase, phase_starts[phase]) for phase in COMMAND_PHASES if phase in phase_starts]
    ends = [began for _, began in marked[1:]] + [now]
    return {**summary, "command_wall_s": now - phase_starts["start"],
            "command_phases_s": {phase: round(end - began, 3) for (phase, began), end in zip(marked, ends)}}
