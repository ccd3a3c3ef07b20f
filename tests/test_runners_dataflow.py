"""Dataflow jobs built offline from the presets, for a tiny Beam pipeline and for the real docscore
graph (pipeline.graph.build_pipeline), asserting on what Dataflow would receive.

Two mechanisms (Beam 2.77):
- --dry_run=True: DataflowRunner translates the pipeline and returns before contacting Google;
  result.job holds the job's options and its Runner API proto, but Beam 2.77 returns *before*
  writing --dataflow_job_file and before the worker-pool environment is filled in.
- --template_location=FILE: the full job JSON (worker pools, service options, experiments,
  sdkPipelineOptions) exactly as it would be submitted - the same JSON --dataflow_job_file holds -
  is written and nothing is submitted. Staging goes to gs://, here the emulator (gcs_support).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import DebugOptions, GoogleCloudOptions, WorkerOptions
from apache_beam.portability.api import beam_runner_api_pb2

from pipeline.options import EvalOptions, parse_options
from pipeline.runs import publish

pytestmark = pytest.mark.integration  # README.md, "Development"

pytest_plugins = ["gcs_support"]

IMAGE = "us-docker.pkg.dev/docscore-test/docscore/worker:tpu-2.77.0"
PROJECT = "docscore-test"


@pytest.fixture
def cloud_env(monkeypatch):
    monkeypatch.setenv("DOCSCORE_PROJECT", PROJECT)
    monkeypatch.setenv("DOCSCORE_REGION", "us-central1")
    monkeypatch.setenv("DOCSCORE_ZONE", "us-central1-b")
    monkeypatch.setenv("DOCSCORE_IMAGE", IMAGE)
    monkeypatch.setenv("DOCSCORE_TEMP_LOCATION", "gs://docscore-test-bucket/tmp")
    return monkeypatch


def tiny_pipeline(p: beam.Pipeline) -> None:
    _ = p | beam.Create(["a", "bb", "ccc"]) | beam.Map(len) | beam.combiners.Count.Globally()


def container_images(proto: beam_runner_api_pb2.Pipeline) -> set[str]:
    """The Docker image of every environment the job's transforms run in."""
    images = set()
    used = {t.environment_id for t in proto.components.transforms.values() if t.environment_id}
    for env_id in used:
        env = proto.components.environments[env_id]
        images.add(beam_runner_api_pb2.DockerPayload.FromString(env.payload).container_image)
    return images


def test_dry_run_carries_the_tpu_preset_into_the_job(cloud_env):
    options, eo = parse_options(["--preset", "dataflow-tpu-v5e", "--input", "unused", "--output", "unused",
                                 "--no_auth", "--dry_run=True"])
    p = beam.Pipeline(options=options)
    tiny_pipeline(p)
    result = p.run()
    job = result.job
    assert job.proto.type_.name == "JOB_TYPE_BATCH"
    worker = job.options.view_as(WorkerOptions)
    assert worker.machine_type == "ct5lp-hightpu-1t"
    assert worker.worker_zone == "us-central1-b"
    assert worker.sdk_container_image == IMAGE
    cloud = job.options.view_as(GoogleCloudOptions)
    assert (cloud.project, cloud.region) == (PROJECT, "us-central1")
    assert cloud.dataflow_service_options == ["worker_accelerator=type:tpu-v5-lite-podslice;topology:1x1"]
    debug = job.options.view_as(DebugOptions)
    assert {"use_runner_v2", "no_use_multiple_sdk_containers"} <= set(debug.experiments)
    assert debug.number_of_worker_harness_threads == 4
    assert job.options.view_as(EvalOptions).target_backend == "tpu"
    assert container_images(job.proto_pipeline) == {IMAGE}


def test_a_dry_run_writes_no_job_file_and_says_so(cloud_env, tmp_path):
    job_file = tmp_path / "job.json"
    options, _ = parse_options(["--preset", "dataflow-tpu-v5e", "--input", "unused", "--output", "unused",
                                "--no_auth", "--dry_run=True", "--template_location", str(job_file)])
    p = beam.Pipeline(options=options)
    tiny_pipeline(p)
    p.run()
    assert not job_file.exists()
    assert publish.submit_only(options) == (
        f"--dry_run: the job was built and translated, not submitted nor written to --template_location {job_file}")


