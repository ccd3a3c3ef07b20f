"""`docscore run` gs:// to gs:// against the emulator: shards and the MiniLM model directory are
uploaded, the run reads them through gcsfs and writes through Beam's GCS filesystem + gcsfs publish;
then the same run_id is rerun through the fault proxy, which must replace the partitions with tables
equal to the clean run's: nothing lost, nothing duplicated, no old file left, no staging left."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.records import TIMING_COLUMNS
from tests.conftest import SENTENCES, common_flags, direct_embeddings, run_docscore

pytestmark = pytest.mark.integration  # README.md, "Development"

pytest_plugins = ["gcs_support"]
RUN_ID = "nightly-2026-01-01"


SHARDS = ("shard-0.jsonl", "shard::1.jsonl")  # `::` in an object name is part of it, not a chained URL


def upload_inputs(fs, bucket: str) -> dict[str, str]:
    """Two JSONL shards (one bad line) and the converted MiniLM directory; returns {doc_id: text}."""
    from models.builtin import builtin_dir
    from models.model_dir import default_cache_dir

    texts = {}
    for k in range(2):
        lines = []
        for i, text in enumerate(SENTENCES[k * 6:(k + 1) * 6]):
            texts[f"s{k}-{i}"] = text
            lines.append(json.dumps({"id": f"s{k}-{i}", "text": text}))
        if k == 1:
            lines.insert(2, "{not json")
        fs.pipe(f"{bucket}/in/{SHARDS[k]}", ("\n".join(lines) + "\n").encode())
    fs.put(builtin_dir("minilm-l6", default_cache_dir()) + "/", f"{bucket}/models/minilm-l6", recursive=True)
    return texts


def read_partition(fs, path: str) -> tuple[pa.Table, dict[str, int]]:
    """A committed partition's rows (sorted by source, record_index) and {file: generation} of the files its
    run's summary names; the partition holds those and the files of launches the run replaced within the
    grace period (summary `retired`), nothing else (failed launches' left-overs are removed at the commit)."""
    from pipeline.io import run_commit

    bucket, table_name, partition = path.split("/")[0], path.split("/")[-2], path.split("/")[-1]
    out = f"gs://{bucket}/out"
    summary = run_commit.committed_summary(out, partition[len("run_id="):])
    committed = [run_commit.fs_path(f) for f in run_commit.committed_files(out, summary["run_id"], table_name, summary)]
    retired = [f"{bucket}/out/{f}" for r in summary["retired"] for f in r["files"] if f.startswith(f"{table_name}/")]
    listed = fs.ls(path, detail=False, refresh=True)
    assert sorted(listed) == sorted(committed + retired), f"{path}: {sorted(listed)} vs {committed} + {retired}"
    files = {p: int(fs.info(p)["generation"]) for p in committed}
    table = pa.concat_tables([pq.read_table(fs.open(p, "rb")) for p in files])
    return table.sort_by([("source", "ascending"), ("record_index", "ascending")]), files


def without_timing(table: pa.Table) -> pa.Table:
    return table.drop_columns([c for c in TIMING_COLUMNS if c in table.column_names])


def test_gs_to_gs_run_and_faulty_rerun_give_the_same_tables(gcs_emulator, tmp_path, minilm):
    from gcs_support import FAULT_RATE, FaultProxy, create_bucket, gcs_environment, unique_bucket_name

    bucket = unique_bucket_name()
    create_bucket(gcs_emulator.url, bucket)
    out, cache = f"gs://{bucket}/out", str(tmp_path / "cache")
    args = ["--input", f"gs://{bucket}/in/*.jsonl", "--model", f"gs://{bucket}/models/minilm-l6",
            "--cache_dir", cache, *common_flags(RUN_ID, out)]
    scores_path, errors_path = f"{bucket}/out/scores/run_id={RUN_ID}", f"{bucket}/out/errors/run_id={RUN_ID}"

    clean = FaultProxy(gcs_emulator.port, fault_rate=0).start()
    try:
        with gcs_environment(clean.url, tmp_path):
            import gcsfs

            fs = gcsfs.GCSFileSystem()
            texts = upload_inputs(fs, bucket)
            assert run_docscore(*args) == 0
            scores, score_files = read_partition(fs, scores_path)
            errors, error_files = read_partition(fs, errors_path)
            summary = json.loads(fs.cat(f"{bucket}/out/runs/run_id={RUN_ID}/summary.json"))
    finally:
        clean.stop()

    # the clean run: every record is a row, embeddings are the model's own
    assert sorted(scores.column("doc_id").to_pylist()) == sorted(texts)
    assert set(scores.column("source").to_pylist()) == {f"gs://{bucket}/in/{name}" for name in SHARDS}
    assert errors.column("record_index").to_pylist() == [2] and errors.column("stage").to_pylist() == ["parse"]
    assert summary["counts"]["records"] == len(texts) + 1
    ids = scores.column("doc_id").to_pylist()
    direct = direct_embeddings(minilm, [texts[i] for i in ids])
    assert np.max(np.abs(np.asarray(scores.column("embedding").to_pylist()) - direct)) <= 1e-5

    faulty = FaultProxy(gcs_emulator.port, fault_rate=FAULT_RATE, seed=1).start()
    try:
        with gcs_environment(faulty.url, tmp_path):
            assert run_docscore(*args) == 0
        stats = faulty.stats
    finally:
        faulty.stop()
    assert stats.fault_fraction >= 0.1 and stats.answered_503 and stats.dropped, stats

    check = FaultProxy(gcs_emulator.port, fault_rate=0).start()
    try:
        with gcs_environment(check.url, tmp_path):
            import gcsfs

            fs = gcsfs.GCSFileSystem()
            rerun_scores, rerun_score_files = read_partition(fs, scores_path)
            rerun_errors, rerun_error_files = read_partition(fs, errors_path)
            rerun_summary = json.loads(fs.cat(f"{bucket}/out/runs/run_id={RUN_ID}/summary.json"))
            leftovers = [p for p in fs.find(f"{bucket}/out") if "_staging" in p or "beam-temp" in p]
    finally:
        check.stop()

    # the rerun replaced every file (its own launch's names, newer generations; the first run's files only
    # kept, as retired, for readers that read the first summary just before the commit) ...
    newest_before = max([*score_files.values(), *error_files.values()])
    for files, before in ((rerun_score_files, score_files), (rerun_error_files, error_files)):
        assert min(files.values()) > newest_before and not set(files) & set(before), "a file of the first run is named"
    assert rerun_summary["launch_id"] != summary["launch_id"]
    assert [r["launch_id"] for r in rerun_summary["retired"]] == [summary["launch_id"]]
    assert rerun_summary["finished_at"] > summary["finished_at"]
    assert not leftovers, leftovers
    # ... with the same rows: nothing lost, nothing duplicated
    assert rerun_scores.num_rows == scores.num_rows == len(texts)
    assert without_timing(rerun_scores).drop_columns(["embedding"]).equals(without_timing(scores).drop_columns(["embedding"]))
    np.testing.assert_allclose(np.asarray(rerun_scores.column("embedding").to_pylist()),
                               np.asarray(scores.column("embedding").to_pylist()), atol=1e-6)
    assert rerun_errors.equals(errors)
    assert rerun_summary["counts"] == summary["counts"]
