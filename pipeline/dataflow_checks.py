"""The checks of a launch whose workers are elsewhere, Dataflow's above all: its required settings (and those Beam
checks offline), the paths its workers must reach, its job labels, and the workers' accelerator (the backend the
run plans for, and TPU settings Dataflow would take but the job cannot run on). pipeline/validate.py calls them
before anything is read; runners/DATAFLOW.md is the user's side of the same rules.
"""
from __future__ import annotations

import math
import os
import re

import fsspec

from models.builtin import BUILTINS
from pipeline.io import sinks, tfds_reader
from pipeline.options import ConfigError, EvalOptions
from pipeline.telemetry.progress import runs_locally
from runners.presets import CLOUD_SETTINGS, is_dataflow_runner, read_preset_file


DATAFLOW_REQUIRED = ("project", "region", "temp_location")
# Cloud Storage's bucket names: 3-63 lowercase letters, digits, -, _ and . (dotted names up to 222), starting and
# ending with a letter or digit. Beam reads another name as no bucket and creates a default one in the project.
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")


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
    for name in ("temp_location", "staging_location"):
        location = given.get(name)
        if not location:
            continue
        bucket = str(location).removeprefix("gs://").split("/", 1)[0]
        if not str(location).startswith("gs://") or not BUCKET_NAME.match(bucket) or (
                "." not in bucket and len(bucket) > 63):
            what = "must be a gs:// path" if not str(location).startswith("gs://") else \
                f"names the bucket {bucket!r}, which is not a Cloud Storage bucket name (Beam would create a default one instead)"
            raise ConfigError(f"--{name}={location}{from_environment(name, location)} {what} for --runner={runner}; "
                              "use gs://BUCKET/tmp in a bucket of the project")
    if not (given.get("sdk_container_image") or given.get("worker_harness_container_image")):
        raise ConfigError(f"--runner={runner} needs --sdk_container_image: Dataflow's stock worker image has no docscore, "
                          "jax or model weights; build the worker image (runners/DATAFLOW.md, section 3) and pass it, "
                          "or set DOCSCORE_IMAGE with a Dataflow preset")
    check_staged_files(given)
    from apache_beam.options.pipeline_options import GoogleCloudOptions, WorkerOptions
    from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator
    from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner

    validator = PipelineOptionsValidator(eo, DataflowRunner())
    problems = (validator.validate_cloud_options(eo.view_as(GoogleCloudOptions))
                + eo.view_as(WorkerOptions).validate(validator))
    if problems:
        raise ConfigError(f"--runner={runner}: {problems[0].rstrip('.')}; fix the options (set on the command line, "
                          "in --config, by the preset or its environment variables: runners/DATAFLOW.md)")


def check_staged_files(given: dict) -> None:
    """Files Beam stages for the workers, and Runner v2, which this Beam cannot turn off: Beam refuses either only
    while it builds the job, after the model has loaded, with a traceback."""
    for name in ("requirements_file", "setup_file"):
        path = given.get(name)
        if path and not os.path.isfile(path):
            raise ConfigError(f"--{name}={path} is not a file; pass the file Beam should stage for the workers, or "
                              "drop the flag (the worker image already holds docscore: runners/DATAFLOW.md, section 3)")
    if "disable_runner_v2" in (given.get("experiments") or []):
        raise ConfigError("--experiments disable_runner_v2: this Beam cannot run Dataflow jobs without Runner v2 "
                          "(and the accelerator workers need it); drop the experiment")


def from_environment(option: str, value: object) -> str:
    """" (from DOCSCORE_X)" when a preset took the option's value from that environment variable."""
    setting = CLOUD_SETTINGS.get(option)
    names = [env for env in (setting.env if setting else ()) if os.environ.get(env) == str(value)]
    return f" (from {names[0]})" if names else ""


