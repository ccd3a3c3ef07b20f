"""An --input on a store that cannot be reached is a configuration error with a message (exit 2), not a
traceback: `docscore run` with gs:// pointed at a closed port (gcs_support.unreachable_gcs: gcsfs's requests are
all refused, its retries made without their back-off)."""
from __future__ import annotations

import pytest

from tests.conftest import run_docscore

pytest_plugins = ["gcs_support"]


@pytest.mark.integration
@pytest.mark.parametrize("path", ["in/*.jsonl", "in/", "in/docs.jsonl"], ids=["glob", "directory", "file"])
def test_an_unreachable_gcs_input_is_exit_2_with_a_message(path, unreachable_gcs, tmp_path, capsys, caplog):
    """A glob, a directory and one file alike: the refused connection is named, never read as an empty path
    ("matches no readable shard") nor as a missing bucket, and gcsfs's own traceback stays out of the logs."""
    url = f"gs://docscore-absent/{path}"
    assert run_docscore("--input", url, "--output", str(tmp_path / "out"), "--run_id", "unreachable") == 2
    stderr = capsys.readouterr().err
    assert f"--input {url}: cannot be reached (ClientConnectorError: Cannot connect to host 127.0.0.1:{unreachable_gcs}" in stderr
    assert "check the network" in stderr
    assert "matches no readable shard" not in stderr and "does not exist" not in stderr
    assert "Traceback" not in stderr and "out of retries" not in caplog.text
    assert not (tmp_path / "out").exists()


@pytest.mark.integration
def test_an_unavailable_gcs_output_is_exit_2_with_a_message(unavailable_gcs, tmp_path, capsys):
    """A store that answers 503 to everything (not a refused port): the --output check names it, exit 2."""
    shard = tmp_path / "docs.jsonl"
    shard.write_text('{"id": "a", "text": "a document"}\n')
    assert run_docscore("--input", str(shard), "--output", "gs://docscore-out/run", "--run_id", "unavailable") == 2
    stderr = capsys.readouterr().err
    assert "--output gs://docscore-out/run: cannot be reached (HttpError" in stderr, stderr
    assert "Traceback" not in stderr


@pytest.mark.integration
def test_an_unreachable_gcs_output_is_named_unreachable_not_unwritable(unreachable_gcs, tmp_path, capsys):
    """A refused connection (aiohttp's ClientConnectorError is an OSError) was "is not writable (...); choose a
    directory you can write to", as if permissions were the problem."""
    shard = tmp_path / "docs.jsonl"
    shard.write_text('{"id": "a", "text": "a document"}\n')
    assert run_docscore("--input", str(shard), "--output", "gs://docscore-out/run", "--run_id", "unreachable") == 2
    stderr = capsys.readouterr().err
    assert "--output gs://docscore-out/run: cannot be reached (ClientConnectorError" in stderr, stderr
    assert "check the network" in stderr and "not writable" not in stderr
