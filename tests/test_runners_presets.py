"""Launch presets (runners/presets/*.yaml): they parse, name only options the pipeline accepts,
take cloud settings from flags or the environment, and fail clearly when one is missing."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.options import ConfigError, known_option_names, parse_options
from runners.presets import CLOUD_SETTINGS, PRESET_NAMES, load_preset, read_preset_file

PRESET_DIR = Path(__file__).resolve().parents[1] / "runners" / "presets"
ACCELERATED = {"dataflow-tpu-v5e": "tpu", "dataflow-tpu-v6e": "tpu", "dataflow-gpu-l4": "gpu"}
CLOUD_ENV = {
    "DOCSCORE_PROJECT": "docscore-test",
    "DOCSCORE_REGION": "us-central1",
    "DOCSCORE_TEMP_LOCATION": "gs://docscore-test-bucket/tmp",
    "DOCSCORE_IMAGE": "us-docker.pkg.dev/docscore-test/docscore/worker:tpu",
}


@pytest.fixture
def no_cloud_env(monkeypatch):
    for setting in CLOUD_SETTINGS.values():
        for var in setting.env:
            monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_preset_names_are_the_files():
    assert sorted(PRESET_NAMES) == sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_preset_options_are_known_to_the_pipeline(name):
    data = read_preset_file(name)
    assert data["description"]
    unknown = set(data["options"]) - known_option_names()
    assert not unknown, f"{name}: {unknown} are not options of docscore run or Beam"


@pytest.mark.parametrize("name", sorted(ACCELERATED))
def test_accelerator_presets_keep_one_process_per_accelerator(name):
    options = read_preset_file(name)["options"]
    assert options["runner"] == "DataflowRunner"
    assert options["target_backend"] == ACCELERATED[name]
    assert {"use_runner_v2", "no_use_multiple_sdk_containers"} <= set(options["experiments"])
    assert 1 <= options["number_of_worker_harness_threads"] <= 8
    accelerator = [o for o in options["dataflow_service_options"] if o.startswith("worker_accelerator=")]
    assert len(accelerator) == 1
    assert ("tpu" if "tpu" in accelerator[0] else "gpu") == ACCELERATED[name]


def test_tpu_v5e_and_gpu_l4_presets_name_the_documented_accelerators():
    v5e = read_preset_file("dataflow-tpu-v5e")["options"]
    assert v5e["machine_type"] == "ct5lp-hightpu-1t"
    assert v5e["dataflow_service_options"] == ["worker_accelerator=type:tpu-v5-lite-podslice;topology:1x1"]
    l4 = read_preset_file("dataflow-gpu-l4")["options"]
    assert l4["dataflow_service_options"] == ["worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver"]


def test_dataflow_preset_takes_cloud_settings_from_the_environment(no_cloud_env):
    for var, value in CLOUD_ENV.items():
        no_cloud_env.setenv(var, value)
    no_cloud_env.setenv("DOCSCORE_ZONE", "us-central1-b")
    options = load_preset("dataflow-tpu-v5e")
    assert options["project"] == "docscore-test"
    assert options["region"] == "us-central1"
    assert options["worker_zone"] == "us-central1-b"
    assert options["temp_location"] == "gs://docscore-test-bucket/tmp"
    assert options["sdk_container_image"] == CLOUD_ENV["DOCSCORE_IMAGE"]


def test_google_cloud_project_is_the_fallback_for_the_project(no_cloud_env):
    for var, value in CLOUD_ENV.items():
        no_cloud_env.setenv(var, value)
    no_cloud_env.delenv("DOCSCORE_PROJECT")
    no_cloud_env.setenv("GOOGLE_CLOUD_PROJECT", "fallback-project")
    assert load_preset("dataflow-cpu")["project"] == "fallback-project"


def test_missing_cloud_settings_name_the_flag_and_the_variable(no_cloud_env):
    no_cloud_env.setenv("DOCSCORE_PROJECT", "docscore-test")
    with pytest.raises(ValueError) as e:
        load_preset("dataflow-gpu-l4")
    message = str(e.value)
    for text in ("--region", "DOCSCORE_REGION", "--temp_location", "DOCSCORE_TEMP_LOCATION",
                 "--sdk_container_image", "DOCSCORE_IMAGE"):
        assert text in message
    assert "--project" not in message  # it was found in the environment



def test_a_bad_setting_from_the_environment_names_the_variable(no_cloud_env):
    """The user never typed --temp_location: the refusal says where its value came from."""
    from pipeline.validate import check_before_data

    for name, value in CLOUD_ENV.items():
        no_cloud_env.setenv(name, value)
    no_cloud_env.setenv("DOCSCORE_TEMP_LOCATION", "/tmp/x")
    _, eo = parse_options(["--preset", "dataflow-cpu", "--input", "gs://docscore-test-bucket/in/", "--output",
                           "gs://docscore-test-bucket/out", "--no_auth"])
    with pytest.raises(ConfigError, match=r"--temp_location=/tmp/x \(from DOCSCORE_TEMP_LOCATION\) must be a gs:// path"):
        check_before_data(eo)


def test_a_setting_from_the_environment_with_white_space_around_it_is_refused_naming_the_variable(no_cloud_env):
    """`export DOCSCORE_REGION="us-central1 "` passed every check before data and failed at Dataflow's submission."""
    for name, value in CLOUD_ENV.items():
        no_cloud_env.setenv(name, value)
    flags = ["--preset", "dataflow-cpu", "--input", "gs://docscore-test-bucket/in/", "--output", "gs://docscore-test-bucket/out"]
    for name, value in (("DOCSCORE_REGION", "us-central1 "), ("DOCSCORE_IMAGE", " "),
                        ("DOCSCORE_TEMP_LOCATION", " gs://docscore-test-bucket/tmp")):
        no_cloud_env.setenv(name, value)
        with pytest.raises(ConfigError, match=rf"--preset dataflow-cpu: {name}='{value}' begins or ends with white space"):
            parse_options(flags)
        no_cloud_env.setenv(name, CLOUD_ENV[name])
    assert parse_options(flags)[1].get_all_options()["region"] == CLOUD_ENV["DOCSCORE_REGION"]


