"""A local runner runs inference on this machine: a --target_backend it does not have is a configuration error
(exit 2) before any data is read, never a run that records one kernel and runs another."""
from __future__ import annotations

import jax
import pytest

from tests.conftest import common_flags, run_docscore

OTHER = [b for b in ("cpu", "gpu", "tpu") if b != jax.default_backend()]

pytest_plugins = ["gcs_support"]


@pytest.mark.parametrize("flags", [
    ["--target_backend", OTHER[0]],
    ["--target_backend", OTHER[-1], "--attention", "flash"],
    ["--target_backend", "tpu", "--attention", "pallas_tpu"] if jax.default_backend() != "tpu" else ["--target_backend", "gpu"],
])
def test_a_backend_the_local_runner_cannot_reach_is_refused_before_reading(flags, corpus, tmp_path, no_data_read, capsys):
    assert run_docscore("--input", corpus, *common_flags("unreachable", tmp_path / "out"), *flags) == 2
    message = capsys.readouterr().err
    assert f"--target_backend={flags[1]} cannot run with the local runner" in message
    assert f"backend is {jax.default_backend()}" in message and "--preset dataflow-" in message
    assert not (tmp_path / "out" / "scores").exists()


def test_the_machines_own_backend_named_explicitly_still_runs(corpus, tmp_path):
    out = tmp_path / "out"
    assert run_docscore("--input", corpus, *common_flags("here", out), "--target_backend", jax.default_backend()) == 0


@pytest.mark.parametrize("accelerator,backend,kernel", [
    ("worker_accelerator=type:tpu-v5-lite-podslice;topology:1x1", "tpu", "splash_tpu"),
    ("worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver", "gpu", "pallas_gpu"),
    (None, "cpu", None),
])
def test_on_dataflow_auto_means_the_workers_backend(accelerator, backend, kernel, gcs_corpus):
    """--target_backend auto with DataflowRunner plans for what the workers have (their worker_accelerator), not
    for the launching machine: the kernel, the batch sizes and the summary follow it."""
    from pipeline.options import parse_options
    from pipeline.validate import validate

    flags = ["--input", gcs_corpus, "--output", "bq:docscore-test.evals.nightly", "--run_id", "r1", "--runner",
             "DataflowRunner", "--project", "docscore-test", "--region", "us-central1", "--temp_location",
             "gs://docscore-test-bucket/tmp", "--sdk_container_image", "img:test", "--attention", "flash", "--dtype",
             "bfloat16", "--experiments", "no_use_multiple_sdk_containers"]  # one SDK process per VM: what accelerators need
    _, eo = parse_options(flags + (["--dataflow_service_options", accelerator] if accelerator else []))
    plan = validate(eo)
    assert plan.target_backend == backend and plan.batch.backend == backend
    if kernel:
        assert plan.kernel == kernel
    # what a launch that does not wait (--dry_run, --template_location) prints of the job it built
    from pipeline.runs.publish import plan_line

    line = plan_line(eo, plan)
    assert line.startswith(f"backend {backend}, kernel {plan.kernel}, dtype bfloat16, batch_size {plan.batch.batch_size}")
    assert "image img:test" in line and (accelerator is None or f"accelerator {accelerator.partition('=')[2]}" in line)


def test_a_backend_the_preset_set_is_not_blamed_on_the_user(corpus, tmp_path, no_data_read, capsys):
    """A Dataflow preset run with the local runner: its --target_backend came from the preset, so the fix is
    --target_backend auto (or dropping --runner), not dropping a flag the user never typed."""
    preset = "dataflow-tpu-v5e" if jax.default_backend() != "tpu" else "dataflow-gpu-l4"
    assert run_docscore("--preset", preset, "--runner", "DirectRunner", "--input", corpus,
                        *common_flags("preset", tmp_path / "out")) == 2
    message = capsys.readouterr().err
    assert f"(set by --preset {preset}) cannot run with the local runner" in message, message
    assert "pass --target_backend auto" in message and "drop --target_backend" not in message, message
