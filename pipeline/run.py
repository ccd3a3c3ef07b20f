"""`docscore run`: parse -> validate (exit 2) -> build the Beam graph -> run -> publish tables and
summary.json -> print where they are. build_pipeline() is the whole graph, so a Dataflow dry run
builds exactly the same job. Must not hold reading, scoring or writing logic (their modules do).
"""
from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from importlib import metadata
from typing import Any

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.ml.inference.base import RunInference

from pipeline import history, progress, report, sinks
from pipeline.inference import FlaxModelHandler
from pipeline.options import ConfigError, EvalOptions, parse_options
from pipeline.postprocess import ERRORS_TAG, STATS_TAG, ScoreDocument, ScoreSpec, inference_failures_to_errors
from pipeline.preprocess import Tokenize
from pipeline.records import error_to_row
from pipeline.sources import ReadShard
from pipeline.stats import ComputeRunStats
from pipeline.timing import STAGES
from pipeline.validate import RunPlan, validate

VERSIONED = ("docscore", "apache-beam", "jax", "jaxlib", "flax", "orbax-checkpoint", "numpy", "pyarrow", "tokenizers", "fsspec", "gcsfs")


def build_pipeline(p: beam.Pipeline, eo: EvalOptions, plan: RunPlan, out: sinks.OutputSpec,
                   counter_dir: str | None = None) -> dict[str, beam.PCollection]:
    """The whole job: shards -> documents -> windows -> RunInference -> rows -> tables + run stats."""
    read = (
        p
        | "Shards" >> beam.Create(list(plan.shards))
        | "SpreadShards" >> beam.Reshuffle()
        | "ReadShards" >> beam.ParDo(ReadShard(plan.read_spec)).with_outputs(ERRORS_TAG, main="docs")
    )
    tokenized = read.docs | "Tokenize" >> beam.ParDo(
        Tokenize(plan.model_spec, plan.window_spec, with_query=eo.task == "similarity")
    ).with_outputs(ERRORS_TAG, main="docs")
    handler = FlaxModelHandler(
        plan.model_spec,
        task=eo.task,
        max_len=plan.window_spec.max_len,
        batch_size=eo.batch_size,
        kernel=plan.kernel,
        labels=plan.labels,
        shadow_spec=plan.shadow,
    )
    predictions, dead_letters = tokenized.docs | "Infer" >> RunInference(handler).with_exception_handling()
    infer_errors = dead_letters.failed_inferences | "InferErrors" >> beam.FlatMap(inference_failures_to_errors)
    score_spec = ScoreSpec(
        task=eo.task,
        run_id=eo.run_id,
        temperature=eo.temperature,
        stride=plan.window_spec.stride,
        prefix_len=plan.prefix_len,
    )
    scored = predictions | "Score" >> beam.ParDo(ScoreDocument(score_spec)).with_outputs(ERRORS_TAG, STATS_TAG, main="rows")
    errors = (read[ERRORS_TAG], tokenized[ERRORS_TAG], infer_errors, scored[ERRORS_TAG]) | "AllErrors" >> beam.Flatten()
    error_rows = errors | "ErrorRows" >> beam.Map(error_to_row, eo.run_id)
    # progress: records read (documents + unreadable records) and finished (scored + error rows)
    _ = read.docs | "CountRead" >> progress.CountProgress(counter_dir, "discovered")
    _ = read[ERRORS_TAG] | "CountUnreadable" >> progress.CountProgress(counter_dir, "discovered")
    _ = scored.rows | "CountScored" >> progress.CountProgress(counter_dir, "done")
    _ = errors | "CountErrors" >> progress.CountProgress(counter_dir, "done")
    sinks.write_table(scored.rows, "scores", out)
    sinks.write_table(error_rows, "errors", out)
    shadow_tolerance = plan.shadow.tolerance if plan.shadow else None
    stats = (scored[STATS_TAG], errors) | "RunStats" >> ComputeRunStats(eo.task, shadow_tolerance)
    sinks.write_stats(stats, out)
    return {"scores": scored.rows, "errors": error_rows, "stats": stats}


