"""Scheduled runs: read a runners/schedules/*.yaml file and turn it into what a scheduler sends -
the Flex Template launch request (Cloud Scheduler, Composer) and the `docscore compare` gate.

Holds the schedule format, its checks (of the run section: the template's regexes, then `docscore run`'s own
checks of the options alone) and pure conversions; `python -m runners.scheduling FILE` prints the launch request
body. Must not call Google APIs, read data or run pipelines.
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not sys.flags.safe_path and sys.path and sys.path[0] in ("", os.getcwd()):
    # `python -m runners.scheduling` puts the working directory first on sys.path: a user's own models/ or
    # kernels/ there would be imported instead of docscore's (pipeline/__main__.py drops it the same way)
    if os.path.realpath(sys.path[0] or ".") != os.path.dirname(os.path.dirname(os.path.realpath(__file__))):
        del sys.path[0]

import argparse
import dataclasses
import difflib
import itertools
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from pipeline.interrupt import exit_on_interrupt, hold_standard_streams, reader_gone
from pipeline.options import ConfigError, ConfigLoader, EvalOptions
from runners.cron import check_cron, check_time_zone, cron_times, fire_before, fires_after

LAUNCHERS = ("cloud-scheduler", "composer")
TEMPLATE_METADATA = Path(__file__).with_name("flex_template_metadata.json")
COMPARE_KEYS = ("baseline", "candidate", "limits")
TEXT_KEYS = ("name", "cron", "time_zone", "launcher", "template", "region")

# The Airflow template values a composer schedule may use (Airflow 2.2+ and 3 have them all): strings as
# {{ name }}, datetimes through a date filter as {{ name | ds_nodash }} (a bare datetime has spaces and colons);
# ts_nodash (20260102T023000) names the runs of a cron that fires more than once a day.
AIRFLOW_STRINGS = ("ds", "ds_nodash", "ts_nodash")
AIRFLOW_DATES = ("data_interval_start", "data_interval_end", "prev_data_interval_start_success")
AIRFLOW_FILTERS = {"ds": "%Y-%m-%d", "ds_nodash": "%Y%m%d", "ts_nodash": "%Y%m%dT%H%M%S"}
# Deprecated since Airflow 2.2 and gone in 3; on a manually triggered run prev_ds* is the run's own date.
AIRFLOW_REMOVED = {
    "prev_ds": "{{ prev_data_interval_start_success | ds }}",
    "prev_ds_nodash": "{{ prev_data_interval_start_success | ds_nodash }}",
    "next_ds": "{{ data_interval_end | ds }}",
    "next_ds_nodash": "{{ data_interval_end | ds_nodash }}",
    "yesterday_ds": "{{ prev_data_interval_start_success | ds }}",
    "yesterday_ds_nodash": "{{ prev_data_interval_start_success | ds_nodash }}",
    "tomorrow_ds": "{{ data_interval_end | ds }}",
    "tomorrow_ds_nodash": "{{ data_interval_end | ds_nodash }}",
    "execution_date": "{{ ds }}",
}
_TEMPLATE = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", re.S)  # anything Jinja would render
_PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*(?:\|\s*(\w+)\s*)?\}\}")  # the forms render() fills



class ScheduleLoader(ConfigLoader):
    """--config's YAML (a key given twice refused; yes/no/on/off text) with numbers kept as the text written, as the
    launch sends them (template parameters are strings): run_id 0755 stays 0755, 12:30 stays 12:30, a limit
    0.00001 stays 0.00001 (not 1e-05, which the template's regex refuses)."""


ScheduleLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag.rsplit(":", 1)[-1] not in ("int", "float")]
    for first, resolvers in ConfigLoader.yaml_implicit_resolvers.items()}

# Dataflow job names; Flex Template specs are JSON files on GCS (gcloud dataflow flex-template build writes one).
JOB_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
TEMPLATE_PATH = re.compile(r"gs://[^/\s]+/\S*\.json")
# Compute Engine region names (us-central1, europe-west4, northamerica-northeast1); a zone adds -a, -b, ...
REGION = re.compile(r"[a-z]+-[a-z]+[0-9]+")
ZONE = re.compile(r"([a-z]+-[a-z]+[0-9]+)-[a-z]")


