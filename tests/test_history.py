"""Run history rows: flattening summaries, one file per run replaced atomically, read back by DuckDB and
through fsspec. The row of a REAL run is checked against its tables in tests/test_report.py."""
from __future__ import annotations

import datetime
import json

import duckdb
import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.io import run_commit
from pipeline.runs import history


def summary_in_layout(run_id: str, *, scored: int, errors: int, docs_per_s: float, accuracy: float | None) -> dict:
    """A summary in the layout pipeline/runs/summary.py writes (only the keys history reads)."""
    return {
        "run_id": run_id,
        "task": "classify",
        "started_at": "2026-12-01T10:00:00+00:00",
        "finished_at": "2026-12-01T10:01:40+00:00",
        "wall_s": 100.0,
        "config": {"input": "gs://bucket/shards/*.jsonl", "output_format": "parquet"},
        "runner": {"runner": "DataflowRunner"},
        "backend": {"launcher": "cpu", "workers": ["tpu"]},
        "kernel": {"requested": "flash", "resolved": "pallas_tpu"},
        "model": {"name": "minilm-l6", "model_id": "minilm-l6@abc", "fingerprint": "ab" * 32, "dtype": "bfloat16"},
        "counts": {"records": scored + errors, "scored": scored, "errors": errors},
        "timing": {"stages": {"infer": {"total_ms": 5000.0, "p50": 2.5, "p95": 9.0, "p99": 12.0}}},
        "throughput": {"docs_per_s": docs_per_s, "tokens_per_s": 10 * docs_per_s},
        "tokens": {"padding_efficiency": 0.8},
        "compile": {"count": 3, "time_ms": 1500},
        "memory": {"peak_rss_mb": 900},
        "task_metrics": {} if accuracy is None else {"accuracy": accuracy, "macro_f1": None, "n_gold": 4},
    }


def read_history(output_dir: str) -> pa.Table:
    """Every committed run's history row under output_dir, read through each run's summary."""
    files = [f for run_id in run_commit.committed_run_ids(output_dir)
             for f in run_commit.committed_files(output_dir, run_id, "history")]
    return pa.concat_tables([pq.read_table(f) for f in files])


def test_history_row_flattens_the_summary():
    row = history.history_row(summary_in_layout("r1", scored=90, errors=10, docs_per_s=1.5, accuracy=0.75))
    assert row["started_at"] == datetime.datetime(2026, 12, 1, 10, 0, tzinfo=datetime.timezone.utc)
    assert (row["backend"], row["runner"], row["attention"], row["attention_impl"]) == ("tpu", "DataflowRunner", "flash", "pallas_tpu")
    assert (row["input_records"], row["scored"], row["errors"], row["error_rate"]) == (100, 90, 10, 0.1)
    assert (row["infer_p50_ms"], row["infer_p95_ms"], row["read_p50_ms"]) == (2.5, 9.0, None)
    assert (row["compile_count"], row["compile_ms"], row["peak_rss_mb"], row["dtype"]) == (3, 1500.0, 900.0, "bfloat16")
    assert row["task_metrics"] == [("accuracy", 0.75), ("n_gold", 4.0)]  # a metric the run could not compute is left out


def test_a_sparse_summary_gives_nulls_and_no_run_id_is_refused():
    row = history.history_row({"run_id": "old", "counts": {"records": 0, "scored": 0, "errors": 0}})
    assert row["error_rate"] is None and row["started_at"] is None and row["task_metrics"] is None
    assert row["command_wall_s"] is row["device_busy_fraction"] is row["compile_cold_count"] is row["batch_size"] is None
    assert row["pooling"] is row["max_seq_len"] is row["document_prompt"] is None
    with pytest.raises(ValueError, match="no run_id"):
        history.history_row({"counts": {}})



def test_the_optional_sections_fill_their_columns():
    """The gates, the shadow kernel, the device's busy share and every worker backend reach their columns, each
    from its own key of the summary (a column read from a neighbouring key, or left out, passed every test)."""
    summary = {
        **summary_in_layout("r1", scored=9, errors=1, docs_per_s=1.0, accuracy=None),
        "backend": {"launcher": "cpu", "workers": ["cpu", "gpu"]},  # workers of two kinds: both are named
        "shadow": {"impl": "blockwise", "documents": 6, "batches": 2, "output_max_abs_diff": 0.001,
                   "score_max_abs_diff": 0.0005, "passed": True},
        "gates": {"error_fraction": {"limit": 0.2, "value": 0.1, "passed": True}},
        "device": {"busy_s": 40.0, "busy_processes": 1, "busy_fraction": 0.4, "host_us_per_doc": 6.0e6},
        "compile": {"count": 3, "time_ms": 1500, "cold_count": 2, "cached_count": 1},
        "command_wall_s": 130.0, "batching": {"batch_size": 16},
        "model": {"pooling": "cls", "max_seq_len": 128, "matmul_precision": "highest", "prompts": {"query": "q: "}},
    }
    row = history.history_row(summary)
    assert (row["pooling"], row["max_seq_len"], row["matmul_precision"]) == ("cls", 128, "highest")
    assert (row["document_prompt"], row["query_prompt"]) == (None, "q: ")
    assert row["backend"] == "cpu,gpu"
    assert (row["shadow_attention_impl"], row["shadow_documents"], row["shadow_passed"]) == ("blockwise", 6, True)
    assert (row["shadow_output_max_abs_diff"], row["shadow_score_max_abs_diff"]) == (0.001, 0.0005)
    assert (row["max_error_fraction"], row["error_gate_passed"]) == (0.2, True)
    assert (row["device_busy_fraction"], row["host_us_per_doc"], row["command_wall_s"]) == (0.4, 6.0e6, 130.0)
    assert (row["compile_cold_count"], row["compile_cached_count"], row["batch_size"]) == (2, 1, 16)
    assert history.history_table([summary]).to_pylist() == [row]  # the row fits HISTORY_SCHEMA as it is

