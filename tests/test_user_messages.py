"""What `docscore` tells a user is true: the real console script in a subprocess, on real files. A
mistyped flag or runner is a configuration error (exit 2) naming the likely fix, never a traceback;
Beam's warnings that misdescribe a docscore run (its own flags "discarded", the `resource` module
"not available") do not appear; `compare` says when nothing could be compared; --labels outside
classify and text gold labels for similarity are not ignored silently."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from tests.conftest import TEST_BATCH, TEST_MAX_LEN, TEST_STRIDE, read_summary, run_docscore, write_jsonl

pytestmark = pytest.mark.integration  # README.md, "Development"

DOCSCORE = os.path.join(os.path.dirname(sys.executable), "docscore")


def docscore(*args, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([DOCSCORE, *map(str, args)], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def docs(tmp_path):
    return write_jsonl(tmp_path / "in" / "docs.jsonl",
                       [{"id": f"d{i}", "text": f"document number {i} about sport", "query": "sport"} for i in range(4)])


def small(out) -> list[str]:
    return ["--output", out, "--max_seq_len", TEST_MAX_LEN, "--batch_size", TEST_BATCH, "--stride", TEST_STRIDE,
            "--no_progress"]


def test_a_misspelled_runner_is_a_configuration_error_naming_the_known_runners(docs, tmp_path):
    done = docscore("run", "--input", docs, *small(tmp_path / "out"), "--runner", "DirectRuner")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "--runner=DirectRuner is not a Beam runner; did you mean --runner=DirectRunner?" in done.stderr
    for runner in ("DirectRunner", "BundleBasedDirectRunner", "DataflowRunner", "PrismRunner"):
        assert runner in done.stderr


def test_a_mistyped_flag_is_answered_with_the_likely_flag_and_no_beam_discard_warning(docs, tmp_path):
    done = docscore("run", "--input", docs, *small(tmp_path / "out"), "--taks", "embed")
    assert done.returncode == 2, done.stderr
    assert "unknown option --taks (did you mean --task?)" in done.stderr
    assert "Discarding unparseable args" not in done.stderr + done.stdout


def test_labels_are_refused_outside_classify(docs, tmp_path):
    done = docscore("run", "--input", docs, *small(tmp_path / "out"), "--task", "embed", "--labels", "a=first;b=second")
    assert done.returncode == 2, done.stderr
    assert "--labels is only for --task=classify" in done.stderr and "--task=embed" in done.stderr
    assert not (tmp_path / "out" / "scores").exists()


def test_a_run_on_worker_processes_prints_no_untrue_beam_warnings(docs, tmp_path):
    """The SDK workers of multi_processing parse the options without docscore's EvalOptions and used to
    log every docscore flag as "Discarding unparseable args"; the launcher relays that to the user."""
    done = docscore("run", "--input", docs, *small(tmp_path / "out"), "--run_id", "mp",
                    "--direct_running_mode", "multi_processing", "--direct_num_workers", "2")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "4 scored, 0 errors" in output
    assert "Discarding unparseable args" not in output
    assert "Resource module is not available" not in output
    assert "No semi_persistent_directory found" not in output and "WARNING" not in output


def test_in_memory_workers_get_no_warning_that_they_do_nothing(docs, tmp_path, caplog):
    """Beam warns that in_memory with direct_num_workers 2 lacks "the desired worker parallelism", but it runs
    each bundle on that many threads (the summary's batching.local_threads)."""
    with caplog.at_level(logging.WARNING):
        code = run_docscore("--input", docs, *small(tmp_path / "out"), "--run_id", "threads", "--direct_num_workers", "2")
    assert code == 0
    assert not [r for r in caplog.records if "direct_num_workers is not equal to 1" in r.getMessage()]
    assert read_summary(tmp_path / "out", "threads")["batching"]["local_threads"] == 2


def test_beams_resource_warning_is_dropped_once_options_are_parsed(docs, tmp_path, caplog):
    """apache_beam.ml.inference.base warns "Resource module is not available" at every model load when
    its optional model_manager import (torch, scipy) failed, on any platform; docscore drops that line."""
    from apache_beam.ml.inference import base

    from pipeline.options import parse_options

    parse_options(["--input", str(docs), "--output", str(tmp_path / "out")])
    original = base.resource
    base.resource = None  # what base.py sets when `import resource` or its model_manager import fails
    try:
        with caplog.at_level(logging.WARNING):
            base._get_current_process_memory_in_bytes()
            logging.warning("an unrelated warning still shows")
    finally:
        base.resource = original
    messages = [r.getMessage() for r in caplog.records]
    assert "an unrelated warning still shows" in messages
    assert not any("Resource module is not available" in m for m in messages)


def test_text_gold_labels_with_similarity_get_a_notice(tmp_path):
    docs = write_jsonl(tmp_path / "in" / "docs.jsonl", [
        {"id": f"d{i}", "text": f"document number {i}", "query": "a number", "label": "relevant"} for i in range(3)])
    done = docscore("run", "--input", docs, *small(tmp_path / "out"), "--task", "similarity", "--run_id", "sim")
    assert done.returncode == 0, done.stderr
    assert "note: --task=similarity takes a record's `label` as a numeric gold score" in done.stderr
    assert "'relevant'" in done.stderr
    summary = json.loads((tmp_path / "out" / "runs" / "run_id=sim" / "summary.json").read_text())
    assert summary["counts"]["scored"] == 3


def test_compare_of_a_missing_run_says_it_does_not_exist(tmp_path):
    done = docscore("compare", tmp_path / "nowhere" / "scores" / "run_id=a", tmp_path / "nowhere" / "scores" / "run_id=b")
    assert done.returncode == 2
    assert "does not exist" in done.stderr and "_SUCCESS" not in done.stderr


def test_compare_of_runs_with_no_document_in_common_exits_2(docs, tmp_path):
    other = write_jsonl(tmp_path / "other" / "docs.jsonl", [{"id": "x", "text": "another document entirely"}])
    out = tmp_path / "out"
    for run_id, data in (("a", docs), ("b", other)):  # the runs in this process: the test is compare's exit
        assert run_docscore("--input", data, *small(out), "--run_id", run_id) == 0
    done = docscore("compare", out / "scores" / "run_id=a", out / "scores" / "run_id=b")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "within every limit" not in done.stdout
    assert "nothing could be compared" in done.stderr


def test_a_mistyped_command_names_the_likely_one():
    done = docscore("compre", "a", "b")
    assert done.returncode == 2
    assert "unknown command 'compre' (did you mean compare?)" in done.stderr


def test_docscore_version_prints_the_installed_version_the_summary_records():
    """`docscore --version` was "unknown command"; it prints what summary.json records as versions.docscore."""
    from importlib.metadata import version

    done = docscore("--version")
    assert done.returncode == 0 and done.stdout == f"docscore {version('docscore')}\n", done.stdout + done.stderr


def test_escape_sequences_in_data_reach_the_terminal_as_text(tmp_path):
    """A record's field names, a file name, a label are quoted in messages: an escape sequence in them (clear the
    screen, an OSC 8 link "Click here to fix" to another site) acted on the reader's terminal. Control characters
    are written as escapes; the message is otherwise the same."""
    shard = tmp_path / "in" / "a.jsonl"
    shard.parent.mkdir()
    shard.write_text('{"body": "x", "\\u001b]8;;http://evil.example/\\u001b\\\\Click here\\u001b]8;;\\u001b\\\\": 1}\n')
    done = docscore("run", "--input", shard, "--output", tmp_path / "out")
    assert done.returncode == 2 and "\x1b" not in done.stderr, repr(done.stderr)
    assert "\\x1b]8;;http://evil.example/\\x1b\\Click here" in done.stderr, done.stderr
