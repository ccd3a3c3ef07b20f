"""--profile_dir: a real `docscore run` writes a JAX profiler trace whose recorded program carries the
attention kernel's named scope ("attention/<impl>"), readable with jax.profiler.ProfileData; the flash
kernel shows under its own scope the same way."""
from __future__ import annotations

import os

import numpy as np
import pytest
from jax.profiler import ProfileData

from pipeline.telemetry.profiling import profile_batch
from tests.conftest import SENTENCES, common_flags, run_docscore, write_jsonl

pytestmark = pytest.mark.integration  # README.md, "Development"


def trace_files(profile_dir: str) -> list[str]:
    """Every .xplane.pb written under profile_dir (sorted)."""
    found = []
    for root, _, files in os.walk(profile_dir):
        found += [os.path.join(root, f) for f in files if f.endswith(".xplane.pb")]
    return sorted(found)


def executed_modules(xplane: str) -> set[str]:
    """Names of the XLA programs whose execution the trace recorded."""
    data = ProfileData.from_file(xplane)
    return {str(value) for plane in data.planes for line in plane.lines for event in line.events
            for key, value in event.stats if key == "hlo_module"}


def test_profile_dir_traces_the_model_under_the_attention_scope(tmp_path):
    shard = write_jsonl(tmp_path / "in" / "docs.jsonl", [{"id": str(i), "text": s} for i, s in enumerate(SENTENCES)])
    profile_dir = tmp_path / "profile"
    code = run_docscore("--input", shard, "--task", "embed", "--attention", "native", "--profile_dir", profile_dir,
                        *common_flags("profiled", tmp_path / "out"))
    assert code == 0
    traces = trace_files(str(profile_dir))
    assert traces, f"no .xplane.pb under {profile_dir}"
    assert any(p.with_suffix("").name == "perfetto_trace.json" for p in profile_dir.rglob("*.gz"))
    assert any(executed_modules(t) for t in traces)  # the model's programs ran inside the trace
    # the HLO of the traced programs is stored in the trace with its op names: the kernel's scope is there
    assert any(b"attention/xla" in open(t, "rb").read() for t in traces)


def test_the_shadow_kernels_calls_are_in_the_trace_too(tmp_path):
    """--shadow_attention's calls are device time of the same batches: the trace shows both kernels' scopes."""
    shard = write_jsonl(tmp_path / "in" / "docs.jsonl", [{"id": str(i), "text": s} for i, s in enumerate(SENTENCES)])
    profile_dir = tmp_path / "profile"
    assert run_docscore("--input", shard, "--task", "embed", "--attention", "native", "--shadow_attention", "flash",
                        "--shadow_fraction", "1", "--profile_dir", profile_dir,
                        *common_flags("shadowed", tmp_path / "out")) == 0
    traced = b"".join(open(t, "rb").read() for t in trace_files(str(profile_dir)))
    assert b"attention/xla" in traced and b"attention/blockwise" in traced


def test_flash_kernel_shows_under_its_own_scope(tmp_path):
    import jax

    import kernels

    q = np.random.default_rng(0).standard_normal((1, 64, 2, 16)).astype(np.float32)
    segments = np.ones((1, 64), np.int32)
    run = jax.jit(lambda q, s: kernels.attention(q, q, q, segment_ids=s, impl="blockwise"))
    run(q, segments).block_until_ready()
    with profile_batch(str(tmp_path), batches=1) as log_dir:
        run(q, segments).block_until_ready()
    with profile_batch(str(tmp_path), batches=1) as second:
        run(q, segments).block_until_ready()
    assert log_dir and second is None  # only the first `batches` are traced per process
    [trace] = trace_files(log_dir)
    assert executed_modules(trace)
    assert b"attention/blockwise" in open(trace, "rb").read()


def test_each_traced_batch_ran_the_model_when_elements_exceed_the_batch_budget(tmp_path):
    """A list of documents over the Beam batch's token budget (--batch_size 1 --calls_per_beam_batch 1 here; long
    documents at the defaults) made Beam hand over an empty batch first: it was traced as one of the two profiled
    batches and counted as a batch. Only batches with documents are traced and counted."""
    from tests.conftest import read_summary

    shard = write_jsonl(tmp_path / "in" / "docs.jsonl", [{"id": str(i), "text": s} for i, s in enumerate(SENTENCES)])
    profile_dir = tmp_path / "profile"
    assert run_docscore("--input", shard, "--task", "embed", "--attention", "native", "--profile_dir", profile_dir,
                        *common_flags("budget", tmp_path / "out"), "--batch_size", "1", "--calls_per_beam_batch", "1",
                        "--direct_num_workers", "1") == 0
    traces = trace_files(str(profile_dir))
    assert traces and all(executed_modules(t) for t in traces), [(t, len(executed_modules(t))) for t in traces]
    summary = read_summary(tmp_path / "out", "budget")
    assert summary["memory"]["batches"] >= 1 and summary["counts"]["scored"] == len(SENTENCES)
