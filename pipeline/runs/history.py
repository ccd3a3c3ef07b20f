"""Run history: one row per finished run, written as DIR/runs/run_id=ID/history-LAUNCH.parquet, a file
of the run's commit (pipeline/io/run_commit.py: the committed summary.json names it).

Holds the history table's schema and the flattening of a run's summary.json into that row; each
run writes its own file, so analysts read every run's row through the committed summaries
(docs/queries.md, the `history` view). Must not compute anything the run did not record, nor read the
scores or errors tables.
"""
from __future__ import annotations

import datetime
import posixpath
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io import run_commit
from pipeline.telemetry.timing import STAGES


# Where each value lives in summary.json (dotted paths, as pipeline/runs/summary.py writes
# it), in one place so a change of the summary's layout is one edit here. The report reads the
# summary through these too.
RUN_ID = "run_id"
STARTED_AT = "started_at"
FINISHED_AT = "finished_at"
WALL_S = "wall_s"
DESCRIPTION = {
    "task": "task",
    "input": "config.input",
    "runner": "runner.runner",
    "model": "model.name",
    "model_id": "model.model_id",
    "model_fingerprint": "model.fingerprint",
    "attention": "kernel.requested",
    "attention_impl": "kernel.resolved",
    "dtype": "model.dtype",
}
BACKEND_WORKERS = "backend.workers"  # list of backends the workers ran on
BACKEND_LAUNCHER = "backend.launcher"
COUNTS = {"input_records": "counts.records", "scored": "counts.scored", "errors": "counts.errors"}
ERRORS_BY_TYPE = "counts.errors_by_type"  # {"stage/error_type": n}
ERROR_FRACTION = "counts.error_fraction"
NUMBERS = {
    "docs_per_s": "throughput.docs_per_s",
    "tokens_per_s": "throughput.tokens_per_s",
    "padding_efficiency": "tokens.padding_efficiency",
    "compile_ms": "compile.time_ms",
    "peak_rss_mb": "memory.peak_rss_mb",
}
COMPILE_COUNT = "compile.count"
TASK_METRICS = "task_metrics"
VERSIONS = "versions"
STAGE_TIMING = "timing.stages"  # {stage: {"total_ms", "p50", "p95", "p99"}} (milliseconds)
SHADOW = "shadow"  # present when the run had --shadow_attention (pipeline/stages/shadow.py)
SHADOW_COLUMNS = {
    "shadow_attention_impl": ("shadow.impl", pa.string()),
    "shadow_documents": ("shadow.documents", pa.int64()),
    "shadow_output_max_abs_diff": ("shadow.output_max_abs_diff", pa.float64()),
    "shadow_score_max_abs_diff": ("shadow.score_max_abs_diff", pa.float64()),
    "shadow_passed": ("shadow.passed", pa.bool_()),
}

GATE_COLUMNS = {  # the launcher's --max_error_fraction gate (exit 4 when it fails); null for a job it did not wait for
    "max_error_fraction": ("gates.error_fraction.limit", pa.float64()),
    "error_gate_passed": ("gates.error_fraction.passed", pa.bool_()),
}

RUN_COST_COLUMNS = {  # what the run cost besides its throughput (#24): null where the summary has no value
    "command_wall_s": ("command_wall_s", pa.float64()),  # the whole `docscore run` command
    "device_busy_fraction": ("device.busy_fraction", pa.float64()),  # one process's model-call time over wall_s
    "host_us_per_doc": ("device.host_us_per_doc", pa.float64()),
    "compile_cold_count": ("compile.cold_count", pa.int64()),  # compiled by XLA
    "compile_cached_count": ("compile.cached_count", pa.int64()),  # read from the persistent compilation cache
    "batch_size": ("batching.batch_size", pa.int64()),  # rows a model call
}

SETTINGS_COLUMNS = {  # what else shapes the outputs beside model and dtype (compare's settings): a drift over time
    "pooling": ("model.pooling", pa.string()),  # mean | cls | lasttoken; null for a per-token task
    "max_seq_len": ("model.max_seq_len", pa.int64()),  # tokens per window as run, the flag or the model's
    "matmul_precision": ("model.matmul_precision", pa.string()),
    "document_prompt": ("model.prompts.document", pa.string()),  # null: no prompt before the documents
    "query_prompt": ("model.prompts.query", pa.string()),
}

