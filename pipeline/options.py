"""Options of `docscore run`: EvalOptions (a Beam PipelineOptions) and config layering.

Holds the flag definitions and the merge preset < --config YAML < command line. Must not check
that values make sense for the data or the model (pipeline/validate.py does) nor read any data.
"""
from __future__ import annotations

import argparse
import datetime
import difflib
import importlib
import json
import logging
import os
import re
import secrets
from typing import Any

import yaml
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from pipeline import tasks
from pipeline.io.sources import DEFAULT_MAX_RECORD_BYTES
from pipeline.stages import batching

TASKS = tuple(tasks.TASKS)  # the registered tasks (pipeline/tasks/__init__.py)
OUTPUT_FORMATS = ("parquet", "jsonl")
DTYPES = ("float32", "bfloat16")
TARGET_BACKENDS = ("auto", "cpu", "gpu", "tpu")



def per_backend(values: dict[str, int]) -> str:
    """"cpu 16, gpu 256, tpu 128": a batching default per backend, as --help shows it."""
    return ", ".join(f"{backend} {value}" for backend, value in values.items())

class ConfigError(Exception):
    """A configuration problem found before any data is read; `docscore run` exits 2 with it."""


def user_path(value: str) -> str:
    """A path flag's value with a leading ~ expanded: the shell leaves `--output=~/out` (and YAML `output: ~/out`)
    as written, and of the libraries that open paths some expand ~ and some make a folder named "~"."""
    return os.path.expanduser(value) if value.startswith("~") else value


def default_run_id() -> str:
    """A UTC timestamp and a random suffix: two launches in the same second into one output are two runs, not one
    launch refused or replacing the other's published run."""
    return f"{datetime.datetime.now(datetime.timezone.utc):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