def test_flags_on_the_command_line_stand_in_for_the_environment(no_cloud_env):
    argv = ["--project=flag-project", "--region", "europe-west4", "--temp_location=gs://b-flag/tmp",
            "--sdk_container_image=img:flag"]
    options = load_preset("dataflow-tpu-v6e", argv)
    assert not {"project", "region", "temp_location", "sdk_container_image"} & set(options)


def test_another_runner_on_the_command_line_needs_no_cloud_settings(no_cloud_env):
    """The command line wins over the preset: --runner DirectRunner with a Dataflow preset runs here, with the
    preset's other settings, and Dataflow's project, region, bucket and image are not asked for."""
    options = load_preset("dataflow-cpu", ["--runner", "DirectRunner"])
    assert options["target_backend"] == "cpu" and "project" not in options
    for runner in ("DataflowRunner", "dataflow", "apache_beam.runners.dataflow.dataflow_runner.DataflowRunner"):
        with pytest.raises(ValueError, match="needs --project"):
            load_preset("dataflow-cpu", ["--runner", runner])
    # with the settings in the environment, a local run still takes none of them (a gs:// temp_location would
    # stage its local output through GCS)
    no_cloud_env.setenv("DOCSCORE_TEMP_LOCATION", "gs://docscore-test-bucket/tmp")
    no_cloud_env.setenv("DOCSCORE_PROJECT", "docscore-test")
    options = load_preset("dataflow-cpu", ["--runner", "DirectRunner"])
    assert not {"temp_location", "project"} & set(options)