HISTORY_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("started_at", pa.timestamp("us", tz="UTC")),
        pa.field("finished_at", pa.timestamp("us", tz="UTC")),
        pa.field("wall_s", pa.float64()),
        pa.field("task", pa.string()),
        pa.field("input", pa.string()),
        pa.field("runner", pa.string()),
        pa.field("backend", pa.string()),  # where inference ran (workers), e.g. cpu | tpu | gpu
        pa.field("model", pa.string()),
        pa.field("model_id", pa.string()),
        pa.field("model_fingerprint", pa.string()),
        pa.field("attention", pa.string()),  # as requested: auto | native | flash | IMPL
        pa.field("attention_impl", pa.string()),  # as resolved: xla | blockwise | ...
        pa.field("dtype", pa.string()),
        *[pa.field(name, type_) for name, (_, type_) in SETTINGS_COLUMNS.items()],
        pa.field("input_records", pa.int64()),
        pa.field("scored", pa.int64()),
        pa.field("errors", pa.int64()),
        pa.field("error_rate", pa.float64()),  # errors / input_records
        pa.field("docs_per_s", pa.float64()),
        pa.field("tokens_per_s", pa.float64()),
        pa.field("padding_efficiency", pa.float64()),
        pa.field("compile_count", pa.int64()),
        pa.field("compile_ms", pa.float64()),
        pa.field("peak_rss_mb", pa.float64()),
        *[pa.field(f"{stage}_{stat}_ms", pa.float64()) for stage in STAGES for stat in ("p50", "p95")],
        pa.field("task_metrics", pa.map_(pa.string(), pa.float64())),  # accuracy, macro_f1, spearman, ...
        *[pa.field(name, type_) for name, (_, type_) in SHADOW_COLUMNS.items()],  # null without a shadow kernel
        *[pa.field(name, type_) for name, (_, type_) in GATE_COLUMNS.items()],
        *[pa.field(name, type_) for name, (_, type_) in RUN_COST_COLUMNS.items()],
    ]
)


def summary_value(summary: dict[str, Any], path: str, unrecorded: Any = None) -> Any:
    """The value at a dotted path of the summary, or `unrecorded` when the run did not record it."""
    value: Any = summary
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return unrecorded
        value = value[part]
    return value


def stage_stats(summary: dict[str, Any], stage: str) -> dict[str, float]:
    """{"total_ms", "p50", "p95", "p99"} (ms) of one stage (e.g. "infer"); empty if not recorded."""
    stats = summary_value(summary, f"{STAGE_TIMING}.{stage}")
    return stats if isinstance(stats, dict) else {}


def history_path(output_dir: str, run_id: str, launch: str) -> str:
    return posixpath.join(run_commit.partition(output_dir, "runs", run_id), run_commit.history_name(launch))


def history_row(summary: dict[str, Any]) -> dict[str, Any]:
    """summary.json (as a dict) -> one row of HISTORY_SCHEMA. Values the run did not record are null."""
    run_id = summary_value(summary, RUN_ID)
    if not run_id:
        raise ValueError(
            "history: the run summary has no run_id; pass the dict written to DIR/runs/run_id=ID/summary.json"
        )
    counts = {name: _int(summary_value(summary, path)) for name, path in COUNTS.items()}
    error_rate = _float(summary_value(summary, ERROR_FRACTION))  # the error gate's value
    if error_rate is None and counts["input_records"]:  # a summary from before counts.error_fraction
        error_rate = (counts["errors"] or 0) / counts["input_records"]
    workers = summary_value(summary, BACKEND_WORKERS)
    backend = ",".join(map(str, workers)) if workers else summary_value(summary, BACKEND_LAUNCHER)
    row: dict[str, Any] = {
        "run_id": str(run_id),
        "started_at": _timestamp(summary_value(summary, STARTED_AT)),
        "finished_at": _timestamp(summary_value(summary, FINISHED_AT)),
        "wall_s": _float(summary_value(summary, WALL_S)),
        **{name: _str(summary_value(summary, path)) for name, path in DESCRIPTION.items()},
        "backend": _str(backend),
        **counts,
        "error_rate": error_rate,
        **{name: _float(summary_value(summary, path)) for name, path in NUMBERS.items()},
        "compile_count": _int(summary_value(summary, COMPILE_COUNT)),
        "task_metrics": _metrics(summary_value(summary, TASK_METRICS)),
    }
    for name, (path, _) in (SHADOW_COLUMNS | GATE_COLUMNS).items():
        row[name] = summary_value(summary, path)
    for name, (path, type_) in (SETTINGS_COLUMNS | RUN_COST_COLUMNS).items():
        row[name] = _AS_TYPE[type_](summary_value(summary, path))
    for stage in STAGES:
        stats = stage_stats(summary, stage)
        for stat in ("p50", "p95"):
            row[f"{stage}_{stat}_ms"] = _float(stats.get(stat))
    return row


def history_table(summaries: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist([history_row(s) for s in summaries], schema=HISTORY_SCHEMA)


def write_history_row(output_dir: str, summary: dict[str, Any], launch: str) -> str:
    """Write (or replace, atomically) the history row of this launch of the run; returns its path relative
    to the output directory, as the committed summary names it."""
    table = history_table([summary])
    path = history_path(output_dir, table["run_id"][0].as_py(), launch)
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer)
    run_commit.write_atomic(path, buffer.getvalue().to_pybytes())
    return run_commit.relative(output_dir, path)


def _timestamp(value: Any) -> datetime.datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        return datetime.datetime.fromtimestamp(value, tz=datetime.timezone.utc)
    parsed = datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.timezone.utc)


def _metrics(value: Any) -> list[tuple[str, float]] | None:
    if not isinstance(value, dict):
        return None
    return [(str(k), float(v)) for k, v in value.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


_AS_TYPE = {pa.int64(): _int, pa.float64(): _float, pa.string(): _str}
