"""Publishing inside the job: the real docscore graph on the DirectRunner commits its own run (tables,
history row, summary.json naming them) with no launcher step after it; the publish is safe to repeat
(a retried Beam bundle) after a crash mid-placement, after it completed, and after a half-removed staging
directory, and until the commit the previous run is what readers see; the summary's metric-only parts
stay null until a waiting launcher adds the Beam metrics; template and dry-run launches are recognised
as launches nobody waits for."""
from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import apache_beam as beam
import fsspec
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.io import run_commit, sinks
from pipeline.runs import publish
from pipeline.runs.summary import (FORMAT_VERSION, add_metrics, summary_from_stats, with_command_wall,
                                   with_launcher_compiles)
from pipeline.telemetry.progress import runs_locally
from tests.conftest import SENTENCES, common_flags, read_table, write_jsonl


def test_the_job_alone_publishes_its_run(tmp_path):
    """build_pipeline + Pipeline.run(): nothing of main() after the run, and the run is published."""
    from pipeline.graph import build_pipeline
    from pipeline.options import parse_options
    from pipeline.validate import validate

    shard = write_jsonl(tmp_path / "in" / "a.jsonl",
                        [{"id": f"d{i}", "text": t} for i, t in enumerate(SENTENCES[:3])] + ["{not json"])
    out = tmp_path / "out"
    options, eo = parse_options(["--input", str(shard), *common_flags("alone", out), "--attention", "native"])
    plan = validate(eo)
    spec = sinks.OutputSpec.for_run(eo.output, eo.run_id, eo.output_format)
    p = beam.Pipeline(options=options)
    build_pipeline(p, eo, plan, spec, started=1_000.0)
    p.run().wait_until_finish()

    scores, _ = read_table(out, "scores", "alone")
    errors, _ = read_table(out, "errors", "alone")
    assert sorted(scores.doc_id) == ["d0", "d1", "d2"] and list(errors.error_type) == ["invalid_json"]
    run_dir = out / "runs" / "run_id=alone"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["launch_id"] == spec.launch and sorted(summary["files"]) == ["errors", "history", "scores"]
    assert summary["counts"]["records"] == 4 and summary["counts"]["scored"] == 3
    assert summary["started_at"].startswith("1970-01-01T00:16:40")  # the launch time handed to the job
    assert summary["wall_s"] > 1_000 and summary["kernel"]["in_rows"] == ["xla"]
    assert summary["compile"]["count"] is None and summary["metrics"] == {}  # Beam metrics: the launcher's to add
    # the history row is part of the commit; the report is the launcher's to write (after adding metrics)
    assert (out / summary["files"]["history"][0]).exists() and not (run_dir / "report.html").exists()
    assert not (out / "_staging").exists()