class EvalOptions(PipelineOptions):
    """docscore's own flags; every other Beam option (--runner, ...) passes through untouched."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--input", type=user_path, help="a directory, a file or a glob (local, gs://, memory://), or tfds:NAME[:VERSION]")
        parser.add_argument("--output", type=user_path, help="output directory (local or gs://) or bq:PROJECT.DATASET.PREFIX")
        parser.add_argument("--task", default="embed", help=" | ".join(TASKS))
        parser.add_argument("--model", type=user_path, default="minilm-l6", help="built-in model name or model directory")
        parser.add_argument("--attention", default="auto", help="auto | native | flash | an implementation name")
        parser.add_argument("--text_field", default="text", help="record field holding the document text")
        parser.add_argument("--id_field", default="id", help="record field holding the document id")
        parser.add_argument("--run_id", default=None, help="partition name of this run (default: a UTC timestamp and a random suffix)")
        parser.add_argument("--max_seq_len", type=int, default=None, help="tokens per window (default: the model's)")
        parser.add_argument("--stride", type=int, default=32, help="tokens shared by consecutive windows of a long document")
        parser.add_argument("--max_chunks", type=int, default=8, help="windows kept per document; more -> truncated")
        parser.add_argument("--batch_size", type=int, default=None,
                            help="rows of --max_seq_len tokens per model call; calls of shorter packed rows "
                                 "take proportionally more (a fixed token budget). Default per backend: "
                                 + per_backend(batching.BATCH_SIZE))
        parser.add_argument("--calls_per_beam_batch", type=int, default=None,
                            help="model calls' worth of tokens in one Beam batch (default per backend: "
                                 f"{per_backend(batching.CALLS_PER_BEAM_BATCH)})")
        # --labels "name=description;..." (docscore's classify labels) is rewritten to --classify_labels by
        # parse_options, because Beam's GoogleCloudOptions owns --labels (Dataflow job labels: --job_labels).
        parser.add_argument("--classify_labels", default=None, help=argparse.SUPPRESS)  # --help shows --labels
        parser.add_argument("--job_labels", action="append", default=None, help="Dataflow job label KEY=VALUE (repeatable)")
        parser.add_argument("--temperature", type=float, default=0.05, help="classify softmax temperature")
        parser.add_argument("--dtype", default="float32", help="float32 | bfloat16 compute dtype")
        parser.add_argument("--document_prompt", default=None,
                            help="text put before every document (and classify label description) instead of the "
                                 "model's document prompt; '' for none (default: the model's)")
        parser.add_argument("--query_prompt", default=None,
                            help="text put before every similarity query instead of the model's query prompt; '' for "
                                 "none (default: the model's)")
        parser.add_argument("--matmul_precision", default=None,
                            help="float32 | tf32: the matmul precision of --dtype float32 (default float32: "
                                 "float32 products on every backend; tf32: TensorFloat-32 inputs, GPU only); "
                                 "--dtype bfloat16 runs at the backend's native precision")
        parser.add_argument("--output_format", default="parquet", help="parquet | jsonl")
        parser.add_argument("--tfds_data_dir", type=user_path, default=None, help="data_dir of a prepared TFDS dataset (tfds: input)")
        parser.add_argument("--split", default="test", help="TFDS split to read (tfds: input)")
        parser.add_argument("--target_backend", default="auto", help="auto | cpu | gpu | tpu: where inference runs")
        parser.add_argument("--cache_dir", type=user_path, default=None,
                            help="where converted models and JAX's compilation cache are kept (default "
                                 "$DOCSCORE_CACHE_DIR, else ~/.cache/docscore; $JAX_COMPILATION_CACHE_DIR, where "
                                 "set, holds the compilation cache instead); a gs:// directory holds the compilation cache only, shared "
                                 "by a job's workers (models are then cached on each machine)")
        parser.add_argument("--profile_dir", type=user_path, default=None, help="write a JAX profiler trace of each worker's first batches here")
        parser.add_argument("--no_progress", action="store_true", help="no progress bar or progress log lines while the pipeline runs")
        parser.add_argument("--shadow_attention", default=None,
                            help="a second kernel (native | flash | IMPL) also run on --shadow_fraction of the batches; "
                                 "divergence goes to the scores, summary and report; past tolerance the run exits 3")
        parser.add_argument("--shadow_fraction", type=float, default=0.1,
                            help="share of batches the shadow kernel also runs (0 < F <= 1), chosen by a hash of the batch")
        parser.add_argument("--shadow_tolerance", type=float, default=None,
                            help="max |model output difference| allowed, relative to max(1, |output|) "
                                 "(default per --dtype: float32 1e-5, bfloat16 1e-2)")
        parser.add_argument("--max_record_bytes", type=int, default=DEFAULT_MAX_RECORD_BYTES,
                            help="a record (JSONL line, text file, Parquet text cell, TFDS record) larger than this "
                                 "becomes an error row record_too_large; a JSONL line or text file is never held "
                                 "whole, a Parquet cell or TFDS record is decoded first (default 32 MiB, at least 1024)")
        parser.add_argument("--max_error_fraction", type=float, default=0.1,
                            help="past this share of error rows among the records, or with a shard not read to its "
                                 "end (a corrupt or truncated file) unless it is 1, the run exits 4 (tables and "
                                 "summary still published), so scheduled runs notice")
        parser.add_argument("--config", type=user_path, default=None, help="YAML file with the same keys as the flags")
        parser.add_argument("--preset", default=None, help="runner preset name (runners/presets)")


def parse_labels(spec: str | dict[str, str] | None) -> dict[str, str]:
    """'name=desc;name=desc' (or a mapping from a config file) -> ordered {label: description}."""
    if spec is None or spec == "":
        return {}
    if isinstance(spec, str) and spec.startswith(LABELS_MAPPING_MARK):  # a --config mapping, carried whole
        try:
            carried = json.loads(spec[len(LABELS_MAPPING_MARK):])
        except ValueError:
            carried = None  # a label named json:...: the text is name=description pairs
        spec = carried if isinstance(carried, dict) else spec
    if isinstance(spec, dict):
        return checked_label_mapping(spec)
    pairs = []
    for part in spec.split(";"):
        if not part.strip():
            continue
        name, sep, desc = part.partition("=")
        if not sep or not name.strip() or not desc.strip():
            raise ConfigError(
                f"--labels: {part!r} is not name=description; write --labels \"sports=an article about sport;...\" "
                "(a description holding ; or a name holding =: use a `labels:` mapping in --config)"
            )
        pairs.append((name.strip(), desc.strip()))
    return distinct_labels(pairs, "--labels")


def checked_label_mapping(mapping: dict) -> dict[str, str]:
    """A `labels:` mapping of --config as {name: description}, held to --labels' rules: names and descriptions are
    non-empty text (a YAML true/false/null or a number must be quoted to be text)."""
    pairs = []
    for name, desc in mapping.items():
        if isinstance(name, bool) or not isinstance(name, (str, int)) or not str(name).strip():
            raise ConfigError(f"labels: the label name {name!r} is not text; write each name as text (quote it: "
                              "\"true\": ...)")
        if not isinstance(desc, str) or not desc.strip():
            raise ConfigError(f"labels: {name!r} has the description {desc!r}; give each class a non-empty text "
                              "description (quote it if YAML reads it as something else)")
        pairs.append((str(name).strip(), desc.strip()))
    return distinct_labels(pairs, "labels")


def distinct_labels(pairs: list[tuple[str, str]], where: str) -> dict[str, str]:
    """{name: description}, refusing a name given twice (1 and "1", "a" and " a" are one name) and two classes
    with one description (their embeddings would be equal: every document a tie the first class wins)."""
    labels: dict[str, str] = {}
    for name, desc in pairs:
        if name in labels:
            raise ConfigError(f"{where} names {name!r} twice; give each class one description")
        same = next((other for other, text in labels.items() if text == desc), None)
        if same is not None:
            raise ConfigError(f"{where}: {same!r} and {name!r} have the same description {desc!r}, so no document "
                              "could tell them apart; describe each class differently")
        labels[name] = desc
    return labels


# A `labels:` mapping from --config travels as this prefix + JSON, so descriptions may hold ; and =
LABELS_MAPPING_MARK = "json:"


class ConfigLoader(yaml.SafeLoader):
    """YAML for --config, with YAML 1.2's plain scalars: true/false are booleans and decimal numbers numbers,
    while 0012, 12:30, yes, no, on, off and dates stay the text written (YAML 1.1 reads them as 10, 750, True,
    False and datetimes); a key given twice is refused, not the last one kept."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: its keys may be overridden here
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)):  # an unhashable key: PyYAML's own error says so
                continue
            if key in seen:
                first = seen[key]
                problem = (f"the key {key!r} is given twice" if type(first) is type(key) else
                           f"the keys {first!r} and {key!r} are one key once read (1 and true, 0 and false are equal "
                           "in Python, so one would be lost); quote them to keep both ('1': ..., 'true': ...)")
                raise yaml.constructor.ConstructorError(None, None, problem, key_node.start_mark)
            seen[key] = key
        return super().construct_mapping(node, deep=deep)


