"""Scheduled runs: read a runners/schedules/*.yaml file and turn it into what a scheduler sends -
the Flex Template launch request (Cloud Scheduler, Composer) and the `docscore compare` gate.

Holds the schedule format and pure conversions; `python -m runners.scheduling FILE` prints the
launch request body. Must not call Google APIs or run pipelines.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

LAUNCHERS = ("cloud-scheduler", "composer")
_PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")  # Airflow macros ({{ ds_nodash }}), rendered by Composer
# A shape check only (Cloud Scheduler and Composer parse the schedule): no cron library is installed or pinned.
_CRON_FIELD = re.compile(r"^(\*|\d+(-\d+)?)(/\d+)?(,(\*|\d+(-\d+)?)(/\d+)?)*$")


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


def check_cron(cron: str) -> None:
    fields = cron.split()
    if len(fields) != 5 or not all(_CRON_FIELD.match(f) for f in fields):
        raise ValueError(f"cron {cron!r}: write five fields (minute hour day month weekday), e.g. '0 3 * * *'")


def load_schedule(path: str | Path) -> Schedule:
    data = yaml.safe_load(Path(path).read_text()) or {}
    known = {f.name for f in dataclasses.fields(Schedule)}
    unknown = set(data) - known
    missing = {f.name for f in dataclasses.fields(Schedule) if f.default is dataclasses.MISSING} - set(data)
    if unknown or missing:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}; "
                         f"a schedule has {', '.join(sorted(known))}")
    schedule = Schedule(**data)
    check_cron(schedule.cron)
    if schedule.launcher not in LAUNCHERS:
        raise ValueError(f"{path}: launcher {schedule.launcher!r}; use one of {', '.join(LAUNCHERS)}")
    if schedule.launcher == "cloud-scheduler" and placeholders(schedule):
        raise ValueError(f"{path}: Cloud Scheduler sends a fixed body; {{{{ ... }}}} placeholders need launcher: composer")
    return schedule


def placeholders(schedule: Schedule) -> set[str]:
    text = json.dumps([schedule.run, schedule.compare])
    return set(_PLACEHOLDER.findall(text))


def render(value: Any, context: dict[str, str]) -> Any:
    """Fill {{ name }} placeholders the way Composer (Airflow) does, for checks and dry runs."""
    if isinstance(value, str):
        return _PLACEHOLDER.sub(lambda m: context[m.group(1)], value)
    if isinstance(value, dict):
        return {k: render(v, context) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, context) for v in value]
    return value


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
    limits = schedule.compare.get("limits", {})
    return [schedule.compare["baseline"], schedule.compare["candidate"],
            *[f"--{name}={value}" for name, value in limits.items()]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runners.scheduling", description=__doc__.split("\n")[0])
    parser.add_argument("schedule", help="a runners/schedules/*.yaml file")
    args = parser.parse_args(argv)
    print(json.dumps(launch_body(load_schedule(args.schedule)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
