"""After inference: a PredictionResult of a list of documents -> their scores-table rows (plus the small
per-document stats the run summary aggregates). A thin Beam DoFn over the task's scoring (pipeline/tasks/); a
document that cannot be scored becomes an ErrorRow. Must not hold scoring math (scoring.py) or write files (sinks.py).
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import apache_beam as beam
import numpy as np

from pipeline import tasks
from pipeline.records import ERRORS_TAG, TIMING_COLUMNS, Batch, ErrorRow
from pipeline.stages import shadow
from pipeline.stages.inference import InferenceOutput
from pipeline.stages.preprocess import TokenizedDoc
from pipeline.telemetry import timing

STATS_TAG = "stats"


@dataclasses.dataclass(frozen=True)
class ScoreSpec:
    task: str
    run_id: str
    temperature: float = 0.05
    stride: int = 0
    prefix_len: int = 0  # special tokens before the text in each window (loglik overlap)
    suffix_len: int = 0  # special tokens after the text in each window (loglik scores them in the last window only)


@dataclasses.dataclass
class DocStats:
    """What the run summary needs from one scored document."""

    timings: dict[str, float]
    n_tokens: int
    window_tokens: int  # real tokens the model computed (special tokens and query included)
    computed_tokens: float  # this document's share of the padded shapes computed
    prediction: Any = None  # the task's (Task.prediction): similarity: cosine; classify: label; loglik: total log-likelihood; choice: chosen indexes
    gold: Any = None  # the record's `label` field; loglik: scored token count
    model_id: str = ""
    attention_impl: str = ""
    fingerprint: str = ""
    backend: str = ""
    shadow: shadow.Divergence | None = None  # set when the document was shadowed (--shadow_attention)
    doc_id: str = ""  # the summary counts doc_ids scored more than once


@dataclasses.dataclass
class TaskInput:
    """What a task scores one document from (pipeline/tasks/base.py, WindowOutputs): its model outputs and
    what its task's own tokenize said of its windows."""

    window_outputs: list
    query_outputs: list
    label_names: tuple[str, ...]
    label_embeddings: Any
    spans: Any = None
    truncated: bool = False  # --max_chunks cut the text: its last window is not the document's end


def task_fields(spec: ScoreSpec, output: InferenceOutput, spans: Any = None, truncated: bool = False) -> dict[str, Any]:
    """The task's columns (score, label, scores, embedding, perplexity, ...) from window outputs."""
    return tasks.get(spec.task).score(TaskInput(output.window_outputs, output.query_outputs, output.label_names,
                                                output.label_embeddings, spans, truncated), spec)


def gold_value(value: Any) -> Any:
    """A record's gold label as the tasks read it: none for a non-finite number (NaN names no class and no
    similarity) and for empty text; true/false in JSON's spelling (as ids are); a whole number as an int (1.0,
    pandas' float64 for an integer column with a missing value, is the class 1, as an id is); text without
    the whitespace around it (as --labels names are read); anything else as it is."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return int(value) if value.is_integer() else value
    if isinstance(value, str):
        return value.strip() or None
    return value


def score_row(spec: ScoreSpec, tokenized: TokenizedDoc, output: InferenceOutput) -> tuple[dict[str, Any], DocStats]:
    start = time.perf_counter()
    fields = task_fields(spec, output, tokenized.spans, tokenized.truncated)
    doc = tokenized.doc
    gold = gold_value(doc.fields.get("label"))
    row = {
        "run_id": spec.run_id,
        "doc_id": doc.doc_id,
        "source": doc.source,
        "record_index": doc.record_index,
        "task": spec.task,
        "score": fields.get("score"),
        "label": fields.get("label"),
        # a task that reads the gold itself (choice: an index) says how it reads
        "gold_label": fields["gold_label"] if "gold_label" in fields else None if gold is None else str(gold),
        "scores": fields.get("scores"),
        "embedding": fields.get("embedding"),
        "perplexity": fields.get("perplexity"),
        "choice_tokens": fields.get("choice_tokens"),
        "choice_bytes": fields.get("choice_bytes"),
        "n_tokens": tokenized.n_tokens,
        "n_chunks": len(tokenized.windows),
        "truncated": tokenized.truncated,
        "model_id": output.model_id,
        "attention_impl": output.attention_impl,
        "read_ms": doc.read_ms,
        "tokenize_ms": tokenized.tokenize_ms,
        "infer_ms": output.infer_ms,
    }
    row["postprocess_ms"] = (time.perf_counter() - start) * 1000.0
    divergence = shadow_divergence(spec, output, fields, tokenized.spans, tokenized.truncated)  # after the timing: it is not the run's own work
    row.update(shadow_columns(output, divergence))
    prediction, stats_gold = tasks.get(spec.task).prediction(fields, gold)
    stats = DocStats(
        timings={c: row[c] for c in TIMING_COLUMNS},
        n_tokens=tokenized.n_tokens,
        window_tokens=sum(len(w) for w in tokenized.windows + tokenized.query_windows),
        computed_tokens=output.computed_tokens,
        prediction=prediction,
        gold=stats_gold,
        model_id=output.model_id,
        attention_impl=output.attention_impl,
        fingerprint=output.fingerprint,
        backend=output.backend,
        shadow=divergence,
        doc_id=doc.doc_id,
    )
    return row, stats


def shadow_divergence(spec: ScoreSpec, output: InferenceOutput, fields: dict[str, Any],
                      spans: Any = None, truncated: bool = False) -> shadow.Divergence | None:
    """The document scored again from the shadow kernel's outputs, and how far both results are apart."""
    if output.shadow is None:
        return None
    other = output.shadow
    shadow_fields = task_fields(spec, dataclasses.replace(
        output, window_outputs=other.window_outputs, query_outputs=other.query_outputs,
        label_embeddings=other.label_embeddings, shadow=None,
    ), spans, truncated)
    return shadow.measure(output.window_outputs + output.query_outputs, other.window_outputs + other.query_outputs,
                          fields, shadow_fields)


