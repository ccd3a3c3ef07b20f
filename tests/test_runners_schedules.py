"""Schedule examples (runners/schedules/*.yaml): they parse, their run section is a valid
`docscore run` command line for a Dataflow preset, their launch body carries only template
parameters, and their compare gate is a valid `docscore compare` command line."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from pipeline.options import parse_labels, parse_options
from pipeline.runs.compare import build_parser as compare_parser
from pipeline.validate import check_run_id
from runners.presets import PRESET_NAMES
from runners.cron import check_cron
from runners.scheduling import (
    MANUAL_RUN,
    SCHEDULED_RUN,
    compare_argv,
    launch_body,
    load_schedule,
    main,
    placeholders,
    render,
    run_flags,
    sample_runs,
)

ROOT = Path(__file__).resolve().parents[1]
SCHEDULES = sorted((ROOT / "runners" / "schedules").glob("*.yaml"))
TEMPLATE_PARAMETERS = {p["name"] for p in json.loads((ROOT / "runners" / "flex_template_metadata.json").read_text())["parameters"]}
AIRFLOW = SCHEDULED_RUN  # the night run of 2026-01-02, whose previous successful run was 2026-01-01's
CLASSIFY = (ROOT / "runners" / "schedules" / "nightly-classify.yaml").read_text()
CANARY = (ROOT / "runners" / "schedules" / "nightly-canary-gated.yaml").read_text()


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


def test_gated_schedule_compares_with_the_previous_successful_run_of_its_own_output():
    schedule = load_schedule(ROOT / "runners" / "schedules" / "nightly-canary-gated.yaml")
    assert schedule.launcher == "composer"
    assert placeholders(schedule) == {"ds_nodash", "prev_data_interval_start_success"}
    argv = render(compare_argv(schedule), AIRFLOW)
    args = compare_parser().parse_args(argv)  # valid `docscore compare` flags
    run = render(schedule.run, AIRFLOW)
    assert args.run_b == f"{run['output']}/scores/run_id={run['run_id']}"
    assert args.run_a == f"{run['output']}/scores/run_id=nightly-20260101"
    assert args.max_count_change == 0 and args.max_mean_drift == 0.001
    # triggered by hand the next morning: this run is 20260103, the last successful one 20260102
    manual = compare_parser().parse_args(render(compare_argv(schedule), MANUAL_RUN))
    assert manual.run_b.endswith("run_id=nightly-20260103") and manual.run_a.endswith("run_id=nightly-20260102")


def test_nightly_classify_replaces_its_run_on_a_retry():
    # Cloud Scheduler sends the same body every time: a fixed run id is the only way a retry replaces
    body = launch_body(load_schedule(ROOT / "runners" / "schedules" / "nightly-classify.yaml"))
    assert body["launchParameter"]["parameters"]["run_id"] == "nightly-classify"


def refusal(tmp_path, text: str) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as e:
        load_schedule(path)
    return str(e.value)


def accepts(tmp_path, text: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    load_schedule(path)


@pytest.mark.parametrize("text, message", [
    (CLASSIFY.replace('cron: "0 3 * * *"', 'cron: "every night"'), "five fields"),
    (CLASSIFY + "retries: 3\n", "unknown keys"),
    (CLASSIFY.replace("launcher: cloud-scheduler", "launcher: cron"), "use one of cloud-scheduler, composer"),
], ids=["cron", "unknown key", "launcher"])
def test_bad_schedules_are_refused(tmp_path, text, message):
    assert message in refusal(tmp_path, text)


@pytest.mark.parametrize("cron", ["0 3 * * MON-FRI", "*/15 0-6,22-23 1,15 JAN-MAR,DEC SUN", "0 3 * * 7",
                                  "59 23 31 12 0-6/2", "0 0-12/3 * * *", "5/15 * * * *", "0 3 * jan-mar mon-fri"])
def test_unix_cron_is_accepted(cron):
    check_cron(cron)


@pytest.mark.parametrize("cron, message", [
    ("75 3 * * *", "minute '75' is not 0-59"),
    ("0 27 * * *", "hour '27' is not 0-23"),
    ("0 3 0 * *", "day of month '0' is not 1-31"),
    ("0 3 * 13 *", "month '13' is not 1-12 or JAN-DEC"),
    ("0 3 * * 8", "day of week '8' is not 0-7 or SUN-SAT"),
    ("0 3 * * mun", "day of week 'mun' is not 0-7 or SUN-SAT"),
    ("0 3 * * FRI-MON", "runs backwards"),
    ("5-/15 * * * *", "is not N, a-b"),
    ("70/15 * * * *", "minute '70' is not 0-59"),
    ("*/0 * * * *", "at least 1"),
    ("0 3 * *", "five fields"),
    ("0 3 30 2 *", "no chosen month has day 30, so it would never run"),
    ("0 3 31 4,6,9,11 *", "no chosen month has day 31"),
    ("\u0663 3 * * *", "minute '\u0663' is not 0-59"),  # an Arabic-Indic 3, which int() would read
])
def test_impossible_cron_is_refused(cron, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        check_cron(cron)


def test_time_zone_must_exist(tmp_path):
    accepts(tmp_path, CLASSIFY.replace("Etc/UTC", "America/New_York"))
    assert "time_zone 'Mars/Olympus' is not an IANA time zone" in refusal(tmp_path, CLASSIFY.replace("Etc/UTC", "Mars/Olympus"))
    # files of this machine's tz database that are no zone name Cloud Scheduler or Airflow knows
    for name in ("localtime", "right/UTC", "posix/Etc/UTC"):
        assert f"time_zone {name!r} is not an IANA time zone" in refusal(tmp_path, CLASSIFY.replace("Etc/UTC", name))


def test_values_are_sent_as_written_and_a_key_given_twice_is_refused(tmp_path):
    """YAML 1.1 reads 0755 as 493 and 1e3 as 1000.0: the launch would have run another run_id than the file's."""
    path = tmp_path / "s.yaml"
    for written in ("0755", "1e3", "20260102"):
        path.write_text(CLASSIFY.replace("run_id: nightly-classify", f"run_id: {written}"))
        assert launch_body(load_schedule(path))["launchParameter"]["parameters"]["run_id"] == written
    path.write_text(CLASSIFY.replace("  task: classify\n", "  task: classify\n  max_error_fraction: 0.00001\n"))
    assert launch_body(load_schedule(path))["launchParameter"]["parameters"]["max_error_fraction"] == "0.00001"
    assert "the key 'task' is given twice" in refusal(tmp_path, CLASSIFY + "  task: embed\n")
    assert "the key 'run' is given twice" in refusal(tmp_path, CLASSIFY + "run:\n  task: embed\n")