def from_preset(eo: EvalOptions, option: str) -> str:
    """" (set by --preset NAME)" when the option holds the value the --preset flag's preset sets, so a refusal does
    not tell the user to drop a flag they never typed."""
    if not eo.preset:
        return ""
    preset = read_preset_file(eo.preset)["options"]
    value = eo.get_all_options().get(option)
    return f" (set by --preset {eo.preset})" if option in preset and preset[option] == value else ""


ACCELERATOR_BACKENDS = (("tpu-", "tpu"), ("nvidia-", "gpu"))  # Dataflow worker_accelerator type prefixes


# Dataflow's TPU types and the machine types that carry their chips (the machine's -<N>t suffix: N chips, one host).
TPU_MACHINES = {"tpu-v5-lite-podslice": "ct5lp-", "tpu-v6e-slice": "ct6e-", "tpu-v5p-slice": "ct5p-"}
# The single-host shape of each TPU machine's chips (runners/DATAFLOW.md, section 1): Dataflow takes no other.
V5E_V6E_SHAPES = {1: "1x1", 4: "2x2", 8: "2x4"}
TPU_SHAPES = {"tpu-v5-lite-podslice": V5E_V6E_SHAPES, "tpu-v6e-slice": V5E_V6E_SHAPES, "tpu-v5p-slice": {4: "2x2x1"}}
TOPOLOGY = re.compile(r"[1-9][0-9]*(x[1-9][0-9]*){1,2}")  # chips along each of two or three axes
# Dataflow's GPU types and the machine types they attach to (an A2 mega machine carries 16 A100 40GB).
GPU_MACHINES = {"nvidia-l4": ("g2-",), "nvidia-tesla-a100": ("a2-highgpu-", "a2-megagpu-"),
                "nvidia-a100-80gb": ("a2-ultragpu-",), "nvidia-h100-80gb": ("a3-highgpu-",),
                "nvidia-h100-mega-80gb": ("a3-megagpu-",), "nvidia-tesla-t4": ("n1-",), "nvidia-tesla-v100": ("n1-",),
                "nvidia-tesla-p100": ("n1-",), "nvidia-tesla-p4": ("n1-",)}
ACCELERATOR_TYPES = (*TPU_MACHINES, *GPU_MACHINES)
# L4s per G2 machine (g2-standard-<vCPUs>); A2 and A3 machine types end in -<N>g.
G2_GPUS = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}
# The compute capability of each Dataflow GPU type (NVIDIA's tables): the kernel policy refuses a kernel whose
# min_gpu_capability the workers' GPU lacks (cuDNN's fused attention and Pallas' Triton need Ampere, 8.0).
GPU_CAPABILITY = {"nvidia-l4": (8, 9), "nvidia-tesla-a100": (8, 0), "nvidia-a100-80gb": (8, 0),
                  "nvidia-h100-80gb": (9, 0), "nvidia-h100-mega-80gb": (9, 0), "nvidia-tesla-t4": (7, 5),
                  "nvidia-tesla-v100": (7, 0), "nvidia-tesla-p100": (6, 0), "nvidia-tesla-p4": (6, 1)}


def worker_gpu(eo: EvalOptions) -> tuple[str, tuple[int, int]] | None:
    """(type, compute capability) of a Dataflow job's GPU workers, for kernels.resolve's `gpu`; None otherwise."""
    kind = worker_accelerator(eo).get("type") if is_dataflow(eo) else None
    return (kind, GPU_CAPABILITY[kind]) if kind in GPU_CAPABILITY else None


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
    check_accelerator_type(worker_accelerator(eo))
    workers = dataflow_accelerator_backend(eo)
    machine = eo.get_all_options().get("machine_type") or ""
    carried = carried_accelerator(machine)
    if workers == "cpu" and carried:
        raise ConfigError(f"--machine_type {machine}{from_preset(eo, 'machine_type')} is an accelerator machine "
                          f"({carried}), but the job names no worker_accelerator in --dataflow_service_options, so it "
                          "would run on the machine's CPU; use the accelerator's preset (runners/presets) or a CPU "
                          "machine type")
    if eo.target_backend not in ("auto", workers):
        raise ConfigError(backend_refusal(eo, workers))
    if workers != "cpu":
        check_accelerator_workers(eo, workers)
    return workers


