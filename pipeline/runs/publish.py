"""The end of a run as a step of the Beam job itself: once every table write is complete (their
results are the step's side inputs: Beam's wait-on pattern), build summary.json from the in-pipeline
run stats, commit the run's tables, history row and summary as one unit (pipeline/io/run_commit.py),
and write the report of the committed run. So a job nobody waits for (Flex Template, --template_location)
publishes its own tables. Also the launcher's side: whether it waits, and what it adds after a wait.
Must not compute run statistics (pipeline/telemetry/stats.py) nor lay out the summary (pipeline/runs/summary.py).
"""
from __future__ import annotations

import json
import logging
import posixpath
import time
from collections.abc import Callable
from typing import Any

import apache_beam as beam
import fsspec
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, TestOptions

from pipeline.io import run_commit, run_lease, sinks, sources
from pipeline.runs import history
from pipeline.runs.summary import add_metrics, summary_from_stats, with_command_wall

_LOG = logging.getLogger(__name__)


def write_derived(spec: sinks.OutputSpec, summary: dict[str, Any]) -> dict[str, str]:
    """The report of a committed run (replaced whole, safe to repeat). Called by the job's Publish step, or
    by a waiting local launcher once it has added what only it knows (Beam metrics, progress samples). A
    failure here leaves the committed run as it is: it is logged with the command that redoes it."""
    if spec.output.startswith(sinks.BQ_PREFIX):
        return {}  # the run's row in PREFIX_runs is its history; reports read file outputs only
    from pipeline.runs import report

    try:
        return {"report": report.write_report(spec.output, spec.run_id)}
    except Exception as e:  # the run is committed; a missing report must not undo that
        _LOG.warning("docscore run %s: the report was not written (%s: %s); the run is published; "
                     "rerun `docscore report %s/runs/run_id=%s` for the report", spec.run_id,
                     type(e).__name__, e, spec.output, spec.run_id)
        return {}


def publish_run(spec: sinks.OutputSpec, facts: dict[str, Any], stats: dict[str, Any],
                written: dict[str, list[str]] | None, *, derived: bool) -> dict[str, Any]:
    """Summary from the run stats, then the run committed as one unit (pipeline/io/run_commit.py), then
    (derived=True) the report. Safe to repeat, as a retried Beam bundle does: a launch that already
    committed only cleans up again."""
    summary = summary_from_stats(facts, stats, time.time())
    if spec.output.startswith(sinks.BQ_PREFIX):
        from pipeline.io import bigquery

        run_commit.remove_staging(spec.staging)  # the load jobs are done; the BigQuery transaction publishes
        bigquery.publish(spec, summary)  # the summary becomes the run's PREFIX_runs row
        return summary
    with run_commit.COMMIT_LOCK:
        committed = run_commit.summary_to_replace(spec.output, spec.run_id)
        if committed is None or committed.get(run_commit.LAUNCH_KEY) != spec.launch:
            committed = commit_launch(spec, summary, written)
    try:  # the run is published: what this leaves, a later launch of the run removes, so a store lost now fails nothing
        run_commit.clean_after_commit(spec.output, spec.run_id)
        run_commit.remove_staging(spec.staging)
    except Exception as e:
        if not (isinstance(e, OSError) or sources.is_transient(e)):
            raise
        _LOG.warning("docscore run %s: published; cleaning up after the commit failed (%s: %s): the run's next launch "
                     "removes what is left", spec.run_id, type(e).__name__, str(e)[:300])
    if derived:
        write_derived(spec, committed)
    return committed


def set_aside_previous_report(spec: sinks.OutputSpec) -> str | None:
    """The replaced run's report.html will not describe the run about to be committed: moved aside just before
    the commit (a hidden name in the same folder, which no reader opens), so no reader ever finds it beside the
    new summary. Returns where it went (put_back_report restores it if the commit fails), or None."""
    fs, path = fsspec.core.url_to_fs(run_commit.report_path(spec.output, spec.run_id))
    aside = posixpath.join(posixpath.dirname(path), f".{run_commit.REPORT_FILE}.{spec.launch}.docscore-tmp")
    try:
        run_commit.move(fs, path, aside)
    except FileNotFoundError:
        return None
    except OSError as e:  # a report left behind must not fail the commit
        _LOG.warning("docscore run %s: could not move the replaced run's report %s aside (%s: %s)", spec.run_id, path,
                     type(e).__name__, e)
        return None
    return aside