def test_local_preset_needs_nothing(no_cloud_env):
    assert load_preset("local")["runner"] == "DirectRunner"


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match="dataflow-tpu-v5e"):
        load_preset("dataflow-tpu-v9")


def test_layering_preset_then_config_then_command_line(no_cloud_env, tmp_path):
    """pipeline/options.py applies a preset under --config and the command line."""
    for var, value in CLOUD_ENV.items():
        no_cloud_env.setenv(var, value)
    config = tmp_path / "run.yaml"
    config.write_text("preset: dataflow-tpu-v5e\nbatch_size: 64\nregion: europe-west4\n")
    options, eo = parse_options(["--config", str(config), "--input", "x.jsonl", "--output", "out",
                                 "--attention", "native"])
    all_options = options.get_all_options()
    assert eo.target_backend == "tpu"  # preset
    assert eo.batch_size == 64  # config beats preset (128)
    assert all_options["region"] == "europe-west4"  # config beats the environment
    assert eo.attention == "native"  # command line beats preset (auto)
    assert all_options["machine_type"] == "ct5lp-hightpu-1t"
    assert all_options["experiments"] == ["use_runner_v2", "no_use_multiple_sdk_containers"]


def test_unknown_preset_is_a_config_error():
    with pytest.raises(ConfigError, match="--preset"):
        parse_options(["--preset", "nope", "--input", "x", "--output", "y"])
    # an empty name (`--preset "$UNSET"`) is no preset's name either: a Dataflow job must not run here instead
    with pytest.raises(ConfigError, match="unknown preset ''"):
        parse_options(["--preset", "", "--input", "x", "--output", "y"])


def test_docscore_run_accepts_cloud_settings_as_flags_without_environment(no_cloud_env):
    """What a Flex Template launch passes: --project, --region, ... as flags, no DOCSCORE_* set."""
    options, eo = parse_options(["--preset", "dataflow-tpu-v5e", "--input", "x.jsonl", "--output", "out",
                                 "--project", "flag-project", "--region", "us-east5",
                                 "--temp_location", "gs://b-flag/tmp", "--sdk_container_image", "img:flag"])
    assert options.get_all_options()["project"] == "flag-project"
    assert eo.target_backend == "tpu"


def test_presets_and_schedules_are_package_data():
    import ast
    import fnmatch

    root = PRESET_DIR.parents[1]
    setup = ast.parse((root / "setup.py").read_text())
    call = next(n for n in ast.walk(setup) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    package_data = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "package_data"))
    globs = package_data["runners"]
    shipped = [p.relative_to(root / "runners").as_posix() for p in (root / "runners").rglob("*")
               if p.suffix in (".yaml", ".json") or p.name == "Dockerfile"]
    missing = [f for f in shipped if not any(fnmatch.fnmatch(f, g) and f.count("/") == g.count("/") for g in globs)]
    assert not missing, missing


def test_cloud_settings_in_the_config_file_stand_in_for_the_environment(no_cloud_env, tmp_path):
    """A --config naming a preset and its project, region, ... needs no DOCSCORE_* variables (the preset
    looked at the command line only and refused the run)."""
    config = tmp_path / "cloud.yaml"
    config.write_text("preset: dataflow-tpu-v5e\nproject: cfg-project\nregion: us-east5\n"
                      "temp_location: gs://cfg-bucket/tmp\nsdk_container_image: img:cfg\n")
    options, eo = parse_options(["--config", str(config), "--input", "x.jsonl", "--output", "out"])
    all_options = options.get_all_options()
    assert (all_options["project"], all_options["region"]) == ("cfg-project", "us-east5")
    assert eo.target_backend == "tpu"


