"""BigQuery output: schemas converted from the Parquet tables' pyarrow schemas (checked against
Beam's and google-cloud-bigquery's own schema parsers), row conversion, the publish transaction,
and the docscore graph with --output bq: built as a Dataflow job offline. Live BigQuery cannot be
reached here, so nothing is loaded."""
from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
import pytest

from pipeline.io.bigquery import (
    RUNS_SCHEMA,
    TABLE_SCHEMAS,
    BigQueryOutput,
    bigquery_schema,
    publish_script,
    summary_to_run_row,
    to_bigquery_row,
)
from pipeline.records import ERRORS_SCHEMA, SCORES_SCHEMA, TIMING_COLUMNS

pytest_plugins = ["gcs_support"]


def by_name(schema: dict) -> dict:
    return {f["name"]: f for f in schema["fields"]}


@pytest.mark.parametrize("schema", [SCORES_SCHEMA, ERRORS_SCHEMA, RUNS_SCHEMA], ids=["scores", "errors", "runs"])
def test_every_column_keeps_its_name_order_and_nullability(schema):
    fields = bigquery_schema(schema)["fields"]
    assert [f["name"] for f in fields] == schema.names
    for arrow, bq in zip(schema, fields):
        if pa.types.is_list(arrow.type):
            assert bq["mode"] == "REPEATED"
        else:
            assert bq["mode"] == ("NULLABLE" if arrow.nullable else "REQUIRED"), arrow.name


def test_scores_columns_map_to_bigquery_types():
    f = by_name(bigquery_schema(SCORES_SCHEMA))
    assert f["run_id"] == {"name": "run_id", "mode": "REQUIRED", "type": "STRING"}
    assert f["record_index"] == {"name": "record_index", "mode": "REQUIRED", "type": "INTEGER"}
    assert f["score"] == {"name": "score", "mode": "NULLABLE", "type": "FLOAT"}
    assert f["truncated"] == {"name": "truncated", "mode": "REQUIRED", "type": "BOOLEAN"}
    assert f["embedding"] == {"name": "embedding", "mode": "REPEATED", "type": "FLOAT"}
    assert f["scores"] == {
        "name": "scores", "mode": "REPEATED", "type": "RECORD",
        "fields": [{"name": "label", "mode": "NULLABLE", "type": "STRING"},
                   {"name": "score", "mode": "NULLABLE", "type": "FLOAT"}],
    }
    for name in TIMING_COLUMNS:
        assert f[name] == {"name": name, "mode": "REQUIRED", "type": "FLOAT"}
    errors = by_name(bigquery_schema(ERRORS_SCHEMA))
    assert errors["record_index"]["mode"] == "NULLABLE"  # null: the error is about a whole shard
    assert by_name(bigquery_schema(RUNS_SCHEMA))["started_at"]["type"] == "TIMESTAMP"


def test_other_arrow_types():
    schema = pa.schema([
        pa.field("nested", pa.struct([("inner", pa.struct([("x", pa.int32())])), ("when", pa.date32())]), nullable=False),
        pa.field("blob", pa.binary()),
        pa.field("flags", pa.list_(pa.bool_())),
    ])
    f = by_name(bigquery_schema(schema))
    assert f["nested"]["type"] == "RECORD" and f["nested"]["mode"] == "REQUIRED"
    assert f["nested"]["fields"][0] == {"name": "inner", "mode": "NULLABLE", "type": "RECORD",
                                        "fields": [{"name": "x", "mode": "NULLABLE", "type": "INTEGER"}]}
    assert f["nested"]["fields"][1]["type"] == "DATE"
    assert f["blob"]["type"] == "BYTES"
    assert f["flags"] == {"name": "flags", "mode": "REPEATED", "type": "BOOLEAN"}
    with pytest.raises(ValueError, match="list of lists"):
        bigquery_schema(pa.schema([pa.field("m", pa.list_(pa.list_(pa.int64())))]))
    with pytest.raises(ValueError, match="no BigQuery column type"):
        bigquery_schema(pa.schema([pa.field("d", pa.dictionary(pa.int8(), pa.string()))]))