ConfigLoader.yaml_implicit_resolvers = {  # YAML 1.2 core schema: no timestamps (2024-02-30 is text, not a bad date)
    first: [(tag, rx) for tag, rx in resolvers if tag.rsplit(":", 1)[-1] not in ("bool", "int", "float", "timestamp")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                   list("tTfF"))
ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"),
                                   list("-+0123456789"))
ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$|^[-+]?[0-9]+[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def dict_to_flags(values: dict[str, Any], origin: str = "--config") -> list[str]:
    """A config mapping -> command-line flags (lists repeat a repeatable flag, True is a bare flag)."""
    flags: list[str] = []
    for key, value in values.items():
        if isinstance(value, bool) and takes_value(key):
            if isinstance(beam_parser().get_default(key), bool):  # a value that means true/false (Beam's --dry_run)
                flags += [f"--{key}=True"] if value else []
                continue
            fix = (f"quote it if it is text: {key}: \"{str(value).lower()}\"" if takes_text(key) else
                   f"give it a value of its type (`docscore run --help`), or leave `{key}` out for its default")
            raise ConfigError(f"{origin}: `{key}` is {str(value).lower()} (a YAML boolean) but takes a value; {fix}")
        if value is None or value is False:
            continue
        if not isinstance(value, bool) and is_switch(key):
            raise ConfigError(f"{origin}: `{key}` is a switch: give it true or false (YAML 1.2: only true/false are "
                              f"booleans, so {value!r} is not one)")
        if value is True:
            flags.append(f"--{key}")
        elif isinstance(value, list):
            if not repeatable(key):
                raise ConfigError(f"{origin}: `{key}` is a list ({value!r}) but takes one value; give one")
            flags += [f"--{key}={item}" for item in value]
        elif isinstance(value, dict) and key == "labels":
            flags.append(f"--labels={LABELS_MAPPING_MARK}" + json.dumps(checked_label_mapping(value)))
        elif isinstance(value, dict) and repeatable(key):  # job_labels: {team: nlp} for job_labels: [team=nlp]
            entries = ", ".join(f"{name}={entry}" for name, entry in value.items())
            raise ConfigError(f"{origin}: `{key}` is a mapping but takes a list of values; write it as a list, e.g. "
                              f"{key}: [{entries}]")
        elif isinstance(value, dict):
            raise ConfigError(f"{origin}: `{key}` is a mapping but takes one value; give one")
        else:
            flags.append(checked_value_flag(key, value, origin))
    return flags


def checked_value_flag(key: str, value: Any, origin: str) -> str:
    """`--key=value` of a config key, its value checked against the flag's type here, so a wrong one names the
    file it is in rather than reading as a command-line mistake."""
    flag = f"--{key}={value}"
    try:
        beam_parser().parse_known_args([flag])
    except ConfigError as e:
        raise ConfigError(f"{origin}: `{key}: {value}`: {e}") from None
    return flag


def takes_value(name: str) -> bool:
    """--name takes a value (is not a bare switch such as --no_progress); unknown names count as taking one. A
    typed option (--stride) refuses the text "a" too, but needs an argument, which a switch does not."""
    if takes_text(name):
        return True
    try:
        beam_parser().parse_known_args([f"--{name}"])
    except ConfigError:  # "expected one argument"
        return True
    return False


def takes_text(name: str) -> bool:
    """--name=a parses: a text option (or a name no option has)."""
    try:
        beam_parser().parse_known_args([f"--{name}=a"])
    except ConfigError:  # a switch given a value, or a value not of the option's type
        return False
    return True


def is_switch(name: str) -> bool:
    """--name is a known bare switch (such as --no_progress): given alone, it parses to true or false."""
    if name not in known_option_names():
        return False
    try:
        parsed, unknown = beam_parser().parse_known_args([f"--{name}"])
    except ConfigError:  # an option that takes a value
        return False
    return not unknown and isinstance(getattr(parsed, name, None), bool)  # not a --no_X-only option's default


def repeatable(name: str) -> bool:
    """--name may be given several times, each adding a value (Beam's --experiments, docscore's --job_labels)."""
    try:
        parsed, _ = beam_parser().parse_known_args([f"--{name}=a", f"--{name}=b"])
    except ConfigError:  # a flag that takes no value
        return False
    return isinstance(getattr(parsed, name, None), list)


def known_option_names() -> set[str]:
    """Every option name any registered PipelineOptions class defines (Beam's and ours)."""
    return set(PipelineOptions([]).get_all_options().keys())


def load_config_file(path: str) -> dict[str, Any]:
    import fsspec

    try:
        with fsspec.open(path, "r") as f:
            data = yaml.load(f, Loader=ConfigLoader) or {}
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: file not found; pass an existing YAML file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"--config {path}: not valid YAML ({' '.join(str(e).split())}); fix the file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--config {path}: not UTF-8 text; pass a YAML file") from None
    except OSError as e:  # a directory, no permission, ...
        raise ConfigError(f"--config {path}: cannot be read ({type(e).__name__}: {e}); pass a YAML file") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: must be a mapping of option: value, got {type(data).__name__}")
    return data


