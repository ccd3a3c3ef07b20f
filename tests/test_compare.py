"""`docscore compare`: two run partitions written with the pipeline's own table schemas; the numbers
it reports are checked against numpy computed here, and its exit status against the limits."""
from __future__ import annotations

import contextlib
import json
import posixpath
import subprocess
import sys
import uuid

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.cli import main as docscore
from pipeline.records import ERRORS_SCHEMA, SCORES_SCHEMA, TIMING_COLUMNS
from pipeline.runs import report
from pipeline.runs.compare import count_change_text
from pipeline.runs.compare import main as compare

pytest_plugins = ["gcs_support"]
LABELS = ("sports", "tech", "politics")


def score_rows(run_id: str, task: str, n: int, *, scores=None, labels=None, embeddings=None, start: int = 0) -> list[dict]:
    rows = []
    for k, i in enumerate(range(start, start + n)):
        rows.append({
            "run_id": run_id, "doc_id": f"doc-{i}", "source": "gs://bucket/in/shard-0.jsonl", "record_index": i,
            "task": task, "score": None if scores is None else float(scores[k]),
            "label": None if labels is None else labels[k], "gold_label": None,
            "scores": None, "embedding": None if embeddings is None else [float(x) for x in embeddings[k]],
            "perplexity": None, "n_tokens": 10 + i, "n_chunks": 1, "truncated": False,
            "model_id": "minilm-l6", "attention_impl": "xla", **{c: 1.0 for c in TIMING_COLUMNS},
        })
    return rows


def summary(run_id: str, task: str, infer_p50: float = 10.0, wall_s: float = 30.0) -> dict:
    stages = {s: {"total_ms": 100.0, "p50": 1.0, "p95": 2.0, "p99": 3.0} for s in ("read", "tokenize", "postprocess")}
    stages["infer"] = {"total_ms": infer_p50 * 50, "p50": infer_p50, "p95": infer_p50 * 2, "p99": infer_p50 * 3}
    return {"run_id": run_id, "task": task, "wall_s": wall_s, "timing": {"stages": stages, "wall_s": wall_s}}


