"""`docscore run` options: config layering (preset < --config < command line), --labels, and every
configuration error exiting 2 with a message naming the flag - before any data is read."""
from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from pipeline.options import ConfigError, parse_labels, parse_options
from tests.conftest import run_docscore


def test_labels_parse_and_reject_malformed():
    assert parse_labels("sports=an article about sport; tech = about computers") == {
        "sports": "an article about sport", "tech": "about computers"}
    assert parse_labels({"a": "x", "b": "y"}) == {"a": "x", "b": "y"}
    with pytest.raises(ConfigError, match="--labels"):
        parse_labels("sports")
    with pytest.raises(ConfigError, match="names 'sports' twice"):
        parse_labels("sports=about sport;politics=about elections;sports=about cooking")


def test_a_config_labels_mapping_keeps_descriptions_with_separators(tmp_path):
    """A `labels:` mapping in --config reaches the task whole: `;` and `=` in a description or name stay text."""
    config = tmp_path / "c.yaml"
    labels = {"sports": "sport; games and athletics", "a=b": "x = y", "politics": "elections"}
    config.write_text(yaml.safe_dump({"task": "classify", "labels": labels}))
    _, eo = parse_options(["--config", str(config)])
    assert parse_labels(eo.classify_labels) == labels


def test_a_label_named_json_colon_is_a_label_not_a_crash():
    """`json:` starts the carried --config mapping; a user's --labels that starts so is still name=description."""
    assert parse_labels("json:api=an article about JSON APIs;web=about the web") == {
        "json:api": "an article about JSON APIs", "web": "about the web"}
    with pytest.raises(ConfigError, match="--labels: 'json:\\[1,2\\]' is not name=description"):
        parse_labels("json:[1,2]")


def test_config_scalars_are_the_text_written_and_a_key_given_twice_is_refused(tmp_path):
    """YAML 1.1 read run_id: 0012 as 10, 12:30 as 750, and text_field: no as False (then dropped)."""
    _, eo = parse_options(["--config", config_file(tmp_path, "run_id: 0012\ntext_field: no\nbatch_size: 8\n")])
    assert (eo.run_id, eo.text_field, eo.batch_size) == ("0012", "no", 8)
    _, eo = parse_options(["--config", config_file(tmp_path, "run_id: 12:30\nno_progress: true\n")])
    assert (eo.run_id, eo.no_progress) == ("12:30", True)
    # YAML 1.2 has no dates: 2024-02-30 was a "day is out of range" traceback, a timestamp was rewritten
    for written in ("2024-02-30", "2024-01-01T10:00:00Z"):
        _, eo = parse_options(["--config", config_file(tmp_path, f"text_field: {written}\n")])
        assert eo.text_field == written
    with pytest.raises(ConfigError, match="`labels` and `classify_labels` are one option"):  # one was dropped unseen
        parse_options(["--config", config_file(tmp_path, "task: classify\nlabels: {a: x, b: y}\nclassify_labels: c=1;d=2\n")])
    with pytest.raises(ConfigError, match="`text_field` is false \\(a YAML boolean\\) but takes a value"):
        parse_options(["--config", config_file(tmp_path, "text_field: false\n")])
    for switch in ("no_progress: yes\n", "no_progress: \"true\"\n", "no_progress: 1\n"):  # text or a number, not true
        with pytest.raises(ConfigError, match="`no_progress` is a switch: give it true or false"):
            parse_options(["--config", config_file(tmp_path, switch)])
    options, _ = parse_options(["--config", config_file(tmp_path, "dry_run: true\n")])  # Beam's true/false value
    assert options.get_all_options()["dry_run"] == "True"
    options, _ = parse_options(["--config", config_file(tmp_path, "dry_run: false\n")])
    assert not options.get_all_options()["dry_run"]
    merged = "task: classify\nlabels:\n  <<: {a: one, b: two}\n  b: second\n"  # a YAML merge key, overridden
    _, eo = parse_options(["--config", config_file(tmp_path, merged)])
    assert parse_labels(eo.classify_labels) == {"a": "one", "b": "second"}
    with pytest.raises(ConfigError, match="the key 'task' is given twice"):
        parse_options(["--config", config_file(tmp_path, "task: embed\ntask: classify\n")])


@pytest.mark.parametrize("labels, refusal", [
    ("sports: about sport\n  sports: about cooking", "the key 'sports' is given twice"),
    ("sports: ''", "has the description ''"),
    ("sports: null", "has the description None"),
    ("'': about nothing", "the label name '' is not text"),
    ("true: about truth", "the label name True is not text"),
    ("1: about one\n  true: about truth", "the keys 1 and True are one key once read"),  # 1 == True in Python
])
def test_a_config_labels_mapping_is_held_to_the_rules_of_labels(tmp_path, labels, refusal):
    with pytest.raises(ConfigError, match=refusal.replace("(", "\\(")):
        parse_options(["--config", config_file(tmp_path, f"task: classify\nlabels:\n  {labels}\n")])


def test_command_line_beats_config_beats_preset(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"attention": "native", "task": "classify", "batch_size": 8,
                                      "labels": {"a": "first", "b": "second"}}))
    options, eo = parse_options(["--preset", "local", "--config", str(config), "--batch_size", "2",
                                 "--direct_num_workers", "3", "--job_labels", "team=eval"])
    all_options = options.get_all_options()
    assert all_options["runner"] == "DirectRunner"  # from the preset (runners/presets/local.yaml)
    assert (eo.attention, eo.task) == ("native", "classify")  # the config file beats the preset
    assert eo.batch_size == 2  # the command line beats the config file
    assert parse_labels(eo.classify_labels) == {"a": "first", "b": "second"}
    assert all_options["direct_num_workers"] == 3  # Beam options pass through
    assert all_options["labels"] == ["team=eval"]  # Dataflow job labels, not classify labels
    # default: a UTC timestamp and a random suffix, so launches in the same second into one output stay apart
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{6}", eo.run_id), eo.run_id
    assert parse_options(["--input", "x", "--output", "y"])[1].run_id != eo.run_id
    _, eo = parse_options(["--config", str(config), "--labels", "x=one;y=two"])
    assert parse_labels(eo.classify_labels) == {"x": "one", "y": "two"}


