"""What `docscore run` sets in its environment for the processes it starts: a local multi_processing run's
workers (and the launcher) allocate accelerator memory as they go instead of each taking 75% of it up
front, unless the user chose otherwise."""
from __future__ import annotations

import os

from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.launch import PREALLOCATE_ENV, share_device_memory


def test_multi_processing_workers_do_not_preallocate_device_memory(monkeypatch):
    monkeypatch.delenv(PREALLOCATE_ENV, raising=False)
    assert not share_device_memory(PipelineOptions(["--direct_running_mode", "multi_threading"]))
    assert PREALLOCATE_ENV not in os.environ
    assert share_device_memory(PipelineOptions(["--direct_running_mode", "multi_processing"]))
    assert os.environ[PREALLOCATE_ENV] == "false"


def test_a_users_own_preallocation_setting_wins(monkeypatch):
    monkeypatch.setenv(PREALLOCATE_ENV, "true")
    assert not share_device_memory(PipelineOptions(["--direct_running_mode", "multi_processing"]))
    assert os.environ[PREALLOCATE_ENV] == "true"
