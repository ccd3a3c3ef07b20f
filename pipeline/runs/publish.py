"""The end of a run as a step of the Beam job itself: once every table write is complete (their
results are the step's side inputs: Beam's wait-on pattern), build summary.json from the in-pipeline
run stats, publish the partitions atomically (pipeline/io/sinks.py), and write the files derived from a
published run (history row, report). So a job nobody waits for (Flex Template, --template_location)
publishes its own tables. Also the launcher's side: whether it waits, and what it adds after a wait.
Must not compute run statistics (pipeline/telemetry/stats.py) nor lay out the summary (pipeline/runs/summary.py).
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, TestOptions

from pipeline.io import sinks
from pipeline.runs.summary import add_metrics, summary_from_stats, with_command_wall

_LOG = logging.getLogger(__name__)


def write_derived(spec: sinks.OutputSpec, summary: dict[str, Any]) -> dict[str, str]:
    """The ONE place for files derived from a published run: its history row and its report, both
    replaced whole (safe to repeat). Called by the job's Publish step, or by a waiting local launcher
    once it has added what only it knows (Beam metrics, progress samples). A failure here leaves the
    published tables as they are: it is logged with the command that redoes it."""
    if spec.output.startswith(sinks.BQ_PREFIX):
        return {}  # the run's row in PREFIX_runs is its history; reports read file outputs only
    from pipeline.runs import history, report

    written: dict[str, str] = {}
    for name, write in (("history", lambda: history.write_history_row(spec.output, summary)),
                        ("report", lambda: report.write_report(spec.output, spec.run_id))):
        try:
            written[name] = write()
        except Exception as e:  # the tables are published; a missing report must not undo that
            _LOG.warning("docscore run %s: the %s was not written (%s: %s); the tables are published; "
                         "rerun `docscore report %s/runs/run_id=%s` for the report", spec.run_id, name,
                         type(e).__name__, e, spec.output, spec.run_id)
    return written


def publish_run(spec: sinks.OutputSpec, facts: dict[str, Any], stats: dict[str, Any],
                written: dict[str, list[str]] | None, *, derived: bool) -> dict[str, Any]:
    """Summary from the run stats, then the atomic publish, then (derived=True) history and report.
    Safe to repeat: a retried bundle republishes the same staged files (pipeline/io/sinks.py publish)."""
    summary = summary_from_stats(facts, stats, time.time())
    sinks.publish(spec, summary, written)
    if derived:
        write_derived(spec, summary)
    return summary


class _PublishFn(beam.DoFn):
    """Thin adapter: the single run-stats element + each table write's results (one side input per
    table, in `tables` order) -> publish_run."""

    def __init__(self, spec: sinks.OutputSpec, facts: dict[str, Any], tables: tuple[str, ...], derived: bool):
        self._spec, self._facts, self._tables, self._derived = spec, facts, tables, derived

    def process(self, stats_json: str, *written_lists: list[str]):
        written = {table: [str(name) for name in names] for table, names in zip(self._tables, written_lists)}
        summary = publish_run(self._spec, self._facts, json.loads(stats_json), written, derived=self._derived)
        yield summary["run_id"]


class PublishRun(beam.PTransform):
    """run-stats JSON (one element) -> the run published; runs only after every PCollection in
    `written` ({table: what sinks.write_table returned}) is complete, because each is a side input of
    its own (not one Flatten of them: Beam's BundleBasedDirectRunner hands a flattened side input
    over before all of its inputs are done)."""

    def __init__(self, spec: sinks.OutputSpec, facts: dict[str, Any], written: dict[str, beam.PCollection], *,
                 derived: bool = True):
        super().__init__()
        self._spec, self._facts, self._written, self._derived = spec, facts, written, derived

    def expand(self, stats_json):
        tables = tuple(self._written)
        side_inputs = [beam.pvalue.AsList(self._written[table]) for table in tables]
        return stats_json | "Publish" >> beam.ParDo(_PublishFn(self._spec, self._facts, tables, self._derived), *side_inputs)


# ---- the launcher's side ----------------------------------------------------------------------


def submit_only(options: PipelineOptions) -> str | None:
    """Why `docscore run` returns as soon as the job is built, or None when it waits for the job.
    It waits for every job it runs (Dataflow included: Ctrl-C stops the wait, not the job, which
    publishes its own tables); it cannot wait for a job it only writes down or translates."""
    template = options.view_as(GoogleCloudOptions).template_location
    if template:
        return f"the job was written to --template_location {template} (a Flex Template launch submits it)"
    if options.view_as(TestOptions).dry_run:
        return "--dry_run: the job was built and translated, not submitted"
    return None


def submitted_message(run_id: str, spec: sinks.OutputSpec, why: str) -> str:
    where = "\n".join(f"  {name:<8} {path}" for name, path in sinks.published_paths(spec).items())
    return f"docscore run {run_id}: {why}; when the job runs, its Publish step writes\n{where}"


def enrich_published_summary(spec: sinks.OutputSpec, metrics: dict[str, Any], command_started: float | None = None,
                             finish: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """After a wait: the summary the job published, with the job's Beam metrics, (given when the command
    started) the whole command's wall time and `finish`'s additions (the launcher's gates), republished once
    behind its _SUCCESS marker when they add anything. None for BigQuery outputs (their summary is the run's
    PREFIX_runs row, not read back here)."""
    if spec.output.startswith(sinks.BQ_PREFIX):
        return None
    summary = sinks.read_summary(spec)
    enriched = add_metrics(summary, metrics)
    if command_started is not None:
        enriched = with_command_wall(enriched, command_started, time.time())
    if finish is not None:
        enriched = finish(enriched)
    if enriched is not summary:
        sinks.publish_summary(spec, enriched)
    return enriched