def set_by_config(eo: "EvalOptions", option: str) -> str:
    """" (set by --config FILE: ...)" when the --config file sets `option` to the value it has, so a refusal that says
    to drop a flag does not send the user to a command line that never had it; "" otherwise."""
    if not eo.config:
        return ""
    try:
        config = load_config_file(eo.config)
    except ConfigError:
        return ""
    if option not in config or config[option] != eo.get_all_options().get(option):
        return ""
    return f" (set by --config {eo.config}: remove `{option}:` there)"


def load_preset(name: str, argv: list[str]) -> dict[str, Any]:
    """The preset's options (runners.presets; it reads cloud settings from argv or the environment)."""
    try:
        from runners.presets import load_preset as runners_load_preset
    except ImportError:
        raise ConfigError(f"--preset {name}: runner presets are not available in this install (runners.presets)") from None
    try:
        return dict(runners_load_preset(name, argv))
    except (KeyError, FileNotFoundError, ValueError) as e:
        raise ConfigError(f"--preset {name}: {e}") from None


def layered_flags(argv: list[str]) -> list[str]:
    """Return argv with preset and --config values in front, so the command line wins (argparse keeps the last)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", type=user_path)
    pre.add_argument("--preset")
    refuse_bad_values(pre)  # `--config` with no value: one line naming it, as for every other flag
    first, _ = pre.parse_known_args(argv)
    config = load_config_file(first.config) if first.config else {}
    if "config" in config:
        raise ConfigError(f"--config {first.config}: a config file cannot name another (config: {config['config']}); "
                          "put its keys in this file, or pass that file with --config")
    preset_name = first.preset if first.preset is not None else config.get("preset")  # --preset "": refused, not none
    config = {k: v for k, v in config.items() if k not in ("config", "preset")}
    refuse_unknown_keys(f"--config {first.config}", config)
    if "labels" in config and "classify_labels" in config:  # one option by two names: one would be dropped unseen
        raise ConfigError(f"--config {first.config}: `labels` and `classify_labels` are one option (classify_labels is "
                          "its name among Flex Template parameters); keep one of them")
    if "labels" in config and not isinstance(config["labels"], (dict, str)):
        raise ConfigError(f"--config {first.config}: `labels` must be a mapping of label: description")
    config_flags = dict_to_flags(config, f"--config {first.config}")
    unknown_flags(config_flags + list(argv))  # a value of the wrong type: one line naming it, before the preset parses them
    # the preset's cloud settings come from the environment unless the config file or the command line gives them
    preset = load_preset(preset_name, config_flags + list(argv)) if preset_name is not None else {}
    refuse_unknown_keys(f"--preset {preset_name}", preset)
    # a preset the config file names is the run's preset as --preset's is (the summary's config, the refusals'
    # "set by --preset"): its name goes in front, where the command line has no --preset to override
    named = ["--preset", preset_name] if first.preset is None and preset_name is not None else []
    return (named + replaced_list_entries(dict_to_flags(preset), config_flags + list(argv))
            + replaced_list_entries(config_flags, list(argv)) + list(argv))


def refuse_unknown_keys(origin: str, values: dict[str, Any]) -> None:
    known = known_option_names()
    unknown = sorted((key for key in values if key not in known), key=str)
    if unknown:
        named = [f"{key} (YAML reads it as {type(key).__name__ if key is not None else 'null'}, not a flag name)"
                 if not isinstance(key, str) else
                 f"{key} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(key, sorted(known), n=1))
                 else key for key in unknown]
        raise ConfigError(
            f"{origin}: unknown key(s) {', '.join(named)}; use the flag names without dashes "
            f"(e.g. task, model, labels), see `docscore run --help`"
        )


# Repeatable options whose entries are KEY=VALUE settings, by their flag spellings (Beam takes the singular
# too); a later layer's KEY replaces an earlier layer's
KEYED_LIST_OPTIONS = {"dataflow_service_options": ("dataflow_service_options", "dataflow_service_option"),
                      "experiments": ("experiments", "experiment")}


def replaced_list_entries(earlier: list[str], later: list[str]) -> list[str]:
    """An earlier layer's flags (the preset's, the config file's) less the entries of a repeatable option that
    a later layer sets again by key (its `worker_accelerator=...` for the command line's, `no_X` for `X`): lists
    add up, but two accelerators or an experiment and its opposite make a job Dataflow refuses or runs
    otherwise than either layer said. Experiments are comma-separated lists (Beam splits them)."""
    def entries(dest: str, value: str) -> list[str]:
        return value.split(",") if dest == "experiments" else [value]

    def key(dest: str, entry: str) -> str:
        name = entry.split("=", 1)[0]
        return name[3:] if dest == "experiments" and name.startswith("no_") else name

    given = set()
    for dest, spellings in KEYED_LIST_OPTIONS.items():
        _, values = take_flag(later, *spellings)
        given |= {(dest, key(dest, e)) for value in values for e in entries(dest, value)}
    kept = []
    for flag in earlier:
        name, _, value = flag[2:].partition("=")
        dest = next((d for d, spellings in KEYED_LIST_OPTIONS.items() if name in spellings), None)
        if dest is None:
            kept.append(flag)
            continue
        left = [e for e in entries(dest, value) if (dest, key(dest, e)) not in given]
        if left:
            kept.append(f"--{name}={','.join(left)}")
    return kept


def unknown_flags(flags: list[str]) -> list[str]:
    """Flags no PipelineOptions class defines (Beam would silently drop them). Asked with
    retain_unknown_options, so Beam does not log its own "Discarding unparseable args" about them. A value
    argparse refuses (--batch_size abc) is a ConfigError naming the flag, not Beam's page of usage."""
    every = set(PipelineOptions(flags).get_all_options(retain_unknown_options=True,
                                                       add_extra_args_fn=refuse_bad_values).keys())
    # Beam keeps an unknown --text-field under argparse's name for it, text_field, which is a known option:
    # the names as written that no option's parser takes are unknown too
    _, unparsed = beam_parser().parse_known_args(flags)
    written = {arg[2:].partition("=")[0] for arg in unparsed if arg.startswith("--") and len(arg) > 2}
    kept_as = {name.replace("-", "_") for name in written}  # the same flag under Beam's dest name
    return sorted(written | {name for name in every - known_option_names() if name not in kept_as})


def refuse_bad_values(parser: argparse.ArgumentParser) -> None:
    """get_all_options' parser raises ConfigError on a value of the wrong type instead of printing usage and exiting."""
    def error(message: str) -> None:
        raise ConfigError(f"{message.replace('argument ', '', 1)}; `docscore run --help` lists the flags and their values")
    parser.error = error  # type: ignore[method-assign]


def single_dash_flags(flags: list[str]) -> list[str]:
    """Arguments written as a flag with one dash (-batch_size=4), which Beam drops with a warning."""
    _, unknown = beam_parser().parse_known_args(flags)
    return [arg for arg in unknown if len(arg) > 1 and arg[0] == "-" and arg[1] != "-" and not _is_number(arg)]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def stray_words(flags: list[str]) -> list[str]:
    """Arguments that are neither a flag nor a flag's value (Beam only logs "Unparseable argument" and drops
    them): most often the second and later file names of a glob the shell expanded."""
    _, unknown = beam_parser().parse_known_args(flags)
    return [arg for arg in unknown if not arg.startswith("-")]


def beam_parser() -> argparse.ArgumentParser:
    """The parser of every registered option (Beam's and docscore's) that PipelineOptions builds, its errors
    raised as ConfigError (refuse_bad_values)."""
    parsers: list[argparse.ArgumentParser] = []
    PipelineOptions([]).get_all_options(add_extra_args_fn=parsers.append)
    refuse_bad_values(parsers[0])
    return parsers[0]


def unknown_flags_message(unknown: list[str]) -> str:
    """"unknown option --taks (did you mean --task?)": the closest known option name for each typo."""
    known = sorted(known_option_names() | {"labels"})
    parts = []
    for name in unknown:
        close = [name.replace("-", "_")] if name.replace("-", "_") in known else difflib.get_close_matches(
            name, known, n=1, cutoff=0.6)
        parts.append(f"--{name} (did you mean --{close[0]}?)" if close else f"--{name}")
    return (f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(parts)}; check the spelling "
            f"(`docscore run --help` lists docscore's flags; Beam's are in its PipelineOptions)")