def test_tables_are_parquet_with_dictionaries_for_strings_only_and_an_empty_table_keeps_its_schema(tmp_path):
    """No bad record: the errors table is still one Parquet file, of no rows, with the errors schema.
    The scores file dictionary-encodes its string columns and not the embedding's floats (pyarrow's
    default would build a dictionary for them only to drop it: benchmarks/README.md)."""
    import pyarrow.parquet as pq

    from pipeline.graph import build_pipeline
    from pipeline.options import parse_options
    from pipeline.records import ERRORS_SCHEMA
    from pipeline.validate import validate

    shard = write_jsonl(tmp_path / "in" / "a.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(SENTENCES[:3])])
    out = tmp_path / "out"
    options, eo = parse_options(["--input", str(shard), *common_flags("clean", out), "--task", "embed"])
    p = beam.Pipeline(options=options)
    build_pipeline(p, eo, validate(eo), sinks.OutputSpec.for_run(eo.output, eo.run_id, eo.output_format))
    p.run().wait_until_finish()

    errors, error_files = read_table(out, "errors", "clean")
    assert len(errors) == 0 and len(error_files) == 1
    assert pq.read_schema(error_files[0]).remove_metadata().equals(ERRORS_SCHEMA.remove_metadata())
    scores, score_files = read_table(out, "scores", "clean")
    assert sorted(scores.doc_id) == ["d0", "d1", "d2"] and all(len(e) == 384 for e in scores.embedding)
    columns = pq.ParquetFile(score_files[0]).metadata.row_group(0)
    encodings = {columns.column(i).path_in_schema: columns.column(i).encodings for i in range(columns.num_columns)}
    assert "RLE_DICTIONARY" in encodings["doc_id"]
    assert "RLE_DICTIONARY" not in encodings["embedding.list.element"], encodings["embedding.list.element"]


def test_parquet_sink_writes_a_row_group_per_buffer_of_record_batches(tmp_path):
    """ParquetRowsSink on its own: every row lands, in one row group by default; with a small
    row_group_bytes the buffered record batches go out as a row group each time they pass it."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([pa.field("doc_id", pa.string(), nullable=False), ("embedding", pa.list_(pa.float32()))])
    rows = [{"doc_id": f"d{i}", "embedding": np.full(4, i, np.float32)} for i in range(2500)]
    for name, sink, groups in (("one.parquet", sinks.ParquetRowsSink(schema), 1),
                               ("many.parquet", sinks.ParquetRowsSink(schema, batch_rows=1000, row_group_bytes=1), 3)):
        with open(tmp_path / name, "wb") as fh:
            sink.open(fh)
            for start in range(0, len(rows), 7):  # lists of rows, as the pipeline hands them over
                sink.write(rows[start:start + 7])
            sink.flush()
        written = pq.ParquetFile(tmp_path / name)
        assert written.metadata.num_row_groups == groups
        table = written.read()
        assert table.column("doc_id").to_pylist() == [r["doc_id"] for r in rows]
        assert table.column("embedding").to_pylist()[-1] == [2499.0] * 4


@pytest.mark.parametrize("runner", ["DirectRunner", "BundleBasedDirectRunner"])
def test_publish_step_waits_for_every_table_write(tmp_path, runner):
    """Many bundles of scores, few errors: the Publish step must see every write's files (BundleBased-
    DirectRunner handed a Flatten of them over early, publishing a partition without its files)."""
    spec = sinks.OutputSpec.for_run(str(tmp_path / "out"), "w1", "jsonl")
    with beam.Pipeline(options=PipelineOptions(["--runner", runner])) as p:
        rows = p | "Rows" >> beam.Create([[{"doc_id": f"d{i}"}, {"doc_id": f"d{i}b"}] for i in range(1500)]) | beam.Reshuffle()
        bad = p | "Bad" >> beam.Create([[{"doc_id": f"e{i}"}] for i in range(3)])  # lists of rows, as the pipeline writes
        written = {"scores": sinks.write_table(rows, "scores", spec), "errors": sinks.write_table(bad, "errors", spec)}
        stats = p | "Stats" >> beam.Create([json.dumps(STATS)])
        _ = stats | publish.PublishRun(spec, dict(FACTS, run_id="w1"), written, derived=False)
    for table, n in (("scores", 3000), ("errors", 3)):
        published, files = read_table(tmp_path / "out", table, "w1")
        assert len(published) == n and len(set(published.doc_id)) == n, (table, len(published), files)
    assert run_commit.committed_summary(spec.output, "w1")["counts"] == STATS["counts"]
    assert not (tmp_path / "out" / "_staging").exists()


# ---- repeating the publish (what a retried bundle does) --------------------------------------------


def stage_run(root: Path, run_id: str = "r1") -> tuple[sinks.OutputSpec, dict[str, list[str]]]:
    """Staged files as the Beam writes leave them (two scores parts, one errors part), an old committed
    run of the same run_id, and the written file names the Publish step receives."""
    old = sinks.OutputSpec.for_run(str(root / "out"), run_id, "parquet")
    publish.publish_run(old, dict(FACTS, run_id=run_id), OLD_STATS, stage(old, {"scores": 1, "errors": 1}, b"old"), derived=False)
    spec = sinks.OutputSpec.for_run(str(root / "out"), run_id, "parquet")
    return spec, stage(spec, {"scores": 2, "errors": 1}, b"new")


def stage(spec: sinks.OutputSpec, parts: dict[str, int], tag: bytes) -> dict[str, list[str]]:
    written = {}
    for table, n in parts.items():
        written[table] = []
        for i in range(n):
            path = Path(spec.staging) / table / f"part-{i:05d}-of-{n:05d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(tag + f" {table} {i}".encode())
            written[table].append(str(path))
    return written


def visible(spec: sinks.OutputSpec) -> dict[str, list[bytes]]:
    """What a reader sees of the run: the contents of the files its committed summary names."""
    return {table: [Path(f).read_bytes() for f in run_commit.committed_files(spec.output, spec.run_id, table)]
            for table in sinks.TABLES}


OLD = {"scores": [b"old scores 0"], "errors": [b"old errors 0"]}
NEW = {"scores": [b"new scores 0", b"new scores 1"], "errors": [b"new errors 0"]}


def test_publish_after_a_crash_mid_placement_gives_the_clean_result_and_readers_see_the_old_run_until_then(tmp_path, monkeypatch):
    spec, written = stage_run(tmp_path)
    real_replace, calls = os.replace, []

    def crash_on_second_move(src, dst, *args, **kwargs):
        calls.append(src)
        if len(calls) == 2:
            raise OSError("worker lost mid-publish")
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", crash_on_second_move)
    with pytest.raises(OSError, match="worker lost"):
        publish.publish_run(spec, FACTS, STATS, written, derived=False)
    assert visible(spec) == OLD  # the old run, whole, while the new one is half placed
    monkeypatch.setattr(os, "replace", real_replace)
    summary = publish.publish_run(spec, FACTS, STATS, written, derived=False)  # the retry
    assert visible(spec) == NEW and summary["launch_id"] == spec.launch
    # nothing but the new run's files and the replaced run's (kept for readers, as retired) is left
    named = {f for names in summary["files"].values() for f in names}
    retired = {f for r in summary["retired"] for f in r["files"]}
    assert on_disk(tmp_path / "out") == named | retired and len(retired) == 3 and not named & retired
    assert not (tmp_path / "out" / "_staging").exists()


def test_a_rerun_over_a_run_published_before_the_run_level_commit_keeps_its_files_for_the_grace_period(tmp_path):
    """A run an older docscore published (part files behind a _SUCCESS per partition, a summary without `files`)
    replaced by a rerun: its files were removed at the commit, under a reader that had just read its summary.
    They are retired as any replaced run's are: readable until the first clean-up after REPLACED_GRACE_S."""
    from tests.test_compare import score_rows, write_run

    out = tmp_path / "out"
    write_run(str(out), "r1", score_rows("r1", "embed", 4), n_errors=1, legacy=True)
    listed = {t: run_commit.committed_files(str(out), "r1", t) for t in sinks.TABLES}  # a reader lists the old run ...
    old = {t: [Path(f).read_bytes() for f in files] for t, files in listed.items()}
    assert old["scores"] and old["errors"]
    spec = sinks.OutputSpec.for_run(str(out), "r1", "parquet")
    summary = publish.publish_run(spec, dict(FACTS, run_id="r1"), STATS, stage(spec, {"scores": 1, "errors": 1}, b"new"),
                                  derived=False)  # ... and the rerun commits before it reads them
    assert {t: [Path(f).read_bytes() for f in files] for t, files in listed.items()} == old
    [retired] = summary["retired"]
    assert {"scores/run_id=r1/_SUCCESS", "errors/run_id=r1/_SUCCESS"} <= set(retired["files"])
    assert run_commit.clean_after_commit(str(out), "r1", now=summary["committed_at"] + 1) == []
    removed = run_commit.clean_after_commit(str(out), "r1", now=summary["committed_at"] + run_commit.REPLACED_GRACE_S)
    assert sorted(removed) == sorted(retired["files"])
    assert on_disk(out) == {f for names in summary["files"].values() for f in names}