def metric_values(result, namespace_prefix: str) -> dict[str, Any]:
    """Counters (value) and distributions (sum/count/min/max) of namespaces starting with the prefix."""
    found: dict[str, Any] = {}
    try:
        query = result.metrics().query(MetricsFilter())
    except Exception:  # a runner without metrics support
        return found
    for kind in ("counters", "distributions"):
        for item in query.get(kind, []):
            if not item.key.metric.namespace.startswith(namespace_prefix):
                continue
            value = item.committed if item.committed is not None else item.attempted
            name = f"{item.key.metric.namespace}/{item.key.metric.name}"
            if kind == "counters":
                found[name] = found.get(name, 0) + value
            else:
                found[name] = {"sum": value.sum, "count": value.count, "min": value.min, "max": value.max}
    return found


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def build_summary(eo: EvalOptions, plan: RunPlan, stats: dict[str, Any], metrics: dict[str, Any], started: float, finished: float) -> dict[str, Any]:
    import jax

    wall_s = max(finished - started, 1e-9)
    infer_ns = f"docscore_inference_{plan.kernel}"
    counters = {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith(infer_ns + "/")}
    rss = counters.get("rss_mb") or {}
    scored = stats["counts"]["scored"]
    config = {k: v for k, v in eo.get_all_options(current_only=True).items() if k not in ("config",)}
    config["labels"] = plan.labels
    config.pop("classify_labels", None)
    return {
        "run_id": eo.run_id,
        "task": eo.task,
        "started_at": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(),
        "finished_at": datetime.datetime.fromtimestamp(finished, datetime.timezone.utc).isoformat(),
        "wall_s": wall_s,
        "config": config,
        "runner": {
            k: v for k, v in eo.get_all_options().items() if k in ("runner", "direct_running_mode", "direct_num_workers") and v is not None
        },
        "versions": versions(),
        "backend": {
            "target": plan.target_backend,
            "launcher": jax.default_backend(),
            "launcher_devices": [str(d) for d in jax.devices()],
            "workers": stats.get("worker_backend", []),
        },
        "kernel": {"requested": eo.attention, "resolved": plan.kernel, "in_rows": stats.get("attention_impl", [])},
        "model": {
            "name": eo.model,
            "family": plan.model_family,
            "model_id": plan.model_id,
            "fingerprint": plan.fingerprint,
            "dtype": eo.dtype,
            "max_seq_len": plan.window_spec.max_len,
        },
        "counts": stats["counts"],
        "timing": {"stages": stats["stages"], "wall_s": wall_s},
        "throughput": {
            "docs_per_s": scored / wall_s,
            "tokens_per_s": stats["tokens"]["text_tokens"] / wall_s,
        },
        "tokens": stats["tokens"],
        "compile": {
            "count": int(counters.get("compiles", 0)),
            "time_ms": int(counters.get("compile_ms", 0)),
            "model_calls": int(counters.get("model_calls", 0)),
        },
        "memory": {"peak_rss_mb": rss.get("max"), "start_rss_mb": rss.get("min")},
        "task_metrics": stats.get("task_metrics", {}),
        "metrics": metrics,
        **shadow_summary(plan, stats, counters),
    }


def shadow_summary(plan: RunPlan, stats: dict[str, Any], counters: dict[str, Any]) -> dict[str, Any]:
    """{"shadow": the --shadow_* settings, the divergence totals and the gate} when the run had a shadow kernel."""
    if plan.shadow is None:
        return {}
    shadow_us = counters.get("shadow_batch_us") or {}
    return {"shadow": {
        **plan.shadow.summary(),
        **stats.get("shadow", {}),
        "batches": int(counters.get("shadow_batches", 0)),
        "time_ms": (shadow_us.get("sum") or 0) / 1000.0,
    }}


def shadow_gate_failure(summary: dict[str, Any]) -> str | None:
    """The message of a failed shadow gate, or None (no shadow kernel, or within tolerance)."""
    gate = summary.get("shadow")
    if gate is None or gate.get("passed", True):
        return None
    return (
        f"shadow gate FAILED: {gate['documents_over_tolerance']} of {gate['documents']} shadowed documents differ by "
        f"more than the tolerance {gate['tolerance']:g} (max |output difference| {gate['output_max_abs_diff']:.3g}, "
        f"{gate['worst_ratio_to_tolerance']:.3g}x the tolerance) between {summary['kernel']['resolved']} and the shadow "
        f"{gate['impl']}; the outputs are published for inspection (scores columns shadow_*); fix the kernel, or pass "
        f"--shadow_tolerance only if this difference is expected"
    )