# Runner names Beam resolves (case-insensitively, with or without the "Runner" suffix); anything with a
# dot is a PipelineRunner class path, which Beam imports itself.
# (InteractiveRunner left out: it is for notebooks, and check_runner refuses it.)
KNOWN_RUNNERS = tuple(name for name in (path.rsplit(".", 1)[-1] for path in StandardOptions.ALL_KNOWN_RUNNERS)
                      if name != "InteractiveRunner")


def check_runner(runner: str | None) -> None:
    """--runner must name a runner Beam knows; otherwise ConfigError with the closest name (Beam itself
    raises a ValueError traceback only when the pipeline is built, after the model has been loaded)."""
    if runner is not None and not runner.strip():
        raise ConfigError("--runner is empty; name a runner (DirectRunner, DataflowRunner) or leave --runner out "
                          "for DirectRunner")
    if not runner:
        return
    if runner.rpartition(".")[2].lower().replace("_", "") in ("interactive", "interactiverunner"):
        raise ConfigError(f"--runner={runner} is Beam's runner for notebooks, which keeps a pipeline open to inspect; "
                          "`docscore run` runs its job to the end: use DirectRunner (the default) on this machine")
    if "." in runner:  # a class path: Beam imports it when the pipeline is built, after the model has loaded
        module, _, name = runner.rpartition(".")
        try:
            found = hasattr(importlib.import_module(module), name)
        except ImportError:
            found = False
        if not found:
            raise ConfigError(f"--runner={runner}: no class {name} in an importable module {module}, so Beam cannot "
                              f"create that runner; install it, or pass a Beam runner ({', '.join(KNOWN_RUNNERS)})")
        return
    lowered = {name.lower(): name for name in KNOWN_RUNNERS}
    if runner.lower() in lowered or runner.lower() + "runner" in lowered:
        return
    close = difflib.get_close_matches(runner.lower(), list(lowered), n=1, cutoff=0.6)
    hint = f"did you mean --runner={lowered[close[0]]}? " if close else ""
    raise ConfigError(
        f"--runner={runner} is not a Beam runner; {hint}known runners: {', '.join(KNOWN_RUNNERS)} "
        "(or the full module.ClassName of a PipelineRunner subclass)")


