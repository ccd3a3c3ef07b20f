"""The worker container and the Flex Template metadata: what can be checked without building the
image (no Docker daemon here) - versions pinned like setup.py, the entry points exist, every template
parameter is a `docscore run` flag whose allowed values are exactly the pipeline's."""
from __future__ import annotations

import argparse
import json
import re
import runpy
import sys
from pathlib import Path

import pytest

from pipeline.options import DTYPES, OUTPUT_FORMATS, TARGET_BACKENDS, TASKS, EvalOptions, parse_options
from runners.presets import PRESET_NAMES, read_preset_file

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "runners" / "Dockerfile").read_text()
METADATA = json.loads((ROOT / "runners" / "flex_template_metadata.json").read_text())
SETUP = (ROOT / "setup.py").read_text()
# EvalOptions flags a template does not offer, and why
NOT_TEMPLATE_PARAMETERS = {
    "tfds_data_dir": "TFDS inputs are local datasets; scheduled runs read GCS shards",
    "split": "TFDS only",
    "job_labels": "Flex Template launches carry their own job labels",
    "no_progress": "a template launch does not wait for the job, so it shows no progress; and a bare "
                   "store_true flag cannot take the --name=value form template parameters arrive in",
}


def dockerfile_arg(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S*)$", DOCKERFILE, re.M)
    assert match, f"runners/Dockerfile has no ARG {name}=..."
    return match.group(1).strip('"')


def setup_pin(distribution: str) -> str:
    match = re.search(rf'"{re.escape(distribution)}==([^"]+)"', SETUP)
    assert match, f"setup.py does not pin {distribution}"
    return match.group(1)


def eval_option_flags() -> set[str]:
    parser = argparse.ArgumentParser()
    EvalOptions._add_argparse_args(parser)
    return {action.dest for action in parser._actions if action.dest != "help"}


def test_image_pins_the_beam_and_python_of_setup_py():
    image = dockerfile_arg("BEAM_SDK_IMAGE")
    match = re.fullmatch(r"apache/beam_python(\d+\.\d+)_sdk:(\S+)", image)
    assert match, image
    python, beam = match.groups()
    assert beam == setup_pin("apache-beam[gcp]")
    assert f'python_requires=">={python}' in SETUP
    assert python == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert dockerfile_arg("JAX_VERSION") == setup_pin("jax") == setup_pin("jaxlib")
    assert dockerfile_arg("MINILM_PACKAGE") in (ROOT / "Makefile").read_text()


def test_image_keeps_beams_boot_and_the_flex_launcher_entry():
    assert re.search(r'^ENTRYPOINT \["/opt/apache/beam/boot"\]$', DOCKERFILE, re.M)
    assert re.search(r"^WORKDIR /opt/docscore$", DOCKERFILE, re.M)
    py_file = re.search(r"FLEX_TEMPLATE_PYTHON_PY_FILE=(\S+)", DOCKERFILE).group(1)
    assert py_file.startswith("/opt/docscore/")
    assert (ROOT / py_file.removeprefix("/opt/docscore/")).is_file()
    for source in re.findall(r"^COPY (?!--from)(\S+) ", DOCKERFILE, re.M):
        assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
        assert f"!{source}" in (ROOT / "runners" / "Dockerfile.dockerignore").read_text() or \
            f"!{source}/**" in (ROOT / "runners" / "Dockerfile.dockerignore").read_text()


def test_every_preset_backend_has_a_jax_build():
    arms = re.findall(r"^\s+([a-z0-9|]+)\) pip install", DOCKERFILE, re.M)
    builds = {extra for arm in arms for extra in arm.split("|")}
    assert builds == {"cpu", "tpu", "cuda12"}
    extra_for = {"tpu": "tpu", "gpu": "cuda12", "cpu": "cpu"}
    guide = (ROOT / "runners" / "DATAFLOW.md").read_text()
    for name in PRESET_NAMES:
        backend = read_preset_file(name)["options"]["target_backend"]
        if backend != "auto":
            assert extra_for[backend] in builds, f"{name}: no JAX_EXTRA build for {backend}"
            assert f"JAX_EXTRA={extra_for[backend]}" in guide, f"runners/DATAFLOW.md: say which image {name} needs"


def test_flex_template_parameters_are_docscore_run_flags():
    names = [p["name"] for p in METADATA["parameters"]]
    assert len(names) == len(set(names))
    flags = eval_option_flags()
    assert set(names) <= flags, set(names) - flags
    assert set(names) | set(NOT_TEMPLATE_PARAMETERS) == flags, "a new docscore run flag: offer it or list why not"
    required = {p["name"] for p in METADATA["parameters"] if not p.get("isOptional", False)}
    assert required == {"input", "output"}
    for p in METADATA["parameters"]:
        assert p["label"] and p["helpText"]
        for pattern in p.get("regexes", []):
            re.compile(pattern)


