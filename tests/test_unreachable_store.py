"""An --input on a store that cannot be reached is a configuration error with a message (exit 2), not a
traceback: a real `docscore run` process pointed at a closed port as its GCS endpoint."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gcs_support import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.integration
@pytest.mark.parametrize("path", ["in/*.jsonl", "in/", "in/docs.jsonl"], ids=["glob", "directory", "file"])
def test_an_unreachable_gcs_input_is_exit_2_with_a_message(tmp_path, path):
    """A glob, a directory and one file alike: the refused connection is named (after gcsfs's retries, ~35 s),
    never read as an empty path ("matches no readable shard") nor as a missing bucket."""
    closed = free_port()  # nothing listens there: every request is refused
    env = dict(os.environ, STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{closed}", GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false")
    url = f"gs://docscore-absent/{path}"
    p = subprocess.run([sys.executable, "-m", "pipeline", "run", "--input", url,
                        "--output", str(tmp_path / "out"), "--run_id", "unreachable"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 2, p.stderr[-2000:]
    assert f"--input {url}: cannot be reached (ClientConnectorError: Cannot connect to host 127.0.0.1:{closed}" in p.stderr
    assert "check the network" in p.stderr
    assert "matches no readable shard" not in p.stderr and "does not exist" not in p.stderr
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / "out" / "scores").exists()