def check_accelerator_type(accelerator: dict[str, str]) -> None:
    """A worker_accelerator names one of Dataflow's accelerator types: a misspelt one would skip every check of the
    workers here and fail the job at Dataflow."""
    if not accelerator:
        return
    kind = accelerator.get("type")
    if not kind:
        raise ConfigError("--dataflow_service_options worker_accelerator has no type: (e.g. "
                          "worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver); add it, or use a preset")
    if kind not in ACCELERATOR_TYPES:
        raise ConfigError(f"--dataflow_service_options worker_accelerator type:{kind} is not a Dataflow accelerator "
                          f"type; use a TPU type ({', '.join(TPU_MACHINES)}) or a GPU type ({', '.join(GPU_MACHINES)})")


def carried_accelerator(machine: str) -> str | None:
    """The accelerator type a machine type comes with (ct5lp-*, g2-*, a2-*, a3-*, ...); None for others, n1-*
    included (it takes GPUs but runs without)."""
    machines = {**{kind: (prefix,) for kind, prefix in TPU_MACHINES.items()}, **GPU_MACHINES}
    return next((kind for kind, prefixes in machines.items()
                 if machine.startswith(prefixes) and prefixes != ("n1-",)), None)


def backend_refusal(eo: EvalOptions, workers: str) -> str:
    """Why --target_backend cannot plan for the Dataflow workers' backend, and the fix: a value the preset set is
    mended by --target_backend (the preset is what the user chose), one the user typed by a preset for it."""
    has = f"a {workers.upper()} (worker_accelerator)" if workers != "cpu" else "no accelerator (no worker_accelerator in --dataflow_service_options)"
    preset = from_preset(eo, "target_backend")
    if preset:
        return (f"--target_backend={eo.target_backend}{preset}, but the Dataflow workers have {has}; pass "
                f"--target_backend auto (or {workers}) to plan for these workers, or use a preset for {workers} workers "
                "(--preset dataflow-..., runners/presets) and leave the accelerator to it")
    return (f"--target_backend={eo.target_backend}, but the Dataflow workers have {has}; use a preset for "
            f"{eo.target_backend} workers (--preset dataflow-..., runners/presets) or --target_backend={workers}")


def check_accelerator_workers(eo: EvalOptions, backend: str) -> None:
    """Accelerator worker settings Dataflow would take but the job cannot run on: several SDK processes per VM
    (Runner v2's default; only one process may own a TPU, and each JAX process would take 75% of a GPU's memory),
    an accelerator type on a machine that does not carry it; for TPUs a topology missing or whose chips are not
    the machine's (Dataflow runs single-host TPU shapes, each on its own machine type); for GPUs no driver, more
    or fewer GPUs than the machine holds, or a flash kernel on a GPU older than Ampere. runners/DATAFLOW.md,
    sections 1-2."""
    check_accelerator_type(worker_accelerator(eo))  # the checks below look the type up
    given = eo.get_all_options()
    experiments = given.get("experiments") or []
    if "no_use_multiple_sdk_containers" not in experiments or "use_multiple_sdk_containers" in experiments:
        owns = "only one process may own its TPU" if backend == "tpu" else \
            "each process's JAX would take 75% of the GPU's memory, so the second could not start"
        raise ConfigError(f"{backend.upper()} workers need --experiments no_use_multiple_sdk_containers (and not "
                          "use_multiple_sdk_containers): Runner v2 otherwise starts several SDK processes per worker VM, "
                          f"and {owns}; add it (the {backend.upper()} presets set it)")
    accelerator, machine = worker_accelerator(eo), given.get("machine_type") or ""
    if backend == "gpu":
        check_gpu_workers(eo, accelerator, machine)
        return
    kind, topology = accelerator["type"], accelerator.get("topology")
    if topology is None:
        raise ConfigError(f"worker_accelerator type:{kind} has no topology: Dataflow needs one for TPU "
                          "workers; add ;topology:1x1 (one chip per worker, as the presets) or the machine's shape")
    if not TOPOLOGY.fullmatch(topology):
        raise ConfigError(f"worker_accelerator topology:{topology} is not a TPU shape: write the chips along each axis, "
                          "e.g. topology:1x1 (one chip per worker, as the presets) or topology:2x2")
    prefix = TPU_MACHINES[kind]
    if not machine:
        return
    if not machine.startswith(prefix):
        raise ConfigError(f"--machine_type {machine}{from_preset(eo, 'machine_type')} does not carry the workers' {kind} "
                          f"chips (worker_accelerator); Dataflow runs that TPU on {prefix}* machines: pass one as --machine_type "
                          "(the TPU presets do)")
    chips = machine.rpartition("-")[2].removesuffix("t")
    if chips.isdigit():
        check_tpu_shape(kind, topology, machine, int(chips))


