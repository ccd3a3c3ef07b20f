"""Schedule examples (runners/schedules/*.yaml): they parse, their run section is a valid
`docscore run` command line for a Dataflow preset, their launch body carries only template
parameters, and their compare gate is a valid `docscore compare` command line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.options import parse_labels, parse_options
from pipeline.runs.compare import build_parser as compare_parser
from pipeline.validate import check_run_id
from runners.presets import PRESET_NAMES
from runners.scheduling import (
    compare_argv,
    launch_body,
    load_schedule,
    main,
    placeholders,
    render,
    run_flags,
)

ROOT = Path(__file__).resolve().parents[1]
SCHEDULES = sorted((ROOT / "runners" / "schedules").glob("*.yaml"))
TEMPLATE_PARAMETERS = {p["name"] for p in json.loads((ROOT / "runners" / "flex_template_metadata.json").read_text())["parameters"]}
AIRFLOW = {"ds": "2026-01-02", "ds_nodash": "20260102", "prev_ds_nodash": "20260101"}


@pytest.fixture
def cloud_env(monkeypatch):
    for var, value in {"DOCSCORE_PROJECT": "docscore-test", "DOCSCORE_REGION": "us-central1",
                       "DOCSCORE_TEMP_LOCATION": "gs://docscore-test-bucket/tmp", "DOCSCORE_IMAGE": "img:tpu"}.items():
        monkeypatch.setenv(var, value)


def test_there_are_schedule_examples():
    assert {p.name for p in SCHEDULES} >= {"nightly-classify.yaml", "nightly-canary-gated.yaml"}


@pytest.mark.parametrize("path", SCHEDULES, ids=lambda p: p.name)
def test_schedule_is_a_valid_docscore_run(path, cloud_env):
    schedule = load_schedule(path)
    assert schedule.run["preset"] in PRESET_NAMES and schedule.run["preset"].startswith("dataflow-")
    assert schedule.template.startswith("gs://") and schedule.template.endswith(".json")
    run = render(schedule.run, AIRFLOW)
    options, eo = parse_options(run_flags(run))
    assert eo.input == run["input"] and eo.output == run["output"] and eo.task == run["task"]
    assert options.get_all_options()["runner"] == "DataflowRunner"
    if eo.task == "classify":
        assert len(parse_labels(eo.classify_labels)) >= 2
    if "run_id" in run:
        check_run_id(eo.run_id)


@pytest.mark.parametrize("path", SCHEDULES, ids=lambda p: p.name)
def test_launch_body_holds_only_template_parameters(path):
    schedule = load_schedule(path)
    body = launch_body(schedule)["launchParameter"]
    assert body["containerSpecGcsPath"] == schedule.template
    assert set(body["parameters"]) <= TEMPLATE_PARAMETERS, set(body["parameters"]) - TEMPLATE_PARAMETERS
    assert all(isinstance(v, str) for v in body["parameters"].values())


def test_gated_schedule_compares_consecutive_runs_of_its_own_output():
    schedule = load_schedule(ROOT / "runners" / "schedules" / "nightly-canary-gated.yaml")
    assert schedule.launcher == "composer" and placeholders(schedule) == {"ds_nodash", "prev_ds_nodash"}
    argv = render(compare_argv(schedule), AIRFLOW)
    args = compare_parser().parse_args(argv)  # valid `docscore compare` flags
    run = render(schedule.run, AIRFLOW)
    assert args.run_b == f"{run['output']}/scores/run_id={run['run_id']}"
    assert args.run_a == f"{run['output']}/scores/run_id=nightly-20260101"
    assert args.max_count_change == 0 and args.max_mean_drift == 0.001


def test_bad_schedules_are_refused(tmp_path):
    good = (ROOT / "runners" / "schedules" / "nightly-classify.yaml").read_text()
    cases = {
        "cron": good.replace('cron: "0 3 * * *"', 'cron: "every night"'),
        "unknown keys": good + "retries: 3\n",
        "placeholders need launcher: composer": good.replace("docs/incoming/", "docs/{{ ds }}/"),
    }
    for message, text in cases.items():
        path = tmp_path / "s.yaml"
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            load_schedule(path)


def test_printing_the_launch_body(capsys):
    assert main([str(ROOT / "runners" / "schedules" / "nightly-classify.yaml")]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["launchParameter"]["parameters"]["task"] == "classify"
