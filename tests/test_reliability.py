"""Nothing lost under retries and reruns, on the real DirectRunner with the real MiniLM weights: an
inference batch that fails once (fail_one_batch_once below) is retried by the runner and every document
still yields exactly one row; on a runner that does not retry, the job fails without publishing
instead of turning the failure into error rows; reruns of a run_id give the same rows; the memory
watch reaches metrics and summary; logs hold neither document text nor credentials."""
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
from collections import Counter
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from pipeline.graph import build_pipeline
from pipeline.io import sinks
from pipeline.options import parse_options
from pipeline.records import TIMING_COLUMNS
from pipeline.stages.inference import FlaxModelHandler
from pipeline.telemetry import memory, timing
from pipeline.validate import validate
from tests.conftest import SENTENCES, common_flags, read_summary, read_table, run_docscore, write_jsonl

SHARDS, DOCS_PER_SHARD = 3, 40
SECRET_TEXT = "Quokka-Zanzibar-7731"  # in documents: must never reach a log line
SECRET_KEY = "AKIA-docscore-test-secret-0000"  # in the environment and a credentials file


FAILED, SEEN = "failed", "batches_seen"  # files in the fault's directory


class TransientFault(RuntimeError):
    """An injected failure that a retry cures (not a problem of the data)."""


