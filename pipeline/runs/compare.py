"""`docscore compare RUN_A RUN_B`: how run B differs from run A, and whether that is within limits.

Holds the run loading (committed runs only, read through their summary: pipeline/io/run_commit.py), the pure
comparison (score drift, label flips, embedding drift, count and timing changes), the threshold
check and the report. Must not change either run (it only reads them); exit status 1 means a limit
was exceeded, 2 that the runs cannot be compared (missing or unreachable run, different tasks or label sets,
no document in common).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import posixpath
import sys
from collections.abc import Sequence
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa

from pipeline import options
from pipeline.cli import SubcommandParser
from pipeline.io import input_files, run_commit, run_lease, sinks, sources
from pipeline.records import ERRORS_SCHEMA, SCORES_SCHEMA
from pipeline.runs.history import STAGE_TIMING, WALL_S, summary_value
from pipeline.telemetry.timing import STAGES

SCORE_COLUMNS = ("doc_id", "source", "record_index", "task", "score", "label", "embedding")
KEYS = {"source_record": ("source", "record_index"), "doc_id": ("doc_id",)}
EXIT_OK, EXIT_THRESHOLD, EXIT_USAGE = 0, 1, 2
# What a run's scores depend on besides its documents (summary.json paths): compare names those that differ, so a
# drift is read against the change that made it (another model, prompt, dtype, kernel or version), not guessed at.
SETTINGS = ("model.model_id", "model.pooling", "model.prompts", "model.dtype", "model.matmul_precision",
            "model.max_seq_len", "config.stride", "config.max_chunks", "config.text_field",
            "config.labels", "config.temperature", "kernel.resolved", "backend.target", "versions.docscore",
            "versions.jax")
_UNRECORDED = object()

USAGE = """\
RUN_A and RUN_B name a run by one of its published partitions, DIR/<table>/run_id=ID, where <table>
is scores, errors or runs, or by its summary.json or report.html (the paths `docscore run` prints); DIR
may be local or gs://. Documents are matched on (source, record_index) by default (--key doc_id matches
on doc_id). Exit status: 0 within every limit, 1 a limit exceeded (listed), 2 the runs cannot be
compared (runs of one task whose documents cannot be paired, one with none scored among them, are
still checked against --max_count_change: past it, exit 1)."""


class CompareError(Exception):
    """A run cannot be compared (missing or unpublished partition, bad reference); exit 2."""


@dataclasses.dataclass(frozen=True)
class RunRef:
    output_dir: str
    run_id: str

    @classmethod
    def parse(cls, text: str) -> "RunRef":
        if text.startswith(sinks.BQ_PREFIX):
            raise CompareError(bigquery_message(text, "compare"))
        named = run_commit.named_run(text)
        if named is None:
            raise CompareError(
                f"{text!r} is not a run partition; pass DIR/scores/run_id=ID (or DIR/errors/..., DIR/runs/..., or "
                f"the run's summary.json) as printed by `docscore run`")
        return cls(*named)

    def partition(self, table: str) -> str:
        return run_commit.partition(self.output_dir, table, self.run_id)

    def __str__(self) -> str:
        return self.partition("scores")


@dataclasses.dataclass
class LoadedRun:
    ref: RunRef
    scores: pa.Table
    n_errors: int
    summary: dict[str, Any]  # the committed summary.json
    notes: list[str]


@dataclasses.dataclass
class Partition:
    """The committed files of one table of a run, on their file system."""

    fs: Any
    files: list[str]


def committed(ref: "RunRef", table: str, summary: dict[str, Any]) -> Partition:
    fs, _ = fsspec.core.url_to_fs(ref.output_dir or ".")
    return Partition(fs, [run_commit.fs_path(f) for f in run_commit.committed_files(ref.output_dir or ".", ref.run_id, table, summary)])


def missing_directory(ref: RunRef) -> str | None:
    """Why `ref` names nothing (its output directory or its scores partition does not exist), or None."""
    fs, path = fsspec.core.url_to_fs(ref.output_dir or ".")
    if not fs.exists(path):
        return f"{ref.output_dir or '.'} does not exist; pass a run partition that `docscore run` printed"
    fs, path = fsspec.core.url_to_fs(ref.partition("scores"))
    if not fs.exists(path):
        return (f"{ref.partition('scores')} does not exist (no run {ref.run_id!r} under {ref.output_dir}); "
                "check the run_id")
    return None


def bigquery_message(path: str, command: str) -> str:
    """`docscore report` / `compare` of a bq: output: its tables are BigQuery's, not files docscore reads
    (runners/DATAFLOW.md, section 7), so say so and what to do, rather than "does not exist"."""
    instead = {
        "report": "query the run in BigQuery instead (its summary is its PREFIX_runs row, its rows those of "
                  "PREFIX_scores and PREFIX_errors WHERE run_id = 'ID')",
        "compare": "compare the runs in BigQuery instead (the PREFIX_scores rows of the two run_ids, joined on "
                   "source and record_index)",
    }[command]
    return (f"{path} is a BigQuery output, and BigQuery outputs have no `docscore {command}` (it reads the files of "
            f"a local or gs:// --output): {instead}, or rerun with --output gs://BUCKET/PATH")


def unreadable_file_message(output_dir: str, run_id: str, error: Exception) -> str:
    """What `compare` and `report` say of a run a file of which, named by its summary.json, cannot be read."""
    return (f"run {run_id!r} under {output_dir}: a file its summary.json names cannot be read "
            f"({type(error).__name__}: {str(error)[:300]}): moved, deleted or damaged since the run was "
            f"published; restore it, or publish the run again (`docscore run` with --run_id {run_id})")


def load_run(ref: RunRef) -> LoadedRun:
    try:
        try:
            summary = run_commit.committed_summary(ref.output_dir or ".", ref.run_id)
        except run_commit.DamagedSummary as e:
            raise CompareError(str(e)) from None
        if summary is None:
            writing = run_lease.writer(ref.output_dir or ".", ref.run_id)
            if writing:  # its partitions may not exist yet: the run is coming, not mistyped
                raise CompareError(f"run {ref.run_id!r} under {ref.output_dir or '.'} is being written by {writing} and "
                                   "has no committed summary.json yet; compare it once that launch finishes")
            missing = missing_directory(ref)
            if missing:
                raise CompareError(missing)
            raise CompareError(
                f"run {ref.run_id!r} under {ref.output_dir or '.'} has no committed summary.json: it did not finish "
                "publishing (or has not committed yet) and is ignored; compare runs that `docscore run` published")
        errors, scores = committed(ref, "errors", summary), committed(ref, "scores", summary)
        try:
            n_errors = sinks.read_parts(errors.fs, errors.files, ("run_id",), ERRORS_SCHEMA).num_rows
            table = sinks.read_parts(scores.fs, scores.files, SCORE_COLUMNS, SCORES_SCHEMA)
        except (OSError, ValueError, pa.ArrowException) as e:  # a file the summary names, gone or damaged since
            if sources.is_transient(e):
                raise  # not the file's fault: named as the store below
            raise CompareError(unreadable_file_message(ref.output_dir or ".", ref.run_id, e)) from None
        return LoadedRun(ref, table, n_errors, summary, [])
    except Exception as e:  # the store cannot be reached (no network, DNS, refused): which run, and what to check
        if not sources.is_transient(e):
            raise
        raise CompareError(sources.unreachable_message(str(ref), e)) from None


# ---- the comparison (pure) ------------------------------------------------------------------------


def _keys(table: pa.Table, key: str) -> list[tuple]:
    columns = [table.column(c).to_pylist() if c in table.column_names else [None] * table.num_rows for c in KEYS[key]]
    return list(zip(*columns))


def _column(table: pa.Table, name: str) -> list:
    return table.column(name).to_pylist() if name in table.column_names else [None] * table.num_rows


def _stats(values: np.ndarray) -> dict[str, float | None]:
    if values.size == 0:
        return {"mean": None, "max": None}
    return {"mean": float(values.mean()), "max": float(values.max())}


def _relative_change(a: int, b: int) -> float:
    return abs(b - a) / max(a, 1)


def compare_tables(scores_a: pa.Table, scores_b: pa.Table, key: str = "source_record") -> dict[str, Any]:
    """Documents matched on `key`: counts, |score_b - score_a|, label flips, 1 - cos(embeddings)."""
    keys_a, keys_b = _keys(scores_a, key), _keys(scores_b, key)
    index_a = {k: i for i, k in enumerate(keys_a)}
    index_b = {k: i for i, k in enumerate(keys_b)}
    matched = [(index_a[k], index_b[k]) for k in index_b if k in index_a]
    changed = 0
    if key == "source_record":  # a record at the same place with another doc_id is another document: the input changed
        ids_a, ids_b = _column(scores_a, "doc_id"), _column(scores_b, "doc_id")
        same = [(i, j) for i, j in matched if ids_a[i] == ids_b[j]]
        changed, matched = len(matched) - len(same), same
    ia = np.array([i for i, _ in matched], dtype=np.int64)
    ib = np.array([j for _, j in matched], dtype=np.int64)

    score_a, score_b = _column(scores_a, "score"), _column(scores_b, "score")
    pairs = [(score_a[i], score_b[j]) for i, j in matched if score_a[i] is not None and score_b[j] is not None]
    score_diff = np.array([abs(b - a) for a, b in pairs], dtype=np.float64)

    label_a, label_b = _column(scores_a, "label"), _column(scores_b, "label")
    labelled = [(label_a[i], label_b[j]) for i, j in matched if label_a[i] is not None and label_b[j] is not None]
    flips = sum(a != b for a, b in labelled)

    emb_a, emb_b = _column(scores_a, "embedding"), _column(scores_b, "embedding")
    cos_drift, sizes = [], set()
    for i, j in zip(ia, ib):
        if emb_a[i] is not None and emb_b[j] is not None and len(emb_a[i]) != len(emb_b[j]):
            sizes.add((len(emb_a[i]), len(emb_b[j])))
        elif emb_a[i] is not None and emb_b[j] is not None and len(emb_a[i]):
            a, b = np.asarray(emb_a[i], np.float64), np.asarray(emb_b[j], np.float64)
            denominator = np.linalg.norm(a) * np.linalg.norm(b)
            # rounding can put the cosine of equal vectors a hair above 1: no drift is 0, never negative
            cos_drift.append(max(0.0, 1.0 - float(a @ b / denominator)) if denominator else math.nan)
    tasks_a, tasks_b = sorted(set(filter(None, _column(scores_a, "task")))), sorted(set(filter(None, _column(scores_b, "task"))))
    return {
        "key": key,
        "tasks": {"a": tasks_a, "b": tasks_b},
        "documents": {
            "a": scores_a.num_rows,
            "b": scores_b.num_rows,
            "matched": len(matched),
            "changed_doc_id": changed,  # same (source, record_index), other doc_id: not compared
            "only_in_a": len(index_a.keys() - index_b.keys()),
            "only_in_b": len(index_b.keys() - index_a.keys()),
            "duplicate_keys_a": len(keys_a) - len(index_a),
            "duplicate_keys_b": len(keys_b) - len(index_b),
        },
        "score_drift": {"compared": int(score_diff.size), **_stats(score_diff)},
        "label_flips": {
            "compared": len(labelled),
            "flipped": int(flips),
            "fraction": flips / len(labelled) if labelled else None,
        },
        "embedding_drift": {"compared": len(cos_drift), **_stats(np.array(cos_drift, dtype=np.float64)),
                            "different_sizes": sorted(sizes)},
    }


def compare_timing(summary_a: dict[str, Any] | None, summary_b: dict[str, Any] | None) -> dict[str, Any]:
    """Per stage (summary.json timing.stages): total and p50/p95 in ms for A and B, and B/A ratios."""
    if summary_a is None or summary_b is None:
        return {}
    stages = {}
    for stage in STAGES:
        a = summary_value(summary_a, f"{STAGE_TIMING}.{stage}") or {}
        b = summary_value(summary_b, f"{STAGE_TIMING}.{stage}") or {}
        entry = {}
        for stat in ("total_ms", "p50", "p95"):
            va, vb = a.get(stat), b.get(stat)
            entry[stat] = {"a": va, "b": vb, "ratio": (vb / va) if va and vb is not None else None}
        stages[stage] = entry
    wall_a, wall_b = summary_value(summary_a, WALL_S), summary_value(summary_b, WALL_S)
    formats = {"a": summary_a.get("format_version"), "b": summary_b.get("format_version")}
    return {"stages": stages, "wall_s": {"a": wall_a, "b": wall_b, "ratio": (wall_b / wall_a) if wall_a and wall_b is not None else None},
            "format_versions": formats}


def timing_format_problem(timing: dict[str, Any]) -> str | None:
    """Why two runs' stage timings mean different things (summaries of different format versions), or None."""
    formats = timing.get("format_versions") or {}
    if formats.get("a") == formats.get("b"):
        return None
    spell = {side: "none (an older docscore)" if v is None else str(v) for side, v in formats.items()}
    return (f"the runs' summaries have different format versions (A: {spell['a']}, B: {spell['b']}): their stage "
            "timings are defined differently (before version 1 infer time counted compiling; docs/summary.md, "
            "\"Older runs\")")