def on_disk(out: Path) -> set[str]:
    """The data files in the run partitions, relative to the output root (summary.json left out)."""
    return {str(p.relative_to(out)) for p in out.rglob("*")
            if p.is_file() and p.parts[-3] in ("scores", "errors", "runs") and p.name != "summary.json"}


def test_a_reader_that_read_the_replaced_summary_still_reads_its_files_until_the_grace_period_ends(tmp_path):
    """A rerun commits while a reader holds the previous summary: the files it names stay readable (they are
    the previous run, whole); the first clean-up at least REPLACED_GRACE_S after the commit removes them,
    and a third launch's commit lists only the launches replaced within the grace period."""
    spec, written = stage_run(tmp_path)
    before = run_commit.committed_summary(spec.output, spec.run_id)  # a reader takes the old run's summary ...
    summary = publish.publish_run(spec, FACTS, STATS, written, derived=False)  # ... and the rerun commits
    old_files = {t: run_commit.committed_files(spec.output, spec.run_id, t, before) for t in sinks.TABLES}
    assert {t: [Path(f).read_bytes() for f in files] for t, files in old_files.items()} == OLD
    assert [r["launch_id"] for r in summary["retired"]] == [before["launch_id"]]

    # within the grace period a clean-up (the next launch's, a repeated publish) keeps them ...
    assert run_commit.clean_after_commit(spec.output, spec.run_id, now=summary["committed_at"] + 1) == []
    # ... after it they go, and only they
    removed = run_commit.clean_after_commit(spec.output, spec.run_id,
                                            now=summary["committed_at"] + run_commit.REPLACED_GRACE_S)
    assert sorted(removed) == sorted(summary["retired"][0]["files"])
    assert on_disk(tmp_path / "out") == {f for names in summary["files"].values() for f in names}
    assert visible(spec) == NEW

    third = sinks.OutputSpec.for_run(spec.output, spec.run_id, "parquet")
    latest = publish.publish_run(third, FACTS, STATS, stage(third, {"scores": 1, "errors": 1}, b"third"), derived=False)
    # two reruns within the grace period: both replaced launches are listed (and their files kept)
    assert [r["launch_id"] for r in latest["retired"]] == [before["launch_id"], spec.launch]
    assert {f for names in summary["files"].values() for f in names} <= on_disk(tmp_path / "out")