def allowed(name: str) -> re.Pattern:
    (parameter,) = [p for p in METADATA["parameters"] if p["name"] == name]
    (pattern,) = parameter["regexes"]
    return re.compile(pattern)


@pytest.mark.parametrize("name,choices,wrong", [
    ("task", TASKS, "summarize"),
    ("dtype", DTYPES, "float16"),
    ("output_format", OUTPUT_FORMATS, "csv"),
    ("target_backend", TARGET_BACKENDS, "npu"),
    ("preset", tuple(n for n in PRESET_NAMES if n.startswith("dataflow-")), "local"),
])
def test_choice_parameters_allow_exactly_the_pipelines_choices(name, choices, wrong):
    """A choice added to the pipeline (a task, a dtype, ...) is one the Flex Template's regex and helpText name too."""
    pattern = allowed(name)
    missing = [c for c in choices if not pattern.fullmatch(c)]
    assert missing == [], f"runners/flex_template_metadata.json: parameter {name!r}'s regex refuses {missing}; add them"
    assert not pattern.fullmatch(wrong)
    if name == "task":
        unnamed = [c for c in choices if c not in help_text(name)]
        assert unnamed == [], f"runners/flex_template_metadata.json: parameter {name!r}'s helpText omits {unnamed}"


def help_text(name: str) -> str:
    (parameter,) = [p for p in METADATA["parameters"] if p["name"] == name]
    return parameter["helpText"]


def test_attention_and_run_id_parameters_follow_the_pipeline():
    """A kernel added to kernels/table.py is one the template's attention parameters take and name."""
    from kernels import table
    from kernels.policy import POLICY_WORDS
    from pipeline.io.run_commit import RUN_ID_PATTERN

    attention = allowed("attention")
    refused = [w for w in (*POLICY_WORDS, *table.IMPLEMENTATIONS) if not attention.fullmatch(w)]
    assert refused == [], f"runners/flex_template_metadata.json: parameter 'attention''s regex refuses {refused}; add them"
    unnamed = [name for name in table.IMPLEMENTATIONS if name not in help_text("attention")]
    assert unnamed == [], f"runners/flex_template_metadata.json: parameter 'attention''s helpText omits {unnamed}"
    assert allowed("run_id").pattern == RUN_ID_PATTERN.pattern
    assert allowed("shadow_attention").pattern == attention.pattern, \
        "runners/flex_template_metadata.json: 'shadow_attention' must take the kernels 'attention' takes"


# Each numeric parameter's values at and around the limits pipeline/validate.py sets, and ones its parser refuses
BOUNDARY_VALUES = {
    "temperature": ("0", "0.0", ".0", "00", "0.001", ".05", "1", "1.", "10", "1e-2", "5E-2", "-1", "nan", "inf", "abc"),
    "shadow_fraction": ("0", "0.0", ".0", "0.001", ".5", "0.1", "1", "1.0", "1.00", "1.001", "2", "-0.1", "abc"),
    "shadow_tolerance": ("0", "0.0", "0e5", "0.0E-3", "1e-5", "1.5E-3", "0.01", "2", "2.", "-1e-5", "1e", "inf",
                         "nan", "abc"),
    "max_error_fraction": ("0", "0.0", ".5", "0.25", "1", "1.0", "1.001", "1.5", "2", "-0.1", "abc"),
    "max_record_bytes": ("0", "5", "1000", "1019", "1020", "1023", "1024", "1025", "1029", "1030", "1099", "1100",
                         "2048", "9999", "10000", "33554432", "-1", "1.5", "32MiB"),
    "max_seq_len": ("0", "1", "7", "8", "9", "10", "19", "128", "-8", "8.0"),
    "max_chunks": ("0", "1", "8", "-1", "1.5"),
    "stride": ("0", "1", "32", "-1", "1.5"),
    "batch_size": ("0", "1", "128", "-1", "1.5"),
    "calls_per_beam_batch": ("0", "1", "4", "-1", "1.5"),
}
# The rest of a run that lets each of them be judged alone: the shadow flags need --shadow_attention
BOUNDARY_RUN = {"input": "gs://bucket/docs/*.jsonl", "output": "gs://bucket/docscore", "shadow_attention": "flash",
                "task": "classify", "classify_labels": "a=about a;b=about b", "stride": "0"}  # a task every parameter
# applies to; stride 0 so that the shortest --max_seq_len the metadata allows has room for it


