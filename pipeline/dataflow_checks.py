"""The checks of a launch whose workers are elsewhere, Dataflow's above all: its required settings (and those Beam
checks offline), the paths its workers must reach, its job labels, and the workers' accelerator (the backend the
run plans for, and TPU settings Dataflow would take but the job cannot run on). pipeline/validate.py calls them
before anything is read; runners/DATAFLOW.md is the user's side of the same rules.
"""
from __future__ import annotations

import math

import fsspec

from models.builtin import BUILTINS
from pipeline.io import sinks, tfds_reader
from pipeline.options import ConfigError, EvalOptions
from pipeline.telemetry.progress import runs_locally
from runners.presets import is_dataflow_runner


DATAFLOW_REQUIRED = ("project", "region", "temp_location")


def is_dataflow(eo: EvalOptions) -> bool:
    return is_dataflow_runner(eo.get_all_options().get("runner"))


def is_label_text(text: str) -> bool:
    """A Google Cloud label's key or value: at most 63 lowercase letters (any script), digits, _ and -."""
    return len(text) <= 63 and all(c.isdigit() or c in "_-" or (c.isalpha() and not c.isupper()) for c in text)


def check_job_labels(eo: EvalOptions) -> None:
    """--job_labels as Dataflow takes them: KEY=VALUE, each part a label's text (checked whatever the runner: a
    config shared by local and Dataflow runs fails here, not at submission)."""
    for label in eo.job_labels or []:
        key, sep, value = label.partition("=")
        if not sep or not key:
            raise ConfigError(f"--job_labels {label!r} is not KEY=VALUE; write e.g. --job_labels team=eval")
        if not (is_label_text(key) and key[0].isalpha() and is_label_text(value)):
            raise ConfigError(f"--job_labels {label!r}: Dataflow refuses the job: a label's key and value hold only "
                              "lowercase letters, digits, _ and - (the key starts with a letter; at most 63 characters "
                              "each); write e.g. --job_labels team=eval")


def check_paths_on_workers(eo: EvalOptions) -> None:
    """A remote runner's workers open the paths themselves: the input's shards, a model or TFDS directory, the
    output and profile folders. A path on this machine (it validates here) is not on theirs."""
    if runs_locally(eo):
        return
    read = "which its workers cannot read; copy it to gs://BUCKET/PATH and pass that"
    written = "whose writes would stay on the workers' own disks; use gs://BUCKET/PATH"
    paths = [("--output", None if eo.output.startswith(sinks.BQ_PREFIX) else eo.output,
              f"{written} or bq:PROJECT.DATASET.PREFIX")]
    if is_dataflow(eo):  # other runners' workers may share this machine (Flink's or a portable runner's LOOPBACK)
        paths += [("--input", None if eo.input.startswith(tfds_reader.TFDS_PREFIX) else eo.input, read),
                  ("--tfds_data_dir", eo.tfds_data_dir, read),
                  ("--model", None if eo.model in BUILTINS else eo.model, read),
                  ("--profile_dir", eo.profile_dir, written)]
    for flag, path, fix in paths:
        if path and fsspec.core.split_protocol(path)[0] in (None, "file", "memory"):
            raise ConfigError(f"{flag} {path} is on this machine, but the runner runs the job on remote workers, {fix}")


def check_dataflow_options(eo: EvalOptions) -> None:
    """DataflowRunner needs a project, a region and a gs:// temp_location, and the worker and project settings
    Beam checks offline (Beam checks them only when the pipeline is built, after the model has loaded, with a
    traceback). --dry_run and --template_location are DataflowRunner's: another runner ignores them and runs
    the job."""
    given = eo.get_all_options()
    runner = given.get("runner") or "DirectRunner"
    if not is_dataflow(eo):
        only = [flag for flag, value in (("--dry_run", given.get("dry_run")),
                                         ("--template_location", given.get("template_location"))) if value]
        if only:
            them = "them" if len(only) > 1 else "it"
            raise ConfigError(f"{' and '.join(only)} {'need' if len(only) > 1 else 'needs'} --runner=DataflowRunner "
                              f"(--runner={runner} ignores {them} and would run and publish the job); pass "
                              f"--runner=DataflowRunner or a Dataflow preset, or drop {them}")
        return
    missing = [f"--{name}" for name in DATAFLOW_REQUIRED if not given.get(name)]
    if missing:
        raise ConfigError(f"--runner={runner} needs {', '.join(missing)}; pass them, or use a preset that reads them "
                          "from the environment (--preset dataflow-cpu, runners/DATAFLOW.md)")
    if not str(given["temp_location"]).startswith("gs://"):
        raise ConfigError(f"--temp_location={given['temp_location']} must be a gs:// path for --runner={runner}")
    from apache_beam.options.pipeline_options import GoogleCloudOptions, WorkerOptions
    from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator
    from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner

    validator = PipelineOptionsValidator(eo, DataflowRunner())
    problems = (validator.validate_cloud_options(eo.view_as(GoogleCloudOptions))
                + eo.view_as(WorkerOptions).validate(validator))
    if problems:
        raise ConfigError(f"--runner={runner}: {problems[0].rstrip('.')}; fix the options (set on the command line, "
                          "in --config, by the preset or its environment variables: runners/DATAFLOW.md)")