@pytest.mark.parametrize("field, value, message", [
    ("name", "Docscore_Nightly", "is not a Dataflow job name"),
    ("name", "docscore-", "is not a Dataflow job name"),
    ("name", '""', "is not a Dataflow job name"),
    ("template", "templates/docscore-tpu.json", "is not a Flex Template spec"),
    ("template", "gs://YOUR_BUCKET/templates/docscore-tpu.yaml", "is not a Flex Template spec"),
])
def test_a_job_name_or_template_dataflow_would_refuse_is_refused(tmp_path, field, value, message):
    text = re.sub(rf"^{field}: .*$", f"{field}: {value}", CLASSIFY, count=1, flags=re.M)
    assert message in refusal(tmp_path, text)


@pytest.mark.parametrize("limits, message", [
    ("    max_drift: 0.001", "compare.limits: max_drift is not a limit of `docscore compare`; the limits are max_mean_drift"),
    ("    max_mean_drift: lots", "compare.limits: argument --max_mean_drift: 'lots' is not a number"),
    # values the parser takes and `docscore compare` then refuses with exit 2, so the gate would fail every night
    ("    max_mean_drift: -1", "compare.limits: --max_mean_drift=-1.0: a limit must be a finite number >= 0"),
    ("    max_mean_drift: 0.001\n    max_stage_slowdown: 0", "compare.limits: --max_stage_slowdown=0 could never pass"),
])
def test_gate_limits_are_ones_docscore_compare_takes(tmp_path, limits, message):
    text = CANARY.replace("    max_mean_drift: 0.001", limits)
    assert message in refusal(tmp_path, text)
    over = CANARY.replace("    max_label_flip_fraction: 0.01", "    max_label_flip_fraction: 5")
    assert "compare.limits: --max_label_flip_fraction=5.0: a share is at most 1" in refusal(tmp_path, over)
    assert "compare.limits: write a mapping" in refusal(tmp_path, CANARY.split("  limits:")[0] + "  limits: [0.001]\n")