@pytest.mark.parametrize("name", sorted(BOUNDARY_VALUES))
def test_numeric_parameters_allow_the_values_the_pipeline_accepts(name):
    """A value the metadata allows but `docscore run` refuses fails the job after its launch; one it refuses but the
    pipeline takes cannot be launched at all. The verdict is the pipeline's own: its option parsing and the checks
    validate.py makes on the options alone (runners.scheduling.run_refusal)."""
    from runners.scheduling import run_refusal

    pattern = allowed(name)
    verdicts = {value: run_refusal({**BOUNDARY_RUN, name: value}) for value in BOUNDARY_VALUES[name]}
    assert {problem is None for problem in verdicts.values()} == {True, False}, verdicts  # both sides of a limit
    wrong = {value: problem for value, problem in verdicts.items() if bool(pattern.fullmatch(value)) != (problem is None)}
    assert not wrong, f"{name}: the metadata's {pattern.pattern} disagrees with the pipeline on {wrong}"


def test_run_id_parameter_refuses_what_the_pipeline_does_but_dots():
    """The pipeline's rule is RUN_ID_PATTERN and no '..' (pipeline/io/run_commit.py safe_run_id). A lookahead would
    say the second, but a template's regexes are not Python's (no lookahead in RE2 or POSIX egrep): the schedule
    check refuses '..' with the pipeline's own check_run_id, and a launch by hand exits 2 before any job."""
    from pipeline.options import ConfigError
    from pipeline.validate import check_run_id

    def pipeline_accepts(run_id: str) -> bool:
        try:
            check_run_id(run_id)
        except ConfigError:
            return False
        return True

    pattern = allowed("run_id")
    for run_id in ("a", "nightly-20260101", "a.b", "a_b-c.d", "a" * 128, "a" * 129, "", ".a", "-a", "a/b", "a b",
                   "a..b", "a..", "ä"):
        if pattern.fullmatch(run_id):
            assert pipeline_accepts(run_id) or ".." in run_id, run_id
        else:
            assert not pipeline_accepts(run_id), run_id


SAMPLE = {
    "input": "gs://bucket/docs/2026-01-01/*.jsonl", "output": "gs://bucket/docscore", "preset": "dataflow-tpu-v5e",
    "config": "gs://bucket/configs/nightly.yaml", "task": "classify", "model": "gs://bucket/models/minilm",
    "attention": "flash", "target_backend": "tpu", "run_id": "nightly-20260101", "text_field": "body",
    "id_field": "uid", "classify_labels": "sports=about sport;politics=about politics", "temperature": "0.1",
    "document_prompt": "task: classification | query: ", "query_prompt": "query: ", "max_seq_len": "128", "stride": "16", "max_chunks": "4", "batch_size": "64", "calls_per_beam_batch": "8", "dtype": "bfloat16", "matmul_precision": "float32",
    "output_format": "parquet", "shadow_attention": "native", "shadow_fraction": "0.25", "shadow_tolerance": "0.0001",
    "max_record_bytes": "1048576", "max_error_fraction": "0.05", "profile_dir": "gs://bucket/profiles",
    "cache_dir": "gs://bucket/docscore-cache",
}


def test_a_launch_with_every_parameter_parses_as_docscore_run(monkeypatch, tmp_path):
    """What the Flex launcher runs: `flex_main.py --name=value ...`; every value the metadata allows
    reaches EvalOptions unchanged."""
    assert set(SAMPLE) == {p["name"] for p in METADATA["parameters"]}
    for p in METADATA["parameters"]:
        for pattern in p.get("regexes", []):
            assert re.fullmatch(pattern, SAMPLE[p["name"]]), p["name"]
    for var, value in {"DOCSCORE_PROJECT": "docscore-test", "DOCSCORE_REGION": "us-central1",
                       "DOCSCORE_TEMP_LOCATION": "gs://bucket/tmp", "DOCSCORE_IMAGE": "img:tpu"}.items():
        monkeypatch.setenv(var, value)
    config = tmp_path / "nightly.yaml"
    config.write_text("task: embed\n")
    launch = {**SAMPLE, "config": str(config)}  # the config itself would be on GCS
    options, eo = parse_options([f"--{k}={v}" for k, v in launch.items()])
    for name, value in launch.items():
        if name not in ("config", "preset"):
            assert str(getattr(eo, name)) == value, name


def test_flex_main_is_docscore_run(monkeypatch, capsys):
    """The launcher runs the file as a script (`python flex_main.py --name=value ...`)."""
    monkeypatch.setattr(sys, "argv", [str(ROOT / "runners" / "flex_main.py"), "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / "runners" / "flex_main.py"), run_name="__main__")
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "docscore run" in out and "--target_backend" in out
