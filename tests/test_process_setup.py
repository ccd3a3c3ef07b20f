"""CPU tuning: user settings win, mallopt really keeps big allocations out of mmap, the XLA flags are
accepted by this jaxlib, and a second process loads its programs from the persistent compilation cache.
Subprocesses: malloc and XLA settings only act in a fresh process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline import process_setup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str, env: dict[str, str]) -> dict:
    """Run code in a fresh interpreter at the repository root; it prints one JSON line last."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k not in ("XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR", process_setup.ENV_SWITCH,
                                                         process_setup.MIN_COMPILE_TIME_ENV, process_setup.TOKENIZERS_PARALLELISM)}
    env["JAX_PLATFORMS"] = "cpu"
    env.update(extra)
    return env


def test_xla_flags_are_chosen_per_dtype_and_the_users_value_wins(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=default --xla_cpu_enable_fast_math=false")
    assert process_setup.add_xla_flags([process_setup.YNN_INDIVIDUAL_DOT]) == []
    assert os.environ["XLA_FLAGS"].split() == ["--xla_cpu_experimental_ynn_fusion_type=default",
                                               "--xla_cpu_enable_fast_math=false"]
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    assert process_setup.add_xla_flags([process_setup.YNN_INDIVIDUAL_DOT]) == [process_setup.YNN_INDIVIDUAL_DOT]
    assert os.environ["XLA_FLAGS"].split() == ["--xla_cpu_enable_fast_math=false", process_setup.YNN_INDIVIDUAL_DOT]
    # the user's value as written: a quoted value keeps its quotes (rejoined unquoted, XLA read "/tmp/a" and "b"), and
    # an unbalanced quote, which XLA reads all the same, stops nothing (test_an_unbalanced_quote_keeps_...: where ours go)
    for users in ('--xla_dump_to="/tmp/a b"', '--xla_dump_to="/tmp/a b'):
        monkeypatch.setenv("XLA_FLAGS", users)
        assert process_setup.add_xla_flags([process_setup.YNN_INDIVIDUAL_DOT]) == [process_setup.YNN_INDIVIDUAL_DOT]
        assert process_setup.YNN_INDIVIDUAL_DOT in os.environ["XLA_FLAGS"] and users in os.environ["XLA_FLAGS"]
    monkeypatch.setenv(process_setup.ENV_SWITCH, "0")
    report = process_setup.apply_cpu_tuning(process_setup.CpuTuning(compilation_cache=False))
    assert report.mallopt == {} and report.xla_flags_added == [] and report.skipped


def test_an_unbalanced_quote_keeps_the_users_value_and_the_flags_added_as_xla_reads_them(tmp_path, monkeypatch):
    """XLA reads a quoted value with no closing quote to the end of XLA_FLAGS: flags added after it became part of the
    user's --xla_dump_to path (a folder 'd --xla_...') and were never applied, though reported as added. XLA itself
    (a fresh process) shows both as meant: the flag added applied, the dump folder the one the user wrote."""
    monkeypatch.setenv("XLA_FLAGS", f'--xla_dump_to="{tmp_path}/d')
    assert process_setup.add_xla_flags(["--xla_force_host_platform_device_count=3"]) == [
        "--xla_force_host_platform_device_count=3"]
    code = """
        import json, jax, jax.numpy as jnp
        jax.jit(lambda x: x + 1)(jnp.ones(2)).block_until_ready()
        print(json.dumps({"devices": jax.device_count()}))
    """
    assert run_python(code, clean_env(XLA_FLAGS=os.environ["XLA_FLAGS"])) == {"devices": 3}
    assert [p.name for p in tmp_path.iterdir()] == ["d"]


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
        from pipeline.process_setup import apply_mallopt
        report["applied"], report["skipped"] = apply_mallopt()
    before = libc.mallinfo2()
    block = libc.malloc(96 << 20)  # a big XLA temporary
    report["mmapped"] = libc.mallinfo2().hblkhd - before.hblkhd
    libc.free(ctypes.c_void_p(block))
    report["heap_after_free"] = libc.mallinfo2().arena
    print(json.dumps(report))
"""


@pytest.mark.integration
@pytest.mark.skipif(sys.platform != "linux", reason="mallopt is glibc's")
def test_mallopt_keeps_big_temporaries_in_the_heap():
    def probe(mode: str, **env: str) -> dict:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(MALLOC_PROBE), mode], cwd=ROOT,
                              env=clean_env(**env), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    default, tuned = probe("default"), probe("tuned")
    assert default["mmapped"] >= 96 << 20  # glibc maps it, and unmaps it again on free
    assert set(tuned["applied"]) == set(process_setup.MALLOPT_VALUES)
    assert tuned["mmapped"] == 0 and tuned["heap_after_free"] >= 96 << 20  # kept for the next call
    users = probe("tuned", MALLOC_MMAP_THRESHOLD_="65536")
    assert "M_MMAP_THRESHOLD" not in users["applied"] and users["mmapped"] >= 96 << 20


ARENA_PROBE = """
    import ctypes, json, os, re, threading
    from pipeline.process_setup import CpuTuning, apply_cpu_tuning
    report = apply_cpu_tuning(CpuTuning(compilation_cache=False, xla_flags=False))
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    go = threading.Barrier(4)

    def allocate():  # four threads allocating at once, as the tokenizer's and XLA's threads do
        go.wait()
        libc.free(ctypes.c_void_p(libc.malloc(4096)))

    threads = [threading.Thread(target=allocate) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    libc.open_memstream.restype = ctypes.c_void_p
    buf, size = ctypes.c_char_p(), ctypes.c_size_t()
    stream = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    libc.malloc_info(0, ctypes.c_void_p(stream))
    libc.fclose(ctypes.c_void_p(stream))
    heaps = len(re.findall(r"<heap nr=", buf.value.decode()))
    print(json.dumps({"mallopt": report.mallopt, "env_set": report.env_set, "skipped": report.skipped, "heaps": heaps,
                      "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM")}))
"""


@pytest.mark.integration
@pytest.mark.skipif(sys.platform != "linux", reason="mallopt is glibc's")
def test_one_malloc_arena_only_where_the_model_runs_on_this_cpu(tmp_path):
    """A CPU run gets one arena (XLA's threads' temporaries stay in the heap) and a tokenizer that encodes on
    the calling thread (its threads would queue for that arena); a host that drives an accelerator keeps
    glibc's arenas and the tokenizer's threads. The user's own settings win."""
    cpu = run_python(ARENA_PROBE, clean_env())
    assert cpu["mallopt"]["M_ARENA_MAX"] == 1 and cpu["heaps"] == 1
    assert cpu["env_set"] == {"TOKENIZERS_PARALLELISM": "false"} and cpu["tokenizers_parallelism"] == "false"
    gpu = run_python(ARENA_PROBE, clean_env(JAX_PLATFORMS="cuda,cpu"))
    assert "M_ARENA_MAX" not in gpu["mallopt"] and gpu["heaps"] > 1 and gpu["env_set"] == {}
    assert gpu["tokenizers_parallelism"] is None and any("JAX_PLATFORMS=cuda,cpu" in s for s in gpu["skipped"])
    assert "M_MMAP_THRESHOLD" in gpu["mallopt"]  # big host buffers still stay in the heap
    users = run_python(ARENA_PROBE, clean_env(TOKENIZERS_PARALLELISM="true"))
    assert users["mallopt"]["M_ARENA_MAX"] == 1 and users["env_set"] == {} and users["tokenizers_parallelism"] == "true"
    # no JAX_PLATFORMS: an installed PJRT plugin (where JAX looks for one) means an accelerator host
    plugin = tmp_path / "site" / "jax_plugins" / "xla_probe"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text("")
    env = clean_env(PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), ROOT]))
    del env["JAX_PLATFORMS"]
    found = run_python(ARENA_PROBE, env)
    assert "M_ARENA_MAX" not in found["mallopt"] and found["heaps"] > 1
    assert any("PJRT plugin xla_probe installed" in s for s in found["skipped"])


