"""BigQuery output for `--output bq:PROJECT.DATASET.PREFIX`: the tables PREFIX_scores, PREFIX_errors
and PREFIX_runs, with schemas converted from the same pyarrow schemas as the Parquet tables.

Holds the pure schema/row conversions, the Beam write (one staging table per run and table, loaded
with WriteToBigQuery) and the publish step that swaps a run's rows in one BigQuery transaction.
Must not compute scores; only pipeline/io/sinks.py (the writes) and pipeline/runs/publish.py (the publish
transaction) call into it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import Any

import apache_beam as beam
import pyarrow as pa

from pipeline.records import ERRORS_SCHEMA, SCORES_SCHEMA, finite_or_none

BQ_PREFIX = "bq:"

# One row per run in PREFIX_runs; the whole summary.json rides along as a JSON string.
RUNS_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("task", pa.string(), nullable=False),
        pa.field("started_at", pa.timestamp("us", tz="UTC")),
        pa.field("finished_at", pa.timestamp("us", tz="UTC")),
        pa.field("wall_s", pa.float64()),
        pa.field("model_id", pa.string()),
        pa.field("model_fingerprint", pa.string()),
        pa.field("attention_requested", pa.string()),
        pa.field("attention_impl", pa.string()),
        pa.field("backend", pa.string()),
        pa.field("records", pa.int64()),
        pa.field("scored", pa.int64()),
        pa.field("errors", pa.int64()),
        pa.field("docs_per_s", pa.float64()),
        pa.field("summary_json", pa.string(), nullable=False),
    ]
)
TABLE_SCHEMAS = {"scores": SCORES_SCHEMA, "errors": ERRORS_SCHEMA, "runs": RUNS_SCHEMA}

_PROJECT = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,1000}$")


@dataclasses.dataclass(frozen=True)
class BigQueryOutput:
    """bq:PROJECT.DATASET.PREFIX, parsed."""

    project: str
    dataset: str
    prefix: str

    @classmethod
    def parse(cls, output: str) -> "BigQueryOutput":
        spec = output[len(BQ_PREFIX):] if output.startswith(BQ_PREFIX) else output
        parts = spec.split(".")
        if len(parts) != 3 or not _PROJECT.match(parts[0]) or not all(_NAME.match(p) for p in parts[1:]):
            raise ValueError(
                f"--output {output}: write bq:PROJECT.DATASET.PREFIX, e.g. bq:my-project.evals.nightly "
                "(project id: 6 to 30 lowercase letters, digits or '-', starting with a letter, not ending with '-'; "
                "dataset and prefix: letters, digits, '_')")
        return cls(*parts)

    def table(self, name: str) -> str:
        """PROJECT.DATASET.PREFIX_name (standard SQL form)."""
        return f"{self.project}.{self.dataset}.{self.prefix}_{name}"

    def staging_table(self, name: str, run_id: str, launch: str) -> str:
        """PREFIX_name__staging_RUN_HASH: the run_id made a table name (its . and - as _) and a hash of it and the
        launch, so that no two launches share one: not eval.1, eval-1 and eval_1, nor two launches of one run_id
        (bq: outputs take no lease), nor a rerun and the rows a failed launch left behind."""
        digest = hashlib.sha256(f"{run_id}\0{launch}".encode()).hexdigest()[:12]
        return f"{self.table(name)}__staging_{re.sub(r'[^A-Za-z0-9_]', '_', run_id)}_{digest}"


# pyarrow type -> BigQuery type (legacy names, as Beam's TableSchema and the load API use them)
def _scalar_type(t: pa.DataType) -> str:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "STRING"
    if pa.types.is_boolean(t):
        return "BOOLEAN"
    if pa.types.is_integer(t):
        return "INTEGER"
    if pa.types.is_floating(t):
        return "FLOAT"
    if pa.types.is_timestamp(t):
        return "TIMESTAMP"
    if pa.types.is_date(t):
        return "DATE"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "BYTES"
    if pa.types.is_decimal(t):
        return "NUMERIC"
    raise ValueError(f"pyarrow type {t} has no BigQuery column type; add it to pipeline/io/bigquery.py")


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def bigquery_field(field: pa.Field) -> dict[str, Any]:
    """One pyarrow field -> one BigQuery schema field: nullable -> NULLABLE/REQUIRED, list -> REPEATED,
    struct -> RECORD (recursively)."""
    t, mode = field.type, "NULLABLE" if field.nullable else "REQUIRED"
    if _is_list(t):
        t, mode = t.value_type, "REPEATED"
        if _is_list(t):
            raise ValueError(f"column {field.name}: BigQuery has no list of lists; wrap the inner list in a struct")
    out: dict[str, Any] = {"name": field.name, "mode": mode}
    if pa.types.is_struct(t):
        out["type"] = "RECORD"
        out["fields"] = [bigquery_field(t.field(i)) for i in range(t.num_fields)]
    else:
        out["type"] = _scalar_type(t)
    return out


def bigquery_schema(schema: pa.Schema) -> dict[str, Any]:
    """A pyarrow schema -> the {'fields': [...]} schema WriteToBigQuery and the BigQuery API take."""
    return {"fields": [bigquery_field(f) for f in schema]}


def to_bigquery_row(row: dict[str, Any], schema: pa.Schema) -> dict[str, Any]:
    """A table row (as the Parquet sink gets it) -> a JSON-ready BigQuery row: null lists become []
    (REPEATED columns cannot be null), numpy scalars become Python numbers."""
    return {f.name: _value(row.get(f.name), f.type) for f in schema}


def _value(value: Any, t: pa.DataType) -> Any:
    if _is_list(t):
        return [] if value is None else [_value(v, t.value_type) for v in value]
    if value is None:
        return None
    if pa.types.is_struct(t):
        return {t.field(i).name: _value(value.get(t.field(i).name), t.field(i).type) for i in range(t.num_fields)}
    if hasattr(value, "item"):  # numpy scalar
        value = value.item()
    if pa.types.is_floating(t):
        return float(value)
    if pa.types.is_integer(t):
        return int(value)
    if pa.types.is_timestamp(t) and hasattr(value, "isoformat"):
        return value.isoformat()
    return value


class WriteStagingTable(beam.PTransform):
    """Load one table's rows of one run into its staging table (replaced if it exists);
    publish() later moves them into PREFIX_<table> in one transaction."""

    def __init__(self, table: str, schema: pa.Schema, output: str, run_id: str, launch: str, gcs_temp: str | None = None):
        super().__init__()
        self.table, self.schema, self.run_id, self.launch, self.gcs_temp = table, schema, run_id, launch, gcs_temp
        self.output = BigQueryOutput.parse(output)

    def expand(self, rows):
        from apache_beam.io.gcp.bigquery import BigQueryDisposition, WriteToBigQuery

        return (
            rows
            | "ToBigQueryRows" >> beam.Map(to_bigquery_row, self.schema)
            | "Load" >> WriteToBigQuery(
                table=self.output.staging_table(self.table, self.run_id, self.launch),
                schema=bigquery_schema(self.schema),
                create_disposition=BigQueryDisposition.CREATE_IF_NEEDED,
                write_disposition=BigQueryDisposition.WRITE_TRUNCATE,
                method=WriteToBigQuery.Method.FILE_LOADS,
                custom_gcs_temp_location=self.gcs_temp,
            )
        )


def write_table(table: str, schema: pa.Schema, spec) -> beam.PTransform:
    """The BigQuery side of sinks.write_table: `rows | write_table("scores", SCORES_SCHEMA, spec)`.
    `spec` is a sinks.OutputSpec with output bq:PROJECT.DATASET.PREFIX; load files are staged under
    spec.staging when it is a gs:// path (else Beam's --temp_location)."""
    gcs_temp = spec.staging if str(spec.staging).startswith("gs://") else None
    return WriteStagingTable(table, schema, spec.output, spec.run_id, spec.launch, gcs_temp)