def config_file(tmp_path, text: str | bytes) -> str:
    path = tmp_path / "c.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def bad_config_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"tsak": "embed"}))
    return str(path)


def labels_config(tmp_path):
    path = tmp_path / "labels.yaml"
    path.write_text("labels:\n  1: one\n  '1': uno\n  2: two\n")  # YAML's 1 and '1': one name to --labels
    return str(path)


def placed(path):
    """A file at `path` (its folders made): something in the way of a folder the run writes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x")
    return path


def folder_at(path):
    path.mkdir(parents=True)
    return path


def not_writable(tmp_path):
    (tmp_path / "a_file").write_text("x")
    return str(tmp_path / "a_file" / "out")  # a directory cannot be made under a file


DATAFLOW = ["--runner", "DataflowRunner", "--dry_run=True", "--project", "docscore-test", "--region", "us-central1",
            "--temp_location", "gs://docscore-test-bucket/tmp", "--sdk_container_image", "img:test",
            "--input", "gs://b/in/*.jsonl", "--output", "gs://b/out"]

TPU_V5E = ["--dataflow_service_options", "worker_accelerator=type:tpu-v5-lite-podslice;topology:1x1"]
L4 = ["--dataflow_service_options", "worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver"]
ONE_PROCESS = ["--experiments", "no_use_multiple_sdk_containers"]

CASES = {
    # name: (extra flags as a function of tmp_path, flag the message must name, schema peek allowed)
    "unknown_task": (lambda t: ["--task", "summarize"], "--task=summarize", False),
    "unknown_option": (lambda t: ["--tsak", "embed"], "--tsak (did you mean --task?)", False),
    # argparse would keep it as text_field, a known option's name, and Beam drop it with a warning
    "dashed_option": (lambda t: ["--text-field=body"], "unknown option --text-field (did you mean --text_field?)", False),
    "dashed_option_and_value": (lambda t: ["--max-error-fraction", "0"],
                                "unknown option --max-error-fraction (did you mean --max_error_fraction?)", False),
    "misspelled_runner": (lambda t: ["--runner", "DirectRuner"], "did you mean --runner=DirectRunner?", False),
    "labels_with_embed": (lambda t: ["--labels", "a=first;b=second"], "--labels is only for --task=classify", False),
    # two classes one description: every document a tie that the first class wins
    # MiniLM's tokenizer is uncased: one embedding for both, every document a tie the first label won
    "labels_the_tokenizer_reads_alike": (lambda t: ["--task", "classify", "--labels",
                                                    "b=An article about sport;a=an article about SPORT;c=politics"],
                                         "'b' and 'a' have descriptions ('An article about sport' and 'an article about "
                                         "SPORT') that the model's tokenizer reads as the same tokens", False),
    "label_description_without_tokens": (lambda t: ["--task", "classify", "--labels", "a=\u200b;b=sport"],
                                          "'a' has the description '\\u200b', in which the model's tokenizer finds no token", False),
    "labels_same_description": (lambda t: ["--task", "classify", "--labels", "sports=an article;politics=an article"],
                                "'sports' and 'politics' have the same description 'an article'", False),
    "labels_mapping_names_one_class_twice": (lambda t: ["--task", "classify", "--config", labels_config(t)],
                                             "labels names '1' twice", False),
    "labels_with_similarity": (lambda t: ["--task", "similarity", "--labels", "a=x;b=y"], "--task=similarity", False),
    "temperature_with_embed": (lambda t: ["--task", "embed", "--temperature", "0.5"],
                               "--temperature is only for --task=classify", False),
    "split_without_tfds_input": (lambda t: ["--split", "train"], "--split only applies to a tfds:NAME --input", False),
    "unknown_config_key": (lambda t: ["--config", bad_config_file(t)], "tsak (did you mean task?)", False),
    "unknown_field": (lambda t: ["--text_field", "body"], "--text_field=body", True),
    "unknown_id_field": (lambda t: ["--id_field", "key"], "--id_field=key", True),
    "kernel_unsupported_on_backend": (lambda t: ["--attention", "pallas_tpu"], "--attention=pallas_tpu", False),
    "kernel_unsupported_on_target": (lambda t: ["--target_backend", "cpu", "--attention", "cudnn"], "--attention=cudnn", False),
    "input_glob_matching_only_folders": (lambda t: ["--input", str(folder_at(t / "gl" / "da").parent / "d*")],
                                         "it matches only folders (", False),
    "input_matching_nothing": (lambda t: ["--input", str(t / "nothing" / "*.jsonl")], "--input", False),
    "stray_word_from_an_unquoted_glob": (lambda t: ["second_file.jsonl"], "unexpected argument 'second_file.jsonl'", False),
    "value_of_the_wrong_type": (lambda t: ["--batch_size", "abc"], "--batch_size: invalid int value: 'abc'", False),
    "value_not_a_choice": (lambda t: ["--direct_running_mode", "bogus"], "--direct_running_mode: invalid choice", False),
    "config_value_of_the_wrong_type_with_a_preset": (lambda t: ["--config", config_file(t, "preset: local\nnum_workers: abc\n")],
                                                     "--num_workers: invalid int value: 'abc'", False),
    "config_misspelled_list_key": (lambda t: ["--config", config_file(t, "experimentz: [use_runner_v2]\n")],
                                   "unknown key(s) experimentz (did you mean experiments?)", False),
    "config_key_yaml_reads_as_a_number": (lambda t: ["--config", config_file(t, "2: x\nfoo: y\nnull: z\n")],
                                          "unknown key(s) 2 (YAML reads it as int, not a flag name), None (YAML reads "
                                          "it as null, not a flag name), foo", False),
    "config_naming_another_config": (lambda t: ["--config", config_file(t, "config: /nonexistent.yaml\n")],
                                     "a config file cannot name another (config: /nonexistent.yaml)", False),
    "config_without_a_value": (lambda t: ["--config"], "--config: expected one argument", False),
    "bigquery_output_with_a_local_temp_location": (
        lambda t: ["--output", "bq:docscore-test.evals.nightly", "--temp_location", str(t / "tmp")],
        "needs --temp_location gs://BUCKET/tmp (not ", False),
    "output_at_the_file_system_root": (lambda t: ["--output", "/"], "--output / is the file system's root", False),
    "runner_class_not_importable": (lambda t: ["--runner", "nosuchpkg.BarRunner"], "no class BarRunner in an importable module nosuchpkg", False),
    "runner_class_not_in_its_module": (lambda t: ["--runner", "apache_beam.runners.NoSuchRunner"], "no class NoSuchRunner", False),
    "runner_interactive": (lambda t: ["--runner", "InteractiveRunner"], "is Beam's runner for notebooks", False),
    "runner_interactive_by_class_path": (lambda t: ["--runner", "apache_beam.runners.interactive.interactive_runner.InteractiveRunner"],
                                         "is Beam's runner for notebooks", False),
    "runner_empty": (lambda t: ["--runner", ""], "--runner is empty; name a runner", False),
    "config_is_a_directory": (lambda t: ["--config", str(t)], "cannot be read (IsADirectoryError", False),
    "config_not_text": (lambda t: ["--config", config_file(t, b"\xff\xfe bad")], "not UTF-8 text", False),
    "config_list_for_one_value": (lambda t: ["--config", config_file(t, "task: [embed, classify]\n")],
                                  "`task` is a list", False),
    "output_inside_the_input_directory": (lambda t: ["--input", str(t / "in"), "--output", str(t / "in" / "out")],
                                          "is inside what --input", False),
    # the first run's tables do not exist yet, but the glob matches them: the next run would read them
    "output_matched_by_a_recursive_input_glob": (lambda t: ["--input", str(t / "in" / "**" / "*"), "--output", str(t / "in" / "o")],
                                                 "is inside what --input", False),
    "flag_with_one_dash": (lambda t: ["-batch_size=4"], "unknown option -batch_size=4 (did you mean --batch_size?)", False),
    "flag_with_one_dash_and_a_value": (lambda t: ["-task", "embed"], "unknown option -task (did you mean --task?)", False),
    "output_is_a_file": (lambda t: ["--output", str(placed(t / "o0" / "out"))], "out is a file, or lies under one", False),
    "output_under_a_file": (lambda t: ["--output", str(placed(t / "o0" / "f") / "out")], "out is a file, or lies under one",
                            False),
    "output_holds_a_file_where_a_table_folder_goes": (lambda t: ["--output", str(placed(t / "o1" / "scores").parent)],
                                                      "scores is a file where the run writes a folder", False),
    "output_holds_a_file_where_the_run_partition_goes": (
        lambda t: ["--output", str(placed(t / "o2" / "runs" / "run_id=r1").parent.parent), "--run_id", "r1"],
        "run_id=r1 is a file where the run writes a folder", False),
    "output_holds_a_folder_where_the_summary_goes": (
        lambda t: ["--output", str(folder_at(t / "o3" / "runs" / "run_id=r1" / "summary.json").parents[2])],
        "summary.json is a folder where the run writes a file", False),
    "profile_dir_not_a_directory": (lambda t: ["--profile_dir", str(not_writable(t))], "--profile_dir", False),
    "output_with_white_space": (lambda t: ["--output", " "], "--output ' ' begins or ends with white space", False),
    "cache_dir_under_a_file": (lambda t: ["--cache_dir", str(not_writable(t))], "--cache_dir", False),
    "temperature_infinite": (lambda t: ["--task", "classify", "--labels", "a=x;b=y", "--temperature", "inf"],
                             "--temperature=inf must be > 0 and finite", False),
    "shadow_tolerance_infinite": (lambda t: ["--shadow_attention", "flash", "--shadow_tolerance", "inf"],
                                  "--shadow_tolerance=inf must be > 0 and finite", False),
    "negative_direct_num_workers": (lambda t: ["--direct_num_workers", "-2"], "--direct_num_workers=-2", False),
    "output_with_a_backslash": (lambda t: ["--output", str(t / "o\\x")], "holds a backslash", False),
    "jsonl_output_under_a_bracketed_name": (lambda t: ["--output", str(t / "out [1]"), "--output_format", "jsonl"],
                                            "holds glob characters", False),
    "dataflow_without_project": (lambda t: ["--runner", "DataflowRunner", "--dry_run=True"],
                                 "--runner=DataflowRunner needs --project, --region, --temp_location", False),
    "dry_run_with_a_local_runner": (lambda t: ["--dry_run=True"], "--dry_run needs --runner=DataflowRunner", False),
    "template_location_with_a_local_runner": (lambda t: ["--template_location", str(t / "job.json")],
                                              "--template_location needs --runner=DataflowRunner", False),
    "dataflow_more_workers_than_the_maximum": (lambda t: [*DATAFLOW, "--num_workers", "8", "--max_num_workers", "4"],
                                               "num_workers (8) cannot exceed max_num_workers (4)", False),
    "dataflow_zone_and_worker_region": (lambda t: [*DATAFLOW, "--worker_zone", "us-central1-a", "--worker_region", "us-east5"],
                                        "worker_region and worker_zone are mutually exclusive", False),
    "dataflow_invalid_project_id": (lambda t: [*DATAFLOW[:-4], "--project", "p1", "--region", "r", "--temp_location",
                                               "gs://docscore-test-bucket/tmp", "--output", "gs://b/out"],
                                    "Invalid Project ID (p1)", False),
    "dataflow_without_a_worker_image": (lambda t: [a for a in DATAFLOW if a not in ("--sdk_container_image", "img:test")],
                                        "needs --sdk_container_image: Dataflow's stock worker image has no docscore", False),
    "dataflow_temp_location_not_a_bucket_name": (lambda t: [*DATAFLOW, "--temp_location", "gs://rb/tmp"],
                                                 "--temp_location=gs://rb/tmp names the bucket 'rb', which is not", False),
    "dataflow_accelerator_machine_without_an_accelerator": (
        lambda t: [*DATAFLOW, "--machine_type", "a2-highgpu-1g"], "--machine_type a2-highgpu-1g is an accelerator machine", False),
    "dataflow_accelerator_without_a_type": (lambda t: [*DATAFLOW, "--dataflow_service_options", "worker_accelerator=topology:1x1"],
                                            "worker_accelerator has no type:", False),
    "dataflow_tpu_without_a_topology": (lambda t: [*DATAFLOW, *ONE_PROCESS, "--dataflow_service_options",
                                                   "worker_accelerator=type:tpu-v5-lite-podslice"], "has no topology", False),
    "dataflow_gpu_workers_with_several_sdk_processes": (lambda t: [*DATAFLOW, *L4], "GPU workers need --experiments "
                                                        "no_use_multiple_sdk_containers", False),
    "dataflow_gpu_without_its_driver": (lambda t: [*DATAFLOW, *ONE_PROCESS, "--dataflow_service_options",
                                                   "worker_accelerator=type:nvidia-l4;count:1"], "has no install-nvidia-driver", False),
    "dataflow_gpu_on_a_machine_without_it": (lambda t: [*DATAFLOW, *L4, *ONE_PROCESS, "--machine_type", "n2-standard-8"],
                                             "--machine_type n2-standard-8 does not take the workers' nvidia-l4", False),
    "dataflow_more_gpus_than_the_machine_holds": (
        lambda t: [*DATAFLOW, *ONE_PROCESS, "--machine_type", "g2-standard-4", "--dataflow_service_options",
                   "worker_accelerator=type:nvidia-l4;count:2;install-nvidia-driver"], "count:2, but --machine_type g2-standard-4 holds 1", False),
    "dataflow_flash_on_a_gpu_older_than_ampere": (
        lambda t: [*DATAFLOW, *ONE_PROCESS, "--attention", "flash", "--dtype", "bfloat16", "--machine_type", "n1-standard-8",
                   "--dataflow_service_options", "worker_accelerator=type:nvidia-tesla-t4;count:1;install-nvidia-driver"],
        "needs an Ampere or newer GPU (compute capability 8.0), but the GPU it would run on is nvidia-tesla-t4 "
        "(compute capability 7.5); use --attention=native or auto", False),
    "dataflow_tpu_kernel_on_cpu_workers": (lambda t: [*DATAFLOW, "--target_backend", "tpu"],
                                           "--target_backend=tpu, but the Dataflow workers have no accelerator", False),
    "dataflow_cpu_backend_on_gpu_workers": (lambda t: [*DATAFLOW, "--target_backend", "cpu", "--dataflow_service_options",
                                                       "worker_accelerator=type:nvidia-l4;count:1"],
                                            "--target_backend=cpu, but the Dataflow workers have a GPU", False),
    "dataflow_tpu_on_a_machine_without_it": (lambda t: [*DATAFLOW, *TPU_V5E, *ONE_PROCESS, "--machine_type", "n2-standard-8"],
                                             "--machine_type n2-standard-8 does not carry the workers' tpu-v5-lite-podslice", False),
    "dataflow_tpu_topology_of_more_chips_than_the_machine": (
        lambda t: [*DATAFLOW, "--dataflow_service_options", "worker_accelerator=type:tpu-v5-lite-podslice;topology:2x2",
                   *ONE_PROCESS, "--machine_type", "ct5lp-hightpu-1t"], "topology:2x2 is 4 TPU chips, but --machine_type ct5lp-hightpu-1t holds 1", False),
    "dataflow_tpu_workers_with_several_sdk_processes": (lambda t: [*DATAFLOW, *TPU_V5E, "--machine_type", "ct5lp-hightpu-1t"],
                                                        "TPU workers need --experiments no_use_multiple_sdk_containers", False),
    "job_label_without_value": (lambda t: ["--job_labels", "noequals"], "--job_labels 'noequals' is not KEY=VALUE", False),
    "job_label_key_with_capitals_and_a_space": (lambda t: ["--job_labels", "Bad Key=x"],
                                                "--job_labels 'Bad Key=x': Dataflow refuses the job", False),
    "job_label_value_too_long": (lambda t: ["--job_labels", "team=" + "x" * 64],
                                 "at most 63 characters each", False),
    "tfds_flags_without_tfds_input": (lambda t: ["--tfds_data_dir", str(t), "--split", "train"],
                                      "--tfds_data_dir and --split only apply to a tfds:NAME --input", False),
    "output_not_writable": (lambda t: ["--output", not_writable(t)], "--output", False),
    "output_file_url": (lambda t: ["--output", f"file://{t}/out"], "(for a local directory write /", False),

    "output_no_beam_file_system": (lambda t: ["--output", "memory://docscore/out"], "--output memory://", False),
    "missing_model": (lambda t: ["--model", str(t / "no_such_model")], "--model", False),
    "task_incompatible_with_model": (lambda t: ["--task", "loglik"], "--task=loglik", False),
    "classify_without_labels": (lambda t: ["--task", "classify"], "--task=classify", False),
    "similarity_without_query_field": (lambda t: ["--task", "similarity"], "--task=similarity", True),
    "run_id_escaping_output": (lambda t: ["--run_id", "../../etc"], "--run_id", False),
    "tfds_without_data_dir": (lambda t: ["--input", "tfds:foo"], "--tfds_data_dir", False),
    "tfds_without_a_name": (lambda t: ["--input", "tfds:", "--tfds_data_dir", str(t)], "--input tfds:: name the dataset",
                            False),
    # Beam's own checks of its options, which it makes when the job's pipeline is made or built: a traceback, exit 1,
    # after the model load, the field peek and the run's lease
    "beam_pickle_library_not_installed": (lambda t: ["--pickle_library", "dill"], "--pickle_library=dill: ", False),
    "beam_resource_hint_invalid": (lambda t: ["--resource_hints", "min_ram=abc"],
                                   "--resource_hints: Resource hint min_ram has invalid value abc", False),
    "beam_options_validator": (lambda t: ["--profiler_agent", "x", "--profile_cpu"],
                               "--profiler_agent is mutually exclusive with --profile_cpu", False),
    "beam_type_check_all_required": (lambda t: ["--type_check_strictness", "ALL_REQUIRED"],
                                     "--type_check_strictness=ALL_REQUIRED needs an output type hint", False),
    "beam_update_compatibility_version_not_a_version": (lambda t: ["--update_compatibility_version", "abc"],
                                                        "--update_compatibility_version=abc is not a Beam version", False),
    "beam_update_compatibility_version_without_dill": (lambda t: ["--update_compatibility_version", "2.60.0"],
                                                       "needs dill==0.3.1.1 installed", False),
    # a refusal to drop a flag the --config file set says so: the command line never had it
    "temperature_from_the_config_with_embed": (lambda t: ["--config", config_file(t, "temperature: 0.1\n"), "--task", "embed"],
                                               "drop --temperature (set by --config", False),
    "shadow_fraction_from_the_config_without_shadow": (lambda t: ["--config", config_file(t, "shadow_fraction: 0.5\n")],
                                                       "or drop --shadow_fraction (set by --config", False),
    "cache_dir_empty": (lambda t: ["--cache_dir", ""], "--cache_dir='' is empty (an unset variable?)", False),
    "profile_dir_white_space": (lambda t: ["--profile_dir", " "], "--profile_dir=' ' is empty", False),
    "config_mapping_for_a_list_option": (lambda t: ["--config", config_file(t, "job_labels: {team: nlp}\n")],
                                         "takes a list of values; write it as a list, e.g. job_labels: [team=nlp]", False),
}


@pytest.mark.parametrize("flag", ["--input", "--tfds_data_dir", "--model", "--output", "--profile_dir"])
def test_a_remote_runner_refuses_a_path_on_this_machine(flag, tmp_path, no_data_read, capsys):
    """Dataflow's workers open the shards, a model or TFDS directory and write the output and profile folders
    themselves: each local path is exit 2 naming its flag, before any data (or the gs:// input) is read."""
    local = tmp_path / "here"
    local.mkdir()
    extra = ["--input", "tfds:mnist", "--tfds_data_dir", str(local)] if flag == "--tfds_data_dir" else [flag, str(local)]
    rc = run_docscore(*DATAFLOW, "--run_id", "r1", *extra)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"{flag} {local} is on this machine, but the runner runs the job on remote workers" in err, err
    assert "gs://BUCKET/PATH" in err and no_data_read == []


@pytest.mark.parametrize("folder", ["scores", "runs", "_staging"])
def test_a_folder_of_the_output_that_cannot_be_written_is_exit_2_before_reading_data(folder, tmp_path, corpus,
                                                                                      no_data_read, capsys):
    """Another user's DIR/scores in a shared output: the root took the probe file, the job read and scored everything
    and failed at its publish with a PermissionError traceback (exit 1), leaving empty partitions behind. Root passes
    permission bits, so as root the folder is made immutable (chattr +i)."""
    import subprocess

    out = tmp_path / "out"
    locked = folder_at(out / folder)
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode != 0:
            pytest.skip("running as root where chattr +i is not available: no folder root cannot write")
    else:
        locked.chmod(0o555)
    try:
        rc = run_docscore("--input", str(corpus), "--output", str(out), "--run_id", "r1")
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(locked)], check=True)
        else:
            locked.chmod(0o755)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"--output {out}: {locked} cannot be written (" in err and "make it writable, or choose another" in err, err
    assert no_data_read == [] and sorted(p.name for p in out.iterdir()) == [folder]