CACHE_PROBE = """
    import json, os
    from pipeline.process_setup import CpuTuning, apply_cpu_tuning
    report = apply_cpu_tuning(CpuTuning())
    import jax, jax.numpy as jnp
    hits = []
    jax.monitoring.register_event_listener(lambda event, **kw: hits.append(event) if event.endswith("/cache_hits") else None)
    f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum(axis=1))
    value = float(f(jnp.ones((8, 8))).sum())
    print(json.dumps({"cache_dir": report.compilation_cache_dir, "flags": os.environ.get("XLA_FLAGS", ""),
                      "added": report.xla_flags_added, "hits": len(hits), "value": value}))
"""


@pytest.mark.integration
def test_compilation_cache_under_the_docscore_cache_dir_serves_a_second_process(tmp_path):
    env = clean_env(DOCSCORE_CACHE_DIR=str(tmp_path))  # the probe's program compiles in milliseconds: cached anyway
    first = run_python(CACHE_PROBE, env)
    cache = tmp_path / process_setup.COMPILATION_CACHE_SUBDIR
    assert first["cache_dir"] == str(cache) and any(cache.iterdir())
    assert first["hits"] == 0
    # the XLA flag chosen for this CPU reached XLA (an unknown flag would abort the process) and was the one added
    chosen = list(process_setup.xla_flags_for("float32", process_setup.cpu_features()))
    assert first["added"] == chosen and chosen[0] in first["flags"].split()
    second = run_python(CACHE_PROBE, env)
    assert second["hits"] >= 1 and second["value"] == first["value"]


