"""What `docscore run` sets in its environment for the processes it starts: a local multi_processing run's
workers (and the launcher) allocate accelerator memory as they go instead of each taking 75% of it up
front, unless the user chose otherwise."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.launch import PREALLOCATE_ENV, share_device_memory


def test_multi_processing_workers_do_not_preallocate_device_memory(monkeypatch):
    monkeypatch.delenv(PREALLOCATE_ENV, raising=False)
    assert not share_device_memory(PipelineOptions(["--direct_running_mode", "multi_threading"]))
    assert PREALLOCATE_ENV not in os.environ
    assert share_device_memory(PipelineOptions(["--direct_running_mode", "multi_processing"]))
    assert os.environ[PREALLOCATE_ENV] == "false"


def test_a_users_own_preallocation_setting_wins(monkeypatch):
    monkeypatch.setenv(PREALLOCATE_ENV, "true")
    assert not share_device_memory(PipelineOptions(["--direct_running_mode", "multi_processing"]))
    assert os.environ[PREALLOCATE_ENV] == "true"


@pytest.mark.integration
@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_jax_platforms_naming_a_backend_this_machine_lacks_is_exit_2(platform, tmp_path):
    """A GPU or TPU image run without its chip: JAX's RuntimeError (tpu) or bare AssertionError (cuda) was a
    traceback with exit 1; one line naming JAX_PLATFORMS and the fix, before any data or output is touched."""
    if platform == "cuda" and shutil.which("nvidia-smi") or platform == "tpu" and os.path.exists("/dev/accel0"):
        pytest.skip(f"this machine has a {platform} backend")
    shard = tmp_path / "in" / "docs.jsonl"
    shard.parent.mkdir()
    shard.write_text('{"id": "a", "text": "one document"}\n')
    done = subprocess.run([sys.executable, "-m", "pipeline", "run", "--input", str(shard), "--output", str(tmp_path / "out")],
                          env={**os.environ, "JAX_PLATFORMS": platform}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"docscore run: JAX_PLATFORMS={platform}: JAX cannot start that backend on this machine (")
    assert "unset JAX_PLATFORMS" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()
    # convert says the same (it blamed the weights file: "cannot read safetensors ... corrupt or incomplete")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"")
    done = subprocess.run([sys.executable, "-m", "pipeline", "convert", "--hf", str(tmp_path / "hf"), "--out",
                           str(tmp_path / "converted")], env={**os.environ, "JAX_PLATFORMS": platform},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"docscore convert: JAX_PLATFORMS={platform}: JAX cannot start that backend on this machine (")
    assert not (tmp_path / "converted").exists()
