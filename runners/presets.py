"""Launch presets: named option sets (runners/presets/NAME.yaml) for `docscore run --preset NAME`.

Holds the loader and the table of cloud settings a preset takes from flags or the environment.
Must not build or run a pipeline: a preset only sets options (layering preset < --config < flags
happens in pipeline/options.py).
"""
from __future__ import annotations

import dataclasses
import importlib.resources
import os
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

PRESET_NAMES = ("local", "dataflow-cpu", "dataflow-tpu-v5e", "dataflow-tpu-v6e", "dataflow-gpu-l4")


@dataclasses.dataclass(frozen=True)
class CloudSetting:
    """One option a Dataflow preset leaves to the user: a flag, or else environment variables."""

    option: str  # the Beam option name (its argparse dest)
    flag: str
    env: tuple[str, ...]  # checked in order; the first non-empty one wins

    def describe(self) -> str:
        return f"{self.flag} (or set {' or '.join(self.env)})"


CLOUD_SETTINGS: dict[str, CloudSetting] = {
    s.option: s
    for s in (
        CloudSetting("project", "--project", ("DOCSCORE_PROJECT", "GOOGLE_CLOUD_PROJECT")),
        CloudSetting("region", "--region", ("DOCSCORE_REGION",)),
        CloudSetting("worker_zone", "--worker_zone", ("DOCSCORE_ZONE",)),
        CloudSetting("temp_location", "--temp_location", ("DOCSCORE_TEMP_LOCATION",)),
        CloudSetting("sdk_container_image", "--sdk_container_image", ("DOCSCORE_IMAGE",)),
    )
}


def preset_path(name: str):
    """The packaged YAML file of preset `name` (an importlib.resources Traversable)."""
    if name not in PRESET_NAMES:
        raise ValueError(f"unknown preset {name!r}; use one of {', '.join(PRESET_NAMES)} (runners/presets/*.yaml)")
    return importlib.resources.files("runners") / "presets" / f"{name}.yaml"


def read_preset_file(name: str) -> dict[str, Any]:
    """The preset's YAML as written: description, options, environment (required/optional)."""
    data = yaml.safe_load(preset_path(name).read_text()) or {}
    if not isinstance(data.get("options"), dict):
        raise ValueError(f"runners/presets/{name}.yaml: needs an `options:` mapping of option: value")
    environment = data.get("environment") or {}
    for option in list(environment.get("required", [])) + list(environment.get("optional", [])):
        if option not in CLOUD_SETTINGS:
            raise ValueError(
                f"runners/presets/{name}.yaml: environment setting {option!r} is not one of "
                f"{', '.join(CLOUD_SETTINGS)} (runners/presets.py CLOUD_SETTINGS)")
    return data


def options_given(argv: Sequence[str]) -> dict[str, Any]:
    """Option names (argparse dests) that command-line flags in `argv` set, with their values."""
    from apache_beam.options.pipeline_options import PipelineOptions

    return {k: v for k, v in PipelineOptions(list(argv)).get_all_options().items() if v is not None}


def environment_value(setting: CloudSetting, environ: Mapping[str, str]) -> str | None:
    for var in setting.env:
        value = environ.get(var)
        if value and value != value.strip():  # `export DOCSCORE_REGION="us-central1 "`: Dataflow refuses it at submission
            raise ValueError(f"{var}={value!r} begins or ends with white space; set it without (or pass "
                             f"{setting.flag})")
        if value:
            return value
    return None


def is_dataflow_runner(runner: Any) -> bool:
    """--runner names Dataflow, in any of Beam's spellings (DataflowRunner, dataflow, a class path, TestDataflowRunner)."""
    return "dataflow" in str(runner or "").lower()


def load_preset(name: str, argv: Sequence[str] = (), environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The options of preset `name` (flat option: value, as in a --config file).

    Cloud settings the preset needs (project, region, temp_location, image, ...) are filled from
    the environment unless a flag in `argv` (the rest of the command line, config values included)
    sets them (Beam's deprecated --zone counts as --worker_zone); a required one found in neither raises ValueError
    naming the flag and variables. When the
    command line chooses another runner than Dataflow (it wins over the preset), none is asked for or filled in:
    a local run must not stage its files through the environment's gs:// temp_location.
    """
    data = read_preset_file(name)
    environ = os.environ if environ is None else environ
    options = dict(data["options"])
    environment = data.get("environment") or {}
    given = options_given(argv) if argv else {}
    if not is_dataflow_runner(given.get("runner") or options.get("runner")):
        return options  # the command line chose another runner (it wins): no cloud settings, none filled in
    missing = []
    for option in list(environment.get("required", [])) + list(environment.get("optional", [])):
        setting = CLOUD_SETTINGS[option]
        if option in given or (option == "worker_zone" and given.get("zone")):
            continue  # Beam refuses the deprecated --zone beside a worker_zone, so a given --zone is the zone given
        value = environment_value(setting, environ)
        region = given.get("worker_region") or given.get("region") or options.get("region")
        if option == "worker_zone" and value and (given.get("worker_region") or region and not value.startswith(f"{region}-")):
            if not (given.get("worker_region") or given.get("region")):  # both from the environment: one is wrong
                raise ValueError(f"preset {name!r}: {setting.env[0]}={value} lies outside the region {region} "
                                 f"({CLOUD_SETTINGS['region'].env[0]}); set a zone of that region (a reservation's "
                                 f"zone is the one it holds), or unset {setting.env[0]} and Dataflow picks one")
            continue  # the flags chose a worker region, or a region the environment's zone lies outside: Dataflow picks one
        if value is not None:
            options[option] = value
        elif option in environment.get("required", []):
            missing.append(setting.describe())
    if missing:
        raise ValueError(
            f"preset {name!r} needs {'; '.join(missing)}: pass the flags or set the environment "
            f"variables (runners/DATAFLOW.md, 'Settings')")
    return options