@pytest.mark.parametrize("name", sorted(TABLE_SCHEMAS))
def test_beam_and_the_bigquery_client_accept_the_schemas(name):
    from apache_beam.io.gcp.bigquery_tools import parse_table_schema_from_json
    from google.cloud.bigquery import SchemaField

    schema = bigquery_schema(TABLE_SCHEMAS[name])
    table_schema = parse_table_schema_from_json(json.dumps(schema))
    assert [f.name for f in table_schema.fields] == TABLE_SCHEMAS[name].names
    for f in schema["fields"]:
        field = SchemaField.from_api_repr(f)
        assert (field.name, field.field_type, field.mode) == (f["name"], f["type"], f["mode"])
        assert [sub.name for sub in field.fields] == [sub["name"] for sub in f.get("fields", [])]


def test_rows_become_json_ready_bigquery_rows():
    row = {
        "run_id": "r1", "doc_id": "d1", "source": "gs://b/in/a.jsonl", "record_index": np.int64(3), "task": "classify",
        "score": np.float64(0.9), "label": "sports", "gold_label": None,
        "scores": [{"label": "sports", "score": np.float32(0.9)}, {"label": "tech", "score": 0.1}],
        "embedding": None, "perplexity": None, "n_tokens": 12, "n_chunks": 1, "truncated": False,
        "model_id": "minilm-l6", "attention_impl": "xla", **{c: 1.5 for c in TIMING_COLUMNS},
    }
    out = to_bigquery_row(row, SCORES_SCHEMA)
    assert list(out) == SCORES_SCHEMA.names
    assert out["embedding"] == []  # REPEATED columns cannot be null
    assert out["record_index"] == 3 and type(out["record_index"]) is int
    assert type(out["scores"][0]["score"]) is float
    json.dumps(out)  # no numpy left
    pa.Table.from_pylist([out], schema=SCORES_SCHEMA)  # and still the table's schema


def test_bigquery_output_spec():
    out = BigQueryOutput.parse("bq:my-project.evals.nightly")
    assert out.table("scores") == "my-project.evals.nightly_scores"
    staging = out.staging_table("errors", "2026-01-01T00:00Z", "0123456789ab")
    assert re.fullmatch(r"my-project\.evals\.nightly_errors__staging_2026_01_01T00_00Z_[0-9a-f]{12}", staging)
    # run_ids that read alike as table names, and two launches of one run_id (bq: outputs take no lease), keep
    # their own staging tables: a launch never publishes rows another one loaded
    assert len({out.staging_table("scores", run_id, "l1") for run_id in ("eval.1", "eval-1", "eval_1")}) == 3
    assert out.staging_table("scores", "eval", "l1") != out.staging_table("scores", "eval", "l2")
    for bad in ("bq:my-project.evals", "bq:My_Project.evals.x", "bq:my-project.ev-als.x"):
        with pytest.raises(ValueError, match="bq:PROJECT.DATASET.PREFIX"):
            BigQueryOutput.parse(bad)


def test_publish_replaces_a_run_in_one_transaction():
    out = BigQueryOutput.parse("bq:my-project.evals.nightly")
    lines = publish_script(out, "run-7", "l1").splitlines()
    begin, commit = lines.index("BEGIN TRANSACTION;"), lines.index("COMMIT TRANSACTION;")
    inside, after = lines[begin + 1:commit], lines[commit + 1:]
    for name, schema in TABLE_SCHEMAS.items():
        delete = f"DELETE FROM `my-project.evals.nightly_{name}` WHERE run_id = run;"
        assert delete in inside
        insert = next(line for line in inside if line.startswith(f"INSERT INTO `my-project.evals.nightly_{name}`"))
        assert inside.index(delete) < inside.index(insert)
        assert f"FROM `{out.staging_table(name, 'run-7', 'l1')}` WHERE run_id = run;" in insert
        assert insert.count("`record_index`" if "record_index" in schema.names else "`run_id`") == 2
        assert f"DROP TABLE IF EXISTS `{out.staging_table(name, 'run-7', 'l1')}`;" in after
    assert lines[0] == 'DECLARE run STRING DEFAULT "run-7";'