@pytest.mark.integration
def filled_cache(tmp_path) -> tuple[dict, Path, list[Path]]:
    """(env, compilation cache, its entries) after CACHE_PROBE ran once with DOCSCORE_CACHE_DIR=tmp_path."""
    env = clean_env(DOCSCORE_CACHE_DIR=str(tmp_path))
    run_python(CACHE_PROBE, env)
    cache = tmp_path / process_setup.COMPILATION_CACHE_SUBDIR
    entries = sorted(cache.glob("*-cache"))
    assert entries
    return env, cache, entries


@pytest.mark.parametrize("damage", ["cut_short", "garbage_that_decompresses"])
def test_an_unreadable_cache_entry_is_written_again_instead_of_compiling_cold_in_every_run(tmp_path, damage):
    """An entry cut short (a full disk, a killed write), or one that decompresses but XLA cannot parse: JAX warns,
    compiles, and never writes over an existing entry, so every later process compiled that program cold. docscore
    removes the unreadable entry when JAX warns (saying so), the process writes it again, and the next one loads it."""
    import zstandard

    env, cache, entries = filled_cache(tmp_path)
    for entry in entries:
        entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2] if damage == "cut_short"
                          else zstandard.ZstdCompressor().compress(b"not an executable"))
    program = entries[0].name.rsplit("-", 2)[0]  # entries are PROGRAM-HASH-cache
    if damage == "cut_short":
        assert {os.path.basename(p) for p in process_setup.unreadable_cache_entries(str(cache), program)} == \
            {e.name for e in entries if e.name.startswith(program + "-")} != set()
    damaged = subprocess.run([sys.executable, "-c", textwrap.dedent(CACHE_PROBE)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=180)
    assert damaged.returncode == 0, damaged.stderr[-3000:]
    assert json.loads(damaged.stdout.strip().splitlines()[-1])["hits"] == 0
    assert "docscore removed the unreadable" in damaged.stderr and "so this run writes the program again" in damaged.stderr
    assert process_setup.unreadable_cache_entries(str(cache), program) == []
    assert run_python(CACHE_PROBE, env)["hits"] >= 1  # loaded again, not compiled cold for good



@pytest.mark.integration
def test_a_damaged_entry_of_a_read_only_cache_is_compiled_not_a_crash(tmp_path):
    """A read-only --cache_dir is used since it holds a warm cache (launch.py); an entry of it cut short made JAX warn,
    docscore's removal of the entry raised PermissionError from inside that warning, and the compile failed with it.
    Now the entry stays, JAX compiles the program, and the warning does not claim a removal."""
    from tests.test_run_faults import as_an_ordinary_user

    env, cache, entries = filled_cache(tmp_path)
    for entry in entries:
        entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
        entry.chmod(0o444)
    cache.chmod(0o555)
    tmp_path.chmod(0o555)
    try:
        damaged = subprocess.run([*as_an_ordinary_user(), sys.executable, "-c", textwrap.dedent(CACHE_PROBE)],
                                 cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    finally:
        tmp_path.chmod(0o755)
        cache.chmod(0o755)
    assert damaged.returncode == 0, damaged.stderr[-3000:]
    assert process_setup.UNREADABLE_ENTRY_WARNING in damaged.stderr and "docscore removed" not in damaged.stderr
    assert sorted(cache.glob("*-cache")) == entries  # left as they were: not this process's to remove


ZEN3 = "processor\t: 0\nflags\t\t: fpu sse4_2 avx avx2 fma\n"  # AVX2 only
ZEN4 = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 avx512_vnni\n"  # AVX-512 with BF16 (also Cooper Lake)
ICE_LAKE = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_vnni\n"  # AVX-512 without BF16
SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: avx2 avx512f amx_tile amx_bf16\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"
OLD_ARM = "processor\t: 0\nFeatures\t: fp asimd crc32\n"


READ_FEATURES = process_setup.cpu_features  # the real reader, whatever a test patches in


def features_of(tmp_path, text: str) -> frozenset[str] | None:
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return READ_FEATURES(str(path))


def test_native_bfloat16_is_read_from_the_cpu_feature_flags(tmp_path):
    cases = {ZEN3: False, ZEN4: True, ICE_LAKE: False, SAPPHIRE_RAPIDS: True, GRAVITON3: True, OLD_ARM: False,
             "processor\t: 0\nmodel name\t: something\n": None}  # no feature list: unknown
    for text, expected in cases.items():
        assert process_setup.has_native_bfloat16(features_of(tmp_path, text)) is expected, text
    assert process_setup.cpu_features(str(tmp_path / "missing")) is None


def test_dots_leave_ynnpack_where_it_was_measured_slower(tmp_path):
    """individual_dot where YNNPACK paid off (AVX-512; bfloat16 instructions for bfloat16), YNN_OFF on x86
    without them, jaxlib's own choice (individual_dot) on CPUs not measured."""
    def flags(text: str | None, dtype: str) -> tuple[str, ...]:
        return process_setup.xla_flags_for(dtype, None if text is None else features_of(tmp_path, text))

    on, off = (process_setup.YNN_INDIVIDUAL_DOT,), (process_setup.YNN_OFF,)
    assert flags(ZEN3, "float32") == off and flags(ZEN3, "bfloat16") == off
    assert flags(ZEN4, "float32") == on and flags(ZEN4, "bfloat16") == on
    assert flags(ICE_LAKE, "float32") == on and flags(ICE_LAKE, "bfloat16") == off
    assert flags(GRAVITON3, "bfloat16") == on and flags(OLD_ARM, "bfloat16") == on and flags(None, "bfloat16") == on


@pytest.mark.integration
@pytest.mark.parametrize("flag", [process_setup.YNN_INDIVIDUAL_DOT, process_setup.YNN_OFF])
def test_this_jaxlib_accepts_both_ynn_settings(flag):
    """An XLA flag jaxlib does not know, or a value it rejects, aborts the process at backend start."""
    done = run_python("""
        import json, jax.numpy as jnp
        print(json.dumps({"value": float(jnp.dot(jnp.ones((4, 4), jnp.bfloat16), jnp.ones((4, 4), jnp.bfloat16)).sum())}))
    """, clean_env(XLA_FLAGS=flag))
    assert done["value"] == 64.0


def test_bfloat16_on_a_cpu_without_it_is_noted_for_local_cpu_runs(monkeypatch, tmp_path):
    from pipeline.options import parse_options
    from pipeline.validate import bfloat16_notice

    def notice(*flags: str, cpu: str | None = ZEN3, backend: str = "cpu") -> str | None:
        features = None if cpu is None else features_of(tmp_path, cpu)
        monkeypatch.setattr(process_setup, "cpu_features", lambda: features)
        _, eo = parse_options(["--input", "x.jsonl", "--output", str(tmp_path / "out"), *flags])
        return bfloat16_notice(eo, backend)

    message = notice("--dtype", "bfloat16")
    assert "--dtype=bfloat16" in message and "--dtype=float32" in message and "avx512_bf16" in message
    assert notice("--dtype", "bfloat16", cpu=ZEN4) is None
    assert notice("--dtype", "bfloat16", cpu=None) is None  # unknown CPU: nothing claimed
    assert notice("--dtype", "float32") is None
    assert notice("--dtype", "bfloat16", backend="tpu") is None
    assert notice("--dtype", "bfloat16", "--runner", "DataflowRunner") is None  # the workers' CPU is not this one