def shadow_columns(output: InferenceOutput, divergence: shadow.Divergence | None) -> dict[str, Any]:
    if divergence is None:
        return dict.fromkeys(("shadow_attention_impl", "shadow_output_max_abs_diff", "shadow_output_mean_abs_diff",
                              "shadow_score_abs_diff", "shadow_label_flip"))
    return {
        "shadow_attention_impl": output.shadow.attention_impl,
        "shadow_output_max_abs_diff": divergence.output_max_abs,
        "shadow_output_mean_abs_diff": divergence.output_mean_abs,
        "shadow_score_abs_diff": divergence.score_abs,
        "shadow_label_flip": divergence.label_flip,
    }


OVERFLOWED = ("a value overflowed inside the model (its weights or --dtype out of range for this text); documents "
              "packed into a model row with it were run again without it")


def unusable_output(output: InferenceOutput, per_token: bool) -> tuple[str, str] | None:
    """(error type, message) when the model's output for a document (its text's windows or its query's) cannot
    be scored: NaN anywhere, or an embedding of zeros (its norm overflowed: no direction, so classify would name
    the first label and every cosine would be 0); None otherwise."""
    windows = output.window_outputs + output.query_outputs
    if any(np.isnan(o).any() for o in windows):
        return "nan_output", f"the model's output for this document (its text or its query) is NaN: {OVERFLOWED}"
    if not per_token and any(not np.any(o) for o in windows):
        return "zero_output", f"the model embeds this document (its text or its query) as zeros: {OVERFLOWED}"
    return None


def score_documents(spec: ScoreSpec, docs: list[TokenizedDoc], outputs: list[InferenceOutput]
                    ) -> tuple[list[dict[str, Any]], list[DocStats], list[ErrorRow]]:
    """score_row of each document: its row and stats, or an ErrorRow when its outputs cannot be scored."""
    rows, stats, errors = [], [], []
    for tokenized, output in zip(docs, outputs, strict=True):
        unusable = unusable_output(output, tasks.get(spec.task).per_token)
        if unusable:
            doc = tokenized.doc
            errors.append(ErrorRow(doc.source, doc.record_index, "infer", *unusable, doc_id=doc.doc_id))
            continue
        try:
            row, doc_stats = score_row(spec, tokenized, output)
        except Exception as e:  # a document whose outputs cannot be scored is an error row
            doc = tokenized.doc
            errors.append(ErrorRow(doc.source, doc.record_index, "score", type(e).__name__, str(e), doc_id=doc.doc_id))
            continue
        rows.append(row)
        stats.append(doc_stats)
    return rows, stats, errors


class ScoreDocuments(beam.DoFn):
    """Beam adapter: a PredictionResult of a list of documents in; the list of their scores rows out, the
    list of their DocStats on 'stats', an ErrorRow per unscorable document on 'errors'."""

    def __init__(self, spec: ScoreSpec):
        self._spec = spec
        self._stage_metrics = timing.StageMetrics()

    def process(self, result):
        rows, stats, errors = score_documents(self._spec, result.example, result.inference)
        for error in errors:
            yield beam.pvalue.TaggedOutput(ERRORS_TAG, error)
        for doc_stats in stats:
            self._stage_metrics.record(doc_stats.timings)
        if rows:
            yield Batch(rows)
            yield beam.pvalue.TaggedOutput(STATS_TAG, Batch(stats))


def inference_failures_to_errors(failure) -> list[ErrorRow]:
    """RunInference's dead letter (batch of document lists, (exception type, repr, traceback)) -> one
    ErrorRow per document."""
    batch, (exc_type, exc_repr, *_rest) = failure
    name = getattr(exc_type, "__name__", str(exc_type))
    return [
        ErrorRow(doc.doc.source, doc.doc.record_index, "infer", name, str(exc_repr), doc_id=doc.doc.doc_id)
        for chunk in batch for doc in chunk
    ]