class DropMessages(logging.Filter):
    """Drops the log records of one logger whose message contains one of `fragments`."""

    def __init__(self, *fragments: str):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not fit its format: let the handler report it
            return True
        return not any(fragment in message for fragment in self.fragments)


BEAM_NOISE = (
    # Beam's options parser in a process that has not imported EvalOptions (the SDK workers of
    # --direct_running_mode multi_processing, a portable runner's workers): it lists docscore's own
    # flags as "discarded" although they were parsed here and reach the job inside its transforms.
    ("apache_beam.options.pipeline_options", "Discarding unparseable args"),
    ("apache_beam.runners.portability.local_job_service", "Discarding unparseable args"),
    # apache_beam.ml.inference.base sets `resource = None` whenever its optional model_manager import
    # (torch, scipy) fails, not only where the platform lacks `resource`, and then warns at every model
    # load; docscore does not use the memory figure it would have measured. docscore's processes import it
    # without torch (pipeline/stages/inference.py); the launcher relays a multi_processing worker's warning.
    ("", "Resource module is not available"),
    ("apache_beam.runners.portability.local_job_service", "Resource module is not available"),
    # multi_processing's SDK workers have no staging directory and warn that objects registered in Beam's
    # registries "may not be effective"; docscore's one (records.BatchCoder) is registered when its module loads.
    ("apache_beam.runners.portability.local_job_service", "No semi_persistent_directory found"),
    # gcsfs logs every request that ran out of retries with its traceback, also when docscore then reports
    # the failure itself (an unreachable --input: exit 2 naming it) or a retry one level up succeeds.
    ("gcsfs", "out of retries on exception"),
    # A full or read-only disk under the tables fails the bundle writing them; Beam logs that with the traceback
    # of its file sink, and docscore's last line then names the error and says nothing was published.
    *((name, fault) for name in ("apache_beam.runners.common", "apache_beam.runners.portability.local_job_service")
      for fault in ("No space left on device", "Read-only file system", "Disk quota exceeded")),
    # FnApiRunner says in_memory ignores direct_num_workers > 1, but its ParallelBundleManager then splits each
    # bundle over that many threads (docscore's batching.local_threads; README: Memory).
    ("apache_beam.runners.portability.fn_api_runner.fn_runner", "If direct_num_workers is not equal to 1"),
    # Beam's SDK worker prints a failed bundle's traceback to stderr, then logs the same traceback again.
    ("apache_beam.runners.worker.sdk_worker", "Original traceback is"),
)