def build_template(options, build) -> dict:
    """Run `build(p)` on DataflowRunner with --template_location: returns the written job JSON."""
    p = beam.Pipeline(options=options)
    build(p)
    p.run()  # writes the job file and returns; nothing is submitted
    return json.loads(Path(options.view_as(GoogleCloudOptions).template_location).read_text())


def template_flags(gcs, tmp_path, preset: str) -> list[str]:
    return ["--preset", preset, "--temp_location", gcs.url("tmp"), "--no_auth",
            "--template_location", str(tmp_path / "job.json")]


def assert_accelerator_job(job: dict, machine_type: str, accelerator: str, backend: str) -> dict:
    env = job["environment"]
    (pool,) = env["workerPools"]
    assert pool["kind"] == "harness"
    assert pool["machineType"] == machine_type
    assert pool["numThreadsPerWorker"] == 4
    assert pool["workerHarnessContainerImage"] == IMAGE
    assert {c["containerImage"] for c in pool["sdkHarnessContainerImages"]} == {IMAGE}
    assert env["workerZone"] == "us-central1-b"
    assert env["serviceOptions"] == [accelerator]
    assert {"use_runner_v2", "no_use_multiple_sdk_containers"} <= set(env["experiments"])
    assert "use_multiple_sdk_containers" not in env["experiments"]  # Beam adds it unless told not to
    options = env["sdkPipelineOptions"]["options"]
    assert options["target_backend"] == backend
    assert options["project"] == PROJECT and options["region"] == "us-central1"
    return options


@pytest.mark.parametrize("preset,machine_type,accelerator,backend", [
    ("dataflow-tpu-v5e", "ct5lp-hightpu-1t", "worker_accelerator=type:tpu-v5-lite-podslice;topology:1x1", "tpu"),
    ("dataflow-gpu-l4", "g2-standard-4", "worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver", "gpu"),
])
def test_job_file_of_a_tiny_pipeline(cloud_env, gcs, tmp_path, preset, machine_type, accelerator, backend):
    options, _ = parse_options(template_flags(gcs, tmp_path, preset) + ["--input", "unused", "--output", "unused"])
    job = build_template(options, tiny_pipeline)
    assert job["type"] == "JOB_TYPE_BATCH"
    assert_accelerator_job(job, machine_type, accelerator, backend)


def staged_pipeline(job: dict) -> beam_runner_api_pb2.Pipeline:
    import fsspec

    with fsspec.open(job["environment"]["sdkPipelineOptions"]["options"]["pipelineUrl"], "rb") as f:
        return beam_runner_api_pb2.Pipeline.FromString(f.read())


def test_job_file_of_the_docscore_graph(cloud_env, gcs, tmp_path):
    """The real graph (build_pipeline, as `docscore run` builds it) on the TPU preset, reading and
    writing gs://: the job Dataflow would get runs every step in the docscore image."""
    from pipeline.graph import build_pipeline
    from pipeline.io import sinks
    from pipeline.validate import validate

    fs = gcs.fs()
    for i in range(2):
        fs.pipe(f"{gcs.bucket}/in/shard-{i}.jsonl", b'{"id": "d%d", "text": "a document"}\n' % i)
    options, eo = parse_options(template_flags(gcs, tmp_path, "dataflow-tpu-v5e") + [
        "--input", gcs.url("in", "*.jsonl"), "--output", gcs.url("out"), "--run_id", "nightly-1",
        "--task", "embed", "--max_seq_len", "64"])
    plan = validate(eo)
    assert plan.target_backend == "tpu" and plan.kernel == "splash_tpu"  # TPU's first flash kernel
    out = sinks.OutputSpec.for_run(eo.output, eo.run_id, eo.output_format)
    job = build_template(options, lambda p: build_pipeline(p, eo, plan, out))
    job_options = assert_accelerator_job(
        job, "ct5lp-hightpu-1t", "worker_accelerator=type:tpu-v5-lite-podslice;topology:1x1", "tpu")
    assert job_options["input"] == gcs.url("in", "*.jsonl")
    assert job_options["output"] == gcs.url("out")
    assert job_options["run_id"] == "nightly-1"
    assert job_options["dtype"] == "bfloat16"
    proto = staged_pipeline(job)
    names = {t.unique_name for t in proto.components.transforms.values()}
    for step in ("ReadShards", "Tokenize", "Infer", "Score", "RunStats"):
        assert step in names, f"{step} missing from the job graph"
    assert any(n.startswith("WriteScores") for n in names) and any(n.startswith("WriteErrors") for n in names)
    assert container_images(proto) == {IMAGE}