def test_each_launch_writes_its_own_file_and_only_committed_rows_are_read(tmp_path):
    out = str(tmp_path)
    r1 = history.write_history_row(out, summary_in_layout("r1", scored=9, errors=1, docs_per_s=1.0, accuracy=0.5), "aaaa")
    r2 = history.write_history_row(out, summary_in_layout("r2", scored=10, errors=0, docs_per_s=2.0, accuracy=0.6), "bbbb")
    r1_again = history.write_history_row(out, summary_in_layout("r1", scored=10, errors=0, docs_per_s=3.0, accuracy=0.7), "cccc")
    assert r1 == "runs/run_id=r1/history-aaaa.parquet" and r1_again != r1
    for run_id, launch, path in (("r1", "cccc", r1_again), ("r2", "bbbb", r2)):  # what the commit writes
        (tmp_path / "runs" / f"run_id={run_id}" / "summary.json").write_text(
            json.dumps({"run_id": run_id, "launch_id": launch, "files": {"history": [path]}}))
    rows = read_history(out).select(["run_id", "docs_per_s"]).to_pylist()
    assert sorted((r["run_id"], r["docs_per_s"]) for r in rows) == [("r1", 3.0), ("r2", 2.0)]  # not r1's replaced row
    con = duckdb.connect()
    con.execute(run_commit.duckdb_views_sql(out, views=("history",)))
    assert con.sql("SELECT run_id, docs_per_s, task_metrics['accuracy'] FROM history ORDER BY run_id").fetchall() == [
        ("r1", 3.0, 0.7), ("r2", 2.0, 0.6)]
    leftovers = [p.name for p in tmp_path.rglob("*") if p.is_file() and "docscore-tmp" in p.name]
    assert leftovers == []  # each file was written under a temporary name and moved into place


def test_history_goes_through_fsspec():
    out = "memory://docscore-history-test/out"
    path = history.write_history_row(out, summary_in_layout("m1", scored=1, errors=0, docs_per_s=1.0, accuracy=None), "ab12")
    assert path == "runs/run_id=m1/history-ab12.parquet"
    fs, fs_path = fsspec.core.url_to_fs(f"{out}/{path}")
    with fs.open(fs_path, "rb") as f:
        table = pq.read_table(f)
    assert table.schema == history.HISTORY_SCHEMA
    assert table.to_pylist()[0]["run_id"] == "m1"
    fs.rm("/docscore-history-test", recursive=True)


@pytest.mark.parametrize("name", ["o'quote", "brackets[1]", "star*and?mark"])
def test_the_views_read_an_output_directory_whose_name_holds_quotes_or_glob_characters(tmp_path, name):
    import duckdb

    from tests.test_compare import score_rows, write_run

    out = str(tmp_path / name)
    write_run(out, "a", score_rows("a", "embed", 4, embeddings=np.eye(4, 8)))
    write_run(str(tmp_path / "brackets1"), "b", score_rows("b", "embed", 2, embeddings=np.eye(2, 8)))  # [1] must not match it
    con = duckdb.connect()
    con.execute(run_commit.duckdb_views_sql(out, views=("scores",)))
    assert con.sql("SELECT run_id, count(*) FROM scores GROUP BY run_id").fetchall() == [("a", 4)]
    assert run_commit.committed_run_ids(out) == ["a"]  # the runs with a committed summary, by their folders


def test_a_copied_partition_is_not_counted_again_by_the_views(tmp_path):
    """An analyst's backup copy beside a run's partition (scores/run_id=a.bak/) holds files of the names the
    run's summary lists: the views matched files by name alone and counted the run's rows twice."""
    import shutil

    import duckdb

    from tests.test_compare import score_rows, write_run

    out = str(tmp_path / "out")
    write_run(out, "a", score_rows("a", "embed", 4, embeddings=np.eye(4, 8)))
    for table in ("scores", "errors"):
        if (tmp_path / "out" / table / "run_id=a").exists():
            shutil.copytree(tmp_path / "out" / table / "run_id=a", tmp_path / "out" / table / "run_id=a.bak")
    shutil.copytree(tmp_path / "out" / "runs" / "run_id=a", tmp_path / "out" / "runs" / "run_id=a.bak")
    con = duckdb.connect()
    con.execute(run_commit.duckdb_views_sql(out, views=("scores",)))
    assert con.sql("SELECT run_id, count(*) FROM scores GROUP BY run_id").fetchall() == [("a", 4)]