@dataclasses.dataclass(frozen=True)
class Schedule:
    name: str
    cron: str
    time_zone: str
    launcher: str
    template: str  # gs:// path of the Flex Template spec (gcloud dataflow flex-template build)
    region: str
    run: dict[str, Any]  # docscore run flags: the template's parameters
    compare: dict[str, Any] | None = None  # baseline, candidate, limits: the `docscore compare` gate


def check_region(region: str) -> None:
    """A Compute Engine region name, as the launch URI and Dataflow's --region take it: not a zone, nor a display
    name such as "US Central"."""
    if REGION.fullmatch(region):
        return
    zone = ZONE.fullmatch(region)
    hint = f"; {region} is a zone of {zone[1]}" if zone else ""
    raise ValueError(f"region {region!r} is not a Compute Engine region name{hint}; write the region the job runs in, "
                     f"e.g. region: {zone[1] if zone else 'us-central1'}")


def template_parameters() -> dict[str, dict[str, Any]]:
    """The Flex Template's parameters by name (runners/flex_template_metadata.json)."""
    return {p["name"]: p for p in json.loads(TEMPLATE_METADATA.read_text())["parameters"]}


def template_strings(value: Any, where: str):
    """(where, text) of every string in a schedule section, where as run.input, compare.baseline, ..."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from template_strings(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from template_strings(item, f"{where}[{index}]")


def check_templates(schedule: Schedule) -> None:
    """Refuse any {{ ... }} the launcher cannot render: all of them on Cloud Scheduler (its body is sent
    as written), and on Composer all but the Airflow forms render() fills and checks."""
    for path, text in template_strings(dataclasses.asdict(schedule), "schedule"):
        where = path.removeprefix("schedule.")
        for found in _TEMPLATE.findall(text):
            if schedule.launcher == "cloud-scheduler":
                raise ValueError(f"{where}: Cloud Scheduler sends a fixed body, so {found} would reach Dataflow as "
                                 f"written; templates need launcher: composer")
            match = _PLACEHOLDER.fullmatch(found)
            name, date_filter = match.groups() if match else (None, None)
            if name in AIRFLOW_REMOVED:
                raise ValueError(f"{where}: {found} is gone in Airflow 3 (deprecated since 2.2) and is the run's "
                                 f"own date on a manual run; write {AIRFLOW_REMOVED[name]}")
            fits = (name in AIRFLOW_STRINGS and not date_filter) or (
                name in AIRFLOW_DATES and date_filter in AIRFLOW_FILTERS)
            if not fits:
                raise ValueError(
                    f"{where}: {found} is not a template this module renders and checks; use "
                    f"{', '.join('{{ %s }}' % s for s in AIRFLOW_STRINGS)}, or "
                    f"{{{{ NAME | {' or '.join(AIRFLOW_FILTERS)} }}}} with NAME one of {', '.join(AIRFLOW_DATES)}")


def check_run(schedule: Schedule, context: dict[str, Any]) -> None:
    """The run section as Flex Template parameters: known names, scalar values that (rendered with
    `context`) match the parameter's regexes, the required ones present - what Dataflow checks at launch."""
    parameters = template_parameters()
    for key, value in schedule.run.items():
        if key not in parameters:
            close = difflib.get_close_matches(str(key), parameters, n=1, cutoff=0.5)  # YAML `1: x` too
            hint = f"did you mean {close[0]}?" if close else f"the parameters are {', '.join(parameters)}"
            raise ValueError(f"run.{key} is not a parameter of the Flex Template (runners/{TEMPLATE_METADATA.name}); {hint}")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError(f"run.{key}: {value!r} is not a string or number; template parameters are strings "
                             f"(a YAML true would arrive as 'True')")
        text = str(render(value, context))
        regexes = parameters[key].get("regexes", [])
        if regexes and not any(re.fullmatch(r, text) for r in regexes):
            raise ValueError(f"run.{key}: {text!r} does not match the template's {regexes[0]}: "
                             f"{parameters[key]['helpText']}")
    missing = [name for name, p in parameters.items() if not p.get("isOptional") and name not in schedule.run]
    if missing:
        raise ValueError(f"run: the template needs {', '.join(missing)}")