ACCELERATOR_BACKENDS = (("tpu-", "tpu"), ("nvidia-", "gpu"))  # Dataflow worker_accelerator type prefixes


# Dataflow's TPU types and the machine types that carry their chips (the machine's -<N>t suffix: N chips, one host).
TPU_MACHINES = {"tpu-v5-lite-podslice": "ct5lp-", "tpu-v6e-slice": "ct6e-", "tpu-v5p-slice": "ct5p-"}


def worker_accelerator(eo: EvalOptions) -> dict[str, str]:
    """The fields of the workers' worker_accelerator service option ({"type": ..., "topology": ...}), else {}."""
    for entry in eo.get_all_options().get("dataflow_service_options") or []:
        name, _, value = str(entry).partition("=")
        if name.strip() == "worker_accelerator":
            return dict(part.partition(":")[::2] for part in value.split(";"))
    return {}


def dataflow_accelerator_backend(eo: EvalOptions) -> str:
    """The backend of a Dataflow job's workers: its worker_accelerator's kind (tpu, gpu), else cpu."""
    kind = worker_accelerator(eo).get("type", "")
    return next((backend for prefix, backend in ACCELERATOR_BACKENDS if kind.startswith(prefix)), "cpu")


def check_worker_backend(eo: EvalOptions) -> str:
    """On Dataflow the kernel and batch sizes are chosen for the workers' backend, which their accelerator sets:
    --target_backend auto means it, and another value is refused (the job would run other kernels than it
    records, or fail on the workers). Returns the backend."""
    workers = dataflow_accelerator_backend(eo)
    if eo.target_backend not in ("auto", workers):
        has = f"a {workers.upper()} (worker_accelerator)" if workers != "cpu" else "no accelerator (no worker_accelerator in --dataflow_service_options)"
        raise ConfigError(f"--target_backend={eo.target_backend}, but the Dataflow workers have {has}; use a preset for "
                          f"{eo.target_backend} workers (--preset dataflow-..., runners/presets) or --target_backend={workers}")
    if workers != "cpu":
        check_accelerator_workers(eo, workers)
    return workers


def check_accelerator_workers(eo: EvalOptions, backend: str) -> None:
    """TPU worker settings Dataflow would take but the job cannot run on: several SDK processes per VM (Runner
    v2's default; only one process may own a TPU, whereas processes may share a GPU), a TPU type on a machine
    that does not carry it, or a topology whose chips are not the machine's (Dataflow runs single-host TPU
    shapes, each on its own machine type). runners/DATAFLOW.md, sections 1-2."""
    if backend != "tpu":
        return
    given = eo.get_all_options()
    experiments = given.get("experiments") or []
    if "no_use_multiple_sdk_containers" not in experiments or "use_multiple_sdk_containers" in experiments:
        raise ConfigError("TPU workers need --experiments no_use_multiple_sdk_containers (and not "
                          "use_multiple_sdk_containers): Runner v2 otherwise starts several SDK processes per worker VM, "
                          "and only one process may own its TPU; add it (the TPU presets set it)")
    accelerator, machine = worker_accelerator(eo), given.get("machine_type") or ""
    prefix = TPU_MACHINES.get(accelerator.get("type", ""))
    if prefix is None or not machine:
        return
    if not machine.startswith(prefix):
        raise ConfigError(f"--machine_type {machine} does not carry the workers' {accelerator['type']} chips (worker_accelerator); "
                          f"Dataflow runs that TPU on {prefix}* machines: use the preset's machine type or another "
                          f"{prefix}* one")
    chips = machine.rpartition("-")[2].removesuffix("t")
    topology = accelerator.get("topology", "")
    if chips.isdigit() and topology and all(d.isdigit() for d in topology.split("x")):
        wanted = math.prod(int(d) for d in topology.split("x"))
        if wanted != int(chips):
            raise ConfigError(f"worker_accelerator topology:{topology} is {wanted} TPU chips, but --machine_type {machine} "
                              f"holds {chips}; Dataflow runs each single-host TPU shape on the machine type of its chips: "
                              f"use a topology of {chips} chips{' (1x1)' if chips == '1' else ''} or a machine of "
                              f"{wanted} chips")
