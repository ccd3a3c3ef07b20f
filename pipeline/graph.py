"""The Beam graph of `docscore run`: shards -> documents -> tokens -> RunInference -> scores rows -> tables
+ run stats -> Publish (tables and summary.json, pipeline/runs/publish.py). build_pipeline() is the whole
graph, so a local run, a Dataflow dry run and a Flex Template build the same job (pipeline/launch.py runs it;
a local run may leave out one reshuffle: spreads_documents). Must not hold reading, scoring or writing logic
(their modules do), nor run or wait for the job.
"""
from __future__ import annotations

import time

import apache_beam as beam

from pipeline import tasks
from pipeline.io import sinks
from pipeline.io.sources import ReadShard
from pipeline.options import EvalOptions
from pipeline.records import ERRORS_TAG, Batch, error_to_row
from pipeline.runs import publish
from pipeline.runs.summary import launch_facts
from pipeline.stages.inference import RECORD_ERRORS, FlaxModelHandler, RunInference  # Beam's, imported without torch
from pipeline.stages.postprocess import STATS_TAG, ScoreDocuments, ScoreSpec, inference_failures_to_errors
from pipeline.stages.preprocess import Tokenize
from pipeline.telemetry import progress
from pipeline.telemetry.progress import runs_locally
from pipeline.telemetry.stats import ComputeRunStats
from pipeline.validate import RunPlan


def spreads_documents(local: bool, shards: int, local_bundles: int) -> bool:
    """Whether the graph reshuffles the documents' lists over parallel bundles (one shard's lists to several
    workers). Always on a remote runner (Dataflow shuffles to its service). A local runner holds a Reshuffle's
    whole input in memory before the step after it starts, the corpus's text: so only where its bundles would
    otherwise idle, with fewer shards than parallel bundles (Create spreads the shards themselves)."""
    return not local or shards < local_bundles


def build_pipeline(p: beam.Pipeline, eo: EvalOptions, plan: RunPlan, out: sinks.OutputSpec,
                   counter_dir: str | None = None, started: float | None = None) -> dict[str, beam.PCollection]:
    """The whole job: shards -> lists of documents -> windows -> RunInference -> rows -> tables + run stats
    -> Publish, after every table write (`started`: the launch time, for the summary's wall time). The
    returned "scores" and "errors" PCollections hold lists of table rows."""
    # documents travel in lists (ReadShard's chunks) so that every stage pays Beam's per-element cost
    # once per list. Lists declared as Batch get records.BatchCoder, whose size estimate does not pickle the list.
    read = (
        p
        | "Shards" >> beam.Create(list(plan.shards))  # Create reshuffles 2+ shards over the workers itself
        | "ReadShards" >> beam.ParDo(ReadShard(plan.read_spec)).with_output_types(Batch).with_outputs(ERRORS_TAG, main="docs")
    )
    docs = read.docs
    if spreads_documents(runs_locally(p.options), len(plan.shards), plan.batch.local_threads):
        docs = docs | "SpreadDocs" >> beam.Reshuffle()
    tokenized = (
        docs
        | "Tokenize" >> beam.ParDo(Tokenize(plan.model_spec, plan.window_spec, with_query=tasks.get(eo.task).with_query,
                                            max_tokens=plan.batch.beam_batch_tokens(plan.window_spec.max_len)))
        .with_output_types(Batch).with_outputs(ERRORS_TAG, main="docs")
    )
    handler = FlaxModelHandler(
        plan.model_spec,
        task=eo.task,
        **plan.batch.call_shapes(plan.window_spec.max_len),
        calls_per_beam_batch=plan.batch.calls_per_beam_batch,
        kernel=plan.kernel,
        progress_dir=counter_dir,
        labels=plan.labels,
        label_windows=(plan.window_spec.stride, plan.window_spec.max_chunks),
        shadow_spec=plan.shadow,
        profile_dir=eo.profile_dir,
    )
    # the model rejecting a batch's data -> error rows; any other failure -> the runner retries the bundle
    predictions, dead_letters = tokenized.docs | "Infer" >> RunInference(handler).with_exception_handling(exc_class=RECORD_ERRORS)
    infer_errors = dead_letters.failed_inferences | "InferErrors" >> beam.FlatMap(inference_failures_to_errors)
    score_spec = ScoreSpec(
        task=eo.task,
        run_id=eo.run_id,
        temperature=eo.temperature,
        stride=plan.window_spec.stride,
        prefix_len=plan.prefix_len,
        suffix_len=plan.suffix_len,
    )
    scored = (predictions | "Score" >> beam.ParDo(ScoreDocuments(score_spec)).with_output_types(Batch)
              .with_outputs(ERRORS_TAG, STATS_TAG, main="rows"))
    errors = (read[ERRORS_TAG], tokenized[ERRORS_TAG], infer_errors, scored[ERRORS_TAG]) | "AllErrors" >> beam.Flatten()
    error_rows = errors | "ErrorRows" >> beam.Map(lambda error: Batch([error_to_row(error, eo.run_id)]))
    # progress: records read (documents + unreadable records) and finished: documents as their model call
    # finishes (the handler counts them) and the error rows of the stages before (a document whose outputs
    # cannot be scored was counted by its model call)
    _ = read.docs | "CountRead" >> progress.CountProgress(counter_dir, "discovered")
    _ = read[ERRORS_TAG] | "CountUnreadable" >> progress.CountProgress(counter_dir, "discovered")
    _ = ((read[ERRORS_TAG], tokenized[ERRORS_TAG], infer_errors) | "ErrorsBeforeScoring" >> beam.Flatten()
         | "CountErrors" >> progress.CountProgress(counter_dir, "done"))
    written = {"scores": sinks.write_table(scored.rows, "scores", out), "errors": sinks.write_table(error_rows, "errors", out)}
    shadow_tolerance = plan.shadow.tolerance if plan.shadow else None
    stats = (scored[STATS_TAG], errors, read.docs) | "RunStats" >> ComputeRunStats(eo.task, shadow_tolerance)
    facts = launch_facts(eo, plan, time.time() if started is None else started)
    # the history row is committed with the run by the job; the report too, except for a local run, whose
    # launcher writes it (and the history row again) once it has added the Beam metrics and progress samples
    published = stats | "Publish" >> publish.PublishRun(out, facts, written, derived=not runs_locally(p.options))
    return {"scores": scored.rows, "errors": error_rows, "stats": stats, "published": published}