def compare_runs(a: LoadedRun, b: LoadedRun, key: str = "source_record") -> dict[str, Any]:
    result = {"run_a": str(a.ref), "run_b": str(b.ref), **compare_tables(a.scores, b.scores, key)}
    result["errors"] = {"a": a.n_errors, "b": b.n_errors}
    result["count_change"] = {
        "scored": _relative_change(a.scores.num_rows, b.scores.num_rows),
        "errors": _relative_change(a.n_errors, b.n_errors),
    }
    result["labels"] = {"a": label_set(a.summary), "b": label_set(b.summary)}
    result["settings_changed"] = setting_changes(a.summary, b.summary)
    result["timing"] = compare_timing(a.summary, b.summary)
    timing_problem = timing_format_problem(result["timing"])
    result["notes"] = [f"run A: {n}" for n in a.notes] + [f"run B: {n}" for n in b.notes] + (
        [timing_problem] if timing_problem else [])
    launches = {"a": a.summary.get(run_commit.LAUNCH_KEY), "b": b.summary.get(run_commit.LAUNCH_KEY)}
    result["launch_ids"] = launches
    # one run: the same launch (a copy elsewhere included), or the same partition of a run without launch ids
    result["same_run"] = same_launch(a.summary, b.summary) or _place(a.ref) == _place(b.ref)
    return result


