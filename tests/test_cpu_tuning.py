"""CPU tuning: user settings win, mallopt really keeps big allocations out of mmap, the XLA flags are
accepted by this jaxlib, and a second process loads its programs from the persistent compilation cache.
Subprocesses: malloc and XLA settings only act in a fresh process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from pipeline import cpu_tuning

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str, env: dict[str, str]) -> dict:
    """Run code in a fresh interpreter at the repository root; it prints one JSON line last."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k not in ("XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR", cpu_tuning.ENV_SWITCH,
                                                         cpu_tuning.MIN_COMPILE_TIME_ENV)}
    env["JAX_PLATFORMS"] = "cpu"
    env.update(extra)
    return env


def test_xla_flags_are_chosen_per_kernel_and_the_users_value_wins(monkeypatch):
    assert cpu_tuning.xla_flags_for("native") == cpu_tuning.CPU_XLA_FLAGS["xla"]
    assert cpu_tuning.xla_flags_for("flash") == cpu_tuning.CPU_XLA_FLAGS["blockwise"]
    assert cpu_tuning.xla_flags_for("pallas_tpu") == ()
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=default --xla_cpu_enable_fast_math=false")
    assert cpu_tuning.add_xla_flags([cpu_tuning.YNN_INDIVIDUAL_DOT]) == []
    assert os.environ["XLA_FLAGS"].split() == ["--xla_cpu_experimental_ynn_fusion_type=default",
                                               "--xla_cpu_enable_fast_math=false"]
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    assert cpu_tuning.add_xla_flags([cpu_tuning.YNN_INDIVIDUAL_DOT]) == [cpu_tuning.YNN_INDIVIDUAL_DOT]
    assert os.environ["XLA_FLAGS"].split() == ["--xla_cpu_enable_fast_math=false", cpu_tuning.YNN_INDIVIDUAL_DOT]
    monkeypatch.setenv(cpu_tuning.ENV_SWITCH, "0")
    report = cpu_tuning.apply_cpu_tuning(cpu_tuning.CpuTuning(compilation_cache=False))
    assert report.mallopt == {} and report.xla_flags_added == [] and report.skipped


MALLOC_PROBE = """
    import ctypes, json, sys
    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                  "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    report = {}
    if sys.argv[-1] == "tuned":
        from pipeline.cpu_tuning import apply_mallopt
        report["applied"], report["skipped"] = apply_mallopt()
    before = libc.mallinfo2()
    block = libc.malloc(96 << 20)  # a big XLA temporary
    report["mmapped"] = libc.mallinfo2().hblkhd - before.hblkhd
    libc.free(ctypes.c_void_p(block))
    report["heap_after_free"] = libc.mallinfo2().arena
    print(json.dumps(report))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="mallopt is glibc's")
def test_mallopt_keeps_big_temporaries_in_the_heap():
    def probe(mode: str, **env: str) -> dict:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(MALLOC_PROBE), mode], cwd=ROOT,
                              env=clean_env(**env), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    default, tuned = probe("default"), probe("tuned")
    assert default["mmapped"] >= 96 << 20  # glibc maps it, and unmaps it again on free
    assert set(tuned["applied"]) == set(cpu_tuning.MALLOPT_VALUES)
    assert tuned["mmapped"] == 0 and tuned["heap_after_free"] >= 96 << 20  # kept for the next call
    users = probe("tuned", MALLOC_MMAP_THRESHOLD_="65536")
    assert "M_MMAP_THRESHOLD" not in users["applied"] and users["mmapped"] >= 96 << 20


CACHE_PROBE = """
    import json, os
    from pipeline.cpu_tuning import CpuTuning, apply_cpu_tuning
    report = apply_cpu_tuning(CpuTuning(attention="native"))
    import jax, jax.numpy as jnp
    hits = []
    jax.monitoring.register_event_listener(lambda event, **kw: hits.append(event) if event.endswith("/cache_hits") else None)
    f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum(axis=1))
    value = float(f(jnp.ones((8, 8))).sum())
    print(json.dumps({"cache_dir": report.compilation_cache_dir, "flags": os.environ.get("XLA_FLAGS", ""),
                      "added": report.xla_flags_added, "hits": len(hits), "value": value}))
"""


def test_compilation_cache_under_the_docscore_cache_dir_serves_a_second_process(tmp_path):
    env = clean_env(DOCSCORE_CACHE_DIR=str(tmp_path))  # the probe's program compiles in milliseconds: cached anyway
    first = run_python(CACHE_PROBE, env)
    cache = tmp_path / cpu_tuning.COMPILATION_CACHE_SUBDIR
    assert first["cache_dir"] == str(cache) and any(cache.iterdir())
    assert first["hits"] == 0
    # the chosen XLA flag reached XLA (an unknown flag would abort the process) and was the one added
    assert first["added"] == list(cpu_tuning.CPU_XLA_FLAGS["xla"]) and cpu_tuning.YNN_INDIVIDUAL_DOT in first["flags"]
    second = run_python(CACHE_PROBE, env)
    assert second["hits"] >= 1 and second["value"] == first["value"]