def test_publish_repeated_after_it_completed_keeps_the_run(tmp_path):
    spec, written = stage_run(tmp_path)
    first = publish.publish_run(spec, FACTS, STATS, written, derived=False)
    summary_file = Path(spec.summary_path())
    before = summary_file.stat().st_mtime_ns
    again = publish.publish_run(spec, FACTS, STATS, written, derived=False)  # the staging directory is gone by now
    assert visible(spec) == NEW and again["files"] == first["files"]
    assert summary_file.stat().st_mtime_ns == before, "a committed run was committed again"


def test_publish_repeated_after_a_half_removed_staging_keeps_the_run(tmp_path):
    spec, written = stage_run(tmp_path)
    publish.publish_run(spec, FACTS, STATS, written, derived=False)
    survivor = Path(written["scores"][1])  # the removal of staging stopped after one scores file
    survivor.parent.mkdir(parents=True)
    survivor.write_bytes(b"new scores 1")
    publish.publish_run(spec, FACTS, STATS, written, derived=False)
    assert visible(spec) == NEW
    assert not (tmp_path / "out" / "_staging").exists()


def test_publish_refuses_when_the_staged_files_are_gone_and_the_old_run_stays(tmp_path):
    spec, written = stage_run(tmp_path)
    fsspec.filesystem("file").rm(spec.staging, recursive=True)
    with pytest.raises(run_commit.CommitError, match="rerun with the same --run_id"):
        publish.publish_run(spec, FACTS, STATS, written, derived=False)
    assert visible(spec) == OLD


def test_a_failed_launch_is_discarded_and_the_old_run_is_untouched(tmp_path):
    spec, written = stage_run(tmp_path)
    run_commit.place_staged(spec.output, spec.run_id, spec.launch, "scores", written["scores"])  # then the job died
    run_commit.discard_launch(spec.output, spec.run_id, spec.launch, spec.staging)
    assert visible(spec) == OLD
    assert not [p for p in (tmp_path / "out").rglob(f"*{spec.launch}*")], "the failed launch left files"



def test_discarding_the_launch_that_committed_leaves_its_run_published(tmp_path):
    """A caller that judged a launch failed after it had committed (the job died after its commit) calls
    discard_launch for it: the published run is its own, so nothing goes: its scores and errors parts and its
    history file stay, and readers still see the new run."""
    spec, written = stage_run(tmp_path)
    summary = publish.publish_run(spec, FACTS, STATS, written, derived=False)
    kept = on_disk(tmp_path / "out")
    history = f"runs/run_id={spec.run_id}/{run_commit.history_name(spec.launch)}"
    assert history in kept and set(summary["files"]["scores"]) <= kept
    run_commit.discard_launch(spec.output, spec.run_id, spec.launch, spec.staging)
    assert on_disk(tmp_path / "out") == kept
    assert visible(spec) == NEW

# ---- the summary: in the job, then enriched by a waiting launcher ----------------------------------

FACTS = {
    "run_id": "r1", "task": "embed", "started": 100.0, "config": {"output_format": "parquet"},
    "runner": {"runner": "DataflowRunner"}, "versions": {"python": "3.11"},
    "backend": {"target": "tpu", "launcher": "cpu", "launcher_devices": ["cpu:0"]},
    "kernel": {"requested": "flash", "resolved": "pallas_tpu"}, "model": {"name": "minilm-l6"},
    "shadow": {"attention": "native", "impl": "xla", "fraction": 0.5, "tolerance": 0.01, "dtype": "bfloat16"},
    "notices": [],
}
OLD_STATS = {"counts": {"records": 2, "scored": 1, "errors": 1}, "stages": {"infer": {"total_ms": 1.0}}, "tokens": {"text_tokens": 8, "model_tokens": 8}}
STATS = {
    "counts": {"records": 5, "scored": 4, "errors": 1}, "stages": {"infer": {"total_ms": 40.0}},
    "tokens": {"text_tokens": 90, "model_tokens": 80}, "worker_backend": ["tpu"], "attention_impl": ["pallas_tpu"],
    "task_metrics": {}, "shadow": {"documents": 2, "passed": True},
}