def fail_one_batch_once(mp: pytest.MonkeyPatch, directory: Path, after: int = 0) -> None:
    """Make one inference batch fail once: every attempt of FlaxModelHandler.run_inference appends its doc ids
    to directory/batches_seen; the first attempt after `after` earlier ones writes its doc ids to
    directory/failed (O_EXCL: once across threads and retries) and raises TransientFault. Patched on the class,
    which the local runners' workers in this process use (by reference, through the pickled handler)."""
    real = FlaxModelHandler.run_inference

    def run_inference(self, batch, model, inference_args=None):
        doc_ids = [doc.doc.doc_id for chunk in batch for doc in chunk]
        with open(directory / SEEN, "a", encoding="utf-8") as f:
            f.write(json.dumps(doc_ids) + "\n")
        if len((directory / SEEN).read_text().splitlines()) > after:
            try:
                handle = os.open(directory / FAILED, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:  # the one failure already happened
                pass
            else:
                with os.fdopen(handle, "w", encoding="utf-8") as f:
                    json.dump(doc_ids, f)
                raise TransientFault(f"injected failure of an inference batch of {len(doc_ids)} documents (once)")
        return real(self, batch, model, inference_args)

    mp.setattr(FlaxModelHandler, "run_inference", run_inference)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """SHARDS shards of short documents (one window each) and one bad line; returns (dir, doc ids)."""
    root = tmp_path_factory.mktemp("reliability_in")
    ids = []
    for s in range(SHARDS):
        records = []
        for i in range(DOCS_PER_SHARD):
            ids.append(f"s{s}-{i}")
            records.append({"id": ids[-1], "text": f"{SENTENCES[(s + i) % len(SENTENCES)]} {SECRET_TEXT} {i}"})
        if s == 0:
            records.insert(5, '{"id": "broken", "text": "' + SECRET_TEXT)
        write_jsonl(root / f"shard-{s}.jsonl", records)
    return root, sorted(ids)


@pytest.fixture(scope="module")
def retried_run(corpus, tmp_path_factory, minilm):
    """The real job graph on Beam's BundleBasedDirectRunner (the DirectRunner that retries a failed
    bundle, as Dataflow does) with fail_one_batch_once failing the second inference batch once. The rows
    are checked inside the job (assert_that on the graph's own PCollections)."""
    root, ids = corpus
    marker = tmp_path_factory.mktemp("fault")
    out = tmp_path_factory.mktemp("reliability_out")
    # --batch_size 1: Beam batches of 32 one-row calls (the CPU default --calls_per_beam_batch), so the corpus makes several of them
    options, eo = parse_options(["--input", str(root), *common_flags("retried", out), "--attention", "native",
                                 "--runner", "BundleBasedDirectRunner", "--batch_size", "1"])
    plan = validate(eo)
    spec = sinks.OutputSpec.for_run(eo.output, eo.run_id, eo.output_format)
    p = beam.Pipeline(options=options)
    outputs = build_pipeline(p, eo, plan, spec)
    assert_that(outputs["scores"] | beam.FlatMap(lambda rows: [row["doc_id"] for row in rows]), equal_to(ids),
                label="ScoresOncePerDocument")
    assert_that(outputs["errors"] | beam.FlatMap(lambda rows: [(row["record_index"], row["error_type"]) for row in rows]),
                equal_to([(5, "invalid_json")]), label="ErrorsOncePerRecord")
    with pytest.MonkeyPatch.context() as mp:
        fail_one_batch_once(mp, marker, after=1)
        p.run().wait_until_finish()  # raises when an assert_that above fails
    failed = json.loads((marker / FAILED).read_text())
    seen = [json.loads(line) for line in (marker / SEEN).read_text().splitlines()]
    return {"out": out, "failed": failed, "seen": seen, "ids": ids}


@pytest.mark.integration
def test_a_failed_inference_batch_is_retried_and_every_document_has_one_row(retried_run):
    """The fixture's job asserted one row per document; here: the failure happened, after a batch of the
    same bundle had already produced its rows, and the retry recomputed that whole bundle."""
    seen, failed = retried_run["seen"], retried_run["failed"]
    assert seen[1] == failed and set(failed) <= set(retried_run["ids"])  # the second attempt failed, once
    attempts = Counter(doc_id for batch in seen for doc_id in batch)
    redone = {doc_id for doc_id, n in attempts.items() if n == 2}
    assert max(attempts.values()) == 2 and set(failed) <= redone
    assert set(seen[0]) <= redone  # rows the failed attempt had emitted were dropped, not duplicated


@pytest.mark.integration
def test_the_retried_run_publishes_one_row_per_document(retried_run):
    scores, _ = read_table(retried_run["out"], "scores", "retried")
    errors, _ = read_table(retried_run["out"], "errors", "retried")
    assert sorted(scores.doc_id) == retried_run["ids"] and list(errors.record_index) == [5]
    counts = read_summary(retried_run["out"], "retried")["counts"]
    assert counts["accounted"] and counts["records"] == len(retried_run["ids"]) + 1


@pytest.mark.integration
def test_on_a_runner_without_retries_a_failure_fails_the_job_and_publishes_nothing(corpus, tmp_path, monkeypatch, capsys):
    """The default DirectRunner does not retry bundles: the transient failure must not become error
    rows (they would silently stand for good documents); the job fails and nothing is published."""
    fail_one_batch_once(monkeypatch, tmp_path)
    out = tmp_path / "out"
    assert run_docscore("--input", corpus[0], *common_flags("no-retry", out), "--attention", "native") == 1
    assert "TransientFault" in capsys.readouterr().err
    assert (tmp_path / FAILED).exists()
    assert not (out / "scores" / "run_id=no-retry").exists() and not (out / "errors" / "run_id=no-retry").exists()


@pytest.fixture(scope="module")
def two_runs(corpus, tmp_path_factory):
    """The same run_id run twice, logs captured at INFO from the first, with credentials in the environment."""
    root, _ = corpus
    out = tmp_path_factory.mktemp("rerun_out")
    credentials = root / "credentials.json"
    credentials.write_text(json.dumps({"type": "service_account", "private_key": SECRET_KEY}))
    handler = _Capture()
    logging.getLogger().addHandler(handler)
    previous = logging.getLogger().level
    logging.getLogger().setLevel(logging.INFO)
    printed = io.StringIO()
    try:
        with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            mp.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            mp.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(credentials))
            assert run_docscore("--input", root / "shard-0.jsonl", *common_flags("same", out), "--attention", "native") == 0
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(previous)
    first = {t: read_table(out, t, "same")[0] for t in ("scores", "errors")}
    first_summary = read_summary(out, "same")
    assert run_docscore("--input", root / "shard-0.jsonl", *common_flags("same", out), "--attention", "native") == 0
    second = {t: read_table(out, t, "same")[0] for t in ("scores", "errors")}
    return {"first": first, "second": second, "summaries": (first_summary, read_summary(out, "same")),
            "logs": handler.lines, "printed": printed.getvalue(), "out": out}


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(self.format(record))


def rows(frame, key: list[str]) -> list[dict]:
    """Rows without the timing columns (they measure the run, not the result), in key order."""
    frame = frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame.columns]).sort_values(key)
    return json.loads(frame.to_json(orient="records"))


@pytest.mark.integration
def test_a_rerun_of_a_run_id_gives_the_same_rows_with_the_same_values(two_runs):
    first, second = two_runs["first"], two_runs["second"]
    assert len(first["scores"]) == DOCS_PER_SHARD and len(first["errors"]) == 1
    assert rows(first["scores"], ["doc_id"]) == rows(second["scores"], ["doc_id"])
    assert rows(first["errors"], ["source", "record_index"]) == rows(second["errors"], ["source", "record_index"])
    a, b = two_runs["summaries"]
    assert a["counts"] == b["counts"] and a["counts"]["accounted"] and a["finished_at"] != b["finished_at"]


