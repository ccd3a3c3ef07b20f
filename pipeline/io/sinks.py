"""Where results go: the scores/errors tables, written by Beam file sinks with explicit pyarrow schemas
into this launch's staging directory (or BigQuery load jobs). Every table write goes through
write_table(). Must not compute scores or statistics, nor publish: pipeline/io/run_commit.py makes the
staged files one committed run, when pipeline/runs/publish.py says so.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import posixpath
import uuid
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq
from apache_beam.io import fileio

from pipeline.io import run_commit
from pipeline.records import ERRORS_SCHEMA, SCORES_SCHEMA, Batch, finite_or_none

TABLES = {"scores": SCORES_SCHEMA, "errors": ERRORS_SCHEMA}
PART_PREFIX = "part"
BQ_PREFIX = "bq:"
READ_BATCH_ROWS = 65_536  # rows per record batch read from a Parquet part (bounded memory)


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """Where one launch of a run writes: the output root, run id, format, and this launch's staging
    directory (its last path segment is the launch id). `leased`: the launcher holds the run's lease
    (pipeline/io/run_lease.py), so the commit checks it still does."""

    output: str
    run_id: str
    output_format: str = "parquet"
    staging: str = ""
    leased: bool = False

    @classmethod
    def for_run(cls, output: str, run_id: str, output_format: str, staging_root: str | None = None) -> "OutputSpec":
        root = staging_root or output
        staging = posixpath.join(run_commit.partition(root, "_staging", run_id), uuid.uuid4().hex[:12])
        return cls(output=output.rstrip("/"), run_id=run_id, output_format=output_format, staging=staging)

    @property
    def launch(self) -> str:
        return posixpath.basename(self.staging.rstrip("/"))

    def partition(self, table: str) -> str:
        return run_commit.partition(self.output, table, self.run_id)

    def summary_path(self) -> str:
        return run_commit.summary_path(self.output, self.run_id)

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


def json_lines(rows: Batch) -> list[str]:
    """A list of rows as one block of JSON lines (WriteToText ends it with the last newline); none when empty."""
    return ["\n".join(json_line(row) for row in rows)] if rows else []


def json_line(row: dict[str, Any]) -> str:
    """One row as JSON. JSON has no NaN or infinity (Python would write a bare NaN, which other readers refuse): a
    non-finite number (a NaN score, an inf perplexity) is written as null; Parquet keeps it."""
    try:
        return json.dumps(row, ensure_ascii=False, default=json_value, allow_nan=False)
    except ValueError:
        return json.dumps(finite_or_none(row), ensure_ascii=False, default=json_value, allow_nan=False)


def iter_parts(fs, paths: list[str], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """A table's committed part files (Parquet or JSONL, by suffix), one record batch at a time: the columns of
    `schema` each part has (older runs lack newer ones, e.g. shadow_*), JSONL typed as `schema`. The ONE reader of
    committed parts: memory holds one batch (a JSONL block), whatever the table's size."""
    for path in paths:
        if path.endswith(".parquet"):
            with fs.open(path, "rb") as f:  # closed here: a gs:// file left to the garbage collector outlives its loop
                parquet = pq.ParquetFile(f)
                present = pa.schema([parquet.schema_arrow.field(c) for c in schema.names if c in parquet.schema_arrow.names])
                if parquet.metadata.num_rows == 0:  # no batch to read; an empty one still says which columns it has
                    yield pa.RecordBatch.from_pylist([], schema=present)
                yield from parquet.iter_batches(columns=present.names, batch_size=READ_BATCH_ROWS)
        elif path.endswith(".jsonl"):
            yield from _jsonl_batches(fs, path, schema)