def test_template_launch_of_docscore_run_exits_zero(cloud_env, gcs, tmp_path, capsys):
    """What the Flex Template launcher does: `docscore run ... --template_location=FILE` must write
    the job and exit 0 without waiting for it; the job's own last step publishes the run."""
    from pipeline.launch import main

    gcs.fs().pipe(f"{gcs.bucket}/in/a.jsonl", b'{"id": "a", "text": "a document"}\n')
    job_file = tmp_path / "job.json"
    code = main(template_flags(gcs, tmp_path, "dataflow-tpu-v5e") + [
        "--input", gcs.url("in", "*.jsonl"), "--output", gcs.url("out"), "--run_id", "flex-1",
        "--max_seq_len", "64"])
    assert job_file.exists() and code == 0
    printed = capsys.readouterr().out
    assert str(job_file) in printed and gcs.url("out", "scores", "run_id=flex-1") in printed
    names = {t.unique_name for t in staged_pipeline(json.loads(job_file.read_text())).components.transforms.values()}
    assert "Publish/Publish" in names, "the job has no Publish step"
    assert not gcs.fs().exists(f"{gcs.bucket}/out/runs"), "nothing may be published before the job runs"


@pytest.mark.integration
@pytest.mark.parametrize("flags, message", [
    (["--requirements_file", "/nonexistent/requirements.txt"], "--requirements_file=/nonexistent/requirements.txt is not a file"),
    (["--setup_file", "/nonexistent/setup.py"], "--setup_file=/nonexistent/setup.py is not a file"),
    (["--experiments", "disable_runner_v2"], "--experiments disable_runner_v2: this Beam cannot run Dataflow jobs"),
])
def test_what_beam_refuses_only_while_building_the_job_is_refused_first(cloud_env, gcs, tmp_path, capsys, flags, message):
    from pipeline.launch import main

    code = main(template_flags(gcs, tmp_path, "dataflow-cpu") + ["--input", gcs.url("in", "*.jsonl"),
                                                                 "--output", gcs.url("out"), *flags])
    assert code == 2 and message in capsys.readouterr().err


@pytest.mark.integration
def test_a_template_launch_beam_cannot_build_ends_in_one_line(cloud_env, gcs, tmp_path, capsys):
    """Beam builds and stages the job in p.run(): a refusal there (here a missing --sdk_location) is one line and
    exit 1, as a waiting launch's failure is, not a traceback."""
    from pipeline.launch import main

    gcs.fs().pipe(f"{gcs.bucket}/in/a.jsonl", b'{"id": "a", "text": "a document"}\n')
    code = main(template_flags(gcs, tmp_path, "dataflow-cpu") + [
        "--input", gcs.url("in", "*.jsonl"), "--output", gcs.url("out"), "--run_id", "unbuilt",
        "--sdk_location", str(tmp_path / "missing-sdk.tar.gz")])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "docscore run unbuilt: the job was not built or submitted (" in err and "nothing was published" in err, err


def test_docscore_run_builds_a_dataflow_job_and_leaves_no_temporary_files(cloud_env, gcs, gcs_corpus, tmp_path):
    """The whole `docscore run` launch with --dry_run=True: validated, built and staged, nothing published; Beam's
    folder for the job's dependencies (the pickled main session, the dependency list) is not left in TMPDIR."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cloud_env.setenv("DOCSCORE_TEMP_LOCATION", gcs.url("tmp"))
    out = gcs.url("out")
    result = subprocess.run([sys.executable, "-m", "pipeline", "run", "--preset", "dataflow-cpu", "--input", gcs_corpus,
                             "--output", out, "--run_id", "dry", "--no_auth", "--dry_run=True"],
                            cwd=Path(__file__).parents[1], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TMPDIR": str(tmp)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--dry_run: the job was built and translated, not submitted" in result.stdout, result.stdout
    assert not gcs.fs().exists(f"{gcs.bucket}/out/runs"), "a dry run published a run"
    assert sorted(p.name for p in tmp.iterdir()) == []