def test_a_region_flag_drops_a_zone_of_another_region_from_the_environment(no_cloud_env):
    """DOCSCORE_ZONE us-west4-a with --region us-central1 made a job Dataflow refuses (a zone outside its region);
    a zone inside the chosen region is kept."""
    for var, value in CLOUD_ENV.items():
        no_cloud_env.setenv(var, value)
    no_cloud_env.setenv("DOCSCORE_ZONE", "us-west4-a")
    assert "worker_zone" not in load_preset("dataflow-gpu-l4", ["--region", "us-central1"])
    assert load_preset("dataflow-gpu-l4", ["--region", "us-west4"])["worker_zone"] == "us-west4-a"
    # a worker region excludes a zone (Beam refuses both): the environment's zone goes
    assert "worker_zone" not in load_preset("dataflow-gpu-l4", ["--region", "us-west4", "--worker_region", "us-west4"])
    # both from the environment: the zone (a reservation's, say) would be dropped without a word; refused instead
    with pytest.raises(ValueError, match="DOCSCORE_ZONE=us-west4-a lies outside the region us-central1 "
                                         r"\(DOCSCORE_REGION\); set a zone of that region"):
        load_preset("dataflow-gpu-l4")


def test_a_keyed_list_entry_on_the_command_line_replaces_the_presets(no_cloud_env):
    """--dataflow_service_options worker_accelerator=... and --experiments X replace the preset's entry of the same
    key (and no_X), instead of a job with two accelerators or an experiment and its opposite; other entries stay."""
    for var, value in CLOUD_ENV.items():
        no_cloud_env.setenv(var, value)
    accelerator = "worker_accelerator=type:nvidia-l4;count:2;install-nvidia-driver"
    options, _ = parse_options(["--preset", "dataflow-gpu-l4", "--input", "x.jsonl", "--output", "out",
                                "--dataflow_service_options", accelerator,
                                "--experiments", "use_multiple_sdk_containers"])
    all_options = options.get_all_options()
    assert all_options["dataflow_service_options"] == [accelerator]
    assert sorted(all_options["experiments"]) == ["use_multiple_sdk_containers", "use_runner_v2"]


def test_the_last_classify_labels_wins_whatever_its_spelling(tmp_path):
    """A Flex Template launch passes --classify_labels; a config's `labels:` mapping must not beat it."""
    config = tmp_path / "c.yaml"
    config.write_text("task: classify\nlabels:\n  a: first\n  b: second\n")
    _, eo = parse_options(["--config", str(config), "--classify_labels", "x=one;y=two"])
    assert eo.classify_labels == "x=one;y=two"
    _, eo = parse_options(["--classify_labels", "x=one;y=two", "--labels", "p=three;q=four"])
    assert eo.classify_labels == "p=three;q=four"


def test_keyed_list_entries_are_replaced_whatever_the_spelling_or_joining(no_cloud_env, tmp_path):
    """Beam takes --experiment and --dataflow_service_option too, and experiments joined by commas: the preset's
    and the config's entries of the same key go all the same, the rest of a joined value stays."""
    for var, value in CLOUD_ENV.items():
        no_cloud_env.setenv(var, value)
    options, _ = parse_options(["--preset", "dataflow-tpu-v5e", "--input", "x.jsonl", "--output", "out",
                                "--dataflow_service_option=worker_accelerator=type:nvidia-l4;count:1",
                                "--experiment=no_use_runner_v2"])
    all_options = options.get_all_options()
    assert all_options["dataflow_service_options"] == ["worker_accelerator=type:nvidia-l4;count:1"]
    assert sorted(all_options["experiments"]) == ["no_use_multiple_sdk_containers", "no_use_runner_v2"]
    config = tmp_path / "c.yaml"
    config.write_text("preset: dataflow-gpu-l4\nexperiments: ['use_runner_v2,use_multiple_sdk_containers,shuffle_mode=x']\n")
    options, _ = parse_options(["--config", str(config), "--input", "x.jsonl", "--output", "out",
                                "--experiments=no_use_multiple_sdk_containers,shuffle_mode=service"])
    assert sorted(options.get_all_options()["experiments"]) == [
        "no_use_multiple_sdk_containers", "shuffle_mode=service", "use_runner_v2"]