def test_a_gate_on_a_run_the_schedule_does_not_launch_is_refused(tmp_path):
    text = CANARY.replace('candidate: "gs://YOUR_BUCKET/docscore-canary/scores/run_id=nightly-{{ ds_nodash }}"',
                          'candidate: "gs://YOUR_BUCKET/docscore-canary/scores/run_id=nightly-{{ ds }}"')
    assert ("compare.candidate renders as gs://YOUR_BUCKET/docscore-canary/scores/run_id=nightly-2026-01-02, which is "
            "not the run this schedule launches (gs://YOUR_BUCKET/docscore-canary/scores/run_id=nightly-20260102)"
            in refusal(tmp_path, text))


@pytest.mark.parametrize("line, message", [
    ("  labels: a=b;c=d", "run.labels is not a parameter of the Flex Template (runners/flex_template_metadata.json); "
                          "did you mean classify_labels?"),
    ("  num_workers: 3", "run.num_workers is not a parameter"),
    ("  no_progress: true", "run.no_progress is not a parameter"),
    ("  model: true", "run.model: True is not a string or number"),
    ("  run_id: nightly 1", "run.run_id: 'nightly 1' does not match"),
    ("  batch_size: 0", "run.batch_size: '0' does not match"),
], ids=["labels", "num_workers", "no_progress", "bool", "run_id", "batch_size"])
def test_run_keys_and_values_must_be_template_parameters(tmp_path, line, message):
    text = CLASSIFY.replace("  run_id: nightly-classify\n", "")  # a key given twice is refused as such
    assert message in refusal(tmp_path, text.replace("  task: classify\n", f"  task: classify\n{line}\n"))


def test_template_required_parameters_must_be_there(tmp_path):
    assert "the template needs output" in refusal(tmp_path, CLASSIFY.replace("  output: gs://YOUR_BUCKET/docscore\n", ""))


@pytest.mark.parametrize("template", ["{{ ds }}", "{{ macros.ds_add(ds, -1) }}", "{{ data_interval_start | ds_nodash }}"])
def test_cloud_scheduler_renders_no_template(tmp_path, template):
    message = refusal(tmp_path, CLASSIFY.replace("docs/incoming/", f"docs/{template}/"))
    assert f"run.input: Cloud Scheduler sends a fixed body, so {template} would reach Dataflow" in message


def test_cloud_scheduler_cannot_run_a_gate(tmp_path):
    gate = "compare:\n  baseline: gs://YOUR_BUCKET/docscore/scores/run_id=a\n  candidate: gs://YOUR_BUCKET/docscore/scores/run_id=b\n"
    assert "nothing runs its gate" in refusal(tmp_path, CLASSIFY + gate)


@pytest.mark.parametrize("template, message", [
    ("{{ macros.ds_add(ds, -1) }}", "{{ macros.ds_add(ds, -1) }} is not a template this module renders"),
    ("{{ data_interval_start }}", "{{ data_interval_start }} is not a template this module renders"),
    ("{{ ts }}", "{{ ts }} is not a template this module renders"),
    ("{% if ds %}x{% endif %}", "{% if ds %} is not a template this module renders"),
    ("{{ prev_ds_nodash }}", "is gone in Airflow 3 (deprecated since 2.2) and is the run's own date on a manual run; "
                             "write {{ prev_data_interval_start_success | ds_nodash }}"),
])
def test_composer_templates_must_be_ones_render_fills(tmp_path, template, message):
    assert message in refusal(tmp_path, CANARY.replace("docs/canary/", f"docs/{template}/"))