def test_an_unusable_docscore_cache_dir_is_named_by_its_variable(tmp_path, corpus, no_data_read, capsys, monkeypatch):
    """The default --cache_dir comes from DOCSCORE_CACHE_DIR: the message named only --cache_dir, which the user
    never passed."""
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("DOCSCORE_CACHE_DIR", not_writable(tmp_path))
    assert run_docscore("--input", str(corpus), "--output", str(tmp_path / "out"), "--run_id", "r1") == 2
    err = capsys.readouterr().err
    assert f"--cache_dir (default DOCSCORE_CACHE_DIR={tmp_path}/a_file/out)" in err, err
    assert no_data_read == []


@pytest.mark.parametrize("case", sorted(CASES))
def test_configuration_error_exits_2_before_reading_data(case, tmp_path, corpus, no_data_read, capsys):
    extra, names, may_peek = CASES[case]
    args = ["--input", str(corpus), "--output", str(tmp_path / "out" / "deeper"), "--run_id", "r1"]
    # later flags win, so a case's own --input/--output/--run_id replaces the defaults
    rc = run_docscore(*args, *extra(tmp_path))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert names in err, err
    assert not (tmp_path / "out").exists()  # not even the directories the writability probe made
    if not may_peek:
        assert no_data_read == [], "validation looked at data before reporting a non-field error"