def test_beams_deprecated_zone_flag_stands_in_for_the_environments_zone(no_cloud_env):
    """`--zone us-central1-a` with DOCSCORE_ZONE set made the preset add worker_zone, and Beam refused the job: "Cannot
    use deprecated flag --zone along with worker_region or worker_zone"."""
    from pipeline.validate import check_before_data

    for var, value in CLOUD_ENV.items():
        no_cloud_env.setenv(var, value)
    no_cloud_env.setenv("DOCSCORE_ZONE", "us-central1-b")
    assert "worker_zone" not in load_preset("dataflow-cpu", ["--zone", "us-central1-a"])
    _, eo = parse_options(["--preset", "dataflow-cpu", "--zone", "us-central1-a", "--input", "gs://docscore-test-bucket/in/",
                           "--output", "gs://docscore-test-bucket/out", "--no_auth"])
    assert check_before_data(eo)[0] == "cpu"  # Beam's own option checks pass
    assert load_preset("dataflow-cpu")["worker_zone"] == "us-central1-b"  # without --zone the environment's is taken


def dataflow_run(env, *flags: str):
    """check_before_data of a Dataflow run on gs:// paths, with the preset's cloud settings from the environment."""
    from pipeline.validate import check_before_data

    for var, value in CLOUD_ENV.items():
        env.setenv(var, value)
    _, eo = parse_options([*flags, "--input", "gs://docscore-test-bucket/in/", "--output", "gs://docscore-test-bucket/out"])
    return check_before_data(eo)


def test_a_backend_the_preset_set_is_blamed_on_the_preset(no_cloud_env):
    """A CPU preset with a TPU accelerator on the command line: the user typed no --target_backend and used a preset,
    so "use a preset for cpu workers" was no help."""
    accelerator = ["--dataflow_service_options", "worker_accelerator=type:tpu-v5-lite-podslice;topology:1x1"]
    with pytest.raises(ConfigError) as e:
        dataflow_run(no_cloud_env, "--preset", "dataflow-cpu", *accelerator)
    message = str(e.value)
    assert message.startswith("--target_backend=cpu (set by --preset dataflow-cpu), but the Dataflow workers have a TPU")
    assert "pass --target_backend auto (or tpu)" in message and "use a preset for cpu workers" not in message
    # a value the user typed is theirs: the message names no preset
    with pytest.raises(ConfigError, match=r"^--target_backend=gpu, but the Dataflow workers have a TPU"):
        dataflow_run(no_cloud_env, "--preset", "dataflow-tpu-v5e", "--target_backend", "gpu")


def test_from_preset_says_which_values_the_preset_set(no_cloud_env):
    """What a refusal of a local run (pipeline/validate.py check_reachable_backend) can say of --target_backend."""
    from pipeline.dataflow_checks import from_preset

    _, eo = parse_options(["--preset", "dataflow-tpu-v5e", "--runner", "DirectRunner", "--input", "x.jsonl", "--output", "o"])
    assert from_preset(eo, "target_backend") == " (set by --preset dataflow-tpu-v5e)"
    _, eo = parse_options(["--preset", "dataflow-tpu-v5e", "--runner", "DirectRunner", "--target_backend", "gpu",
                           "--input", "x.jsonl", "--output", "o"])
    assert from_preset(eo, "target_backend") == ""
    _, eo = parse_options(["--target_backend", "tpu", "--input", "x.jsonl", "--output", "o"])
    assert from_preset(eo, "target_backend") == ""


