"""Where results go: the scores/errors tables (Beam file sinks with explicit pyarrow schemas, staged
per attempt) and the atomic, retry-safe per-run_id publish of the staged files plus summary.json
(fsspec, so local paths and gs:// behave the same). Every table write goes through write_table().
Must not compute scores or statistics, nor decide when to publish (pipeline/runs/publish.py does).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import posixpath
import shutil
import uuid
from typing import Any

import apache_beam as beam
import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io import fileio
from fsspec.implementations.local import LocalFileSystem

from pipeline.records import ERRORS_SCHEMA, SCORES_SCHEMA

TABLES = {"scores": SCORES_SCHEMA, "errors": ERRORS_SCHEMA}
SUCCESS = "_SUCCESS"
PART_PREFIX = "part"
BQ_PREFIX = "bq:"

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """Where one run writes: the output root, run id, format, and this attempt's staging directory."""

    output: str
    run_id: str
    output_format: str = "parquet"
    staging: str = ""

    @classmethod
    def for_run(cls, output: str, run_id: str, output_format: str, staging_root: str | None = None) -> "OutputSpec":
        root = staging_root or output
        staging = posixpath.join(root.rstrip("/"), "_staging", f"run_id={run_id}", uuid.uuid4().hex[:12])
        return cls(output=output.rstrip("/"), run_id=run_id, output_format=output_format, staging=staging)

    def partition(self, table: str) -> str:
        return posixpath.join(self.output, table, f"run_id={self.run_id}")

    def summary_path(self) -> str:
        return posixpath.join(self.output, "runs", f"run_id={self.run_id}", "summary.json")

    @property
    def suffix(self) -> str:
        return ".parquet" if self.output_format == "parquet" else ".jsonl"


def write_table(rows: beam.PCollection, table: str, spec: OutputSpec) -> beam.PCollection:
    """Write one table (scores | errors) from a PCollection of lists of dict rows (one element per list:
    the file sinks pay Beam's per-element cost per list) with its explicit schema: the ONE table-write path.
    Returns what the write reports when it is complete (file outputs: the staged file names; BigQuery:
    its load/copy jobs), for a later step to wait on as a side input."""
    if spec.output.startswith(BQ_PREFIX):
        from pipeline.io import bigquery

        result = (rows | f"{table.title()}Rows" >> beam.FlatMap(lambda rows: rows)
                  | f"Write{table.title()}ToBigQuery" >> bigquery.write_table(table, TABLES[table], spec))
        jobs = (result.destination_load_jobid_pairs, result.destination_copy_jobid_pairs)
        return jobs | f"{table.title()}BigQueryJobs" >> beam.Flatten() | f"{table.title()}JobNames" >> beam.Map(lambda pair: str(pair[0]))
    if spec.output_format == "parquet":
        staging_dir = posixpath.join(spec.staging, table)
        return (
            rows
            | f"Write{table.title()}" >> fileio.WriteToFiles(
                staging_dir, file_naming=fileio.default_file_naming(PART_PREFIX, spec.suffix),
                sink=lambda _destination, schema=TABLES[table]: ParquetRowsSink(schema))
            | f"{table.title()}FileNames" >> beam.Map(lambda result, d=staging_dir: posixpath.join(d, result.file_name))
        )
    prefix = posixpath.join(spec.staging, table, PART_PREFIX)
    return (
        rows
        | f"{table.title()}ToJson" >> beam.FlatMap(json_lines)
        | f"Write{table.title()}" >> beam.io.WriteToText(prefix, file_name_suffix=spec.suffix)
    )