def test_help_lists_the_flags(capsys):
    assert run_docscore("--help") == 0
    out = capsys.readouterr().out
    for flag in ("--input", "--output", "--task", "--attention", "--labels", "--run_id", "--config"):
        assert flag in out
    flat = " ".join(out.split())
    assert "embed | similarity | classify | loglik | choice (default: embed)" in flat  # defaults are shown
    assert "(default: None)" not in flat  # a flag without a default says none


def test_help_into_a_closed_pipe_ends_quietly():
    """`docscore --help | head -1`: the reader is gone before docscore writes; no traceback, SIGPIPE's status."""
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to the pipe now fails with EPIPE
    try:
        done = subprocess.run([sys.executable, "-m", "pipeline", "--help"], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (141, "")



@pytest.mark.integration
def test_a_command_started_with_its_streams_closed_keeps_its_exit_codes(tmp_path):
    """A scheduler that closes stdout and stderr (`docscore run ... >&- 2>&-`): Python leaves sys.stdout None, and
    the first message raised, so a published run exited 1 and a bad flag 1. Now: 0 and 2, and the run's tables are
    whole (a file opened first would have taken the free descriptors and any output to them)."""
    import subprocess
    import sys

    from tests.conftest import common_flags, read_summary, read_table, write_jsonl

    def closed(*args: str) -> int:  # the command started with stdin, stdout and stderr closed
        return subprocess.run(["sh", "-c", 'exec "$@" <&- >&- 2>&-', "sh", sys.executable, "-m", "pipeline", *args],
                              timeout=600).returncode

    shard = write_jsonl(tmp_path / "in" / "docs.jsonl", [{"id": f"d{i}", "text": f"document number {i}"} for i in range(3)])
    assert closed("--version") == 0
    assert closed("run", "--input", str(shard), "--output", str(tmp_path / "bad"), "--task", "nope") == 2
    out = tmp_path / "out"
    assert closed("run", "--input", str(shard), *common_flags("closed", out), "--no_progress") == 0
    assert read_summary(out, "closed")["counts"]["scored"] == 3
    assert sorted(read_table(out, "scores", "closed")[0]["doc_id"]) == ["d0", "d1", "d2"]

def test_classify_gold_labels_that_name_no_class_get_a_notice(tmp_path):
    """Gold labels compared as text with the --labels names: `Sports` for `sports`, or a number, would count as
    wrong predictions without a word. JSONL and Parquet shards alike; none when every gold label is a class."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.io.sources import ReadSpec
    from pipeline.input_checks import unknown_gold_notice

    records = [{"id": "a", "text": "x", "label": "Sports"}, {"id": "b", "text": "y", "label": "politics"},
               {"id": "c", "text": "z", "label": 3}, {"id": "d", "text": "w"}]
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    pq.write_table(pa.table({"text": ["x", "y"], "label": ["Sports", "politics"]}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"text": ["x"], "label": ["Sports"]}), tmp_path / "notes::v2.parquet")  # opened as named
    names = ("sports", "politics")
    for shard, unknown in ((jsonl, "'3', 'Sports'"), (tmp_path / "b.parquet", "'Sports'"),
                           (tmp_path / "notes::v2.parquet", "'Sports'")):
        notice = unknown_gold_notice(str(shard), ReadSpec(), names)
        assert notice and f"not among --labels ({unknown};" in notice and "count as wrong" in notice
    assert unknown_gold_notice(str(jsonl), ReadSpec(), ("Sports", "politics", "3")) is None
    booleans = tmp_path / "bool.jsonl"  # JSON true/false are the classes `true` and `false`, as scoring reads them
    booleans.write_text('{"text": "x", "label": true}\n{"text": "y", "label": false}\n')
    assert unknown_gold_notice(str(booleans), ReadSpec(), ("true", "false")) is None
    assert "('false', 'true';" in unknown_gold_notice(str(booleans), ReadSpec(), ("True", "False"))


def test_validations_peek_reads_labels_as_the_reader_does(tmp_path):
    """A Parquet decimal 3.00 is the class `3` (the reader's plain_number), and an integer past float's range is a
    number, not a "text label", for the similarity notice."""
    import decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.io.sources import ReadSpec
    from pipeline.input_checks import text_gold_notice, unknown_gold_notice

    decimals = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": ["x", "y"], "label": pa.array([decimal.Decimal("3.00"), decimal.Decimal("4.00")],
                                                                    pa.decimal128(5, 2))}), decimals)
    assert unknown_gold_notice(str(decimals), ReadSpec(), ("3", "4")) is None
    assert "not among --labels ('3';" in unknown_gold_notice(str(decimals), ReadSpec(), ("three", "4"))
    huge = tmp_path / "huge.jsonl"
    huge.write_text('{"text": "x", "label": 1' + "0" * 400 + '}\n{"text": "y", "label": 0.5}\n')
    assert text_gold_notice(str(huge), ReadSpec()) is None
    words = tmp_path / "words.jsonl"
    words.write_text('{"text": "x", "label": "high"}\n{"text": "y", "label": true}\n{"text": "z", "label": " "}\n')
    assert "has text labels ('high', 'true')" in text_gold_notice(str(words), ReadSpec())  # as the table spells them
    # labels that make their record an error row are never scored, so the notices leave them out
    unscored = tmp_path / "unscored.jsonl"
    unscored.write_text('{"text": "x", "label": [1]}\n{"text": "y", "label": {"a": 1}}\n{"text": "z", "label": "\\udfff"}\n'
                        '{"text": "w", "label": 0.5}\n')
    assert text_gold_notice(str(unscored), ReadSpec()) is None
    assert unknown_gold_notice(str(unscored), ReadSpec(), ("0.5", "1")) is None


def test_only_a_real_switch_refuses_a_config_value_that_is_not_true_or_false():
    """Beam's options that have only a --no_X flag are not switches named X (their X would be an unknown flag)."""
    from pipeline.options import is_switch

    assert is_switch("no_progress") and is_switch("dry_run") is False
    assert not is_switch("direct_runner_use_stacked_bundle") and not is_switch("batch_size")
    assert not is_switch("not_an_option")


def test_a_shard_without_the_text_field_among_others_is_bad_input_not_a_bad_flag(tmp_path):
    """check_fields looks at the first record of several shards: a wrong --text_field (no shard has it) is refused
    whatever the file names' order; one shard without it beside shards with it is left to become error rows."""
    from pipeline.io.sources import ReadSpec
    from pipeline.input_checks import check_fields

    good = write_shard(tmp_path / "b.jsonl", {"id": "1", "text": "a document"})
    odd = write_shard(tmp_path / "a.jsonl", {"id": "2", "body": "no text field"})
    _, eo = parse_options(["--input", str(tmp_path), "--output", str(tmp_path / "out")])
    for shards in ([odd, good], [good, odd]):
        check_fields(eo, shards, ReadSpec())  # no error either way
    with pytest.raises(ConfigError, match="--text_field=text: .*a.jsonl has no such field"):
        check_fields(eo, [odd, write_shard(tmp_path / "c.jsonl", {"body": "x"})], ReadSpec())


def write_shard(path, record: dict) -> str:
    path.write_text(json.dumps(record) + "\n")
    return str(path)


def test_single_host_tpu_shapes_pass_the_worker_checks():
    """The presets' one-chip shape and a four-chip host (topology 2x2 on ct5lp-hightpu-4t) are what Dataflow runs."""
    from pipeline.dataflow_checks import check_accelerator_workers

    for machine, topology in (("ct5lp-hightpu-1t", "1x1"), ("ct5lp-hightpu-4t", "2x2"), ("ct6e-standard-8t", "2x4")):
        kind = "tpu-v6e-slice" if machine.startswith("ct6e") else "tpu-v5-lite-podslice"
        _, eo = parse_options([*DATAFLOW, "--machine_type", machine, "--experiments", "no_use_multiple_sdk_containers",
                               "--dataflow_service_options", f"worker_accelerator=type:{kind};topology:{topology}"])
        check_accelerator_workers(eo, "tpu")


@pytest.mark.parametrize("runner,local", [("DirectRunner", True), ("direct", True), ("Direct", True), (None, True),
                                          ("apache_beam.runners.direct.direct_runner.DirectRunner", True),
                                          ("DataflowRunner", False), ("dataflow", False), ("FlinkRunner", False)])
def test_beams_spellings_of_a_runner_are_read_as_beam_reads_them(runner, local):
    from pipeline.runs.summary import busy_processes
    from pipeline.telemetry.progress import runner_name, runs_locally

    _, eo = parse_options(["--input", "x", "--output", "y"] + (["--runner", runner] if runner else []))
    assert runs_locally(eo) is local
    # one name per runner in the summary and history, and a local run's device time is its one process's
    assert runner_name(runner) == {"dataflow": "DataflowRunner", "FlinkRunner": "FlinkRunner",
                                   "DataflowRunner": "DataflowRunner"}.get(runner, "DirectRunner")
    assert busy_processes({"runner": runner} if runner else {}) == (1 if local else None)


def test_a_non_dataflow_remote_runner_may_read_local_inputs_but_not_write_a_local_output(tmp_path, no_data_read):
    """Flink's or a portable runner's LOOPBACK workers are this process: a local --input may be theirs, while a
    local --output is still refused for any remote runner (it was before Dataflow's own path checks)."""
    from pipeline.dataflow_checks import check_paths_on_workers

    flink = ["--runner", "FlinkRunner", "--input", str(tmp_path / "in.jsonl"), "--model", str(tmp_path)]
    _, eo = parse_options([*flink, "--output", "gs://b/out"])
    check_paths_on_workers(eo)
    _, eo = parse_options([*flink, "--output", str(tmp_path / "out")])
    with pytest.raises(ConfigError, match="--output .* is on this machine"):
        check_paths_on_workers(eo)


def test_a_config_files_labels_are_cleared_by_an_empty_labels_flag(tmp_path):
    """A classify config reused for another task: the refusal says how to clear its labels from the command line."""
    from pipeline.validate import check_options

    config = tmp_path / "classify.yaml"
    config.write_text("input: x.jsonl\noutput: out\ntask: classify\nlabels:\n  a: first\n  b: second\n")
    _, eo = parse_options(["--config", str(config), "--task", "embed"])
    with pytest.raises(ConfigError, match=re.escape("a --config's `labels:` key is cleared by --labels ''")):
        check_options(eo)
    _, eo = parse_options(["--config", str(config), "--task", "embed", "--labels", ""])
    check_options(eo)


def test_an_output_above_the_input_is_not_inside_what_it_reads(tmp_path):
    """`--input data/ --output .`: the tables go to ./scores, ./errors and ./runs, which data/ never holds, so the
    run is not refused; an input whose shards lie in those folders is."""
    from pipeline.validate import check_output_outside_input

    shard = tmp_path / "data" / "a.jsonl"
    shard.parent.mkdir()
    shard.write_text('{"text": "x"}\n')
    for given in (shard.parent, shard):
        _, eo = parse_options(["--input", str(given), "--output", str(tmp_path)])
        check_output_outside_input(eo, [str(shard)])
    table_shard = tmp_path / "scores" / "run_id=x" / "part-0.jsonl"  # an earlier run's --output_format jsonl table
    _, eo = parse_options(["--input", str(tmp_path / "**" / "*.jsonl"), "--output", str(tmp_path)])
    with pytest.raises(ConfigError, match="is inside what --input"):
        check_output_outside_input(eo, [str(shard), str(table_shard)])


def test_a_device_memory_budget_that_is_not_a_number_names_the_variable(tmp_path, corpus, monkeypatch, capsys):
    """It was reported as a --model load error with no fix."""
    monkeypatch.setenv("DOCSCORE_DEVICE_MEMORY_BYTES", "abc")
    assert run_docscore("--input", str(corpus), "--output", str(tmp_path / "out")) == 2
    err = capsys.readouterr().err
    assert "DOCSCORE_DEVICE_MEMORY_BYTES='abc' is not a number of bytes per device; set it" in err and "--model" not in err, err


def test_beams_test_runner_runs_locally():
    from pipeline.telemetry.progress import runs_locally

    assert runs_locally(parse_options(["--input", "x", "--output", "y", "--runner", "TestDirectRunner"])[0])


def test_a_leading_tilde_in_a_path_flag_is_the_home_directory_from_the_command_line_and_a_config(tmp_path, monkeypatch):
    """The shell leaves `--output=~/out` as written and YAML never expands ~: docscore expands it once, so the
    tables, the cache and the trace do not go to a folder named "~" in the working directory."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = tmp_path / "job.yaml"
    config.write_text("model: ~/models/mini\ntfds_data_dir: ~/tfds\n")
    _, eo = parse_options(["--input=~/in/*.jsonl", "--output=~/out", "--cache_dir", "~/cache", "--profile_dir=~/prof",
                           "--config", str(config)])
    home = str(tmp_path / "home")
    assert (eo.input, eo.output, eo.cache_dir, eo.profile_dir) == (f"{home}/in/*.jsonl", f"{home}/out", f"{home}/cache",
                                                                   f"{home}/prof")
    assert (eo.model, eo.tfds_data_dir) == (f"{home}/models/mini", f"{home}/tfds")
    _, eo = parse_options(["--input", "gs://b/~x/*.jsonl", "--output", "out/~tmp"])
    assert (eo.input, eo.output) == ("gs://b/~x/*.jsonl", "out/~tmp")  # only a leading ~ is the home directory


@pytest.mark.parametrize("given, dry_run", [("--dry_run=False", False), ("--dry_run=false", False), ("--dry_run=0", False),
                                            ("--dry_run=True", "True"), ("--dry_run=1", "True")])
def test_dry_run_false_is_no_dry_run(given, dry_run):
    """Beam keeps --dry_run's value as text, so --dry_run=False built the job without submitting it."""
    options, _ = parse_options(["--input", "a.jsonl", "--output", "out", given])
    assert options.get_all_options().get("dry_run") == dry_run


def test_a_dry_run_value_that_is_neither_true_nor_false_is_refused():
    with pytest.raises(ConfigError, match=r"--dry_run='maybe' is not true or false; pass --dry_run=True"):
        parse_options(["--input", "a.jsonl", "--output", "out", "--dry_run", "maybe"])


def test_a_relative_input_from_a_config_run_elsewhere_says_it_is_taken_from_the_working_directory(tmp_path, monkeypatch,
                                                                                                capsys):
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "a.jsonl").write_text('{"id": "a", "text": "a document"}\n')
    (project / "job.yaml").write_text("input: data/*.jsonl\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert run_docscore("--config", str(project / "job.yaml"), "--output", str(tmp_path / "out")) == 2
    err = capsys.readouterr().err
    assert "--input data/*.jsonl: matches no readable shard" in err, err
    assert f"a relative path is still taken from the working directory {elsewhere}" in err, err


@pytest.mark.parametrize("line, message", [("batch_size: sixteen", "`batch_size: sixteen`: --batch_size: invalid int value"),
                                           ("stride: 3.5", "`stride: 3.5`: --stride: invalid int value"),
                                           ("temperature: warm", "`temperature: warm`: --temperature: invalid float value"),
                                           # a YAML boolean for a number: `false` was dropped unseen, `true` refused
                                           # as the command line's "--stride: expected one argument"
                                           ("stride: false", "`stride` is false (a YAML boolean) but takes a value; "
                                                             "give it a value of its type"),
                                           ("batch_size: true", "`batch_size` is true (a YAML boolean) but takes a value")])
def test_a_config_value_of_the_wrong_type_names_the_file(tmp_path, line, message):
    path = config_file(tmp_path, line + "\n")
    with pytest.raises(ConfigError) as refused:
        parse_options(["--config", path, "--input", "a.jsonl", "--output", "out"])
    assert str(refused.value).startswith(f"--config {path}: {message}"), refused.value


def test_labels_separated_by_commas_say_what_was_read(tmp_path, capsys):
    shard = tmp_path / "a.jsonl"
    shard.write_text('{"id": "a", "text": "a document"}\n')
    assert run_docscore("--input", shard, "--output", tmp_path / "out", "--task", "classify", "--labels", "a=x,b=y") == 2
    err = capsys.readouterr().err
    assert "needs at least two labels (read 1: 'a'='x,b=y')" in err and "separated by ';'" in err, err


def test_a_run_id_starting_with_a_dot_is_told_the_rule_it_breaks(tmp_path, capsys):
    shard = tmp_path / "a.jsonl"
    shard.write_text('{"id": "a", "text": "a document"}\n')
    assert run_docscore("--input", shard, "--output", tmp_path / "out", "--run_id", ".hidden") == 2
    assert "starting with a letter or digit" in capsys.readouterr().err


@pytest.mark.parametrize("gpu, machine, kernel", [("nvidia-tesla-t4", "n1-standard-8", "xla"),
                                                  ("nvidia-l4", "g2-standard-8", "pallas_gpu")])
def test_auto_plans_the_kernel_the_dataflow_workers_gpu_can_run(gpu, machine, kernel):
    """The workers' GPU type sets what the kernel policy may choose: a T4 (compute capability 7.5) has no flash
    kernel, so auto plans xla instead of refusing the run; an L4 gets its flash kernel. Every Dataflow GPU type has a
    capability in the table."""
    from pipeline import dataflow_checks
    from pipeline.validate import check_before_data

    _, eo = parse_options([*DATAFLOW, *ONE_PROCESS, "--run_id", "r1", "--dtype", "bfloat16", "--machine_type", machine,
                           "--dataflow_service_options", f"worker_accelerator=type:{gpu};count:1;install-nvidia-driver"])
    assert check_before_data(eo)[:2] == ("gpu", kernel)
    assert set(dataflow_checks.GPU_CAPABILITY) == set(dataflow_checks.GPU_MACHINES)


def test_a_launch_from_a_gpu_machine_plans_the_kernel_of_the_workers_gpu(monkeypatch, tmp_path):
    """The launcher's own GPU (an H100) is not the Dataflow workers' (T4s): the planned kernel, which the summary
    records and --shadow_attention is checked against, is the one the workers' loader resolves (xla), not the
    flash kernel the launcher's GPU would run."""
    import jax

    import kernels.policy
    from pipeline.validate import check_loaded_model

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(kernels.policy, "local_gpu_capability", lambda: ("NVIDIA H100 80GB HBM3", (9, 0)))
    _, eo = parse_options([*DATAFLOW, *ONE_PROCESS, "--run_id", "r1", "--dtype", "bfloat16", "--machine_type",
                           "n1-standard-8", "--dataflow_service_options",
                           "worker_accelerator=type:nvidia-tesla-t4;count:1;install-nvidia-driver"])
    _, _, same_backend, kernel, _, _ = check_loaded_model(eo, "gpu", "the Dataflow workers' accelerator")
    assert (same_backend, kernel) == (False, "xla")