@pytest.mark.integration
def test_memory_is_sampled_every_batch_into_metrics_and_summary(two_runs):
    summary = two_runs["summaries"][0]
    mem, metrics = summary["memory"], summary["metrics"]
    batches = metrics[f"docscore_inference_{summary['kernel']['resolved']}/batch_us"]["count"]
    assert mem["batches"] == batches == metrics[f"{memory.NAMESPACE}/rss_mb"]["count"] >= 1
    assert 100 < mem["start_rss_mb"] <= mem["peak_rss_mb"] and 100 < mem["end_rss_mb"] <= mem["peak_rss_mb"]
    assert mem["device"] is None  # CPU devices report no allocator stats


@pytest.mark.integration
def test_every_scored_document_is_in_the_per_stage_timing_distributions(two_runs):
    """The docscore_timing distributions (live in the Dataflow UI) hold each scored document's stage times,
    the same ones the summary's stage totals add up (distributions hold whole microseconds)."""
    summary = two_runs["summaries"][0]
    scored = summary["counts"]["scored"]
    for stage in timing.STAGES:
        distribution = summary["metrics"][f"{timing.METRICS_NAMESPACE}/{stage}_us"]
        assert distribution["count"] == scored
        assert abs(distribution["sum"] / 1000 - summary["timing"]["stages"][stage]["total_ms"]) <= 0.001 * scored


def test_the_memory_watch_records_start_warm_peak_and_end():
    """MemoryWatch inside a real Beam job: one sample per call; the summary derives growth after warm-up."""
    class Batches(beam.DoFn):
        def setup(self):
            self.watch = memory.MemoryWatch()

        def process(self, _):
            self.watch.record_batch()
            yield 1

    with beam.Pipeline() as p:
        _ = p | beam.Create(range(memory.WARMUP_BATCHES + 5)) | beam.ParDo(Batches())
    from pipeline.telemetry.progress import metric_values

    found = memory.summarize(metric_values(p.result, "docscore"))
    assert found["batches"] == memory.WARMUP_BATCHES + 5
    assert 0 < found["start_rss_mb"] <= found["peak_rss_mb"] and found["warm_rss_mb"] <= found["peak_rss_mb"]
    assert found["growth_after_warmup_pct"] == pytest.approx(100 * (found["end_rss_mb"] - found["warm_rss_mb"]) / found["warm_rss_mb"])
    assert memory.summarize({})["growth_after_warmup_pct"] is None


def test_the_peak_rss_counts_a_spike_between_samples():
    """A batch that held 400 MB for a moment and freed it before its sample: the sampled RSS never saw it, the
    process's high-water mark did (the summary's peak was the largest sample)."""
    import mmap

    import numpy as np
    import psutil

    class Spike(beam.DoFn):
        def setup(self):
            self.watch = memory.MemoryWatch()

        def process(self, _):
            block = mmap.mmap(-1, 400 * memory.MB)  # its own mapping: unmapped at close whatever malloc is tuned to
            np.frombuffer(block, np.uint8)[:] = 1  # written, so resident
            during = psutil.Process().memory_info().rss / memory.MB
            block.close()
            self.watch.record_batch()
            beam.metrics.Metrics.distribution("test", "during_mb").update(int(during))
            yield 1

    with beam.Pipeline() as p:
        _ = p | beam.Create([0]) | beam.ParDo(Spike())
    from pipeline.telemetry.progress import metric_values

    values = metric_values(p.result, "docscore")
    during = metric_values(p.result, "test")["test/during_mb"]["max"]
    found = memory.summarize(values)
    assert found["end_rss_mb"] < during - 200 and found["peak_rss_mb"] >= during


@pytest.mark.integration
def test_logs_hold_neither_document_text_nor_credentials(two_runs):
    logs = "\n".join(two_runs["logs"])
    assert len(two_runs["logs"]) >= 3, "nothing was logged at INFO: the check below would be empty"
    assert SECRET_TEXT not in logs and SECRET_KEY not in logs
    assert "scored" in two_runs["printed"]  # the run's own report was captured too
    assert SECRET_TEXT not in two_runs["printed"] and SECRET_KEY not in two_runs["printed"]
    summary_text = (two_runs["out"] / "runs" / "run_id=same" / "summary.json").read_text()
    assert SECRET_TEXT not in summary_text and SECRET_KEY not in summary_text