def test_composer_date_filters_render():
    run = {"input": "gs://b/docs/{{ data_interval_start | ds }}/", "run_id": "n-{{ data_interval_end | ds_nodash }}"}
    assert render(run, AIRFLOW) == {"input": "gs://b/docs/2026-01-02/", "run_id": "n-20260103"}


@pytest.mark.parametrize("baseline, candidate, kind", [
    ("nightly-{{ ds_nodash }}", "nightly-{{ ds_nodash }}", "scheduled"),
    ("nightly-{{ prev_data_interval_start_success | ds_nodash }}", "nightly-{{ data_interval_start | ds_nodash }}",
     "manually triggered"),
])
def test_a_gate_that_compares_a_run_with_itself_is_refused(tmp_path, baseline, candidate, kind):
    text = CANARY.replace("nightly-{{ prev_data_interval_start_success | ds_nodash }}", baseline)
    text = text.replace("run_id=nightly-{{ ds_nodash }}", f"run_id={candidate}")
    message = refusal(tmp_path, text)
    assert "baseline and candidate are both" in message and f"on a {kind} run" in message


@pytest.mark.parametrize("spelling", ["scores/run_id=nightly-{{ ds_nodash }}/", "runs/run_id=nightly-{{ ds_nodash }}/summary.json",
                                      "errors/run_id=nightly-{{ ds_nodash }}"])
def test_a_gate_naming_one_run_two_ways_is_refused_and_any_spelling_of_the_launched_run_is_its_candidate(tmp_path,
                                                                                                      spelling):
    """`docscore compare` takes a run by any of its partitions or its summary.json, and refuses one compared with
    itself however it is written: so does the schedule's check (it compared the strings)."""
    baseline = "scores/run_id=nightly-{{ prev_data_interval_start_success | ds_nodash }}"
    itself = CANARY.replace(baseline, spelling)
    message = refusal(tmp_path, itself)
    assert "baseline and candidate are both" in message and "one run, on a scheduled run" in message, message
    # the launched run, written another way, is the gate's candidate
    accepts(tmp_path, CANARY.replace("scores/run_id=nightly-{{ ds_nodash }}", spelling))


def test_a_gate_path_that_names_no_run_is_refused(tmp_path):
    text = CANARY.replace('"gs://YOUR_BUCKET/docscore-canary/scores/run_id=nightly-{{ prev_data_interval_start_success '
                          '| ds_nodash }}"', "5")
    assert "compare.baseline renders as '5', which `docscore compare` refuses: '5' is not a run partition" in refusal(
        tmp_path, text)