def test_summary_leaves_metric_parts_null_until_the_launcher_adds_them():
    summary = summary_from_stats(FACTS, STATS, finished=110.0)
    assert summary["wall_s"] == 10.0 and summary["throughput"]["docs_per_s"] == 0.4
    assert summary["throughput"]["tokens_per_s"] == 8.0  # the tokens the model ran, not text --max_chunks cut off
    assert summary["backend"]["workers"] == ["tpu"] and summary["kernel"]["in_rows"] == ["pallas_tpu"]
    assert summary["compile"] == {"count": None, "time_ms": None, "model_calls": None, "cached_count": None,
                                  "cached_ms": None, "cold_count": None, "cold_ms": None}
    assert summary["device"] == {"busy_s": None, "busy_processes": None, "busy_fraction": None, "host_us_per_doc": None}
    assert summary["shadow"]["passed"] and summary["shadow"]["batches"] is None
    assert add_metrics(summary, {}) is summary  # nothing to add: nothing to republish
    ns = "docscore_inference_pallas_tpu"
    metrics = {f"{ns}/compiles": 2, f"{ns}/compile_ms": 900, f"{ns}/model_calls": 7, f"{ns}/shadow_batches": 3,
               f"{ns}/shadow_batch_us": {"sum": 4500.0, "count": 3, "min": 1000.0, "max": 2000.0},
               f"{ns}/compiles_cached": 1, f"{ns}/compile_cached_ms": 100, "docscore/device_busy_us": 4_000_000}
    enriched = add_metrics(summary, metrics)
    assert enriched["compile"] == {"count": 2, "time_ms": 900, "model_calls": 7, "cached_count": 1, "cached_ms": 100,
                                   "cold_count": 1, "cold_ms": 800}
    # Dataflow's workers: their busy seconds add up, and no fraction of one chip's time follows from the sum
    assert enriched["device"] == {"busy_s": 4.0, "busy_processes": None, "busy_fraction": None, "host_us_per_doc": None}
    # one local process: 4 of the pipeline's 10 s with a model batch in flight; 6 s of host time over 4 documents
    local = add_metrics({**summary, "runner": {"direct_running_mode": "multi_threading", "direct_num_workers": 4}}, metrics)
    assert local["device"] == {"busy_s": 4.0, "busy_processes": 1, "busy_fraction": 0.4, "host_us_per_doc": 1.5e6}
    workers = add_metrics({**summary, "runner": {"direct_running_mode": "multi_processing", "direct_num_workers": 3}},
                          metrics)
    assert workers["device"]["busy_processes"] == 3 and workers["device"]["busy_fraction"] is None
    per_core = add_metrics({**summary, "runner": {"runner": "DirectRunner", "direct_running_mode": "multi_processing",
                                                   "direct_num_workers": 0}}, metrics)  # Beam: one worker per core
    assert per_core["device"]["busy_processes"] == multiprocessing.cpu_count()
    if multiprocessing.cpu_count() > 1:
        assert per_core["device"]["busy_fraction"] is None and per_core["device"]["host_us_per_doc"] is None
    assert enriched["shadow"]["batches"] == 3 and enriched["shadow"]["time_ms"] == 4.5
    assert enriched["counts"] == summary["counts"] and enriched["metrics"] == metrics



def test_the_launchers_own_compiles_are_added_to_the_workers_under_the_kernels_names():
    """Validation compiles on the launcher before the job (label embeddings): its [count, seconds, cached count,
    cached seconds] add to the workers' counters of the resolved kernel, each to its own, so `compile` holds every
    compile of the command; a launcher that compiled nothing leaves the metrics as they are."""
    ns = "docscore_inference_pallas_tpu/"
    workers = {f"{ns}compiles": 2, f"{ns}compile_ms": 900, f"{ns}compiles_cached": 1, f"{ns}compile_cached_ms": 100,
               "docscore_inference_xla/compiles": 7}
    added = with_launcher_compiles(workers, "pallas_tpu", [3, 1.5, 1, 0.25])
    assert added == {**workers, f"{ns}compiles": 5, f"{ns}compile_ms": 2400, f"{ns}compiles_cached": 2,
                     f"{ns}compile_cached_ms": 350}
    assert workers[f"{ns}compiles"] == 2  # the job's metrics are not changed in place
    assert with_launcher_compiles({}, "xla", [1, 0.5, 0, 0.0]) == {
        "docscore_inference_xla/compiles": 1, "docscore_inference_xla/compile_ms": 500,
        "docscore_inference_xla/compiles_cached": 0, "docscore_inference_xla/compile_cached_ms": 0}
    assert with_launcher_compiles(workers, "pallas_tpu", [0, 0.0, 0, 0.0]) is workers
    summary = add_metrics(summary_from_stats(FACTS, STATS, finished=110.0), added)
    assert (summary["compile"]["count"], summary["compile"]["cold_count"], summary["compile"]["cold_ms"]) == (5, 3, 2050)