def _jsonl_batches(fs, path: str, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """A JSONL part docscore wrote, as the columns of `schema` its rows hold, typed as `schema`: not inferred, so
    a label or id such as "2024-03-31" stays text (pyarrow would read a timestamp). Nothing for an empty part."""
    with fs.open(path, "rb") as f:
        first = next((line for line in f if line.strip()), None)
        if first is None:
            return
        keys = json.loads(first)  # every row of a part has the table's columns
        typed = pa.schema([schema.field(name).with_nullable(True) for name in schema.names if name in keys])
        f.seek(0)
        parse = pa_json.ParseOptions(explicit_schema=typed, unexpected_field_behavior="ignore")
        yield from pa_json.open_json(f, parse_options=parse)


def read_parts(fs, paths: list[str], columns: tuple[str, ...], schema: pa.Schema) -> pa.Table:
    """A table's committed part files (iter_parts) -> one table of the named columns the files have, typed as
    `schema`; zero rows of those columns when the parts hold no rows (none, or empty JSONL parts: a run without
    errors)."""
    tables = [pa.Table.from_batches([batch]) for batch in iter_parts(fs, paths, pa.schema([schema.field(c) for c in columns]))]
    present = [c for c in columns if any(c in t.schema.names for t in tables)] if tables else list(columns)
    typed = pa.schema([schema.field(c).with_nullable(True) for c in present])
    return pa.concat_tables([conform(t, typed) for t in tables]) if tables else typed.empty_table()


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """table's columns of `schema`, cast to its types (a column JSON saw only nulls in reads as null type); a
    column the table lacks is all nulls."""
    return pa.table([table.column(f.name).cast(f.type) if f.name in table.schema.names else pa.nulls(table.num_rows, f.type)
                     for f in schema], schema=schema)


class ParquetRowsSink(fileio.FileSink):
    """Lists of dict rows -> one Parquet file of `schema`: rows become Arrow record batches of `batch_rows`, and a
    row group is written when the batches reach `row_group_bytes` or the file ends (the layout and the
    memory bound of beam.io.WriteToParquet's defaults). Dictionary encoding only for the string
    columns: for the embedding's floats pyarrow would build a dictionary only to drop it, which cost
    most of the write (benchmarks/README.md) and made the files larger. (beam.io.WriteToParquet passes no
    such option to pyarrow.)"""

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
    """Create the output directory and write/delete a probe file; raises OSError when that fails, and
    ValueError when Beam (which writes the tables) or fsspec (which publishes them) has no file system
    for that kind of path."""
    from apache_beam.io.filesystem import BeamIOError
    from apache_beam.io.filesystems import FileSystems

    try:
        FileSystems.get_filesystem(output)
        fs, root = fsspec.core.url_to_fs(output)
    except (ValueError, ImportError, BeamIOError) as e:
        hint = f" (for a local directory write {output[len('file://'):]})" if output.startswith("file://") else ""
        raise ValueError(f"no file system writes this kind of path{hint}: {str(e)[:200]}") from None
    fs.makedirs(root, exist_ok=True)
    probe = posixpath.join(root, f".docscore-probe-{uuid.uuid4().hex[:8]}")
    try:
        fs.pipe_file(probe, b"ok")
    except BaseException:  # made, then not written (a full disk): not left in the user's output
        with contextlib.suppress(Exception):
            fs.rm_file(probe)
        raise
    fs.rm_file(probe)


def published_paths(spec: OutputSpec) -> dict[str, str]:
    """Where a published run is: {table: partition (or BigQuery table), "summary": summary.json}."""
    if spec.output.startswith(BQ_PREFIX):
        from pipeline.io import bigquery

        out = bigquery.BigQueryOutput.parse(spec.output)
        return {name: out.table(name) for name in bigquery.TABLE_SCHEMAS}
    return {**{table: spec.partition(table) for table in TABLES}, "summary": spec.summary_path()}


def staged_files(spec: OutputSpec, table: str, written: dict[str, list[str]] | None) -> list[str]:
    """This launch's staged files of `table`: what its write step reported (`written`), else the staging
    directory's part files; a Parquet table that got no rows is staged as one empty file with its schema."""
    fs, staging_dir = fsspec.core.url_to_fs(posixpath.join(spec.staging, table))
    if written is not None and table in written:
        staged = list(written[table])
    else:
        fs.invalidate_cache(staging_dir)
        staged = [fs.unstrip_protocol(p) for p in (fs.ls(staging_dir, detail=False) if fs.exists(staging_dir) else [])
                  if posixpath.basename(p).startswith(PART_PREFIX)]
    if not staged and spec.output_format == "parquet":
        staged = [fs.unstrip_protocol(_empty_parquet(fs, staging_dir, TABLES[table]))]
    return staged


def _empty_parquet(fs, staging_dir: str, schema: pa.Schema) -> str:
    """A Parquet file of no rows with the table's schema, staged for a table that got no rows."""
    path = posixpath.join(staging_dir, f"{PART_PREFIX}-00000-of-00001.parquet")
    fs.makedirs(staging_dir, exist_ok=True)
    with fs.open(path, "wb") as f:
        parquet_writer(f, schema).close()
    return path