def print_help() -> None:
    parser = argparse.ArgumentParser(
        prog="docscore run",
        description="Score document shards with a Flax model on Beam. Any Beam option (--runner, "
        "--direct_num_workers, --direct_running_mode, --project, ...) is accepted as well.",
    )
    EvalOptions._add_argparse_args(parser)
    parser.add_argument("--labels", help='classify labels "name=description;name=description" (in --config: a mapping)')
    parser.print_help()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print_help()
        return 0
    try:
        options, eo = parse_options(argv)
        plan = validate(eo)
    except ConfigError as e:
        print(f"docscore run: {e}", file=sys.stderr)
        return 2
    staging_root = eo.get_all_options().get("temp_location") if eo.output.startswith(sinks.BQ_PREFIX) else None
    out = sinks.OutputSpec.for_run(eo.output, eo.run_id, eo.output_format, staging_root)
    started = time.time()
    p = beam.Pipeline(options=options)
    counter_dir = progress.local_counter_dir(options)
    build_pipeline(p, eo, plan, out, counter_dir)
    try:
        result, reporter = progress.run_with_progress(p, counter_dir, display=not eo.no_progress)
        state = result.state
    except Exception as e:  # the job failed: nothing is published, the previous partition stays
        print(f"docscore run {eo.run_id}: the pipeline failed ({type(e).__name__}: {e}); nothing was published", file=sys.stderr)
        return 1
    if state not in (None, "DONE"):
        print(f"docscore run {eo.run_id}: the pipeline ended in state {state}; nothing was published", file=sys.stderr)
        return 1
    finished = time.time()
    stats = sinks.read_stats(out)
    metrics = metric_values(result, "docscore")
    summary = build_summary(eo, plan, stats, metrics, started, finished)
    published = sinks.publish(out, summary)
    if not eo.output.startswith(sinks.BQ_PREFIX):  # after publish: the run's directory now exists
        reporter.write_samples(progress.samples_path(eo.output, eo.run_id))
        history.write_history_row(eo.output, summary)
        published["report"] = report.write_report(eo.output, eo.run_id)
    print_report(summary, published)
    failure = shadow_gate_failure(summary)
    if failure:
        print(f"docscore run {eo.run_id}: {failure}", file=sys.stderr)
        return 3
    return 0


def print_report(summary: dict[str, Any], published: dict[str, str]) -> None:
    counts = summary["counts"]
    print(f"docscore run {summary['run_id']}: {counts['scored']} scored, {counts['errors']} errors "
          f"({counts['records']} records) in {summary['wall_s']:.1f}s "
          f"[{summary['model']['name']}, attention={summary['kernel']['resolved']}, task={summary['task']}]")
    for name, path in published.items():
        print(f"  {name:<8} {path}")
    stages = summary["timing"]["stages"]
    print("  stage ms  " + "  ".join(
        f"{s}: p50 {stages[s].get('p50', 0):.1f} p95 {stages[s].get('p95', 0):.1f}" for s in STAGES if s in stages))
    print(f"  throughput {summary['throughput']['docs_per_s']:.1f} docs/s, {summary['throughput']['tokens_per_s']:.0f} tokens/s; "
          f"padding efficiency {summary['tokens']['padding_efficiency'] or 0:.2f}; compiles {summary['compile']['count']}")
    gate = summary.get("shadow")
    if gate:
        print(f"  shadow {gate['impl']} on {gate['documents']} documents ({gate['batches']} batches): max |output diff| "
              f"{gate['output_max_abs_diff']:.3g}, max |score diff| {gate['score_max_abs_diff']:.3g}, tolerance "
              f"{gate['tolerance']:g} -> {'passed' if gate['passed'] else 'FAILED'}")
    metrics = {k: v for k, v in summary["task_metrics"].items() if v is not None}
    if metrics:
        print("  task metrics " + ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()))