def test_the_commands_wall_time_and_its_phases():
    """command_wall_s runs from the process's start to `now`; each marked phase lasts until the next marked one
    (a phase not marked, here prepare, is inside the one before it), the last until `now`."""
    summary = summary_from_stats(FACTS, STATS, finished=110.0)
    assert summary["format_version"] == FORMAT_VERSION  # what compare reads before it sets two runs' figures side by side
    timed = with_command_wall(summary, {"job": 96.0, "start": 90.0, "validate": 91.5, "launcher": 111.0}, 112.25)
    assert timed["command_wall_s"] == 22.25
    assert timed["command_phases_s"] == {"start": 1.5, "validate": 4.5, "job": 15.0, "launcher": 1.25}
    assert list(timed["command_phases_s"]) == ["start", "validate", "job", "launcher"]  # in the command's order
    assert timed["wall_s"] == summary["wall_s"] and "command_wall_s" not in summary


def test_host_time_per_document_is_never_negative():
    """busy_s and wall_s come from different clocks (the job's model calls, the launcher's start and the job's
    finish): a busy time a little past the wall time is no host time, not a negative one."""
    local = {**summary_from_stats(FACTS, STATS, finished=110.0), "runner": {"runner": "DirectRunner"}}
    device = add_metrics(local, {"docscore/device_busy_us": 10_500_000})["device"]
    assert device["busy_processes"] == 1 and device["host_us_per_doc"] == 0.0 and device["busy_fraction"] == 1.05

def test_waiting_launcher_rewrites_the_enriched_summary_and_history_row_of_its_own_launch(tmp_path):
    spec, written = stage_run(tmp_path)
    publish.publish_run(spec, FACTS, STATS, written, derived=False)
    enriched = publish.enrich_published_summary(spec, {"docscore_inference_pallas_tpu/compiles": 2})
    committed = run_commit.committed_summary(spec.output, spec.run_id)
    assert enriched["compile"]["count"] == 2 and committed["compile"]["count"] == 2
    assert committed["files"] == enriched["files"] and visible(spec) == NEW
    import pyarrow.parquet as pq
    row = pq.read_table(run_commit.committed_files(spec.output, spec.run_id, "history")[0]).to_pylist()[0]
    assert row["compile_count"] == 2
    other = sinks.OutputSpec.for_run(spec.output, spec.run_id, "parquet")  # a launch that never committed
    with pytest.raises(run_commit.CommitError, match="no committed summary"):
        publish.enrich_published_summary(other, {"x": 1})
    bq = sinks.OutputSpec("bq:docscore-test.evals.nightly", "r1", staging=str(tmp_path / "staging"))
    assert publish.enrich_published_summary(bq, {"x": 1}) is None


def test_a_history_row_that_cannot_be_rewritten_leaves_the_enriched_summary_and_says_which_was_written(tmp_path):
    """A disk that fills between the summary's rewrite and the history row's: the launcher is told the summary has
    the additions (its report can be written from it), not that nothing of them was written."""
    spec, written = stage_run(tmp_path)
    publish.publish_run(spec, FACTS, STATS, written, derived=False)
    row = run_commit.committed_files(spec.output, spec.run_id, "history")[0]
    os.remove(row)
    os.mkdir(row)  # a folder where the row is: its rewrite fails as on a full disk, after the summary's
    with pytest.raises(publish.HistoryRowNotRewritten, match="IsADirectoryError") as caught:
        publish.enrich_published_summary(spec, {"docscore_inference_pallas_tpu/compiles": 2})
    assert caught.value.summary["compile"]["count"] == 2
    assert run_commit.committed_summary(spec.output, spec.run_id)["compile"]["count"] == 2


def test_launches_nobody_waits_for():
    assert publish.submit_only(PipelineOptions([])) is None
    assert runs_locally(PipelineOptions([])) and not runs_locally(PipelineOptions(["--runner", "DataflowRunner"]))
    assert "job.json" in publish.submit_only(PipelineOptions(["--template_location", "job.json"]))
    assert "--dry_run" in publish.submit_only(PipelineOptions(["--dry_run=True"]))
    spec = sinks.OutputSpec.for_run("gs://b/out", "flex-1", "parquet")
    message = publish.submitted_message("flex-1", spec, "written")
    assert "gs://b/out/scores/run_id=flex-1" in message and "gs://b/out/runs/run_id=flex-1/summary.json" in message
    assert os.path.basename(spec.staging) not in message  # where readers look, not the staging area