def summary_to_run_row(summary: dict[str, Any]) -> dict[str, Any]:
    """summary.json -> the run's PREFIX_runs row (RUNS_SCHEMA)."""
    model, kernel, counts = summary.get("model", {}), summary.get("kernel", {}), summary.get("counts", {})
    return {
        "run_id": summary["run_id"],
        "task": summary["task"],
        "started_at": summary.get("started_at"),
        "finished_at": summary.get("finished_at"),
        "wall_s": summary.get("wall_s"),
        "model_id": model.get("model_id"),
        "model_fingerprint": model.get("fingerprint"),
        "attention_requested": kernel.get("requested"),
        "attention_impl": kernel.get("resolved"),
        "backend": summary.get("backend", {}).get("target"),
        "records": counts.get("records"),
        "scored": counts.get("scored"),
        "errors": counts.get("errors"),
        "docs_per_s": summary.get("throughput", {}).get("docs_per_s"),
        "summary_json": json.dumps(finite_or_none(summary), sort_keys=True, default=str, allow_nan=False),  # as summary.json
    }


def publish_script(output: BigQueryOutput, run_id: str, launch: str) -> str:
    """One BigQuery script that replaces run `run_id` in PREFIX_scores/_errors/_runs with the rows
    of its staging tables: DELETE + INSERT inside one transaction (readers see all the old rows or
    all the new ones, never a mix), then the staging tables are dropped."""
    lines = [f"DECLARE run STRING DEFAULT {json.dumps(run_id)};", "BEGIN TRANSACTION;"]
    for name in TABLE_SCHEMAS:
        columns = ", ".join(f"`{f.name}`" for f in TABLE_SCHEMAS[name])
        lines.append(f"DELETE FROM `{output.table(name)}` WHERE run_id = run;")
        lines.append(f"INSERT INTO `{output.table(name)}` ({columns}) "
                     f"SELECT {columns} FROM `{output.staging_table(name, run_id, launch)}` WHERE run_id = run;")
    lines.append("COMMIT TRANSACTION;")
    for name in TABLE_SCHEMAS:
        lines.append(f"DROP TABLE IF EXISTS `{output.staging_table(name, run_id, launch)}`;")
    return "\n".join(lines)