def write_run(out: str, run_id: str, rows: list[dict], *, n_errors: int = 0, run_summary: dict | None = None,
              publish: bool = True, fmt: str = "parquet", legacy: bool = False) -> str:
    """DIR/{scores,errors,runs}/run_id=ID as `docscore run` commits them (two part files for scores, a
    summary.json naming the files); publish=False: the files without the commit; legacy: as docscore
    published before the run-level commit (a _SUCCESS per partition, a summary without `files`)."""
    fs, root = fsspec.core.url_to_fs(out)
    errors = [{"run_id": run_id, "doc_id": None, "source": "gs://bucket/in/bad.jsonl", "record_index": i,
               "stage": "parse", "error_type": "JSONDecodeError", "message": "bad", "raw": "{"} for i in range(n_errors)]
    files: dict[str, list[str]] = {}
    for table, schema, chunks in (("scores", SCORES_SCHEMA, [rows[: len(rows) // 2], rows[len(rows) // 2:]]),
                                  ("errors", ERRORS_SCHEMA, [errors])):
        part_dir = posixpath.join(root, table, f"run_id={run_id}")
        fs.makedirs(part_dir, exist_ok=True)
        files[table] = []
        for k, chunk in enumerate(chunks):
            name = f"part-{k:05d}-of-{len(chunks):05d}.{fmt}" if legacy else f"part-0123456789ab-{k:05d}-of-{len(chunks):05d}.{fmt}"
            path = posixpath.join(part_dir, name)
            if fmt == "parquet":
                with fs.open(path, "wb") as f:
                    pq.write_table(pa.Table.from_pylist(chunk, schema=schema), f)
            else:
                fs.pipe(path, "".join(json.dumps(r) + "\n" for r in chunk).encode())
            files[table].append(f"{table}/run_id={run_id}/{name}")
        if legacy:
            fs.pipe(posixpath.join(part_dir, "_SUCCESS"), b"")
    runs_dir = posixpath.join(root, "runs", f"run_id={run_id}")
    fs.makedirs(runs_dir, exist_ok=True)
    committed = dict(run_summary or summary(run_id, rows[0]["task"]))
    if not legacy:
        committed.update(files=files, launch_id=uuid.uuid4().hex[:12])  # each launch its own id
    if publish:
        fs.pipe(posixpath.join(runs_dir, "summary.json"), json.dumps(committed).encode())
    return f"{out.rstrip('/')}/scores/run_id={run_id}"


def run_compare(capsys, *args) -> tuple[int, dict]:
    code = compare([*map(str, args), "--json", "-"])
    return code, json.loads(capsys.readouterr().out)


def test_identical_runs_are_within_every_limit(tmp_path, capsys):
    rng = np.random.default_rng(0)
    scores = rng.uniform(0, 1, 20)
    labels = [LABELS[i % 3] for i in range(20)]
    a = write_run(str(tmp_path), "a", score_rows("a", "classify", 20, scores=scores, labels=labels), n_errors=2)
    b = write_run(str(tmp_path), "b", score_rows("b", "classify", 20, scores=scores, labels=labels), n_errors=2)
    code, result = run_compare(capsys, a, b)
    assert code == 0, result["violations"]
    assert result["documents"]["matched"] == 20
    assert result["score_drift"] == {"compared": 20, "mean": 0.0, "max": 0.0}
    assert result["label_flips"]["flipped"] == 0
    assert result["errors"] == {"a": 2, "b": 2}


def test_score_drift_and_label_flips(tmp_path, capsys):
    rng = np.random.default_rng(1)
    n = 40
    score_a = rng.uniform(0, 1, n)
    score_b = score_a + rng.normal(0, 0.003, n)
    labels_a = [LABELS[i % 3] for i in range(n)]
    labels_b = list(labels_a)
    for i in (3, 17, 30):
        labels_b[i] = LABELS[(i + 1) % 3]
    a = write_run(str(tmp_path), "a", score_rows("a", "classify", n, scores=score_a, labels=labels_a))
    b = write_run(str(tmp_path), "b", score_rows("b", "classify", n, scores=score_b, labels=labels_b))
    code, result = run_compare(capsys, a, b)
    drift = np.abs(score_b - score_a)
    assert result["score_drift"]["mean"] == pytest.approx(drift.mean(), rel=1e-9)
    assert result["score_drift"]["max"] == pytest.approx(drift.max(), rel=1e-9)
    assert result["label_flips"] == {"compared": n, "flipped": 3, "fraction": 3 / n}
    assert code == 1  # 7.5% flips > the default 5%
    assert any("--max_label_flip_fraction" in v for v in result["violations"])
    code, _ = run_compare(capsys, a, b, "--max_label_flip_fraction", "0.1")
    assert code == 0
    code, result = run_compare(capsys, a, b, "--max_label_flip_fraction", "0.1", "--max_max_drift", str(drift.max() / 2))
    assert code == 1 and any("--max_max_drift" in v for v in result["violations"])


def test_count_changes_and_unmatched_documents(tmp_path, capsys):
    a = write_run(str(tmp_path), "a", score_rows("a", "similarity", 10, scores=np.arange(10) / 10), n_errors=1)
    # B lost documents 0 and 1 and has one new document (10); errors went from 1 to 3
    b = write_run(str(tmp_path), "b", score_rows("b", "similarity", 9, scores=np.arange(2, 11) / 10, start=2), n_errors=3)
    code, result = run_compare(capsys, a, b)
    assert result["documents"] == {"a": 10, "b": 9, "matched": 8, "changed_doc_id": 0, "only_in_a": 2, "only_in_b": 1,
                                   "duplicate_keys_a": 0, "duplicate_keys_b": 0}
    assert result["count_change"] == {"scored": pytest.approx(0.1), "errors": pytest.approx(2.0)}
    assert result["score_drift"] == {"compared": 8, "mean": 0.0, "max": 0.0}
    assert code == 0  # counts are not limited by default
    code, result = run_compare(capsys, a, b, "--max_count_change", "0.5")
    assert code == 1 and any("errors count change" in v for v in result["violations"])
    # the report says how each count changed, not the bare fraction |B - A| / A the limit is checked against
    assert compare([a, b]) == 0
    assert "counts      scored 10 -> 9 (-10%), errors 1 -> 3 (+200%)\n" in capsys.readouterr().out


def test_count_change_text_reads_as_a_change():
    assert count_change_text(20, 10) == "20 -> 10 (-50%)"
    assert count_change_text(7, 7) == "7 -> 7 (unchanged)"
    assert count_change_text(0, 3) == "0 -> 3 (none in A)"  # no percentage of nothing
    assert count_change_text(10_000, 10_001) == "10000 -> 10001 (+0.01%)"  # a small change is not rounded to 0%


def test_embedding_cosine_drift(tmp_path, capsys):
    rng = np.random.default_rng(2)
    emb_a = rng.normal(size=(12, 16)).astype(np.float32)
    emb_b = (emb_a + rng.normal(0, 0.05, size=emb_a.shape)).astype(np.float32)
    a = write_run(str(tmp_path), "a", score_rows("a", "embed", 12, embeddings=emb_a))
    b = write_run(str(tmp_path), "b", score_rows("b", "embed", 12, embeddings=emb_b))
    code, result = run_compare(capsys, a, b, "--max_embedding_drift", "1")
    a64, b64 = emb_a.astype(np.float64), emb_b.astype(np.float64)
    drift = 1 - (a64 * b64).sum(1) / np.linalg.norm(a64, axis=1) / np.linalg.norm(b64, axis=1)
    assert result["embedding_drift"]["compared"] == 12
    assert result["embedding_drift"]["mean"] == pytest.approx(drift.mean(), rel=1e-6)
    assert result["embedding_drift"]["max"] == pytest.approx(drift.max(), rel=1e-6)
    assert result["score_drift"]["compared"] == 0  # embed rows have no score
    assert code == 0
    code, _ = run_compare(capsys, a, b, "--max_embedding_drift", str(drift.mean() / 2))
    assert code == 1



def test_a_zero_embedding_in_run_b_fails_the_embedding_drift_limit(tmp_path, capsys):
    """An all-zero embedding (its norm overflowed) has no direction: its cosine with A's is undefined, so the drift
    is NaN, not 0, and NaN fails the limit (NaN > limit is False, so it is checked on its own): a run B that
    broke a document's embedding must not pass the gate as if nothing drifted."""
    emb_a = np.eye(4, 8)
    emb_b = emb_a.copy()
    emb_b[0] = 0.0
    a = write_run(str(tmp_path), "a", score_rows("a", "embed", 4, embeddings=emb_a))
    b = write_run(str(tmp_path), "b", score_rows("b", "embed", 4, embeddings=emb_b))
    code, result = run_compare(capsys, a, b)
    assert result["embedding_drift"]["compared"] == 4 and np.isnan(result["embedding_drift"]["mean"])
    assert code == 1 and any("--max_embedding_drift" in v for v in result["violations"])


def test_a_nan_score_in_run_b_fails_the_score_drift_limit(tmp_path, capsys):
    """A NaN score makes the mean drift NaN: that fails --max_mean_drift rather than comparing False against it."""
    scores_a = np.arange(5) / 10
    scores_b = scores_a.copy()
    scores_b[2] = np.nan
    a = write_run(str(tmp_path), "a", score_rows("a", "similarity", 5, scores=scores_a))
    b = write_run(str(tmp_path), "b", score_rows("b", "similarity", 5, scores=scores_b))
    code, result = run_compare(capsys, a, b)
    assert np.isnan(result["score_drift"]["mean"])
    assert code == 1 and any("--max_mean_drift" in v for v in result["violations"])


def test_a_value_exactly_at_its_limit_passes(tmp_path, capsys):
    """A limit is the most allowed: 1 label flip in 20 documents is exactly the default 5% and passes; 2 fail."""
    labels_a = [LABELS[i % 3] for i in range(20)]
    a = write_run(str(tmp_path), "a", score_rows("a", "classify", 20, scores=np.full(20, 0.5), labels=labels_a))
    for flips, expected in ((1, 0), (2, 1)):
        labels_b = [LABELS[(i + 1) % 3] if i < flips else label for i, label in enumerate(labels_a)]
        b = write_run(str(tmp_path), f"b{flips}", score_rows(f"b{flips}", "classify", 20, scores=np.full(20, 0.5),
                                                             labels=labels_b))
        code, result = run_compare(capsys, a, b)
        assert result["label_flips"]["fraction"] == flips / 20
        assert code == expected, result["violations"]

def test_stage_timing_change(tmp_path, capsys):
    rows = score_rows("a", "embed", 4, embeddings=np.eye(4, 8))
    a = write_run(str(tmp_path), "a", rows, run_summary=summary("a", "embed", infer_p50=10.0, wall_s=30.0))
    b = write_run(str(tmp_path), "b", [dict(r, run_id="b") for r in rows],
                  run_summary=summary("b", "embed", infer_p50=25.0, wall_s=45.0))
    code, result = run_compare(capsys, a, b)
    assert code == 0
    infer = result["timing"]["stages"]["infer"]
    assert infer["p50"] == {"a": 10.0, "b": 25.0, "ratio": 2.5}
    assert result["timing"]["stages"]["read"]["p50"]["ratio"] == 1.0
    assert result["timing"]["wall_s"]["ratio"] == pytest.approx(1.5)
    code, result = run_compare(capsys, a, b, "--max_stage_slowdown", "2")
    assert code == 1 and result["violations"] == ["infer p50 slowdown (B/A) 2.5 > --max_stage_slowdown=2"]


def test_a_run_that_did_not_commit_is_refused(tmp_path, capsys):
    rows = score_rows("a", "embed", 4, embeddings=np.eye(4, 8))
    a = write_run(str(tmp_path), "a", rows)
    b = write_run(str(tmp_path), "b", [dict(r, run_id="b") for r in rows], publish=False)
    assert compare([a, b]) == 2
    err = capsys.readouterr().err
    assert "run 'b'" in err and "no committed summary.json" in err and "ignored" in err


def test_files_the_summary_does_not_name_are_not_read(tmp_path, capsys):
    """A half-placed rerun's files beside the committed run's: only the committed files count."""
    rows = score_rows("a", "embed", 4, embeddings=np.eye(4, 8))
    a = write_run(str(tmp_path), "a", rows, n_errors=2)
    b = write_run(str(tmp_path), "b", [dict(r, run_id="b") for r in rows], n_errors=2)
    stray = tmp_path / "errors" / "run_id=b" / "part-fedcba987654-00000-of-00001.parquet"
    row = {"run_id": "b", "doc_id": None, "source": "x", "record_index": 0, "stage": "parse", "error_type": "t",
           "message": "m", "raw": ""}
    pq.write_table(pa.Table.from_pylist([row] * 5, schema=ERRORS_SCHEMA), stray)
    code, result = run_compare(capsys, a, b)
    assert code == 0 and result["errors"] == {"a": 2, "b": 2}


def test_a_run_published_before_the_run_level_commit_is_read_through_its_markers(tmp_path, capsys):
    rows = score_rows("a", "embed", 4, embeddings=np.eye(4, 8))
    a = write_run(str(tmp_path), "a", rows, n_errors=1, legacy=True)
    b = write_run(str(tmp_path), "b", [dict(r, run_id="b") for r in rows], n_errors=1)
    code, result = run_compare(capsys, a, b)
    assert code == 0 and result["errors"] == {"a": 1, "b": 1} and result["documents"]["matched"] == 4


def test_duplicates_are_violations_and_a_task_mismatch_cannot_be_compared(tmp_path, capsys):
    rows = score_rows("a", "classify", 5, scores=np.ones(5), labels=["tech"] * 5)
    a = write_run(str(tmp_path), "a", rows)
    b = write_run(str(tmp_path), "b", [dict(r, run_id="b") for r in rows + rows[:2]])
    code, result = run_compare(capsys, a, b)
    assert code == 1 and result["documents"]["duplicate_keys_b"] == 2
    c = write_run(str(tmp_path), "c", score_rows("c", "similarity", 5, scores=np.ones(5)))
    code = compare([a, c, "--json", "-"])
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    # was exit 1 with "different tasks" as one exceeded limit; the help says 2 means "cannot be compared"
    assert code == 2 and result["violations"] == [] and "different tasks" in result["not_comparable"]
    assert "classify" in captured.err and "similarity" in captured.err and "same --task" in captured.err


def test_classify_runs_over_different_label_sets_cannot_be_compared(tmp_path, capsys):
    """Every document "flips" between runs that chose among different classes: that is no limit exceeded (it was
    exit 1, "label flips 20 of 20") but two runs that cannot be compared, as runs of different tasks are."""
    def labelled(run_id, labels):
        names = sorted(labels)
        rows = score_rows(run_id, "classify", 20, scores=np.full(20, 0.9), labels=[names[i % len(names)] for i in range(20)])
        return write_run(str(tmp_path), run_id, rows, run_summary={**summary(run_id, "classify"), "config": {"labels": labels}})

    a = labelled("a", {"statement": "a statement", "expression": "an expression"})
    b = labelled("b", {"a": "first", "b": "second", "c": "third"})
    code = compare([a, b, "--json", "-"])
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert code == 2 and result["violations"] == []
    assert result["labels"] == {"a": ["expression", "statement"], "b": ["a", "b", "c"]}
    assert "(A: expression, statement; B: a, b, c)" in captured.err and "same --labels" in captured.err
    # the same classes described otherwise (a prompt change) are compared: that is what flips measure
    c = labelled("c", {"expression": "a Python expression", "statement": "a Python statement"})
    code, result = run_compare(capsys, a, c)
    assert code == 0 and result["not_comparable"] is None and result["label_flips"]["compared"] == 20


def test_records_whose_doc_id_changed_at_the_same_place_are_not_compared_as_one_document(tmp_path, capsys):
    """The input file was rewritten between the runs: record 3 of it is another document in B. Pairing them would
    measure two documents' difference as the model's drift (it was exit 1, "label flips")."""
    labels = ["tech"] * 6
    a = write_run(str(tmp_path), "a", score_rows("a", "classify", 6, scores=np.full(6, 0.9), labels=labels))
    rows_b = score_rows("b", "classify", 6, scores=np.full(6, 0.9), labels=labels)
    rows_b[3].update(doc_id="another-doc", label="sports", score=0.2)
    b = write_run(str(tmp_path), "b", rows_b)
    code, result = run_compare(capsys, a, b)
    assert result["documents"]["matched"] == 5 and result["documents"]["changed_doc_id"] == 1
    assert result["label_flips"] == {"compared": 5, "flipped": 0, "fraction": 0.0}
    assert result["score_drift"]["max"] == 0.0
    assert code == 1 and result["violations"] == [
        "1 records at the same (source, record_index) hold another doc_id in run B than in run A: the input changed "
        "between the runs; those were not compared"]
    # every record changed: nothing is left to compare (exit 2); matched on doc_id they are simply other documents
    c = write_run(str(tmp_path), "c", [dict(r, doc_id=f"new-{r['record_index']}", run_id="c")
                                       for r in score_rows("c", "classify", 6, scores=np.full(6, 0.9), labels=labels)])
    assert compare([a, c]) == 2
    assert "the input changed between the runs" in capsys.readouterr().err
    assert run_compare(capsys, a, c, "--key", "doc_id")[0] == 2


def test_no_matched_document_is_not_within_every_limit(tmp_path, capsys):
    """Runs over different data (or the same data under another path) share no key: nothing was compared,
    so the report must not say "within every limit" and the exit status is 2, not 0."""
    a = write_run(str(tmp_path), "a", score_rows("a", "embed", 4, embeddings=np.eye(4, 8)))
    b = write_run(str(tmp_path), "b", score_rows("b", "embed", 4, embeddings=np.eye(4, 8), start=100))
    code = compare([a, b])
    captured = capsys.readouterr()
    assert code == 2
    assert "within every limit" not in captured.out
    assert "NOT COMPARED" in captured.out and "nothing could be compared" in captured.err
    assert "--key doc_id" in captured.err


def test_a_run_directory_that_does_not_exist_is_named_as_such(tmp_path, capsys):
    a = write_run(str(tmp_path), "a", score_rows("a", "embed", 4, embeddings=np.eye(4, 8)))
    assert compare([a, str(tmp_path / "scores" / "run_id=nope")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "run_id=nope" in err and "_SUCCESS" not in err
    assert compare([str(tmp_path / "elsewhere" / "scores" / "run_id=a"), a]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'elsewhere'} does not exist" in err


@contextlib.contextmanager
def held_by_another_process(output: str, run_id: str, launch: str):
    """run_id's lease taken by a live process of its own (a launch that is writing the run), released on exit;
    yields its pid."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pipeline.io import run_lease\n"
         "with run_lease.acquire(*sys.argv[1:]):\n    print('held', flush=True); sys.stdin.read()",
         output, run_id, launch], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        yield holder.pid
    finally:
        holder.stdin.close()
        holder.wait()


def test_a_run_being_written_is_named_with_its_launch_not_as_missing(tmp_path, capsys):
    """While a launch writes run b (its first: no partition yet), compare and report say who is writing it and
    to come back when it finishes, not that the run_id is wrong; once the launch has gone, it is missing."""
    a = write_run(str(tmp_path), "a", score_rows("a", "embed", 4, embeddings=np.eye(4, 8)))
    b = str(tmp_path / "scores" / "run_id=b")
    with held_by_another_process(str(tmp_path), "b", "feedc0ffee12") as pid:
        assert compare([a, b]) == 2
        err = capsys.readouterr().err
        assert f"run 'b' under {tmp_path} is being written by launch feedc0ffee12 (pid {pid} on " in err
        assert "compare it once that launch finishes" in err and "does not exist" not in err
        assert report.main([str(tmp_path), "--run_id", "b"]) == 2
        err = capsys.readouterr().err
        assert f"is being written by launch feedc0ffee12 (pid {pid} on " in err and "does not exist" not in err
    assert compare([a, b]) == 2
    assert "run_id=b does not exist (no run 'b' under" in capsys.readouterr().err


def test_readable_report_through_the_docscore_command(tmp_path, capsys):
    rows = score_rows("a", "classify", 6, scores=np.linspace(0, 1, 6), labels=["tech"] * 6)
    a = write_run(str(tmp_path), "a", rows, fmt="jsonl")
    b = write_run(str(tmp_path), "b", [dict(r, run_id="b", label="sports") if r["record_index"] == 0 else dict(r, run_id="b") for r in rows],
                  fmt="jsonl")
    json_file = tmp_path / "cmp.json"
    code = docscore(["compare", a, b.replace("/scores/", "/runs/"), "--json", str(json_file)])
    report = capsys.readouterr().out
    assert code == 1
    assert "label flips 1 of 6" in report
    assert "LIMIT EXCEEDED: label flip fraction 0.166667 > --max_label_flip_fraction=0.05" in report
    assert json.loads(json_file.read_text())["label_flips"]["flipped"] == 1
    assert docscore(["compare", str(tmp_path / "scores"), b]) == 2
    assert "is not a run partition" in capsys.readouterr().err
    # a limit that could never fail, or is no number of its kind, is refused before any run is read
    assert docscore(["compare", a, b, "--max_label_flip_fraction", "2"]) == 2
    assert "a share is at most 1, and a larger limit could never fail" in capsys.readouterr().err
    assert docscore(["compare", a, b, "--max_mean_drift", "inf"]) == 2
    assert "a limit must be a finite number >= 0" in capsys.readouterr().err


@pytest.mark.integration
def test_compare_runs_on_gcs(gcs, capsys):
    rng = np.random.default_rng(3)
    emb = rng.normal(size=(6, 8))
    a = write_run(gcs.url("out"), "a", score_rows("a", "embed", 6, embeddings=emb))
    b = write_run(gcs.url("out"), "b", score_rows("b", "embed", 6, embeddings=emb * 2))  # same direction
    code, result = run_compare(capsys, a, b)
    assert code == 0
    assert result["run_a"] == gcs.url("out", "scores", "run_id=a")
    assert result["embedding_drift"]["compared"] == 6
    assert result["embedding_drift"]["max"] == pytest.approx(0.0, abs=1e-12)


def test_runs_that_cannot_be_paired_or_read_exit_2_not_1(tmp_path, capsys):
    """Exit 1 means a limit was exceeded; runs that cannot be compared, or a damaged table, are exit 2."""
    # embeddings of different sizes (another model): nothing was compared, so no "within every limit"
    a = write_run(str(tmp_path), "a", score_rows("a", "embed", 4, embeddings=np.eye(4, 8)))
    small = write_run(str(tmp_path), "small", score_rows("small", "embed", 4, embeddings=np.eye(4, 3)))
    code = compare([a, small])
    captured = capsys.readouterr()
    assert code == 2 and "different sizes (A: 8, B: 3)" in captured.err and "within every limit" not in captured.out
    # --key doc_id over duplicated doc_ids would pair rows arbitrarily
    rows = score_rows("d", "classify", 3, scores=np.ones(3), labels=["tech"] * 3)
    twice = [dict(r, run_id="d") for r in rows] + [dict(rows[0], run_id="d", record_index=99)]
    d = write_run(str(tmp_path), "d", twice)
    e = write_run(str(tmp_path), "e", [dict(r, run_id="e") for r in twice])
    assert compare([d, e, "--key", "doc_id"]) == 2 and "--key source_record" in capsys.readouterr().err
    assert compare([d, e]) == 0  # by source record every row pairs with its own
    capsys.readouterr()
    # a limit that is not a number compares nothing
    assert compare([d, e, "--max_mean_drift", "nan"]) == 2 and "finite number" in capsys.readouterr().err
    assert compare([d, e, "--max_stage_slowdown", "0"]) == 2 and "could never pass" in capsys.readouterr().err
    # a committed table damaged after the commit, or an unwritable --json
    part = next((tmp_path / "scores" / "run_id=e").glob("*.parquet"))
    part.write_bytes(part.read_bytes()[:100])
    err = compare([d, e]) == 2 and capsys.readouterr().err
    assert f"run 'e' under {tmp_path}: a file its summary.json names cannot be read (" in err, err
    assert "publish the run again (`docscore run` with --run_id e)" in err
    (tmp_path / "a_file").write_text("x")
    assert compare([d, d, "--json", str(tmp_path / "a_file" / "x.json")]) == 2
    assert "a_file does not exist or is not a folder" in capsys.readouterr().err
    # a summary edited into a shape compare does not know (a stage's timing a number, not its figures)
    odd = {**summary("f", "classify"), "timing": {"stages": {"infer": 5.0}, "wall_s": 1.0}}
    f = write_run(str(tmp_path), "f", [dict(r, run_id="f") for r in twice], run_summary=odd)
    assert compare([d, f]) == 2 and "cannot compare" in capsys.readouterr().err


def test_an_unwritable_json_path_is_exit_2_before_any_run_is_read(tmp_path, capsys):
    """A --json PATH that cannot be written is refused first (nothing read, no verdict printed and then exit 2), and no
    missing folder of it is created (fsspec's default made every one of a mistyped path)."""
    rows = score_rows("a", "embed", 4, embeddings=np.eye(4, 8))
    a = write_run(str(tmp_path), "a", rows)
    b = write_run(str(tmp_path), "b", [dict(r, run_id="b") for r in rows])
    nowhere = str(tmp_path / "scores" / "run_id=nope")  # would be exit 2 for another reason, had it been read
    for json_path, expected in ((tmp_path / "typo" / "deeper" / "cmp.json", "typo/deeper does not exist"),
                                (tmp_path, "is a folder")):
        assert compare([a, nowhere, "--json", str(json_path)]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and f"--json {json_path}" in captured.err and expected in captured.err, captured.err
    assert not (tmp_path / "typo").exists()
    assert compare([a, b, "--json", ""]) == 2 and "--json is empty or white space (an unset variable?)" in capsys.readouterr().err
    # a file docscore keeps for either run: it was written over (A's summary.json, B's scores part), losing the run
    kept = [tmp_path / "runs" / "run_id=a" / "summary.json", next((tmp_path / "scores" / "run_id=b").glob("*.parquet")),
            tmp_path / "errors" / "new.json"]
    before = [p.read_bytes() for p in kept[:2]]
    for json_path in kept:
        assert compare([a, b, "--json", str(json_path)]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and f"--json {json_path} is inside {tmp_path}/" in captured.err, captured.err
        assert "where docscore keeps its runs' files (it would write over them); pass a path outside it" in captured.err
    assert [p.read_bytes() for p in kept[:2]] == before and not kept[2].exists()
    # a writable path: the verdict's exit status, and the file holds the comparison
    assert compare([a, b, "--json", str(tmp_path / "cmp.json")]) == 0
    assert "within every limit" in capsys.readouterr().out
    assert json.loads((tmp_path / "cmp.json").read_text())["documents"]["matched"] == 4


def test_bigquery_outputs_have_no_compare_nor_report(tmp_path, capsys):
    """runners/DATAFLOW.md, section 7: a bq: run's tables are BigQuery's. Said plainly, with what to do instead,
    not "does not exist" / "no finished run under bq:..."."""
    a = write_run(str(tmp_path), "a", score_rows("a", "embed", 4, embeddings=np.eye(4, 8)))
    assert compare([a, "bq:proj.ds.prefix/scores/run_id=b"]) == 2
    err = capsys.readouterr().err
    assert "bq:proj.ds.prefix/scores/run_id=b is a BigQuery output" in err and "no `docscore compare`" in err
    assert "compare the runs in BigQuery instead" in err and "does not exist" not in err
    for argv in (["bq:proj.ds.prefix"], ["bq:proj.ds.prefix", "--run_id", "r1"]):
        assert report.main(argv) == 2
        err = capsys.readouterr().err
        assert "bq:proj.ds.prefix is a BigQuery output" in err and "no `docscore report`" in err
        assert "query the run in BigQuery instead" in err and "no finished run" not in err


def test_an_unreachable_gcs_run_is_exit_2_naming_it(unreachable_gcs, capsys, caplog):
    """No network (or a wrong endpoint): a one-line message naming the path and what to check, as `docscore run`
    gives for an unreachable --input, not "cannot compare: ClientConnectorDNSError" or report's traceback; and
    not gcsfs's own traceback of the request out of retries either."""
    a, b = "gs://docscore-absent/out/scores/run_id=a", "gs://docscore-absent/out/scores/run_id=b"
    assert compare([a, b]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"docscore compare: {a}: cannot be reached (ClientConnectorError: "), err
    assert "check the network, the endpoint and the credentials" in err
    assert report.main(["gs://docscore-absent/out"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("docscore report: gs://docscore-absent/out: cannot be reached (ClientConnectorError: "), err
    assert "check the network" in err
    assert "out of retries" not in caplog.text


def test_a_run_compared_with_itself_is_refused(tmp_path, capsys):
    """The same run as A and B (the same partition, or a copy of it elsewhere) always passes every limit: a gate
    whose baseline and candidate resolve to one run must fail loudly (exit 2), not pass."""
    import shutil

    a = write_run(str(tmp_path / "out"), "a", score_rows("a", "embed", 4, embeddings=np.eye(4).tolist()))
    shutil.copytree(tmp_path / "out", tmp_path / "copy")
    for b in (a, a.replace(str(tmp_path / "out"), str(tmp_path / "copy"))):
        code, result = run_compare(capsys, a, b)
        assert code == 2 and result["not_comparable"].startswith("A and B are the same run (launch "), result
    # a run published before launch ids existed: the same partition, spelled two ways, is one run too
    legacy = write_run(str(tmp_path / "old"), "l", score_rows("l", "embed", 4, embeddings=np.eye(4).tolist()), legacy=True)
    code, result = run_compare(capsys, legacy, legacy.replace("/scores/", "/runs/") + "/")
    assert code == 2 and result["not_comparable"].startswith("A and B are the same run ("), result
    # ... and so is a copy of it elsewhere: the same run_id started and finished at the same microsecond
    times = {"started_at": "2026-03-01T02:00:00.123456+00:00", "finished_at": "2026-03-01T02:03:00.654321+00:00"}
    stamped = dict(summary("t", "embed"), **times)
    old = write_run(str(tmp_path / "old"), "t", score_rows("t", "embed", 4, embeddings=np.eye(4).tolist()), legacy=True,
                    run_summary=stamped)
    shutil.copytree(tmp_path / "old", tmp_path / "old_copy")
    code, result = run_compare(capsys, old, old.replace("/old/", "/old_copy/"))
    assert code == 2 and result["not_comparable"].startswith("A and B are the same run ("), result
    # a rerun of it (another start) is another run
    write_run(str(tmp_path / "rerun"), "t", score_rows("t", "embed", 4, embeddings=np.eye(4).tolist()), legacy=True,
              run_summary=dict(stamped, started_at="2026-03-02T02:00:00.000001+00:00"))
    code, result = run_compare(capsys, old, old.replace("/old/", "/rerun/"))
    assert not result.get("not_comparable"), result


def test_jsonl_tables_read_as_their_schema_not_as_inferred_types(tmp_path, capsys):
    """Labels and ids that look like dates: pyarrow's JSON inference made them timestamps, so a JSONL run and
    the same run in Parquet showed every label flipped, and the report printed 2024-03-31 00:00:00."""
    from pipeline.runs import report

    labels = ["2024-03-31", "2024-12-31"] * 3
    rows = [dict(r, doc_id=f"2024-01-0{i + 1}") for i, r in
            enumerate(score_rows("a", "classify", 6, scores=np.linspace(0, 1, 6), labels=labels))]
    a = write_run(str(tmp_path / "j"), "a", rows, fmt="jsonl")
    b = write_run(str(tmp_path / "p"), "b", [dict(r, run_id="b") for r in rows])
    code, result = run_compare(capsys, a, b)
    assert code == 0 and result["label_flips"]["flipped"] == 0 and result["documents"]["matched"] == 6
    table = report.read_table(str(tmp_path / "j"), "scores", "a", ("doc_id", "label"))
    assert table.schema.field("label").type == pa.string() and table.column("label").to_pylist() == labels
    assert table.column("doc_id").to_pylist()[0] == "2024-01-01"


def test_a_run_that_scored_nothing_is_past_the_count_limit_not_a_usage_error(tmp_path, capsys):
    """Run B lost every document to error rows: no document can be paired, but its counts are the largest change
    of all, so a gate with --max_count_change fails it (exit 1) instead of reading exit 2 as a usage error."""
    rows = score_rows("a", "embed", 4, embeddings=np.eye(4, 8))
    a = write_run(str(tmp_path), "a", rows)
    b = write_run(str(tmp_path), "b", [], n_errors=4, run_summary=summary("b", "embed"))
    code = compare([a, b, "--max_count_change", "0.1"])
    captured = capsys.readouterr()
    assert code == 1, captured
    assert "LIMIT EXCEEDED: scored count change 1 > --max_count_change=0.1" in captured.out
    assert "LIMIT EXCEEDED: errors count change 4 > --max_count_change=0.1" in captured.out
    assert "NOT COMPARED: run B has no scored documents" in captured.out
    assert compare([a, b, "--max_count_change", "none"]) == 2  # nothing else to check: cannot compare
    assert "run B has no scored documents" in capsys.readouterr().err


def test_a_run_is_named_by_the_summary_json_path_docscore_run_prints(tmp_path, capsys):
    rows = score_rows("a", "embed", 4, embeddings=np.eye(4, 8))
    a = write_run(str(tmp_path), "a", rows)
    write_run(str(tmp_path), "b", [dict(r, run_id="b") for r in rows])
    summary_b = str(tmp_path / "runs" / "run_id=b" / "summary.json")
    assert compare([a, summary_b]) == 0, capsys.readouterr()
    assert "within every limit" in capsys.readouterr().out


def test_a_damaged_summary_is_named_with_its_run_and_the_fix(tmp_path, capsys):
    rows = score_rows("a", "embed", 4, embeddings=np.eye(4, 8))
    a, b = write_run(str(tmp_path), "a", rows), write_run(str(tmp_path), "b", [dict(r, run_id="b") for r in rows])
    (tmp_path / "runs" / "run_id=b" / "summary.json").write_text('{"x')
    assert compare([a, b]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'runs' / 'run_id=b' / 'summary.json'} is damaged" in err, err
    assert "publish the run again (`docscore run` with --run_id b)" in err, err


def test_a_committed_file_gone_since_the_run_is_named_with_its_run_and_the_fix(tmp_path, capsys):
    """`rm OUT/scores/run_id=X/*.parquet`: compare said "cannot compare: FileNotFoundError: ...", naming neither the
    run nor what to do; report's message says both."""
    rows = score_rows("a", "embed", 4, embeddings=np.eye(4, 8))
    a, b = write_run(str(tmp_path), "a", rows), write_run(str(tmp_path), "b", [dict(r, run_id="b") for r in rows])
    part = next((tmp_path / "scores" / "run_id=b").glob("*.parquet"))
    part.unlink()
    assert compare([a, b]) == 2
    err = capsys.readouterr().err
    assert f"run 'b' under {tmp_path}: a file its summary.json names cannot be read (FileNotFoundError: " in err, err
    assert part.name in err and "publish the run again (`docscore run` with --run_id b)" in err


def test_a_mistyped_or_abbreviated_flag_is_refused_with_the_likely_one(tmp_path, capsys):
    """As `docscore run` does: argparse alone would take --max_mean_drif for --max_mean_drift and answer a typo with
    a bare 'unrecognized arguments'."""
    rows = score_rows("a", "embed", 4, embeddings=np.eye(4, 8))
    a, b = write_run(str(tmp_path), "a", rows), write_run(str(tmp_path), "b", [dict(r, run_id="b") for r in rows])
    for flag, likely in (("--max_mean_drif", "--max_mean_drift"), ("--max_count_chang", "--max_count_change")):
        with pytest.raises(SystemExit) as stopped:
            compare([a, b, flag, "0.1"])
        assert stopped.value.code == 2
        assert f"unknown argument {flag} (did you mean {likely}?)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        report.main([str(tmp_path), "--runid", "a"])
    assert "unknown argument --runid (did you mean --run_id?)" in capsys.readouterr().err


def test_a_local_json_path_is_never_inside_a_bucket(tmp_path, monkeypatch):
    """Runs on gs://bkt/out and --json bkt/out/runs/x.json in a local folder of that name: the bare paths matched
    ("is inside gs://bkt/out/runs"), a refusal of a file that cannot touch the runs."""
    from pipeline.runs.compare import RunRef, json_destination_problem

    (tmp_path / "bkt" / "out" / "runs").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    refs = [RunRef("gs://bkt/out", "a"), RunRef("gs://bkt/out", "b")]
    assert json_destination_problem("bkt/out/runs/x.json", refs) is None
    local = [RunRef(str(tmp_path / "bkt" / "out"), "a")]  # the same path for runs on this machine: refused
    assert "is inside" in json_destination_problem("bkt/out/runs/x.json", local)


def test_stage_timings_of_summaries_of_different_format_versions_are_not_gated(tmp_path, capsys):
    """An older docscore's summary (no format_version) counted compiling in its infer time: a baseline from it
    failed --max_stage_slowdown 77x on definitions alone (or would hide a real slowdown the other way round).
    The limit is refused with both versions named; without it, a note says the timings differ in meaning."""
    scores = np.linspace(0, 1, 6)
    old = write_run(str(tmp_path), "old", score_rows("old", "similarity", 6, scores=scores),
                    run_summary=summary("old", "similarity", infer_p50=134.0))
    new = write_run(str(tmp_path), "new", score_rows("new", "similarity", 6, scores=scores),
                    run_summary=dict(summary("new", "similarity", infer_p50=1.7), format_version=1))
    code, result = run_compare(capsys, new, old, "--max_stage_slowdown", "1.5")
    assert code == 1 and result["violations"] == [
        "--max_stage_slowdown cannot be checked: the runs' summaries have different format versions (A: 1, B: none "
        "(an older docscore)): their stage timings are defined differently (before version 1 infer time counted "
        "compiling; docs/summary.md, \"Older runs\"); compare against a baseline run written by this docscore"]
    code, result = run_compare(capsys, new, old)
    assert code == 0 and any("different format versions" in n for n in result["notes"]), result["notes"]
    both_new = write_run(str(tmp_path), "new2", score_rows("new2", "similarity", 6, scores=scores),
                         run_summary=dict(summary("new2", "similarity", infer_p50=1.8), format_version=1))
    code, result = run_compare(capsys, new, both_new, "--max_stage_slowdown", "1.5")
    assert code == 0 and not result["notes"], result


@pytest.mark.parametrize("entry", ["../elsewhere/scores/run_id=x/part-0.parquet", "/etc/passwd",
                                   "scores/run_id=other/part-0123456789ab-00000-of-00002.parquet"])
def test_a_summary_naming_files_outside_its_run_is_refused_not_followed(tmp_path, capsys, entry):
    """report and compare read the files a run's summary names: an edited or foreign summary (a shared bucket) named
    any table on the machine (`..`, an absolute path, another run's partition) and its rows were reported as this
    run's. Such a summary is damaged: exit 2 naming the entry."""
    from pipeline.runs.report import main as report_main

    a = write_run(str(tmp_path / "out"), "a", score_rows("a", "embed", 4, embeddings=np.eye(4).tolist()))
    b = write_run(str(tmp_path / "out"), "b", score_rows("b", "embed", 4, embeddings=np.eye(4).tolist()))
    path = tmp_path / "out" / "runs" / "run_id=b" / "summary.json"
    summary_b = json.loads(path.read_text())
    summary_b["files"]["scores"][0] = entry
    path.write_text(json.dumps(summary_b))
    assert compare([a, b]) == 2
    assert f"names {entry!r}, which is not a file of run b's partitions" in capsys.readouterr().err
    assert report_main([str(tmp_path / "out"), "--run_id", "b"]) == 2
    assert "is damaged" in capsys.readouterr().err


def test_the_settings_two_runs_recorded_differently_are_named_and_unrecorded_ones_are_not(tmp_path, capsys):
    """A drift is read against what changed: settings the summaries record differently are in the report and
    settings_changed; one an older summary did not record is not a change; a changed setting fails no limit."""
    rows = score_rows("a", "embed", 4, embeddings=np.eye(4))
    model = {"model_id": "m@0123", "dtype": "float32", "prompts": {}, "pooling": "mean", "max_seq_len": 256}
    a = write_run(str(tmp_path), "a", rows, run_summary={**summary("a", "embed"), "model": model,
                                                         "config": {"stride": 32, "max_seq_len": None}})
    b = write_run(str(tmp_path), "b", [dict(r, run_id="b") for r in rows], run_summary={
        **summary("b", "embed"), "model": {**model, "dtype": "bfloat16", "prompts": {"document": "query: "},
                                           "max_seq_len": 128},
        "config": {"stride": 32, "max_seq_len": 128}, "kernel": {"resolved": "xla"}})  # A recorded no kernel
    code, result = run_compare(capsys, a, b)
    assert code == 0 and result["settings_changed"] == {
        "model.prompts": {"a": {}, "b": {"document": "query: "}}, "model.dtype": {"a": "float32", "b": "bfloat16"},
        "model.max_seq_len": {"a": 256, "b": 128}}
    assert compare([a, b]) == 0
    report = capsys.readouterr().out
    assert ('settings    model.prompts {} -> {"document": "query: "}; model.dtype "float32" -> "bfloat16"; '
            "model.max_seq_len 256 -> 128") in report, report
    # --max_seq_len 256 given where the model's own length is 256: the same windows, so not a change
    c = write_run(str(tmp_path), "c", [dict(r, run_id="c") for r in rows], run_summary={
        **summary("c", "embed"), "model": model, "config": {"stride": 32, "max_seq_len": 256}})
    assert compare([a, c]) == 0
    assert "settings    no recorded setting differs" in capsys.readouterr().out


@pytest.mark.integration
def test_two_real_runs_name_their_dtype_and_prompt_change(tmp_path, capsys):
    from tests.conftest import SENTENCES, common_flags, run_docscore, write_jsonl

    shard = write_jsonl(tmp_path / "in" / "d.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(SENTENCES[:6])])
    for run_id, flags in (("f32", ()), ("bf16", ("--dtype", "bfloat16", "--document_prompt", "query: "))):
        assert run_docscore("--input", shard, *common_flags(run_id, tmp_path), "--attention", "native",
                            "--no_progress", *flags) == 0
    capsys.readouterr()
    code, result = run_compare(capsys, tmp_path / "scores" / "run_id=f32", tmp_path / "scores" / "run_id=bf16")
    changed = result["settings_changed"]
    assert changed["model.dtype"] == {"a": "float32", "b": "bfloat16"}, changed
    assert changed["model.prompts"] == {"a": {}, "b": {"document": "query: "}}, changed
    assert set(changed) <= {"model.dtype", "model.prompts", "model.matmul_precision"}, changed


def test_the_window_count_and_label_descriptions_are_settings_compare_names(tmp_path, capsys):
    """--max_chunks (the windows kept of a long document) and classify's label descriptions change the scores as much
    as --stride or --temperature do; a pair of runs differing only there was reported "no recorded setting differs"."""
    rows = score_rows("a", "embed", 4, embeddings=np.eye(4))
    config = {"stride": 32, "max_chunks": 8, "labels": {"sport": "an article about sport"}}
    a = write_run(str(tmp_path), "a", rows, run_summary={**summary("a", "embed"), "config": config})
    b = write_run(str(tmp_path), "b", [dict(r, run_id="b") for r in rows], run_summary={
        **summary("b", "embed"), "config": {**config, "max_chunks": 2, "labels": {"sport": "football news"}}})
    code, result = run_compare(capsys, a, b)
    assert code == 0 and result["settings_changed"] == {
        "config.max_chunks": {"a": 8, "b": 2},
        "config.labels": {"a": {"sport": "an article about sport"}, "b": {"sport": "football news"}}}