class RecordingClient:
    """The part of google.cloud.bigquery.Client that publish() calls, over tables held in memory: BigQuery cannot
    be reached here. Scripts are recorded, not run; a runs row a script would commit is set with `published`."""

    def __init__(self, tables=None, published=None):
        self.tables = dict(tables or {})  # name -> list of SchemaField
        self.published = published  # the launch_id PREFIX_runs holds for the run
        self.scripts, self.loads, self.updated, self.deleted = [], [], [], []

    def create_table(self, table, exists_ok=False):
        name = f"{table.project}.{table.dataset_id}.{table.table_id}"
        self.tables.setdefault(name, list(table.schema))
        made = type(table)(name, schema=self.tables[name])
        return made

    def get_table(self, name):
        from google.api_core.exceptions import NotFound
        from google.cloud import bigquery as bq

        if name not in self.tables:
            raise NotFound(name)
        return bq.Table(name, schema=self.tables[name])

    def update_table(self, table, fields):
        assert fields == ["schema"]
        self.tables[f"{table.project}.{table.dataset_id}.{table.table_id}"] = list(table.schema)
        self.updated.append(table.table_id)

    def delete_table(self, name, not_found_ok=False):
        self.tables.pop(name, None)
        self.deleted.append(name)

    def load_table_from_json(self, rows, name, job_config=None):
        self.loads.append((name, rows))
        return self

    def query(self, sql, job_config=None):
        if sql.startswith("SELECT JSON_VALUE"):
            self.rows = [] if self.published is None else [{"launch": self.published}]
        else:
            self.scripts.append(sql)
            self.rows = []
        return self

    def result(self):
        return getattr(self, "rows", [])


def test_publish_checks_its_own_staging_tables_and_is_safe_to_repeat():
    from google.cloud import bigquery as bq

    from pipeline.io import bigquery
    from pipeline.io.sinks import OutputSpec

    spec = OutputSpec("bq:my-project.evals.nightly", "r1", "parquet", "gs://b/tmp/_staging/r1/launch1")
    out = BigQueryOutput.parse(spec.output)
    summary = {"run_id": "r1", "task": "embed", "counts": {"records": 3, "scored": 3, "errors": 0}}
    scores_fields = [bq.SchemaField.from_api_repr(f) for f in bigquery_schema(SCORES_SCHEMA)["fields"]]
    # a scores table made before the shadow_* columns existed; the launch's loaded scores staging table
    old = [f for f in scores_fields if not f.name.startswith("shadow_")]
    staged = {out.staging_table("scores", "r1", spec.launch): scores_fields}
    client = RecordingClient({out.table("scores"): old, **staged})
    bigquery.publish(spec, summary, client)
    assert client.updated == ["nightly_scores"] and client.tables[out.table("scores")] == scores_fields
    assert out.staging_table("errors", "r1", spec.launch) in client.tables  # no error rows: an empty one
    (runs_table, (row,)), = client.loads
    assert runs_table == out.staging_table("runs", "r1", spec.launch) and json.loads(row["summary_json"])["launch_id"] == spec.launch
    assert client.scripts == [publish_script(out, "r1", spec.launch)]
    # a retried bundle after the commit (its script dropped the staging tables): nothing deleted or inserted again
    retry = RecordingClient(published=spec.launch)
    bigquery.publish(spec, summary, retry)
    assert retry.scripts == [] and retry.loads == []
    # the scores this launch loaded are gone (another hand dropped them): refused, not published as no scores
    gone = RecordingClient(published="another-launch")
    with pytest.raises(RuntimeError, match="is gone though this launch loaded 3 scores rows"):
        bigquery.publish(spec, summary, gone)
    assert gone.scripts == []