def test_printing_the_launch_body(capsys):
    assert main([str(ROOT / "runners" / "schedules" / "nightly-classify.yaml")]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["launchParameter"]["parameters"]["task"] == "classify"


def test_ctrl_c_ends_it_with_one_line_and_exit_130(tmp_path):
    """The schedule is a named pipe nobody writes: the command waits inside its work for the interrupt."""
    import os
    import signal
    import subprocess
    import sys

    fifo = tmp_path / "schedule.yaml"
    os.mkfifo(fifo)
    process = subprocess.Popen([sys.executable, "-m", "runners.scheduling", str(fifo)], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    writer = None
    try:
        while writer is None and process.poll() is None:  # until it opens the pipe (after installing its handler)
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO while no reader has it open
            except OSError:
                time.sleep(0.05)
        process.send_signal(signal.SIGINT)  # it now waits to read what this writer never writes
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
        if writer is not None:
            os.close(writer)
    assert (process.returncode, out, err.strip()) == (130, "", "python -m runners.scheduling: interrupted; nothing printed")


def test_printing_into_a_closed_pipe_ends_quietly():
    """`python -m runners.scheduling FILE | head -0`: the reader is gone before the body is written; no traceback,
    SIGPIPE's status."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to the pipe now fails with EPIPE
    try:
        done = subprocess.run([sys.executable, "-m", "runners.scheduling",
                               str(ROOT / "runners" / "schedules" / "nightly-classify.yaml")],
                              cwd=ROOT, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (141, "")


@pytest.mark.parametrize("text, message", [
    (None, "no such file"),
    (CLASSIFY.replace("  task: classify\n", "  task: classify\n  labels: a=b;c=d\n"),
     "run.labels is not a parameter of the Flex Template (runners/flex_template_metadata.json); did you mean classify_labels?"),
    (CLASSIFY.replace('cron: "0 3 * * *"', 'cron: "0 25 * * *"'), "cron '0 25 * * *': hour '25' is not 0-23"),
    ("cron: [0, 3\n", "not valid YAML"),
    ("- a list\n", "a schedule is a mapping of key: value, got list"),
    (CLASSIFY.replace("time_zone: Etc/UTC", "time_zone: [UTC]"), "time_zone: ['UTC'] is not text"),
    (CLASSIFY.replace("  task: classify\n", "  task: classify\n  1: x\n"), "run.1 is not a parameter"),
    (CLASSIFY.split("run:\n")[0] + "run: gs://YOUR_BUCKET/docs\n",
     "run: 'gs://YOUR_BUCKET/docs' is not a mapping of template parameter: value"),
    (CLASSIFY + "1: x\nretries: 3\n", "unknown keys ['1', 'retries']"),
], ids=["missing file", "unknown parameter", "cron", "bad yaml", "not a mapping", "text key", "number key", "run not a mapping",
        "keys of two types"])
def test_a_bad_schedule_exits_2_with_one_line_and_prints_no_body(tmp_path, capsys, text, message):
    """`python -m runners.scheduling FILE > body.json && gcloud ...` must stop at a bad schedule: exit 2, nothing on
    stdout, the reason on one line of stderr (not a traceback)."""
    path = tmp_path / "s.yaml"
    if text is not None:
        path.write_text(text)
    assert main([str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"python -m runners.scheduling: {path}: "), err
    assert message in err


def test_help_describes_the_command_in_whole_sentences(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert ("turn it into what a scheduler sends - the Flex Template launch request (Cloud Scheduler, Composer) and "
            "the `docscore compare` gate.") in shown


@pytest.mark.parametrize("line, message", [
    ("  task: classify\n  run_id: a..b", "--run_id='a..b' is not a safe partition name"),
    ("  task: classify\n  shadow_fraction: 0.5", "--shadow_fraction=0.5 has no effect without --shadow_attention"),
    ("  task: embed", "--labels is only for --task=classify"),
    # what the preset sets decides these: its TPU workers, its bfloat16
    ("  task: classify\n  attention: cudnn", "--attention=cudnn cannot run on tpu: it needs a GPU"),
    ("  task: classify\n  target_backend: gpu", "--target_backend=gpu, but the Dataflow workers have a TPU"),
    ("  task: classify\n  matmul_precision: tf32", "--matmul_precision=tf32 applies to --dtype float32 only"),
], ids=["run_id dots", "shadow without kernel", "labels without classify", "kernel", "backend", "precision"])
def test_run_values_docscore_run_refuses_are_refused(tmp_path, line, message):
    """What no regex can say (a '..' in a run id; one parameter that needs another) is refused by the pipeline's own
    option checks, before a launch that would fail."""
    text = CLASSIFY.replace("  run_id: nightly-classify\n", "").replace("  task: classify\n", f"{line}\n")
    assert f"run: `docscore run` would refuse it at launch: {message}" in refusal(tmp_path, text)


def test_classify_without_labels_is_refused(tmp_path):
    """The refusal names the schedule's own key: `labels:` in a run section is refused as no parameter."""
    text = "\n".join(line for line in CLASSIFY.splitlines() if not line.startswith("  classify_labels:")) + "\n"
    message = refusal(tmp_path, text)
    assert "--task=classify needs at least two labels" in message
    assert "in a schedule's run section the labels are the `classify_labels` key" in message


def test_a_run_with_a_config_file_leaves_the_pipeline_checks_to_the_launch(tmp_path):
    """The config file on GCS may hold the labels: only the launch can read it."""
    text = "\n".join(line for line in CLASSIFY.splitlines() if not line.startswith("  classify_labels:")) + "\n"
    accepts(tmp_path, text.replace("  task: classify\n", "  task: classify\n  config: gs://YOUR_BUCKET/labels.yaml\n"))


SIX_HOURLY = CANARY.replace('cron: "30 2 * * *"', 'cron: "0 */6 * * *"')


def test_a_per_day_run_id_on_a_cron_that_fires_more_than_once_a_day_is_refused(tmp_path, capsys):
    """Every fire after the first of the day rendered nightly-YYYYMMDD again: it replaced the earlier run and its gate
    compared the run with itself (docscore compare exits 2 every time)."""
    path = tmp_path / "s.yaml"
    path.write_text(SIX_HOURLY)
    assert main([str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert ("cron '0 */6 * * *' fires at 2026-01-02 00:00 and 2026-01-02 06:00 UTC, and run.run_id "
            "'nightly-{{ ds_nodash }}' renders as nightly-20260102 for both") in err
    assert "{{ ts_nodash }}" in err
    # the fix the message names: run ids of the date and time, the baseline the previous fire's
    schedule_text = SIX_HOURLY.replace("ds_nodash", "ts_nodash")
    accepts(tmp_path, schedule_text)
    schedule = load_schedule(tmp_path / "s.yaml")
    scheduled, manual = sample_runs(schedule.cron, schedule.time_zone)
    args = compare_parser().parse_args(render(compare_argv(schedule), scheduled))
    assert args.run_b.endswith("run_id=nightly-20260102T000000") and args.run_a.endswith("run_id=nightly-20260101T180000")
    manual_args = compare_parser().parse_args(render(compare_argv(schedule), manual))
    assert manual_args.run_a != manual_args.run_b


def test_a_run_id_a_dst_change_repeats_is_refused(tmp_path):
    """01:30 in Berlin is 00:30 UTC in winter and 23:30 UTC the day before in summer: on 29 March 2026 two nightly
    runs fall on the same UTC date, which Airflow's ds is."""
    text = CANARY.replace('cron: "30 2 * * *"', 'cron: "30 1 * * *"').replace("time_zone: Etc/UTC",
                                                                          "time_zone: Europe/Berlin")
    assert ("fires at 2026-03-29 00:30 and 2026-03-29 23:30 UTC, and run.run_id 'nightly-{{ ds_nodash }}' renders as "
            "nightly-20260329 for both") in refusal(tmp_path, text)
    accepts(tmp_path, text.replace("time_zone: Europe/Berlin", "time_zone: Etc/UTC"))


def test_a_run_id_without_placeholders_may_repeat_on_purpose(tmp_path):
    """A fixed run id is one run replaced at each fire (nightly-classify.yaml), whatever the cron."""
    accepts(tmp_path, CLASSIFY.replace('cron: "0 3 * * *"', 'cron: "0 */6 * * *"'))


def test_sample_runs_follow_the_crons_interval():
    scheduled, manual = sample_runs("0 */6 * * *", "Etc/UTC")
    assert render("{{ data_interval_end | ts_nodash }}/{{ prev_data_interval_start_success | ts_nodash }}",
                  scheduled) == "20260102T060000/20260101T180000"
    # triggered by hand between the next two fires: the interval the scheduled run covered, its own logical date
    assert manual["ts_nodash"] == "20260102T080000" and render("{{ prev_data_interval_start_success | ts_nodash }}",
                                                               manual) == "20260102T000000"
    assert (SCHEDULED_RUN, MANUAL_RUN) == sample_runs("30 2 * * *", "Etc/UTC")


@pytest.mark.parametrize("region, message", [
    ("us-central1-a", "region 'us-central1-a' is not a Compute Engine region name; us-central1-a is a zone of "
                      "us-central1; write the region the job runs in, e.g. region: us-central1"),
    ("US Central", "region 'US Central' is not a Compute Engine region name; write the region the job runs in, e.g. "
                   "region: us-central1"),
    ("us-central", "region 'us-central' is not a Compute Engine region name"),
])
def test_region_must_be_a_region_name(tmp_path, region, message):
    assert message in refusal(tmp_path, CLASSIFY.replace("region: us-central1", f"region: {region}"))


@pytest.mark.parametrize("region", ["europe-west4", "northamerica-northeast1", "us-east5"])
def test_region_names_are_accepted(tmp_path, region):
    accepts(tmp_path, CLASSIFY.replace("region: us-central1", f"region: {region}"))


def test_the_documented_cloud_scheduler_command_uses_the_files_cron_time_zone_and_region():
    """The command once used $DOCSCORE_REGION, so the region the launch API was called in was not the one checked."""
    schedule = load_schedule(ROOT / "runners" / "schedules" / "nightly-classify.yaml")
    command = (ROOT / "runners" / "DATAFLOW.md").read_text().split("gcloud scheduler jobs create http", 1)[1]
    command = command.split("```", 1)[0]
    assert f"--location {schedule.region} " in command
    assert f"/locations/{schedule.region}/flexTemplates:launch" in command
    assert f'--schedule "{schedule.cron}" --time-zone {schedule.time_zone} ' in command
    assert "DOCSCORE_REGION" not in command


@pytest.mark.parametrize("line, message", [
    ("  task: loglik", "--task=loglik needs a decoder (GPT-2 or Llama-family) model but --model minilm-l6 is bert"),
    ("  task: loglik\n  model: minilm-l6", "--task=loglik needs a decoder"),
    # the TPU preset's attention auto runs splash_tpu on its workers, and flash means the same kernel there
    ("  task: embed\n  shadow_attention: flash", "--shadow_attention=flash resolves to splash_tpu, the kernel "
                                                 "--attention=auto already runs"),
    ("  task: embed\n  stride: \"300\"", "--stride=300 (tokens shared by consecutive windows) must be < 254"),
    ("  task: embed\n  max_seq_len: \"100000\"", "--max_seq_len=100000 exceeds the model's 256"),
    ("  task: classify\n  classify_labels: \"sports=sport;politics=SPORT\"",
     "--labels: 'sports' and 'politics' have descriptions ('sport' and 'SPORT') that the model's tokenizer reads as the same"),
], ids=["loglik default model", "loglik minilm", "shadow same kernel", "stride", "max_seq_len", "labels read alike"])
def test_the_built_in_models_checks_are_made(tmp_path, line, message):
    """The built-in model needs no data and no cloud: `docscore run` refuses these at launch, so the schedule check does."""
    text = "\n".join(line for line in CLASSIFY.splitlines() if not line.startswith("  classify_labels:")) + "\n"
    text = text.replace("  task: classify\n", f"{line}\n")
    assert f"run: `docscore run` would refuse it at launch: {message}" in refusal(tmp_path, text)


@pytest.mark.parametrize("model", ["gs://YOUR_BUCKET/models/gpt2", "gs://YOUR_BUCKET/models/{{ ds_nodash }}"])
def test_a_model_that_is_not_read_offline_is_left_to_the_launch(tmp_path, model):
    """A gs:// model (or one the launcher renders) cannot be loaded here: its family is the launch's to judge."""
    text = "\n".join(line for line in CANARY.splitlines() if not line.startswith("  classify_labels:")) + "\n"
    accepts(tmp_path, text.split("compare:")[0].replace("  task: classify\n", f"  task: loglik\n  model: \"{model}\"\n"))