def test_the_replaced_runs_report_goes_at_the_commit(tmp_path, monkeypatch):
    """A launch stopped between its commit and its report must not leave the previous run's report.html beside
    the new summary (it described another launch): it is gone before the summary is written (on gs:// the two
    are separate requests), and `docscore report` writes it again."""
    spec, written = stage_run(tmp_path)
    report = Path(run_commit.report_path(spec.output, spec.run_id))
    report.write_text("<html>the old run</html>")
    commit, seen = run_commit.commit, []
    monkeypatch.setattr(run_commit, "commit", lambda *a, **k: seen.append(report.exists()) or commit(*a, **k))
    publish.publish_run(spec, FACTS, STATS, written, derived=False)  # the launcher would write the report next
    assert seen == [False]
    assert visible(spec) == NEW and not report.exists()
    report.write_text("<html>this launch's report</html>")
    publish.publish_run(spec, FACTS, STATS, written, derived=False)  # a retried publish of the same launch keeps it
    assert report.read_text() == "<html>this launch's report</html>"


def test_a_report_that_cannot_be_removed_does_not_fail_the_committed_run(tmp_path, caplog):
    """The commit happened: a report.html that cannot be removed (here a directory in its place) is logged, and the
    publish finishes (clean-up, staging removed) instead of failing a committed run as 'nothing was published'."""
    spec, written = stage_run(tmp_path)
    report = Path(run_commit.report_path(spec.output, spec.run_id))
    (report / "inside").mkdir(parents=True)
    summary = publish.publish_run(spec, FACTS, STATS, written, derived=False)
    assert visible(spec) == NEW and summary["launch_id"] == spec.launch
    assert not (tmp_path / "out" / "_staging").exists()
    assert "could not remove the replaced run's report" in caplog.text


def test_a_launch_removes_the_replaced_runs_files_once_the_grace_period_is_over(tmp_path, monkeypatch):
    """README: the replaced run's files go at the first commit *or launch* after the grace period, so a launch
    that then fails still removes them; not while another launch's staging of the run is left (a launch
    nobody waits for may still be placing files)."""
    from pipeline.io import run_lease

    spec, written = stage_run(tmp_path)
    summary = publish.publish_run(spec, FACTS, STATS, written, derived=False)
    retired = {f for r in summary["retired"] for f in r["files"]}
    assert run_lease.remove_replaced(spec.output, spec.run_id, own_launch="next") == []  # within the grace period
    monkeypatch.setattr(run_commit, "REPLACED_GRACE_S", 0.0)
    other = Path(spec.output) / "_staging" / f"run_id={spec.run_id}" / "flexjob"
    other.mkdir(parents=True)
    assert run_lease.remove_replaced(spec.output, spec.run_id, own_launch="next") == []
    assert retired <= on_disk(tmp_path / "out")
    other.rmdir()
    with run_lease.acquire(spec.output, spec.run_id, "next"):  # as launch.py calls it: holding the run's lease
        assert sorted(run_lease.remove_replaced(spec.output, spec.run_id, own_launch="next")) == sorted(retired)
    assert on_disk(tmp_path / "out") == {f for names in summary["files"].values() for f in names}


def test_a_launch_names_only_failed_launches_leftovers_as_such(tmp_path, monkeypatch):
    """remove_stale's list is what the launch prints as "left by a launch that did not finish": the files of a
    replaced launch whose grace period is over go too, but are not called that."""
    from pipeline.io import run_lease

    spec, written = stage_run(tmp_path)
    summary = publish.publish_run(spec, FACTS, STATS, written, derived=False)
    dead = sinks.OutputSpec.for_run(spec.output, spec.run_id, "parquet")  # a launch killed after placing its files
    left = run_commit.place_staged(spec.output, spec.run_id, dead.launch, "scores", stage(dead, {"scores": 1}, b"dead")["scores"])
    monkeypatch.setattr(run_commit, "REPLACED_GRACE_S", 0.0)
    removed = run_lease.remove_stale(spec.output, own_launch="next")
    retired = {f for r in summary["retired"] for f in r["files"]}
    assert retired and not retired & set(removed) and set(left) <= set(removed)
    assert on_disk(tmp_path / "out") == {f for names in summary["files"].values() for f in names}