def test_a_preset_the_config_file_names_is_the_runs_preset(no_cloud_env, tmp_path):
    """`preset:` in a --config file is --preset by its key: the run records it (the summary's config) and a refusal
    blames it for the values it set; a --preset on the command line still wins over the file's."""
    from pipeline.dataflow_checks import from_preset

    config = tmp_path / "c.yaml"
    config.write_text("preset: dataflow-tpu-v5e\nbatch_size: 8\n")
    _, eo = parse_options(["--config", str(config), "--runner", "DirectRunner", "--input", "x.jsonl", "--output", "o"])
    assert (eo.preset, eo.target_backend, eo.batch_size) == ("dataflow-tpu-v5e", "tpu", 8)
    assert from_preset(eo, "target_backend") == " (set by --preset dataflow-tpu-v5e)"
    _, eo = parse_options(["--config", str(config), "--preset", "local", "--input", "x.jsonl", "--output", "o"])
    assert (eo.preset, eo.target_backend) == ("local", "auto")


TPU_FLAGS = ["--preset", "dataflow-tpu-v5e"]


@pytest.mark.parametrize("machine, accelerator, message", [
    ("ct5lp-hightpu-1t", "type:tpu-v5e-lite;topology:1x1",
     "worker_accelerator type:tpu-v5e-lite is not a Dataflow accelerator type; use a TPU type (tpu-v5-lite-podslice, "),
    ("ct5lp-hightpu-1t", "type:tpu-v5-lite-podslice;topology:one", "topology:one is not a TPU shape"),
    ("ct5lp-hightpu-1t", "type:tpu-v5-lite-podslice;topology:1x", "topology:1x is not a TPU shape"),
    ("ct5lp-hightpu-4t", "type:tpu-v5-lite-podslice;topology:1x4",
     "topology:1x4 is not the shape of --machine_type ct5lp-hightpu-4t's 4 tpu-v5-lite-podslice chips, which Dataflow "
     "runs as 2x2; use topology:2x2"),
    ("ct6e-standard-8t", "type:tpu-v6e-slice;topology:4x2", "which Dataflow runs as 2x4; use topology:2x4"),
    ("ct5lp-hightpu-4t", "type:tpu-v5-lite-podslice;topology:2x4",
     "topology:2x4 is 8 TPU chips, but --machine_type ct5lp-hightpu-4t holds 4; Dataflow runs each single-host TPU "
     "shape on the machine type of its chips: use topology:2x2 or a machine of 8 chips"),
    ("a2-megagpu-16g", "type:nvidia-tesla-a100;count:8;install-nvidia-driver", "count:8, but --machine_type "
                                                                              "a2-megagpu-16g holds 16"),
], ids=["unknown type", "topology word", "topology half", "v5e 4 chips in a row", "v6e 8 chips turned", "more chips",
        "a2 mega count"])
def test_worker_accelerators_dataflow_cannot_run_are_refused(no_cloud_env, machine, accelerator, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        dataflow_run(no_cloud_env, *TPU_FLAGS, "--target_backend", "auto", "--machine_type", machine,
                     "--dataflow_service_options", f"worker_accelerator={accelerator}")


@pytest.mark.parametrize("machine, accelerator, backend", [
    ("ct5lp-hightpu-4t", "type:tpu-v5-lite-podslice;topology:2x2", "tpu"),
    ("ct6e-standard-8t", "type:tpu-v6e-slice;topology:2x4", "tpu"),
    ("ct5p-hightpu-4t", "type:tpu-v5p-slice;topology:2x2x1", "tpu"),
    ("a2-megagpu-16g", "type:nvidia-tesla-a100;count:16;install-nvidia-driver", "gpu"),  # 16 A100 40GB on Compute Engine
    ("a2-highgpu-2g", "type:nvidia-tesla-a100;count:2;install-nvidia-driver", "gpu"),
])
def test_worker_accelerators_of_compute_engines_machines_are_accepted(no_cloud_env, machine, accelerator, backend):
    assert dataflow_run(no_cloud_env, *TPU_FLAGS, "--target_backend", "auto", "--machine_type", machine,
                        "--dataflow_service_options", f"worker_accelerator={accelerator}")[0] == backend
