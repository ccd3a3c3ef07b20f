"""JAX's persistent compilation cache on GCS (--cache_dir gs://...): what one process compiles, the next one
reads from the bucket instead of compiling (Dataflow workers share it this way). Real processes, the GCS
emulator."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest_plugins = ["gcs_support"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# a fresh process: docscore's tuning with a gs:// --cache_dir, one program compiled, the cache hits counted
CHILD = r"""
import json, sys
from pipeline.telemetry.cpu_tuning import CpuTuning, apply_cpu_tuning
report = apply_cpu_tuning(CpuTuning(attention="native", cache_dir=sys.argv[1]))
import jax, jax.numpy as jnp
from models.loader import PERSISTENT_CACHE_HITS
jax.jit(lambda x: jnp.tanh(x) @ x.T + 1.0).lower(jnp.ones((32, 32))).compile()
print(json.dumps({"hits": PERSISTENT_CACHE_HITS.count, "dir": report.compilation_cache_dir}))
"""


@pytest.mark.integration
def test_a_gs_cache_dir_shares_compiled_programs_between_processes(gcs):
    cache_dir = gcs.url("shared-cache")
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}  # the session's own cache is local
    runs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", CHILD, cache_dir], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    assert runs[0]["dir"] == f"{cache_dir}/jax-compilation-cache"
    assert runs[0]["hits"] == 0 and runs[1]["hits"] >= 1  # the second process read what the first wrote
    written = gcs.fs().ls(f"{gcs.bucket}/shared-cache/jax-compilation-cache")
    assert any("jit__lambda" in name for name in written), written


def test_models_stay_in_the_local_cache_when_cache_dir_is_on_gcs(tmp_path, monkeypatch):
    """A gs:// --cache_dir holds the compilation cache; models are converted into the machine's own cache
    (not into a local folder named 'gs:' under the working directory)."""
    from models.loader import local_model_dir
    from models.model_dir import default_cache_dir

    monkeypatch.chdir(tmp_path)
    path, name = local_model_dir("minilm-l6", "gs://some-bucket/docscore-cache")
    assert name == "minilm-l6" and path.startswith(default_cache_dir()) and os.path.isdir(path)
    assert not (tmp_path / "gs:").exists()
