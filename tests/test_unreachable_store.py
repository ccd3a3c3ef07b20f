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
def test_an_unreachable_gcs_input_is_exit_2_with_a_message(tmp_path):
    """A glob, a directory and one file alike: the refused connection is named (after gcsfs's retries, ~35 s
    each, so the three launches run at once), never read as an empty path ("matches no readable shard") nor as
    a missing bucket."""
    closed = free_port()  # nothing listens there: every request is refused
    env = dict(os.environ, STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{closed}", GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false")
    launches = {}
    for kind, path in (("glob", "in/*.jsonl"), ("directory", "in/"), ("file", "in/docs.jsonl")):
        url = f"gs://docscore-absent/{path}"
        launches[url] = subprocess.Popen([sys.executable, "-m", "pipeline", "run", "--input", url,
                                          "--output", str(tmp_path / kind), "--run_id", "unreachable"],
                                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for url, launch in launches.items():
        _, stderr = launch.communicate(timeout=240)
        assert launch.returncode == 2, (url, stderr[-2000:])
        assert f"--input {url}: cannot be reached (ClientConnectorError: Cannot connect to host 127.0.0.1:{closed}" in stderr
        assert "check the network" in stderr
        assert "matches no readable shard" not in stderr and "does not exist" not in stderr
        assert "Traceback" not in stderr, stderr[-2000:]
    assert not [p for p in tmp_path.rglob("scores")]