def test_any_launch_removes_other_run_ids_replaced_files_unless_a_live_launch_holds_them(tmp_path, monkeypatch):
    """A date-named run retried once is never launched again: a launch of another run_id into the output removes
    its replaced files once the grace period is over (not while a live launch holds that run's lease, nor while
    another launch's staging of it is left), as the launch of the run_id itself would."""
    from pipeline.io import run_lease
    from tests.test_compare import held_by_another_process

    spec, written = stage_run(tmp_path, "day1")
    summary = publish.publish_run(spec, dict(FACTS, run_id="day1"), STATS, written, derived=False)
    retired = {f for r in summary["retired"] for f in r["files"]}
    monkeypatch.setattr(run_commit, "REPLACED_GRACE_S", 0.0)
    with held_by_another_process(spec.output, "day1", "feedc0ffee12"):
        assert run_lease.remove_replaced(spec.output, "day2", own_launch="next") == []
    other = Path(spec.output) / "_staging" / "run_id=day1" / "flexjob"
    other.mkdir(parents=True)
    assert run_lease.remove_replaced(spec.output, "day2", own_launch="next") == []
    assert retired and retired <= on_disk(tmp_path / "out")
    other.rmdir()
    assert sorted(run_lease.remove_replaced(spec.output, "day2", own_launch="next")) == sorted(retired)
    assert on_disk(tmp_path / "out") == {f for names in summary["files"].values() for f in names}
    assert visible(spec) == NEW


def _half_bad_corpus(path: Path) -> Path:
    """Six records, three of them not JSON: the error gate's default (--max_error_fraction 0.1) fails them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": f"d{i}", "text": SENTENCES[i]}) if i % 2 == 0 else "{not json" for i in range(6)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _flags(run_id: str, out: Path) -> list[str]:  # common_flags without its --max_error_fraction 1
    flags = common_flags(run_id, out)
    cut = flags.index("--max_error_fraction")
    return flags[:cut] + flags[cut + 2:] + ["--attention", "native", "--no_progress"]


def test_a_store_lost_while_cleaning_up_after_the_commit_fails_nothing(tmp_path, monkeypatch, capsys):
    """The commit done, removing the staging folder lost the store: the job failed, and the launcher said
    "nothing was published" (exit 1) over a published run. What is left, the run's next launch removes."""
    from tests.conftest import read_summary, run_docscore

    def lost(staging):
        raise ConnectionResetError("the store went away")

    monkeypatch.setattr(run_commit, "remove_staging", lost)
    shard = write_jsonl(tmp_path / "in" / "docs.jsonl", [{"id": f"d{i}", "text": SENTENCES[i]} for i in range(3)])
    assert run_docscore("--input", shard, *common_flags("r1", tmp_path / "out"), "--attention", "native") == 0
    summary = read_summary(tmp_path / "out", "r1")
    assert summary["counts"]["scored"] == 3 and summary["gates"]["error_fraction"]["passed"] is True
    assert "nothing was published" not in capsys.readouterr().err


def test_a_job_failing_after_its_commit_says_the_run_is_published_and_exits_by_its_gates(tmp_path, monkeypatch, capsys):
    """A job that fails after its commit published its run: the launcher says so and exits with the committed run's
    gate (4 here), neither "nothing was published" nor 1, and does not discard the committed files."""
    from tests.conftest import run_docscore

    def broken(staging):
        raise RuntimeError("a bug after the commit")

    monkeypatch.setattr(run_commit, "remove_staging", broken)
    out = tmp_path / "out"
    assert run_docscore("--input", _half_bad_corpus(tmp_path / "in" / "docs.jsonl"), *_flags("r1", out)) == 4
    err = capsys.readouterr().err
    assert "after the run was published" in err and "nothing was published" not in err
    assert "docscore report" in err
    assert len(read_table(out, "scores", "r1")[0]) == 3  # the committed files are still there


def test_a_store_lost_while_the_gates_are_written_still_exits_by_the_gates(tmp_path, monkeypatch, capsys):
    """The launcher judged the error gate failed, then writing the summary (and reading it back) lost the store:
    it exited 0, so a scheduler saw a success for a run that failed its gate."""
    from tests.conftest import run_docscore

    lost = []
    real_committed = run_commit.committed_summary

    def rewrite(output, summary):
        lost.append(True)
        raise ConnectionResetError("the store went away")

    def committed(output, run_id):
        if lost:
            raise ConnectionResetError("the store went away")
        return real_committed(output, run_id)

    monkeypatch.setattr(run_commit, "rewrite_summary", rewrite)
    monkeypatch.setattr(run_commit, "committed_summary", committed)
    assert run_docscore("--input", _half_bad_corpus(tmp_path / "in" / "docs.jsonl"), *_flags("r1", tmp_path / "out")) == 4
    err = capsys.readouterr().err
    assert "the run is published, but the launcher's additions" in err and "docscore report" in err