def json_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A list of rows as one block of JSON lines (WriteToText ends it with the last newline); none when empty."""
    return ["\n".join(json.dumps(row, ensure_ascii=False, default=json_value) for row in rows)] if rows else []


class ParquetRowsSink(fileio.FileSink):
    """Lists of dict rows -> one Parquet file of `schema`: rows become Arrow record batches of `batch_rows`, and a
    row group is written when the batches reach `row_group_bytes` or the file ends (the layout and the
    memory bound of beam.io.WriteToParquet's defaults). Dictionary encoding only for the string
    columns: for the embedding's floats pyarrow would build a dictionary only to drop it, which cost
    0.5-0.7 s on 1,891 rows inside a run against 0.02-0.06 s without (benchmarks/README.md), and the
    files are ~20% smaller. (beam.io.WriteToParquet passes no such option to pyarrow.)"""

    def __init__(self, schema: pa.Schema, batch_rows: int = 1000, row_group_bytes: int = 64 << 20):
        self._schema = schema
        self._batch_rows = batch_rows
        self._row_group_bytes = row_group_bytes

    def open(self, fh) -> None:
        self._writer = parquet_writer(fh, self._schema)
        self._rows: list[dict[str, Any]] = []
        self._batches: list[pa.RecordBatch] = []
        self._buffered_bytes = 0

    def write(self, rows: list[dict[str, Any]]) -> None:
        self._rows.extend(rows)
        if len(self._rows) >= self._batch_rows:
            self._to_batch()
            if self._buffered_bytes >= self._row_group_bytes:
                self._write_row_group()

    def flush(self) -> None:
        self._to_batch()
        self._write_row_group()
        self._writer.close()  # the footer; fileio closes the file

    def _to_batch(self) -> None:
        if self._rows:
            batch = pa.RecordBatch.from_pylist(self._rows, schema=self._schema)
            self._batches.append(batch)
            self._buffered_bytes += batch.nbytes
            self._rows = []

    def _write_row_group(self) -> None:
        if self._batches:
            self._writer.write_table(pa.Table.from_batches(self._batches, schema=self._schema))
            self._batches, self._buffered_bytes = [], 0


def parquet_writer(where, schema: pa.Schema) -> pq.ParquetWriter:
    """docscore's Parquet writer settings: dictionary encoding for string columns only."""
    strings = [field.name for field in schema if pa.types.is_string(field.type)]
    return pq.ParquetWriter(where, schema, use_dictionary=strings)


def json_value(value: Any) -> Any:
    """json.dumps' fallback for the numpy values rows hold (float32 embedding arrays, numpy scalars)."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def check_writable(output: str) -> None:
    """Create the output directory and write/delete a probe file; raises OSError when that fails."""
    fs, root = fsspec.core.url_to_fs(output)
    fs.makedirs(root, exist_ok=True)
    probe = posixpath.join(root, f".docscore-probe-{uuid.uuid4().hex[:8]}")
    fs.pipe_file(probe, b"ok")
    fs.rm_file(probe)


def published_paths(spec: OutputSpec) -> dict[str, str]:
    """Where a published run is: {table: partition (or BigQuery table), "summary": summary.json}."""
    if spec.output.startswith(BQ_PREFIX):
        from pipeline.io import bigquery

        out = bigquery.BigQueryOutput.parse(spec.output)
        return {name: out.table(name) for name in bigquery.TABLE_SCHEMAS}
    return {**{table: spec.partition(table) for table in TABLES}, "summary": spec.summary_path()}


def publish(spec: OutputSpec, summary: dict[str, Any], written: dict[str, list[str]] | None = None) -> dict[str, str]:
    """Replace this run_id's partitions with the staged files, atomically per partition for readers
    that honour _SUCCESS: drop the old marker, replace the files, write _SUCCESS last. Then write
    summary.json (and its _SUCCESS) and remove the staging directory. Returns the published paths.

    `written`: table -> the staged files its write step reported (default: the staging directory's
    part files). Safe to repeat, as a retried Beam bundle does: staged files are copied, not moved,
    and staging is removed only after everything is published, so a repeat either finds every staged
    file and publishes again, or finds them gone and the partitions already holding them."""
    if spec.output.startswith(BQ_PREFIX):
        from pipeline.io import bigquery

        _remove_staging(spec)  # the load jobs are done; the BigQuery transaction is the last step
        bigquery.publish(spec, summary)  # the summary becomes the run's PREFIX_runs row
        return published_paths(spec)
    fs, _ = fsspec.core.url_to_fs(spec.output)
    for table in TABLES:
        staging_dir = _path(posixpath.join(spec.staging, table))
        if written is None or table not in written:
            staged = [p for p in _ls(fs, staging_dir) if posixpath.basename(p).startswith(PART_PREFIX)]
        else:
            staged = [_path(p) for p in written[table]]
        if not staged and spec.output_format == "parquet":  # no rows, no file: an empty table is one file with the schema
            staged = [_empty_parquet(fs, staging_dir, TABLES[table])]
        _publish_partition(fs, _path(spec.partition(table)), staged)
    publish_summary(spec, summary)
    _remove_staging(spec)
    return published_paths(spec)


def publish_summary(spec: OutputSpec, summary: dict[str, Any]) -> str:
    """(Re)write runs/run_id=ID/summary.json behind its _SUCCESS marker (dropped first, written last).
    runs/run_id=ID also holds files other modules write (history, report, progress samples): only
    summary.json and the marker are replaced here."""
    fs, summary_path = fsspec.core.url_to_fs(spec.summary_path())
    summary_dir = posixpath.dirname(summary_path)
    fs.makedirs(summary_dir, exist_ok=True)
    if fs.exists(posixpath.join(summary_dir, SUCCESS)):
        fs.rm_file(posixpath.join(summary_dir, SUCCESS))
    fs.pipe_file(summary_path, json.dumps(summary, indent=2, sort_keys=True, default=str).encode())
    fs.pipe_file(posixpath.join(summary_dir, SUCCESS), b"")
    return spec.summary_path()


def read_summary(spec: OutputSpec) -> dict[str, Any]:
    """The published summary.json of a file output."""
    with fsspec.open(spec.summary_path(), "r") as f:
        return json.load(f)


def _path(url: str) -> str:
    """A URL's path inside its fsspec filesystem."""
    return fsspec.core.url_to_fs(url)[1]


def _remove_staging(spec: OutputSpec) -> None:
    """Remove this launch's staging directory (spec.staging, unique per launch), then _staging/run_id=ID
    and _staging only if empty: other launches, of this run_id or another, stage beside it."""
    fs, staging = fsspec.core.url_to_fs(spec.staging)
    if _is_link(fs, staging) or fs.exists(staging):
        _delete(fs, staging)
    _remove_if_empty(fs, posixpath.dirname(staging))  # _staging/run_id=ID
    _remove_if_empty(fs, posixpath.dirname(posixpath.dirname(staging)))  # _staging


def _remove_if_empty(fs, path: str) -> None:
    """Remove the directory `path` if it is empty, never its contents: a listing then a recursive delete
    would take files another launch staged in between. Locally one os.rmdir, which the kernel refuses
    for a non-empty directory (or a symlink); object stores have no empty directories to remove (a
    prefix is gone with its last object), and gcsfs's rmdir would delete a bucket, so nothing there."""
    if not _is_local(fs):
        return
    try:
        os.rmdir(path)
    except OSError:
        pass  # not empty (another launch is using it), gone already, or not a directory


def _is_local(fs) -> bool:
    return isinstance(fs, LocalFileSystem)


def _is_link(fs, path: str) -> bool:
    """Whether `path` is a symlink (local paths only: object stores have none)."""
    return _is_local(fs) and os.path.islink(path)


def _delete(fs, path: str) -> None:
    """Delete `path`, an entry this launch owns, without following symlinks: a link is removed, never its
    target or the target's contents; a directory is removed with the links inside it (shutil.rmtree
    does not follow them)."""
    if _is_local(fs):
        if os.path.islink(path) or not os.path.isdir(path):
            os.remove(path)
        else:
            shutil.rmtree(path)
    else:
        fs.rm(path, recursive=True)


def _ls(fs, path: str) -> list[str]:
    fs.invalidate_cache(path)  # gcsfs caches listings; Beam's own GCS client wrote these files
    try:
        return [p for p in fs.ls(path, detail=False)]
    except FileNotFoundError:
        return []


def _publish_partition(fs, dest: str, staged: list[str]) -> None:
    """Publish the staged files as partition `dest`, or nothing when an earlier attempt already did."""
    names = {posixpath.basename(p) for p in staged}
    present = {p for d in {posixpath.dirname(p) for p in staged} for p in _ls(fs, d)}
    missing = [p for p in staged if p not in present]
    if not missing:
        _replace_partition(fs, dest, staged)
        return
    marker = posixpath.join(dest, SUCCESS)
    if not _is_link(fs, dest) and fs.exists(marker) and names <= {posixpath.basename(p) for p in _ls(fs, dest)}:
        return  # published by an earlier attempt of this step, which then removed the staging files
    raise FileNotFoundError(
        f"cannot publish {dest}: staged files {sorted(missing)[:3]} are gone and the partition does not hold "
        f"them (staging removed by hand, or another run with the same --run_id published in between?); "
        f"rerun with the same --run_id to replace the partition"
    )


def _empty_parquet(fs, staging_dir: str, schema: pa.Schema) -> str:
    """A Parquet file of no rows with the table's schema, staged for a table that got no rows."""
    path = posixpath.join(staging_dir, f"{PART_PREFIX}-00000-of-00001.parquet")
    fs.makedirs(staging_dir, exist_ok=True)
    with fs.open(path, "wb") as f:
        parquet_writer(f, schema).close()
    return path


def _replace_partition(fs, dest: str, staged: list[str]) -> None:
    """Replace partition `dest` with the staged files. docscore owns the partition path, not what a link
    there points to: a symlinked partition is replaced by a real directory (the link removed, its
    target's files untouched), and links inside the partition are removed, never followed."""
    if _is_link(fs, dest):
        log.warning("partition %s is a symlink to %s: removing the link (its target is left untouched) "
                    "and publishing the run into a real directory", dest, os.readlink(dest))
        os.remove(dest)
    fs.makedirs(dest, exist_ok=True)
    marker = posixpath.join(dest, SUCCESS)
    if _is_link(fs, marker) or fs.exists(marker):
        _delete(fs, marker)
    for old in _ls(fs, dest):
        _delete(fs, old)
    for path in sorted(staged):
        fs.copy(path, posixpath.join(dest, posixpath.basename(path)))
    fs.pipe_file(marker, b"")
