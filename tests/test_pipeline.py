"""`docscore run` end to end on the real DirectRunner with the real MiniLM weights: every record is
a scored row or an error row, tables have the documented schemas, scores equal direct model calls,
kernels agree, timing adds up, multi-process mode gives the same rows, reruns replace a partition."""
from __future__ import annotations

import gc
import gzip
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.launch import launcher_objects_frozen
from pipeline.records import ERRORS_SCHEMA, SCORES_SCHEMA, TIMING_COLUMNS
from pipeline.stages.packing import shapes_for
from tests.conftest import (LONG_TEXT, SENTENCES, common_flags, direct_embeddings, read_summary, read_table,
                            run_docscore, write_jsonl)

pytestmark = pytest.mark.integration  # README.md, "Development"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Four shards of four formats; returns (input dir, {doc_id: text} expected scored, expected errors)."""
    root = tmp_path_factory.mktemp("corpus")
    scored, errors = {}, []
    a = [{"id": f"a{i}", "text": t, "label": "x"} for i, t in enumerate(SENTENCES[:6])]
    write_jsonl(root / "a.jsonl", a[:3] + ["{not json"] + a[3:] + [{"id": "a-missing", "body": "no text"}])
    scored.update({r["id"]: r["text"] for r in a})
    errors += [("a.jsonl", 3, "invalid_json"), ("a.jsonl", 7, "missing_field")]
    b = [{"id": f"b{i}", "text": t} for i, t in enumerate(SENTENCES[6:])] + [{"id": "long", "text": LONG_TEXT}]
    (root / "b.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in b).encode()))
    scored.update({r["id"]: r["text"] for r in b})
    pq.write_table(pa.table({"text": [None, "Parquet rows have no id column here."]}), root / "c.parquet")
    scored[f"{root / 'c.parquet'}#1"] = "Parquet rows have no id column here."
    errors.append(("c.parquet", 0, "missing_field"))
    (root / "d.md").write_text("A markdown file is one document.", encoding="utf-8")
    scored[str(root / "d.md")] = "A markdown file is one document."
    return root, scored, errors


@pytest.fixture(scope="module")
def native_run(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    assert run_docscore("--input", corpus[0], *common_flags("native", out), "--attention", "native") == 0
    return out, "native"


def test_every_record_is_a_scored_row_or_an_error_row(corpus, native_run):
    root, expected_scored, expected_errors = corpus
    scores, _ = read_table(*native_run[:1], "scores", native_run[1])
    errors, _ = read_table(native_run[0], "errors", native_run[1])
    assert sorted(scores.doc_id) == sorted(expected_scored)
    got_errors = sorted((e.source.rsplit("/", 1)[-1], e.record_index, e.error_type) for e in errors.itertuples())
    assert got_errors == sorted(expected_errors)
    summary = read_summary(*native_run)
    assert summary["counts"]["records"] == len(scores) + len(errors) == len(expected_scored) + len(expected_errors)
    assert (summary["counts"]["scored"], summary["counts"]["errors"]) == (len(scores), len(errors))
    long = scores[scores.doc_id == "long"].iloc[0]
    assert long.n_chunks == 3 and not long.truncated and long.n_tokens > 32
    assert set(scores.source) == {str(root / n) for n in ("a.jsonl", "b.jsonl.gz", "c.parquet", "d.md")}
    assert scores[scores.doc_id == "a3"].iloc[0].record_index == 4  # position in its shard, bad line included


def test_tables_have_the_documented_schemas(native_run):
    for table, schema in (("scores", SCORES_SCHEMA), ("errors", ERRORS_SCHEMA)):
        _, files = read_table(native_run[0], table, native_run[1])
        for f in files:
            assert pq.read_schema(f).remove_metadata().equals(schema), (table, pq.read_schema(f))


def test_embeddings_equal_calling_the_model_directly(corpus, native_run, minilm):
    _, texts, _ = corpus
    scores, _ = read_table(native_run[0], "scores", native_run[1])
    ids = sorted(texts)
    direct = direct_embeddings(minilm, [texts[i] for i in ids])
    table = np.stack([np.asarray(scores[scores.doc_id == i].iloc[0].embedding, np.float64) for i in ids])
    assert table.shape == (len(ids), 384) and len(scores) == len(ids)
    assert np.max(np.abs(table - direct)) <= 1e-5
    assert set(scores.attention_impl) == {"xla"} and set(scores.model_id) == {minilm.model_id}


def test_timing_columns_are_non_negative_and_add_up_to_the_summary(native_run):
    scores, _ = read_table(native_run[0], "scores", native_run[1])
    summary = read_summary(*native_run)
    for column in TIMING_COLUMNS:
        assert (scores[column] >= 0).all(), column
        stage = summary["timing"]["stages"][column[: -len("_ms")]]
        assert stage["total_ms"] == pytest.approx(scores[column].sum(), rel=1e-9)
        assert scores[column].min() <= stage["p50"] <= stage["p95"] <= stage["p99"] <= scores[column].max()
    assert scores.infer_ms.sum() > 0 and summary["throughput"]["docs_per_s"] > 0


def test_summary_records_kernel_model_and_compiles(native_run, minilm):
    summary = read_summary(*native_run)
    assert summary["kernel"] == {"requested": "native", "resolved": "xla", "in_rows": ["xla"]}
    assert summary["model"]["fingerprint"] == minilm.fingerprint
    assert summary["backend"]["workers"] == ["cpu"]
    assert {"apache-beam", "jax", "flax", "pyarrow"} <= set(summary["versions"])
    assert 0 < summary["tokens"]["padding_efficiency"] <= 1
    assert summary["compile"]["model_calls"] >= 1
    assert summary["compile"]["count"] <= len(shapes_for(32, 8))  # 32-token rows: full and tail calls, once each
    assert summary["config"]["max_seq_len"] == 32 and summary["task"] == "embed"


def test_flash_attention_gives_the_same_scores(corpus, native_run, tmp_path):
    assert run_docscore("--input", corpus[0], *common_flags("flash", tmp_path), "--attention", "flash") == 0
    native, _ = read_table(native_run[0], "scores", native_run[1])
    flash, _ = read_table(tmp_path, "scores", "flash")
    assert set(flash.attention_impl) == {"blockwise"}
    a = np.stack(native.sort_values("doc_id").embedding.map(np.asarray))
    b = np.stack(flash.sort_values("doc_id").embedding.map(np.asarray))
    assert a.shape == b.shape and np.max(np.abs(a - b)) <= 1e-5
    assert read_summary(tmp_path, "flash")["kernel"]["resolved"] == "blockwise"


def test_multi_processing_mode_gives_the_same_rows(corpus, native_run, tmp_path):
    flags = ["--attention", "native", "--direct_running_mode", "multi_processing", "--direct_num_workers", "2"]
    assert run_docscore("--input", corpus[0], *common_flags("mp", tmp_path), *flags) == 0
    native, _ = read_table(native_run[0], "scores", native_run[1])
    multi, _ = read_table(tmp_path, "scores", "mp")
    errors, _ = read_table(tmp_path, "errors", "mp")
    assert sorted(multi.doc_id) == sorted(native.doc_id) and len(errors) == 3
    a = np.stack(native.sort_values("doc_id").embedding.map(np.asarray))
    b = np.stack(multi.sort_values("doc_id").embedding.map(np.asarray))
    assert np.max(np.abs(a - b)) <= 1e-5
    summary = read_summary(tmp_path, "mp")
    assert summary["counts"]["records"] == len(multi) + len(errors)
    assert summary["runner"]["direct_running_mode"] == "multi_processing"


def test_rerun_of_a_run_id_replaces_its_partition(tmp_path, capsys):
    out = tmp_path / "out"
    first = write_jsonl(tmp_path / "one" / "x.jsonl", [{"id": f"x{i}", "text": t} for i, t in enumerate(SENTENCES[:4])])
    second = write_jsonl(tmp_path / "two" / "y.jsonl", [{"id": "y0", "text": SENTENCES[5]}])
    assert run_docscore("--input", first, *common_flags("same", out), "--attention", "native") == 0
    assert "replaced launch" not in capsys.readouterr().out
    assert run_docscore("--input", second, *common_flags("same", out), "--attention", "native",
                        "--output_format", "jsonl") == 0
    # the printed folders hold the replaced launch's files too: the end of the run says to read through the summary
    assert "still hold the files of 1 replaced launch of this run_id" in capsys.readouterr().out
    scores, files = read_table(out, "scores", "same")
    assert list(scores.doc_id) == ["y0"] and all(f.suffix == ".jsonl" for f in files)
    embedding = scores.embedding[0]  # written from the row's float32 array (pipeline/io/sinks.py json_value)
    assert len(embedding) == 384 and all(isinstance(x, float) for x in embedding)
    assert abs(np.linalg.norm(embedding) - 1.0) < 1e-5
    # the first run's files stay beside them only as the replaced run's, for readers that read its summary
    retired = [f.rsplit("/", 1)[-1] for r in read_summary(out, "same")["retired"] for f in r["files"] if f.startswith("scores/")]
    assert len(retired) == 1 and retired[0].endswith(".parquet")
    assert sorted(p.name for p in (out / "scores" / "run_id=same").iterdir()) == sorted([f.name for f in files] + retired)
    assert not (out / "_staging").exists()
    assert read_summary(out, "same")["counts"]["records"] == 1


def test_the_job_runs_with_the_launchers_objects_frozen_and_leaves_none_frozen(tmp_path, monkeypatch):
    """The collector skips the launcher's objects while the job runs (pipeline/launch.py); a finished run,
    or a failed one, leaves nothing frozen, so a process that launches runs can still collect them."""
    from pipeline.telemetry import progress

    frozen_during_job = []
    real_run = progress.run_with_progress

    def run_with_progress(*args, **kwargs):
        frozen_during_job.append(gc.get_freeze_count())
        return real_run(*args, **kwargs)

    monkeypatch.setattr(progress, "run_with_progress", run_with_progress)
    shard = write_jsonl(tmp_path / "in" / "x.jsonl", [{"id": "x0", "text": SENTENCES[0]}])
    assert run_docscore("--input", shard, *common_flags("gc", tmp_path / "out"), "--attention", "native") == 0
    assert frozen_during_job and frozen_during_job[0] > 10_000  # modules, the model, the Beam graph
    assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError):
        with launcher_objects_frozen():
            assert gc.get_freeze_count() > 0
            raise RuntimeError("the job failed")
    assert gc.get_freeze_count() == 0


def test_a_batch_the_model_rejects_becomes_error_rows(minilm):
    """RunInference's dead letters -> one 'infer' error row per document of the failed batch."""
    import apache_beam as beam
    from apache_beam.ml.inference.base import RunInference
    from apache_beam.testing.util import assert_that, equal_to

    from pipeline.records import Document
    from pipeline.stages.inference import FlaxModelHandler, ModelSpec
    from pipeline.stages.postprocess import inference_failures_to_errors
    from pipeline.stages.preprocess import TokenizedDoc

    def doc(i, ids):
        return TokenizedDoc(Document(f"d{i}", "", "src", i), [np.asarray(ids, np.int32)], len(ids) - 2, False, 0.0)

    handler = FlaxModelHandler(ModelSpec("minilm-l6", attention="native"), task="embed", max_len=32, calls_per_beam_batch=32,
                               batch_size=8, kernel="xla")
    with beam.Pipeline() as p:
        # one batch (a Beam batch is --calls_per_beam_batch calls' worth of rows); one document has an id past the vocabulary
        docs = p | beam.Create([[doc(0, [101, 2023, 102])], [doc(1, [101, 10**7, 102])]])  # lists of documents
        good, dead = docs | RunInference(handler).with_exception_handling()
        errors = dead.failed_inferences | beam.FlatMap(inference_failures_to_errors)
        assert_that(errors | beam.Map(lambda e: (e.doc_id, e.stage, e.error_type)),
                    equal_to([("d0", "infer", "ValueError"), ("d1", "infer", "ValueError")]), label="errors")
        assert_that(good, equal_to([]), label="no_results")


def test_readmes_python_read_of_a_run_reads_its_rows(native_run):
    """The snippet README gives for reading a run from Python runs as written (pyarrow would otherwise take the
    run_id=ID folders for a partition that clashes with the run_id column) and reads the committed rows."""
    out, run_id = native_run
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    snippet = re.search(r"```python\n(import pyarrow.parquet as pq\n.*?)```", text, re.S).group(1)
    namespace: dict = {}
    exec(snippet.replace('"out"', repr(str(out))).replace('"RUN_ID"', repr(run_id)), namespace)
    scores, _ = read_table(out, "scores", run_id)
    assert namespace["scores"].num_rows == len(scores) > 0
    assert set(namespace["scores"].column("run_id").to_pylist()) == {run_id}