# The rows each staging table holds, by the run's counts (the runs row is loaded by publish itself).
STAGED_COUNTS = {"scores": "scored", "errors": "errors"}


def publish(spec, summary: dict[str, Any], client=None) -> dict[str, str]:
    """After the pipeline (called by pipeline/runs/publish.py for bq: outputs): make sure the final tables exist
    with every current column, check this launch's staging tables (one without rows may have none yet; one
    whose rows the run counts must be there), load the run row, then run publish_script. Safe to repeat (a
    retried Beam bundle): a launch whose runs row is already the run's only drops its staging tables again.
    Needs credentials and the BigQuery API; returns the table names."""
    from google.api_core.exceptions import NotFound
    from google.cloud import bigquery as bq

    output = BigQueryOutput.parse(spec.output)
    client = client or bq.Client(project=output.project)
    for name, schema in TABLE_SCHEMAS.items():
        fields = [bq.SchemaField.from_api_repr(f) for f in bigquery_schema(schema)["fields"]]
        table = client.create_table(bq.Table(output.table(name), schema=fields), exists_ok=True)
        add_missing_columns(client, table, fields)
    if published_launch(client, output, spec.run_id) == spec.launch:
        for name in TABLE_SCHEMAS:
            client.delete_table(output.staging_table(name, spec.run_id, spec.launch), not_found_ok=True)
        return {name: output.table(name) for name in TABLE_SCHEMAS}
    counts = summary.get("counts", {})
    for name, schema in TABLE_SCHEMAS.items():
        staging = output.staging_table(name, spec.run_id, spec.launch)
        try:
            client.get_table(staging)
        except NotFound:
            rows = counts.get(STAGED_COUNTS.get(name, ""), 0) or 0
            if rows:
                raise RuntimeError(f"run {spec.run_id}: the staging table {staging} is gone though this launch loaded "
                                   f"{rows} {name} rows into it; nothing was published (rerun the run)") from None
            fields = [bq.SchemaField.from_api_repr(f) for f in bigquery_schema(schema)["fields"]]
            client.create_table(bq.Table(staging, schema=fields), exists_ok=True)
    runs_fields = [bq.SchemaField.from_api_repr(f) for f in bigquery_schema(RUNS_SCHEMA)["fields"]]
    client.load_table_from_json(
        [to_bigquery_row(summary_to_run_row({**summary, "launch_id": spec.launch}), RUNS_SCHEMA)],
        output.staging_table("runs", spec.run_id, spec.launch),
        job_config=bq.LoadJobConfig(schema=runs_fields, write_disposition=bq.WriteDisposition.WRITE_TRUNCATE),
    ).result()
    client.query(publish_script(output, spec.run_id, spec.launch)).result()
    return {name: output.table(name) for name in TABLE_SCHEMAS}


def add_missing_columns(client, table, fields) -> None:
    """Columns docscore added since the table was made (nullable or repeated: BigQuery adds those to a table with
    rows), so the publish's INSERT, which names every current column, finds them."""
    have = {f.name for f in table.schema}
    missing = [f for f in fields if f.name not in have]
    if not missing:
        return
    required = [f.name for f in missing if f.mode == "REQUIRED"]
    if required:
        raise ValueError(f"{table.reference}: lacks the required column(s) {', '.join(required)} that this docscore "
                         "writes; BigQuery cannot add a required column to a table: publish to a new PREFIX")
    table.schema = [*table.schema, *missing]
    client.update_table(table, ["schema"])


def published_launch(client, output: BigQueryOutput, run_id: str) -> str | None:
    """The launch whose rows PREFIX_runs holds for run_id (its summary's launch_id), or None."""
    from google.cloud import bigquery as bq

    job = client.query(
        f"SELECT JSON_VALUE(summary_json, '$.launch_id') AS launch FROM `{output.table('runs')}` WHERE run_id = @run",
        job_config=bq.QueryJobConfig(query_parameters=[bq.ScalarQueryParameter("run", "STRING", run_id)]))
    launches = [row["launch"] for row in job.result()]
    return launches[0] if len(launches) == 1 else None