def check_tpu_shape(kind: str, topology: str, machine: str, chips: int) -> None:
    """A TPU topology is the machine's chips in the one single-host shape Dataflow runs them as (1x1 on -1t, 2x2 on
    -4t, ...; TPU_SHAPES); for a chip count with no documented shape, the chips alone."""
    wanted = math.prod(int(d) for d in topology.split("x"))
    shape = TPU_SHAPES[kind].get(chips)
    if wanted != chips:
        use = f"topology:{shape}" if shape else f"a topology of {chips} chips"
        raise ConfigError(f"worker_accelerator topology:{topology} is {wanted} TPU chips, but --machine_type {machine} "
                          f"holds {chips}; Dataflow runs each single-host TPU shape on the machine type of its chips: "
                          f"use {use} or a machine of {wanted} chips")
    if shape and topology != shape:
        raise ConfigError(f"worker_accelerator topology:{topology} is not the shape of --machine_type {machine}'s "
                          f"{chips} {kind} chips, which Dataflow runs as {shape}; use topology:{shape}")


def gpus_on_machine(machine: str) -> int | None:
    """The GPUs a G2, A2 or A3 machine type comes with (g2-standard-<vCPUs>, a2-highgpu-<N>g); None for others."""
    if match := re.fullmatch(r"g2-standard-(\d+)", machine):
        return G2_GPUS.get(int(match[1]))
    if match := re.fullmatch(r"a[23]-\w+-(\d+)g", machine):
        return int(match[1])
    return None


def check_gpu_workers(eo: EvalOptions, accelerator: dict[str, str], machine: str) -> None:
    """The GPU checks of check_accelerator_workers."""
    kind = accelerator["type"]
    if "install-nvidia-driver" not in accelerator:
        raise ConfigError(f"worker_accelerator type:{kind} has no install-nvidia-driver: without the driver JAX "
                          "cannot see the GPU and the job's GPU kernels fail on the workers; add ;install-nvidia-driver")
    prefixes = GPU_MACHINES[kind]
    if machine and not machine.startswith(prefixes):
        machines = " or ".join(f"{prefix}*" for prefix in prefixes)
        raise ConfigError(f"--machine_type {machine}{from_preset(eo, 'machine_type')} does not take the workers' {kind} "
                          f"GPUs (worker_accelerator); Dataflow attaches them to {machines} machines: pass one as "
                          "--machine_type (the GPU preset does)")
    count, holds = accelerator.get("count", "1"), gpus_on_machine(machine)
    if holds is not None and count.isdigit() and int(count) != holds:
        raise ConfigError(f"worker_accelerator count:{count}, but --machine_type {machine} holds {holds} {kind} "
                          f"GPU{'s' if holds > 1 else ''}; use count:{holds} or a machine with {count}")