def check_run_options(schedule: Schedule) -> None:
    """The run section as `docscore run` would take it at launch (run_refusal): a value no regex can refuse (a '..' in
    a run id) or one parameter that needs another (task classify and its labels) fails the launch otherwise."""
    problem = run_refusal(schedule.run, schedule.region)
    if problem:
        raise ValueError(f"run: `docscore run` would refuse it at launch: {problem}")


# Stand-ins for the cloud settings a Dataflow preset reads from the launch's environment (runners/presets.py):
# what a launch's checks look at is their presence and form, not which project or bucket they name.
CLOUD_STAND_INS = {"project": "docscore-schedule-check", "region": "us-central1",
                   "temp_location": "gs://docscore-schedule-check/tmp", "sdk_container_image": "docscore-schedule-check"}


def run_refusal(run: dict[str, Any], region: str | None = None) -> str | None:
    """Why `docscore run` refuses these template parameters before reading data, in the pipeline's own words
    (parse_options with the preset, then validate.check_before_data: the options, the workers' backend, the
    kernel, the precision, the batch flags; and for the built-in model, which needs no data nor cloud,
    check_model), or None. The preset's cloud settings come from the launch's
    environment: stand-ins here, and the schedule's region when given. What only the launch knows is not judged: a run
    naming a config (a file on GCS that may set any option) is left to it, and so are values holding an Airflow
    {{ placeholder }}, except input and output, which the pipeline requires: those are rendered for the
    scheduled run (a date changes nothing its checks of them look at); a gs:// model is not read here either."""
    from models.builtin import BUILTINS
    from pipeline import validate
    from pipeline.options import parse_options

    if "config" in run:
        return None
    checked = {}
    for key, value in run.items():
        text = str(value)
        if _TEMPLATE.search(text):
            if key not in ("input", "output"):
                continue
            text = render(text, SCHEDULED_RUN)
        checked[key] = text
    model_known = "model" in checked or "model" not in run  # a model holding a {{ placeholder }} is the launch's
    try:
        _, eo = parse_options(run_flags({**CLOUD_STAND_INS, "region": region or CLOUD_STAND_INS["region"], **checked}))
        backend, _, _ = validate.check_before_data(eo)
        if model_known and eo.model in BUILTINS:  # a gs:// model cannot be read offline
            check_model(eo, backend)
    except (ConfigError, ValueError) as e:
        if "--labels" in str(e):  # the flag's message; a schedule sets it as the Flex Template parameter
            return (f"{e}; in a schedule's run section the labels are the `classify_labels` key "
                    "(classify_labels: \"name=description;name=description\")")
        return str(e)
    return None


def check_model(eo: EvalOptions, backend: str) -> None:
    """What `docscore run` checks of the loaded model before reading data (pipeline/validate.py validate_plan): the
    kernel --attention resolves to for it on the workers' backend, the task's model family, --max_seq_len and
    --stride against the model's length, and a --shadow_attention that must run another kernel."""
    from pipeline import validate

    validate.check_loaded_model(eo, backend, validate.backend_origin(eo, backend))


def airflow_context(logical_date: datetime, interval_start: datetime, interval_end: datetime,
                    prev_success_start: datetime) -> dict[str, Any]:
    """The Airflow values render() fills for a DAG run (datetimes in UTC, as Airflow's)."""
    return {"ds": logical_date.strftime(AIRFLOW_FILTERS["ds"]), "ds_nodash": logical_date.strftime(AIRFLOW_FILTERS["ds_nodash"]),
            "ts_nodash": logical_date.strftime(AIRFLOW_FILTERS["ts_nodash"]),
            "data_interval_start": interval_start, "data_interval_end": interval_end,
            "prev_data_interval_start_success": prev_success_start}


# The day the sample DAG runs fall on, in the schedule's time zone.
SAMPLE_DAY = datetime(2026, 1, 2)