def test_run_row_from_a_summary():
    summary = {
        "run_id": "r1", "task": "embed", "started_at": "2026-01-01T00:00:00+00:00",
        "finished_at": "2026-01-01T00:01:00+00:00", "wall_s": 60.0,
        "model": {"model_id": "minilm-l6", "fingerprint": "abc"}, "kernel": {"requested": "auto", "resolved": "xla"},
        "backend": {"target": "cpu"}, "counts": {"records": 10, "scored": 9, "errors": 1},
        "throughput": {"docs_per_s": 0.15}, "timing": {"stages": {}},
    }
    row = to_bigquery_row(summary_to_run_row(summary), RUNS_SCHEMA)
    assert row["scored"] == 9 and row["attention_impl"] == "xla" and row["backend"] == "cpu"
    assert json.loads(row["summary_json"]) == summary
    table = pa.Table.from_pylist([{**row, "started_at": None, "finished_at": None}], schema=RUNS_SCHEMA)
    assert table.num_rows == 1


@pytest.mark.integration
def test_docscore_graph_with_bigquery_output_builds_a_dataflow_job(monkeypatch, gcs):
    """--output bq:... goes through sinks.write_table into WriteToBigQuery (file loads) in the real
    graph; built with DataflowRunner --dry_run, nothing reaches Google (the input is on the GCS emulator)."""
    import apache_beam as beam

    from pipeline.graph import build_pipeline
    from pipeline.io import sinks
    from pipeline.options import parse_options
    from pipeline.validate import validate

    monkeypatch.setenv("DOCSCORE_PROJECT", "docscore-test")
    monkeypatch.setenv("DOCSCORE_REGION", "us-central1")
    monkeypatch.setenv("DOCSCORE_TEMP_LOCATION", "gs://docscore-test-bucket/tmp")
    monkeypatch.setenv("DOCSCORE_IMAGE", "us-docker.pkg.dev/docscore-test/docscore/worker:tpu")
    gcs.fs().pipe(f"{gcs.bucket}/in.jsonl", b'{"id": "a", "text": "one document"}\n')
    options, eo = parse_options(["--preset", "dataflow-tpu-v5e", "--input", gcs.url("in.jsonl"),
                                 "--output", "bq:docscore-test.evals.nightly", "--run_id", "r1",
                                 "--max_seq_len", "64", "--no_auth", "--dry_run=True"])
    plan = validate(eo)
    out = sinks.OutputSpec.for_run(eo.output, eo.run_id, eo.output_format, options.get_all_options()["temp_location"])
    p = beam.Pipeline(options=options)
    build_pipeline(p, eo, plan, out)
    job = p.run().job
    names = {t.unique_name for t in job.proto_pipeline.components.transforms.values()}
    for table in ("Scores", "Errors"):
        loads = [n for n in names if n.startswith(f"Write{table}ToBigQuery/Load")]
        assert loads, f"no BigQuery load for {table}: {sorted(names)[:20]}"


def test_a_malformed_bigquery_output_is_a_configuration_error():
    """It was a ValueError traceback out of building the graph (exit 1), after the model had loaded."""
    from pipeline.options import ConfigError, parse_options
    from pipeline.validate import check_options

    _, eo = parse_options(["--input", "x.jsonl", "--task", "embed", "--output", "bq:my_proj.evals.x"])
    with pytest.raises(ConfigError, match=r"--output bq:my_proj.evals.x: write bq:PROJECT.DATASET.PREFIX"):
        check_options(eo)


def test_a_local_bigquery_runs_temp_location_is_probed_before_any_data_is_read(gcs, tmp_path):
    """BigQuery loads the run's tables from --temp_location: only its gs:// prefix was checked, so a bucket that is
    not there (or not writable) failed the load after every document had been read and scored (exit 1, ~2 min of
    retries and tracebacks). A gs:// --output gets the same probe."""
    from pipeline.options import ConfigError, parse_options
    from pipeline.validate import validate

    shard = tmp_path / "in.jsonl"
    shard.write_text('{"id": "a", "text": "one document"}\n')
    flags = ["--input", str(shard), "--output", "bq:docscore-test.evals.nightly", "--run_id", "r1", "--max_seq_len", "64"]
    _, eo = parse_options([*flags, "--temp_location", "gs://docscore-no-such-bucket/tmp"])
    with pytest.raises(ConfigError, match="--temp_location gs://docscore-no-such-bucket/tmp: .*docscore-no-such-bucket"):
        validate(eo)
    _, eo = parse_options([*flags, "--temp_location", gcs.url("tmp")])
    assert list(validate(eo).shards) == [str(shard)]