def settle_report(spec: sinks.OutputSpec, aside: str | None, committed: bool) -> None:
    """After the commit: the set-aside report goes; after a failed commit it comes back, since the previous run is
    still the published one (and a launch stopped before it writes its own leaves no report, which `docscore
    report` writes, rather than the old one)."""
    if aside is None:
        return
    fs, path = fsspec.core.url_to_fs(run_commit.report_path(spec.output, spec.run_id))
    try:
        fs.rm_file(aside) if committed else run_commit.move(fs, aside, path)
    except OSError as e:
        _LOG.warning("docscore run %s: could not %s the replaced run's report %s (%s: %s)", spec.run_id,
                     "remove" if committed else "restore", aside, type(e).__name__, e)


def commit_launch(spec: sinks.OutputSpec, summary: dict[str, Any], written: dict[str, list[str]] | None) -> dict[str, Any]:
    """Place this launch's staged tables and its history row beside the committed run, then commit."""
    files = {table: run_commit.place_staged(spec.output, spec.run_id, spec.launch, table,
                                            sinks.staged_files(spec, table, written))
             for table in sinks.TABLES}
    files["history"] = [history.write_history_row(spec.output, summary, spec.launch)]
    if spec.leased:
        run_lease.check_holder(spec.output, spec.run_id, spec.launch)
    aside = set_aside_previous_report(spec)
    try:
        committed = run_commit.commit(spec.output, spec.run_id, summary, files, spec.launch)
    except BaseException:
        settle_report(spec, aside, committed=False)
        raise
    settle_report(spec, aside, committed=True)
    return committed


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
    if options.view_as(TestOptions).dry_run:  # Beam's dry run returns before it writes --template_location too
        written = f" nor written to --template_location {template}" if template else ""
        return f"--dry_run: the job was built and translated, not submitted{written}"
    if template:
        return f"the job was written to --template_location {template} (a Flex Template launch submits it)"
    return None


def submitted_message(run_id: str, spec: sinks.OutputSpec, why: str, plan_line: str = "") -> str:
    """What a launch that does not wait says: why, what the job will run (plan_line), where it will publish."""
    where = "\n".join(f"  {name:<8} {path}" for name, path in sinks.published_paths(spec).items())
    planned = f"\n  planned  {plan_line}" if plan_line else ""
    return f"docscore run {run_id}: {why}; when the job runs, its Publish step writes\n{where}{planned}"


def plan_line(eo, plan) -> str:
    """The run as planned for its workers, in one line: backend, kernel, dtype, batch settings, and for Dataflow
    the machine, accelerator and image the job names."""
    given = eo.get_all_options()
    workers = [f"{name} {given[option]}" for name, option in (("machine", "machine_type"), ("image", "sdk_container_image"))
               if given.get(option)]
    accelerator = next((str(o).partition("=")[2] for o in given.get("dataflow_service_options") or []
                        if str(o).startswith("worker_accelerator=")), None)
    return ", ".join([f"backend {plan.target_backend}", f"kernel {plan.kernel}", f"dtype {eo.dtype}",
                      f"batch_size {plan.batch.batch_size}", f"{plan.batch.calls_per_beam_batch} calls per Beam batch",
                      *([f"accelerator {accelerator}"] if accelerator else []), *workers])


def enrich_published_summary(spec: sinks.OutputSpec, metrics: dict[str, Any], phase_starts: dict[str, float] | None = None,
                             finish: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """After a wait: the summary the job committed, with the job's Beam metrics, (given when the command and
    its phases started, summary.with_command_wall) the whole command's wall time and its phases, and `finish`'s additions (the launcher's gates); when they add
    anything, the summary and then the history row are rewritten (each atomically; same launch, same
    files: a launch stopped between them leaves the history row saying less than the summary, never more).
    None for BigQuery outputs (their summary is the run's PREFIX_runs row, not read back here)."""
    if spec.output.startswith(sinks.BQ_PREFIX):
        return None
    summary = run_commit.committed_summary(spec.output, spec.run_id)
    if summary is None or summary.get(run_commit.LAUNCH_KEY) != spec.launch:
        raise run_commit.CommitError(f"run {spec.run_id}: this launch ({spec.launch}) has no committed summary under {spec.output}")
    enriched = add_metrics(summary, metrics)
    if phase_starts is not None:
        enriched = with_command_wall(enriched, phase_starts, time.monotonic())
    if finish is not None:
        enriched = finish(enriched)
    if enriched is not summary:
        run_commit.rewrite_summary(spec.output, enriched)
        try:
            history.write_history_row(spec.output, enriched, spec.launch)
        except Exception as e:
            raise HistoryRowNotRewritten(enriched, e) from e
    return enriched


class HistoryRowNotRewritten(Exception):
    """The enriched summary was written but the history row was not (a disk that filled between them): the run's
    summary and report can say everything, its history row only what the job committed."""

    def __init__(self, summary: dict[str, Any], error: BaseException):
        super().__init__(f"{type(error).__name__}: {str(error)[:300]}")
        self.summary = summary
