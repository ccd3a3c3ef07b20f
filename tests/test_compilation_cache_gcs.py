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
from pipeline.process_setup import CpuTuning, apply_cpu_tuning
report = apply_cpu_tuning(CpuTuning(cache_dir=sys.argv[1]))
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


def test_a_file_url_cache_dir_is_that_local_folder(tmp_path, monkeypatch):
    """--cache_dir file:///x is the folder /x for models as for the compilation cache: the model conversion took the
    URL for a path (a folder 'file:' under the working directory, then 'cannot read safetensors')."""
    from models.loader import local_model_dir

    monkeypatch.chdir(tmp_path)
    path, name = local_model_dir("minilm-l6", f"file://{tmp_path / 'cache'}")
    assert name == "minilm-l6" and path.startswith(str(tmp_path / "cache")) and os.path.isdir(path)
    assert not (tmp_path / "file:").exists()


@pytest.mark.integration
def test_a_cache_dir_that_cannot_hold_the_cache_is_refused_before_any_data_is_read(gcs, tmp_path, monkeypatch, corpus,
                                                                                    no_data_read, capsys):
    """A gs:// --cache_dir in a bucket that does not exist: exit 2 naming --cache_dir (JAX itself only warns, per
    program, and every run compiles cold), with nothing exported or configured for the refused location."""
    import jax

    from tests.conftest import common_flags, run_docscore

    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    before = jax.config.jax_compilation_cache_dir
    missing = f"gs://{gcs.bucket}-missing/cache"
    rc = run_docscore("--input", corpus, *common_flags("c1", tmp_path / "out"), "--cache_dir", missing)
    err = capsys.readouterr().err
    assert rc == 2 and f"--cache_dir {missing}: cannot hold the compilation cache {missing}/jax-compilation-cache" in err, err
    assert "JAX_COMPILATION_CACHE_DIR" not in os.environ and jax.config.jax_compilation_cache_dir == before
    assert not (tmp_path / "out").exists()


def test_two_runs_in_one_process_each_use_their_own_cache_dir(tmp_path, monkeypatch, corpus):
    """The compilation cache the first run exported does not hold the second run, which names another --cache_dir;
    a JAX_COMPILATION_CACHE_DIR the user set still wins over --cache_dir."""
    from models.builtin import builtin_dir
    from models.model_dir import default_cache_dir
    from tests.conftest import common_flags, run_docscore

    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    model = builtin_dir("minilm-l6", default_cache_dir())  # converted once, outside the caches under test
    for name in ("a", "b"):
        rc = run_docscore("--input", corpus, *common_flags(name, tmp_path / "out"), "--model", model,
                          "--cache_dir", str(tmp_path / name), "--attention", "native")
        assert rc == 0
        assert any((tmp_path / name / "jax-compilation-cache").iterdir()), f"run {name} cached nothing in its own --cache_dir"
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "users"))
    assert run_docscore("--input", corpus, *common_flags("c", tmp_path / "out"), "--model", model,
                        "--cache_dir", str(tmp_path / "c"), "--attention", "native") == 0
    assert any((tmp_path / "users").iterdir()) and not (tmp_path / "c" / "jax-compilation-cache").exists()