def quiet_beam_noise() -> None:
    """Install (once) the filters that drop BEAM_NOISE: warnings that say something untrue about a docscore run,
    and tracebacks of a failure docscore's own last line names."""
    for name, prefix in BEAM_NOISE:  # a filter on the logger that emits: records pass loggers' filters once
        logger = logging.getLogger(name or None)
        if not any(isinstance(f, DropMessages) and prefix in f.fragments for f in logger.filters):
            logger.addFilter(DropMessages(prefix))


def take_flag(flags: list[str], *names: str) -> tuple[list[str], list[str]]:
    """Remove every --name VALUE / --name=VALUE (of any of names) from flags; return (the rest, the values in order)."""
    rest, values, i = [], [], 0
    while i < len(flags):
        flag = flags[i]
        if flag in {f"--{n}" for n in names} and i + 1 < len(flags):
            values.append(flags[i + 1])
            i += 2
            continue
        if flag.startswith(tuple(f"--{n}=" for n in names)):
            values.append(flag.split("=", 1)[1])
        else:
            rest.append(flag)
        i += 1
    return rest, values


def dry_run_flags(value: str) -> list[str]:
    """Beam's --dry_run as a true/false flag: Beam keeps its value as text, so --dry_run=False (any text) was a dry run."""
    word = value.strip().lower()
    if word in ("true", "1", "yes"):
        return ["--dry_run=True"]
    if word in ("false", "0", "no"):
        return []
    raise ConfigError(f"--dry_run={value!r} is not true or false; pass --dry_run=True to build the Dataflow job without "
                      "submitting it, or leave the flag out")