def sample_runs(cron: str, time_zone: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A scheduled DAG run and one triggered by hand after it, for the cron's real interval. The scheduled run is
    the cron's first fire of SAMPLE_DAY (its logical date is its interval's start; the interval ends at the next fire)
    and its previous successful run the fire before. The manual run is triggered a third of the way between the next
    two fires: Airflow gives it the trigger time as logical date and the last complete interval, which is the one the
    scheduled run covered. That is CronDataIntervalTimetable (Airflow 2's cron default); under CronTriggerTimetable
    (Airflow 3's) a manual run on the day of a scheduled one gets that run's date, which no date-named run id can tell
    apart: `docscore compare X X` then exits 2 and fails the DAG run."""
    times = cron_times(cron, time_zone)
    start = SAMPLE_DAY.replace(tzinfo=times.zone)
    first, second, third = itertools.islice(fires_after(times, start), 3)
    scheduled = airflow_context(first, first, second, fire_before(times, start))
    triggered = second + (third - second) / 3
    return scheduled, airflow_context(triggered, first, second, first)


# The night run of 2026-01-02 of a daily 02:30 UTC cron, and a run triggered by hand the next morning.
SCHEDULED_RUN, MANUAL_RUN = sample_runs("30 2 * * *", "Etc/UTC")

# A year of an hourly cron's fires. A cron that fires more often repeats a run id on its first day if it ever
# does: the placeholders are per day or per second, and only a cron firing at most daily meets a DST change first.
FIRES_CHECKED = 10_000


def check_run_ids(schedule: Schedule) -> None:
    """Consecutive DAG runs get different run ids. A run id with placeholders names each run; one that renders the
    same on two fires (a per-day {{ ds_nodash }} with a cron that fires every 6 hours, or across a DST change) has
    the later run replace the earlier and a gate compare a run with itself. A run id without placeholders is one
    run, replaced on purpose each time (nightly-classify.yaml)."""
    run_id = schedule.run.get("run_id")
    if not isinstance(run_id, str) or not _PLACEHOLDER.search(run_id):
        return
    times = cron_times(schedule.cron, schedule.time_zone)
    start = SAMPLE_DAY.replace(tzinfo=times.zone)
    fires = fires_after(times, start)
    previous, fire = fire_before(times, start), next(fires)
    last_fire, last_id = None, None
    for following in itertools.islice(fires, FIRES_CHECKED):
        rendered = render(run_id, airflow_context(fire, fire, following, previous))
        if rendered == last_id:
            raise ValueError(
                f"cron {schedule.cron!r} fires at {last_fire:%Y-%m-%d %H:%M} and {fire:%Y-%m-%d %H:%M} UTC, and run.run_id "
                f"{run_id!r} renders as {rendered} for both: the later run would replace the earlier (and a gate "
                "compare a run with itself); name each run after its date and time, e.g. {{ ts_nodash }} (and the "
                "gate's baseline {{ prev_data_interval_start_success | ts_nodash }}), or a cron whose consecutive fires "
                "fall on different UTC days")
        last_fire, last_id = fire, rendered
        previous, fire = fire, following


def check_compare(schedule: Schedule) -> None:
    """The gate compares two different runs, on a scheduled and on a manually triggered DAG run of the cron."""
    compare = schedule.compare
    if not isinstance(compare, dict) or set(compare) - set(COMPARE_KEYS) or not {"baseline", "candidate"} <= set(compare):
        raise ValueError(f"compare: write baseline, candidate and optionally limits (got {compare!r})")
    if schedule.launcher == "cloud-scheduler":
        raise ValueError("compare: a Cloud Scheduler schedule only launches the job, nothing runs its gate; "
                         "gate from launcher: composer (a task after the launch) or remove compare")
    limits = compare.get("limits") or {}
    if not isinstance(limits, dict):
        raise ValueError(f"compare.limits: write a mapping of limit: value (e.g. max_mean_drift: 0.001), not {limits!r}")
    check_limits(schedule)
    scheduled, manual = sample_runs(schedule.cron, schedule.time_zone)
    output, run_id = schedule.run.get("output"), schedule.run.get("run_id")
    if "config" not in schedule.run and isinstance(output, str) and isinstance(run_id, str):
        candidate, run = render([compare["candidate"], f"{output.rstrip('/')}/scores/run_id={run_id}"], scheduled)
        if compared_run("compare.candidate", candidate) != compared_run("run.output", run):
            raise ValueError(f"compare.candidate renders as {candidate}, which is not the run this schedule launches "
                             f"({run}); the gate would find no such run every night")
    for kind, context in (("scheduled", scheduled), ("manually triggered", manual)):
        baseline, candidate = render([compare["baseline"], compare["candidate"]], context)
        if compared_run("compare.baseline", baseline) == compared_run("compare.candidate", candidate):
            same = baseline if baseline == candidate else f"{baseline} and {candidate}, one run,"
            raise ValueError(f"compare: baseline and candidate are both {same} on a {kind} run, so the gate "
                             f"would compare a run with itself; name the baseline after the previous successful "
                             f"run ({{{{ prev_data_interval_start_success | ds_nodash }}}}) and the candidate after "
                             f"this one ({{{{ ds_nodash }}}}); with | ts_nodash and {{{{ ts_nodash }}}} for a cron that "
                             f"fires more than once a day")


def compared_run(where: str, rendered: Any) -> tuple[str, str]:
    """The run a rendered compare path names as `docscore compare` reads it (any of its partitions, its summary.json
    or report.html): (output in one spelling, run_id), so two spellings of one run compare equal. A path that names
    no run is refused as the gate would refuse it, every night."""
    from pipeline.io import run_commit
    from pipeline.runs.compare import CompareError, RunRef

    try:
        ref = RunRef.parse(str(rendered))
    except CompareError as e:
        raise ValueError(f"{where} renders as {rendered!r}, which `docscore compare` refuses: {e}") from None
    return run_commit.one_spelling(ref.output_dir), ref.run_id


def check_limits(schedule: Schedule) -> None:
    """The gate's command line (compare_argv) as `docscore compare` parses it: its limits and values it takes."""
    from pipeline.runs import compare

    parser = compare.build_parser()
    parser.exit_on_error = False
    try:
        args, unknown = parser.parse_known_args(compare_argv(schedule))
    except argparse.ArgumentError as e:
        raise ValueError(f"compare.limits: {e}") from None
    if unknown:
        names = [f.name for f in dataclasses.fields(compare.Limits)]
        raise ValueError(f"compare.limits: {unknown[0].split('=')[0].lstrip('-')} is not a limit of `docscore compare`; "
                         f"the limits are {', '.join(names)}")
    problem = compare.limit_problem(compare.limits_given(args))
    if problem:  # `docscore compare` would refuse it with exit 2 every night
        raise ValueError(f"compare.limits: {problem}")


def read_schedule_file(path: str | Path) -> dict[str, Any]:
    """The file's mapping; a file that is missing, unreadable, not YAML or not a mapping is a ValueError naming it,
    as every other problem with a schedule is (main() reports those in one line)."""
    try:
        data = yaml.load(Path(path).read_text(), Loader=ScheduleLoader) or {}
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file; pass a runners/schedules/*.yaml file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a schedule is a mapping of key: value, got {type(data).__name__}")
    return data


def load_schedule(path: str | Path) -> Schedule:
    data = read_schedule_file(path)
    known = {f.name for f in dataclasses.fields(Schedule)}
    unknown = set(data) - known
    missing = {f.name for f in dataclasses.fields(Schedule) if f.default is dataclasses.MISSING} - set(data)
    if unknown or missing:
        raise ValueError(f"{path}: unknown keys {sorted(map(str, unknown))}, missing keys {sorted(missing)}; "
                         f"a schedule has {', '.join(sorted(known))}")
    schedule = Schedule(**data)
    for key in TEXT_KEYS:
        if not isinstance(getattr(schedule, key), str):
            raise ValueError(f"{path}: {key}: {getattr(schedule, key)!r} is not text; quote it")
    if not isinstance(schedule.run, dict):
        raise ValueError(f"{path}: run: {schedule.run!r} is not a mapping of template parameter: value")
    if schedule.launcher not in LAUNCHERS:
        raise ValueError(f"{path}: launcher {schedule.launcher!r}; use one of {', '.join(LAUNCHERS)}")
    if not JOB_NAME.fullmatch(schedule.name):
        raise ValueError(f"{path}: name {schedule.name!r} is not a Dataflow job name: lower-case letters, digits and "
                         "hyphens, starting with a letter and not ending with a hyphen (e.g. docscore-nightly)")
    if not TEMPLATE_PATH.fullmatch(schedule.template):
        raise ValueError(f"{path}: template {schedule.template!r} is not a Flex Template spec; write the gs://BUCKET/"
                         "PATH.json that `gcloud dataflow flex-template build` wrote")
    try:
        check_cron(schedule.cron)
        check_time_zone(schedule.time_zone)
        check_region(schedule.region)
        check_templates(schedule)
        check_run(schedule, sample_runs(schedule.cron, schedule.time_zone)[0])
        check_run_ids(schedule)
        check_run_options(schedule)
        if schedule.compare is not None:
            check_compare(schedule)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return schedule


def placeholders(schedule: Schedule) -> set[str]:
    """The Airflow values the run and compare sections use."""
    text = json.dumps([schedule.run, schedule.compare])
    return {name for name, _ in _PLACEHOLDER.findall(text)}


def render(value: Any, context: dict[str, Any]) -> Any:
    """Fill {{ name }} and {{ name | ds_nodash }} placeholders the way Composer (Airflow) does, for checks
    and dry runs; context holds strings and, for dates, datetimes (airflow_context)."""
    if isinstance(value, str):
        return _PLACEHOLDER.sub(lambda m: _fill(context[m.group(1)], m.group(2)), value)
    if isinstance(value, dict):
        return {k: render(v, context) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, context) for v in value]
    return value


def _fill(value: Any, date_filter: str | None) -> str:
    return value.strftime(AIRFLOW_FILTERS[date_filter]) if date_filter else str(value)


def run_flags(run: dict[str, Any]) -> list[str]:
    """The schedule's run section as `docscore run` flags."""
    return [f"--{key}={value}" for key, value in run.items()]


def launch_body(schedule: Schedule) -> dict[str, Any]:
    """The body of POST https://dataflow.googleapis.com/v1b3/projects/PROJECT/locations/REGION/
    flexTemplates:launch (Flex Template parameters are strings)."""
    return {
        "launchParameter": {
            "jobName": schedule.name,
            "containerSpecGcsPath": schedule.template,
            "parameters": {key: str(value) for key, value in schedule.run.items()},
        }
    }


def compare_argv(schedule: Schedule) -> list[str]:
    """`docscore compare` arguments of the gate (empty when the schedule has none)."""
    if not schedule.compare:
        return []
    limits = schedule.compare.get("limits") or {}
    return [schedule.compare["baseline"], schedule.compare["candidate"],
            *[f"--{name}={value}" for name, value in limits.items()]]


def main(argv: list[str] | None = None) -> int:
    """Print the launch body; a schedule that cannot launch exits 2 with one line on stderr and prints nothing, so
    `python -m runners.scheduling FILE > body.json && gcloud ...` stops there (as `docscore run` and `compare` do)."""
    description = " ".join(__doc__.split("\n\n")[0].split())  # the whole first paragraph, not its first line
    parser = argparse.ArgumentParser(prog="python -m runners.scheduling", description=description)
    parser.add_argument("schedule", help="a runners/schedules/*.yaml file")
    args = parser.parse_args(argv)
    try:
        with exit_on_interrupt(lambda: f"{parser.prog}: interrupted; nothing printed"):
            body = launch_body(load_schedule(args.schedule))
    except ValueError as e:
        print(f"{parser.prog}: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    try:
        print(json.dumps(body, indent=2), flush=True)
    except BrokenPipeError:  # `python -m runners.scheduling FILE | head`
        return reader_gone()
    return 0


if __name__ == "__main__":
    hold_standard_streams()
    sys.exit(main())
