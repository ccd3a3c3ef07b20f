"""Where results go: the scores/errors tables (Beam file sinks with explicit pyarrow schemas), the
run-stats file, and the atomic per-run_id publish of staged files plus summary.json (fsspec, so
local paths and gs:// behave the same). Every table write goes through write_table().
Must not compute scores or statistics.
"""
from __future__ import annotations

import dataclasses
import json
import posixpath
import uuid
from typing import Any

import apache_beam as beam
import fsspec

from pipeline.records import ERRORS_SCHEMA, SCORES_SCHEMA

TABLES = {"scores": SCORES_SCHEMA, "errors": ERRORS_SCHEMA}
SUCCESS = "_SUCCESS"
PART_PREFIX = "part"
BQ_PREFIX = "bq:"


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

    def stats_path(self) -> str:
        return posixpath.join(self.staging, "stats.json")

    @property
    def suffix(self) -> str:
        return ".parquet" if self.output_format == "parquet" else ".jsonl"


def write_table(rows: beam.PCollection, table: str, spec: OutputSpec):
    """Write one table (scores | errors) of dict rows with its explicit schema: the ONE table-write path."""
    if spec.output.startswith(BQ_PREFIX):
        from pipeline import bigquery

        return rows | f"Write{table.title()}ToBigQuery" >> bigquery.write_table(table, TABLES[table], spec)
    prefix = posixpath.join(spec.staging, table, PART_PREFIX)
    if spec.output_format == "parquet":
        return rows | f"Write{table.title()}" >> beam.io.WriteToParquet(
            prefix, TABLES[table], file_name_suffix=spec.suffix
        )
    return (
        rows
        | f"{table.title()}ToJson" >> beam.Map(json.dumps, ensure_ascii=False)
        | f"Write{table.title()}" >> beam.io.WriteToText(prefix, file_name_suffix=spec.suffix)
    )


def write_stats(stats_json: beam.PCollection, spec: OutputSpec):
    """The single run-stats JSON document, next to the staged tables."""
    return stats_json | "WriteStats" >> beam.io.WriteToText(
        spec.stats_path(), shard_name_template="", num_shards=1
    )


def read_stats(spec: OutputSpec) -> dict[str, Any]:
    with fsspec.open(spec.stats_path(), "r") as f:
        return json.loads(f.read())


def check_writable(output: str) -> None:
    """Create the output directory and write/delete a probe file; raises OSError when that fails."""
    fs, root = fsspec.core.url_to_fs(output)
    fs.makedirs(root, exist_ok=True)
    probe = posixpath.join(root, f".docscore-probe-{uuid.uuid4().hex[:8]}")
    fs.pipe_file(probe, b"ok")
    fs.rm_file(probe)


def publish(spec: OutputSpec, summary: dict[str, Any]) -> dict[str, str]:
    """Replace this run_id's partitions with the staged files, atomically per partition for readers
    that honour _SUCCESS: drop the old marker, replace the files, write _SUCCESS last. Then write
    summary.json (and its _SUCCESS) and remove the staging directory. Returns the published paths."""
    if spec.output.startswith(BQ_PREFIX):
        from pipeline import bigquery

        published = bigquery.publish(spec, summary)  # the summary becomes the run's PREFIX_runs row
        _remove_staging(spec)
        return published
    fs, _ = fsspec.core.url_to_fs(spec.output)
    published: dict[str, str] = {}
    for table in TABLES:
        staged = [p for p in _ls(fs, _path(posixpath.join(spec.staging, table))) if posixpath.basename(p).startswith(PART_PREFIX)]
        _replace_partition(fs, _path(spec.partition(table)), staged)
        published[table] = spec.partition(table)
    # runs/run_id=ID also holds files other modules write (history, report, progress samples):
    # only summary.json and the marker are replaced here
    summary_dir = _path(posixpath.dirname(spec.summary_path()))
    fs.makedirs(summary_dir, exist_ok=True)
    if fs.exists(posixpath.join(summary_dir, SUCCESS)):
        fs.rm_file(posixpath.join(summary_dir, SUCCESS))
    fs.pipe_file(_path(spec.summary_path()), json.dumps(summary, indent=2, sort_keys=True, default=str).encode())
    fs.pipe_file(posixpath.join(summary_dir, SUCCESS), b"")
    published["summary"] = spec.summary_path()
    _remove_staging(spec)
    return published


def _path(url: str) -> str:
    """A URL's path inside its fsspec filesystem."""
    return fsspec.core.url_to_fs(url)[1]


def _remove_staging(spec: OutputSpec) -> None:
    fs, staging = fsspec.core.url_to_fs(spec.staging)
    fs.rm(staging, recursive=True)
    _remove_if_empty(fs, posixpath.dirname(staging))  # _staging/run_id=ID
    _remove_if_empty(fs, posixpath.dirname(posixpath.dirname(staging)))  # _staging


def _remove_if_empty(fs, path: str) -> None:
    try:
        if fs.exists(path) and not fs.ls(path, detail=False):
            fs.rm(path, recursive=True)
    except OSError:
        pass  # another run is using it


def _ls(fs, path: str) -> list[str]:
    try:
        return [p for p in fs.ls(path, detail=False)]
    except FileNotFoundError:
        return []


def _replace_partition(fs, dest: str, staged: list[str]) -> None:
    fs.makedirs(dest, exist_ok=True)
    marker = posixpath.join(dest, SUCCESS)
    if fs.exists(marker):
        fs.rm_file(marker)
    for old in _ls(fs, dest):
        fs.rm(old, recursive=True)
    for path in sorted(staged):
        fs.mv(path, posixpath.join(dest, posixpath.basename(path)))
    fs.pipe_file(marker, b"")