def given_option_names(argv: list[str]) -> set[str]:
    """Names of the options the command line, --config and --preset set, whatever their values."""
    return {flag[2:].split("=", 1)[0] for flag in layered_flags(argv) if flag.startswith("--")}


def parse_options(argv: list[str]) -> tuple[PipelineOptions, EvalOptions]:
    """argv -> (all pipeline options, our view of them). Raises ConfigError on unknown flags/keys.

    --labels is docscore's (classify labels, the last one wins); Dataflow job labels come from
    --job_labels and are handed to Beam's own --labels."""
    # --classify_labels (what a Flex Template launch passes) is --labels by its own name: the last one given wins
    flags, label_specs = take_flag(layered_flags(argv), "labels", "classify_labels")
    if label_specs:
        flags.append(f"--classify_labels={label_specs[-1]}")
    flags, dry_runs = take_flag(flags, "dry_run")
    flags += dry_run_flags(dry_runs[-1]) if dry_runs else []
    quiet_beam_noise()
    single = single_dash_flags(flags)
    if single:
        raise ConfigError(", ".join(f"unknown option {arg} (did you mean -{arg.partition('=')[0]}?)" for arg in single[:3])
                          + "; docscore's and Beam's flags take two dashes")
    unknown = unknown_flags(flags)
    if unknown:
        raise ConfigError(unknown_flags_message(unknown))
    stray = stray_words(flags)
    if stray:
        raise ConfigError(
            f"unexpected argument{'s' if len(stray) > 1 else ''} {', '.join(map(repr, stray[:3]))}"
            f"{' ...' if len(stray) > 3 else ''}: docscore run takes only --flags. A glob the shell expanded passes its "
            "second and later files this way: quote it (--input 'data/*.jsonl')")
    job_labels = PipelineOptions(flags).view_as(EvalOptions).job_labels or []
    options = PipelineOptions(flags + [f"--labels={label}" for label in job_labels])
    check_runner(options.view_as(StandardOptions).runner)
    eval_options = options.view_as(EvalOptions)
    if eval_options.run_id is not None and not eval_options.run_id.strip():  # `--run_id "$RUN"` with RUN unset
        raise ConfigError(f"--run_id={eval_options.run_id!r} is empty; give the run a name, or leave --run_id out for a "
                          "UTC timestamp and a random suffix")
    if not eval_options.run_id:
        eval_options.run_id = default_run_id()
    return options, eval_options