def setting_changes(a: dict[str, Any], b: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{summary path: {"a": value, "b": value}} of the SETTINGS the two runs recorded differently; a path one of
    them did not record (an older docscore's summary) is left out rather than reported as a change."""
    changed = {}
    for path in SETTINGS:
        value_a, value_b = summary_value(a, path, _UNRECORDED), summary_value(b, path, _UNRECORDED)
        if _UNRECORDED not in (value_a, value_b) and value_a != value_b:
            changed[path] = {"a": value_a, "b": value_b}
    return changed


def same_launch(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two summaries are one launch's: the same launch_id, or for runs an older docscore wrote without
    one, the same run_id started and finished at the same microsecond (a copy of the run)."""
    launch_a, launch_b = a.get(run_commit.LAUNCH_KEY), b.get(run_commit.LAUNCH_KEY)
    if launch_a or launch_b:
        return launch_a == launch_b
    keys = ("run_id", "started_at", "finished_at")
    return all(a.get(k) is not None for k in keys) and all(a.get(k) == b.get(k) for k in keys)


def label_set(summary: dict[str, Any]) -> list[str] | None:
    """The class names a classify run scored against (its summary's config.labels), sorted; None for other
    tasks and for runs that did not record them. The rows cannot tell: a run need not predict every class."""
    labels = summary_value(summary, "config.labels")
    return sorted(labels) if isinstance(labels, dict) and labels else None


def _place(ref: RunRef) -> tuple[str, str]:
    """(output directory in one spelling, run_id)."""
    return run_commit.one_spelling(ref.output_dir or "."), ref.run_id


# ---- limits --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Limits:
    """Each limit's --help text is LIMIT_HELP's; None: not checked."""

    max_mean_drift: float | None = 0.01
    max_max_drift: float | None = None
    max_label_flip_fraction: float | None = 0.05
    max_embedding_drift: float | None = 0.01  # mean 1 - cosine
    max_count_change: float | None = None  # |B - A| / A of scored rows and of error rows
    max_stage_slowdown: float | None = None  # B/A of each stage's p50


LIMIT_HELP = {
    "max_mean_drift": "mean |score B - score A| over the paired documents",
    "max_max_drift": "largest |score B - score A| of one paired document",
    "max_label_flip_fraction": "share of paired documents whose label changed (0 to 1)",
    "max_embedding_drift": "mean 1 - cosine between a paired document's embeddings",
    "max_count_change": "|B - A| / max(A, 1) of the scored rows and of the error rows: a fraction of A's count "
                        "(from 0 errors, a count); 0.1 allows 10%%",
    "max_stage_slowdown": "B's p50 over A's of each stage's per-document time (1.5: 50%% slower)",
}
FRACTIONS = ("max_label_flip_fraction",)  # at most 1: a larger limit could never fail


def not_comparable(result: dict[str, Any]) -> str | None:
    """Why the two runs cannot be compared at all (then no limit means anything), or None."""
    d, tasks = result["documents"], result["tasks"]
    if result.get("same_run"):
        launch = result["launch_ids"]["a"]
        return (f"A and B are the same run ({f'launch {launch}; ' if launch else ''}{result['run_a']} and "
                f"{result['run_b']}): a gate comparing a run with itself always passes; pass two different runs")
    for side in ("a", "b"):
        if not d[side]:
            return f"run {side.upper()} has no scored documents: nothing to compare"
    if tasks["a"] != tasks["b"]:
        return (f"the runs scored different tasks (A: {', '.join(tasks['a'])}; B: {', '.join(tasks['b'])}); "
                "compare runs of the same --task")
    labels = result.get("labels") or {}
    if labels.get("a") and labels.get("b") and labels["a"] != labels["b"]:
        return (f"the runs classified into different label sets (A: {', '.join(labels['a'])}; B: "
                f"{', '.join(labels['b'])}): a label of one set is no flip from a label of the other; "
                "compare runs of the same --labels")
    if not d["matched"] and d.get("changed_doc_id"):
        return (f"every record both runs scored ({d['changed_doc_id']}) holds another doc_id in run B than at the "
                "same (source, record_index) in run A: the input changed between the runs, so no document can be "
                "compared; compare runs of the same input (or match on --key doc_id)")
    if not d["matched"]:
        hint = ("; if the runs read the same data from different paths, match on --key doc_id"
                if result["key"] == "source_record" else "")
        return (f"no document of run A ({d['a']}) matches one of run B ({d['b']}) on {result['key']}: "
                f"nothing could be compared{hint}")
    sizes = result["embedding_drift"].get("different_sizes")
    if sizes:
        return (f"the runs' embeddings have different sizes (A: {sizes[0][0]}, B: {sizes[0][1]}): different models' "
                "embeddings cannot be compared")
    duplicated = {side: d[f"duplicate_keys_{side}"] for side in ("a", "b") if d[f"duplicate_keys_{side}"]}
    if result["key"] == "doc_id" and duplicated:
        shown = ", ".join(f"run {side.upper()} has {n} duplicated doc_id rows" for side, n in duplicated.items())
        return f"{shown}, which --key doc_id cannot pair; match on --key source_record (the default)"
    return None


def count_violations(result: dict[str, Any], limits: Limits) -> list[str]:
    """The scored and error counts past --max_count_change: checked even when no document can be compared (a run
    B that scored nothing is the largest change of all)."""
    found = []
    for name, change in result["count_change"].items():
        if limits.max_count_change is not None and change is not None and change > limits.max_count_change:
            found.append(f"{name} count change {change:.6g} > --max_count_change={limits.max_count_change:g}")
    return found


def violations(result: dict[str, Any], limits: Limits) -> list[str]:
    """Every limit the comparison exceeds, as a sentence naming the flag."""
    found = []

    def over(value, limit, flag, what):
        if limit is not None and value is not None and (value > limit or (isinstance(value, float) and math.isnan(value))):
            found.append(f"{what} {value:.6g} > --{flag}={limit:g}")

    if result["key"] == "source_record":
        for side in ("a", "b"):
            if result["documents"][f"duplicate_keys_{side}"]:
                found.append(f"run {side.upper()} has {result['documents'][f'duplicate_keys_{side}']} duplicated "
                             "(source, record_index) rows")
    if result["documents"].get("changed_doc_id"):
        found.append(f"{result['documents']['changed_doc_id']} records at the same (source, record_index) hold another "
                     "doc_id in run B than in run A: the input changed between the runs; those were not compared")
    over(result["score_drift"]["mean"], limits.max_mean_drift, "max_mean_drift", "mean |score drift|")
    over(result["score_drift"]["max"], limits.max_max_drift, "max_max_drift", "max |score drift|")
    over(result["label_flips"]["fraction"], limits.max_label_flip_fraction, "max_label_flip_fraction", "label flip fraction")
    over(result["embedding_drift"]["mean"], limits.max_embedding_drift, "max_embedding_drift", "mean embedding drift (1 - cos)")
    found += count_violations(result, limits)
    timing_problem = timing_format_problem(result.get("timing", {}))
    if limits.max_stage_slowdown is not None and timing_problem:
        found.append(f"--max_stage_slowdown cannot be checked: {timing_problem}; compare against a baseline run written "
                     "by this docscore")
        return found
    for stage, entry in result.get("timing", {}).get("stages", {}).items():
        over(entry["p50"]["ratio"], limits.max_stage_slowdown, "max_stage_slowdown", f"{stage} p50 slowdown (B/A)")
    return found


# ---- report and command --------------------------------------------------------------------------


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _shown(value: Any) -> str:
    """A setting's value as the report prints it: JSON, so a prompt's spaces and an unset (null) value show."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def count_change_text(a: int, b: int) -> str:
    """'20 -> 10 (-50%)': a count's change as a reader takes it in, signed; the result's count_change keeps
    |B - A| / A, the fraction --max_count_change is checked against."""
    if a == b:
        return f"{a} -> {b} (unchanged)"
    if a == 0:
        return f"{a} -> {b} (none in A)"
    percent = 100 * (b - a) / a
    return f"{a} -> {b} ({percent:+.0f}%)" if abs(percent) >= 1 else f"{a} -> {b} ({percent:+.2g}%)"


def format_report(result: dict[str, Any], problems: list[str], reason: str | None = None) -> str:
    d, s, f, e = result["documents"], result["score_drift"], result["label_flips"], result["embedding_drift"]
    lines = [
        f"docscore compare  A = {result['run_a']}",
        f"                  B = {result['run_b']}",
        f"documents   A {d['a']}  B {d['b']}  matched {d['matched']} on {result['key']}  "
        f"only in A {d['only_in_a']}  only in B {d['only_in_b']}"
        + (f"  other doc_id at the same record {d['changed_doc_id']}" if d.get("changed_doc_id") else ""),
        f"errors      A {result['errors']['a']}  B {result['errors']['b']}",
        f"counts      scored {count_change_text(d['a'], d['b'])}, "
        f"errors {count_change_text(result['errors']['a'], result['errors']['b'])}",
        f"score drift mean {_num(s['mean'])}  max {_num(s['max'])}  over {s['compared']} documents",
        f"label flips {f['flipped']} of {f['compared']} ({_num(f['fraction'])})",
        f"embedding   mean 1-cos {_num(e['mean'])}  max {_num(e['max'])}  over {e['compared']} documents",
        "settings    " + ("; ".join(f"{path} {_shown(change['a'])} -> {_shown(change['b'])}"
                                    for path, change in result["settings_changed"].items())
                          or "no recorded setting differs (model, pooling, prompts, dtype, kernel, windows, versions)"),
    ]
    timing = result.get("timing") or {}
    if timing:
        lines.append(f"timing      {'stage':<12} {'p50 ms A -> B':>24} {'ratio':>7}   {'total ms A -> B':>26} {'ratio':>7}")
        for stage, entry in timing["stages"].items():
            p50, total = entry["p50"], entry["total_ms"]
            lines.append(f"            {stage:<12} {_num(p50['a']) + ' -> ' + _num(p50['b']):>24} {_num(p50['ratio'], 3):>7}"
                         f"   {_num(total['a']) + ' -> ' + _num(total['b']):>26} {_num(total['ratio'], 3):>7}")
        wall = timing["wall_s"]
        lines.append(f"            {'wall s':<12} {_num(wall['a']) + ' -> ' + _num(wall['b']):>24} {_num(wall['ratio'], 3):>7}")
    lines += [f"note: {n}" for n in result["notes"]]
    lines += [f"LIMIT EXCEEDED: {p}" for p in problems]
    if reason:
        lines.append(f"NOT COMPARED: {reason}")
    elif not problems:
        lines.append("within every limit")
    return "\n".join(lines)


def limit_value(text: str) -> float | None:
    if text.lower() == "none":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; pass e.g. 0.01, or none to skip the check") from None


def build_parser() -> argparse.ArgumentParser:
    parser = SubcommandParser(prog="docscore compare", description=__doc__.split("\n")[0], epilog=USAGE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_a", metavar="RUN_A", help="the reference run: DIR/scores/run_id=ID")
    parser.add_argument("run_b", metavar="RUN_B", help="the run compared with it: DIR/scores/run_id=ID")
    parser.add_argument("--key", choices=sorted(KEYS), default="source_record",
                        help="how documents are matched (default source_record)")
    defaults = Limits()
    for field in dataclasses.fields(Limits):
        parser.add_argument(f"--{field.name}", type=limit_value, default=getattr(defaults, field.name),
                            help=f"{LIMIT_HELP[field.name]} (default {getattr(defaults, field.name)}; 'none': not checked)")
    parser.add_argument("--json", metavar="FILE", default=None, help="also write the comparison as JSON ('-': stdout, instead of the report)")
    return parser


def limit_problem(limits: Limits) -> str | None:
    """Why these limits cannot gate anything (a limit no finite number >= 0, a slowdown of 0, a share over 1), or
    None: what `docscore compare` refuses with exit 2, and a schedule's check before it deploys the gate."""
    bad = [f"--{name}={value}" for name, value in dataclasses.asdict(limits).items()
           if value is not None and not 0 <= value < math.inf]
    if bad:
        return f"{', '.join(bad)}: a limit must be a finite number >= 0"
    if limits.max_stage_slowdown == 0:  # a ratio B/A: 0 fails every stage that took any time
        return ("--max_stage_slowdown=0 could never pass (it is B's p50 over A's per stage: 1.5 allows 50% slower, 1 "
                "no slower); pass a ratio > 0, or none to leave it unchecked")
    over = [f"--{name}={getattr(limits, name)}" for name in FRACTIONS if (getattr(limits, name) or 0) > 1]
    if over:
        return (f"{', '.join(over)}: a share is at most 1, and a larger limit could never fail; pass a share (0.05: "
                "5%), or none to leave it unchecked")
    return None


def limits_given(args: argparse.Namespace) -> Limits:
    return Limits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Limits)})


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    limits = limits_given(args)
    problem = limit_problem(limits)
    if problem:
        print(f"docscore compare: {problem}", file=sys.stderr)
        return EXIT_USAGE
    options.quiet_beam_noise()  # among it gcsfs's traceback of a store out of retries: load_run names that store
    try:
        return compare_and_report(args, limits)
    except CompareError as e:
        print(f"docscore compare: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # the reader went away (`docscore compare A B | head`): docscore's cli says nothing
        raise
    except Exception as e:  # a table or summary damaged, gone or of a shape not written by docscore; --json unwritable
        # exit 1 would read as a limit exceeded to the gate that runs this
        print(f"docscore compare: cannot compare: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
        return EXIT_USAGE


def json_destination_problem(path: str, runs: Sequence[RunRef] = ()) -> str | None:
    """Why --json PATH cannot be written, or None; checked before any run is read, so a mistyped path costs no
    work and cannot follow a verdict with exit 2. PATH must not be among the files docscore keeps in the compared
    runs' outputs (it would write over a run's summary.json or a table part). A local PATH's folder must exist
    already: write_json makes no folder (fsspec's default would create every missing one of a mistyped path). An
    object store has no folders to check; a failed upload is reported when it happens."""
    if not path.strip():  # an unset variable: '' would be read as this folder
        return "--json is empty or white space (an unset variable?); pass a file path, or '-' for stdout"
    def store(url: str) -> str:
        protocol = fsspec.core.split_protocol(url)[0] or "file"
        return "gs" if protocol in input_files.GCS_PROTOCOLS else protocol

    fs, local = fsspec.core.url_to_fs(path)
    for ref in runs:
        for folder in run_commit.OUTPUT_FOLDERS:
            if store(ref.output_dir) != store(path):  # another file system: a local path is never inside a bucket
                continue
            kept = fsspec.core.url_to_fs(posixpath.join(ref.output_dir, folder))[1]
            if run_commit.is_local(fs):
                local, kept = os.path.realpath(local), os.path.realpath(kept)
            if local == kept or local.startswith(kept.rstrip("/") + "/"):
                return (f"--json {path} is inside {posixpath.join(ref.output_dir, folder)}, where docscore keeps its "
                        f"runs' files (it would write over them); pass a path outside it, e.g. "
                        f"{posixpath.join(ref.output_dir, 'compare.json')}")
    if not run_commit.is_local(fs):
        return None
    folder = posixpath.dirname(local)
    if os.path.isdir(local):
        return f"--json {path} is a folder; pass the path of a file in it (e.g. {posixpath.join(path, 'compare.json')})"
    if not os.path.isdir(folder):
        return f"--json {path}: the folder {folder} does not exist or is not a folder; create it or pass another path"
    if not os.access(folder, os.W_OK) or (os.path.exists(local) and not os.access(local, os.W_OK)):
        return f"--json {path}: not writable (permission denied); pass a path you can write"
    return None


def write_json(path: str, result: dict[str, Any]) -> None:
    """The comparison as JSON at `path`, creating no folder; a failed write names the path (the verdict
    printed above stands, but the file the caller asked for is missing: exit 2)."""
    try:
        with fsspec.open(path, "w", auto_mkdir=False) as f:
            f.write(json.dumps(result, indent=2, sort_keys=True))
    except Exception as e:
        if not (isinstance(e, OSError) or sources.is_transient(e)):
            raise
        raise CompareError(f"--json {path}: cannot be written ({type(e).__name__}: {str(e)[:300]}); the "
                           "comparison above was not saved") from None


def compare_and_report(args: argparse.Namespace, limits: Limits) -> int:
    """Load both runs, print (or write) the comparison; the exit code of its verdict."""
    refs = RunRef.parse(args.run_a), RunRef.parse(args.run_b)
    if args.json not in (None, "-"):
        problem = json_destination_problem(args.json, refs)
        if problem:
            raise CompareError(problem)
    a, b = (load_run(ref) for ref in refs)
    result = compare_runs(a, b, args.key)
    reason = not_comparable(result)
    if reason is None:
        problems = violations(result, limits)
    else:  # documents that cannot be paired still have counts, unless the runs scored different tasks
        a, b = result["tasks"]["a"], result["tasks"]["b"]
        problems = [] if result.get("same_run") or (a and b and a != b) else count_violations(result, limits)
    result["limits"] = dataclasses.asdict(limits)
    result["violations"] = problems
    result["not_comparable"] = reason
    if args.json == "-":
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(format_report(result, problems, reason))
        if args.json:
            write_json(args.json, result)
    if problems:
        return EXIT_THRESHOLD
    if reason:
        print(f"docscore compare: cannot compare: {reason}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
