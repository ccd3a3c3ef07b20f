"""The simulated accelerator of benchmarks/pipeline_overhead.py (--device_us_per_row), whose measurements chose the
accelerators' default of parallel bundles: reading a call's result waits until the device has run it, calls run
one at a time in order, and the devices of several processes sharing a lock file take turns as one device."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from pipeline_overhead import SimulatedDevice  # noqa: E402

CALLS = """
import json, sys
import numpy as np
sys.path.insert(0, {benchmarks!r})
from pipeline_overhead import SimulatedDevice
device = SimulatedDevice(2000.0, {lock!r})  # 2 ms a row: 10 ms a call of 5 rows
results = [device.start(np.full((5, 3), i, np.float32)) for i in range(4)]
values = [float(np.asarray(r)[0, 0]) for r in results]
print(json.dumps({{"turns": device.turns, "values": values}}))
"""


def test_a_result_is_read_only_after_its_call_ran_and_calls_run_in_order():
    device = SimulatedDevice(2000.0)
    outputs = [np.full((5, 2), i, np.float32) for i in range(3)]
    results = [device.start(o) for o in outputs]  # returns at once: the device runs them in turn
    last = np.asarray(results[-1], dtype=np.float64)
    read_at = time.time()
    assert len(device.turns) == 3 and read_at >= device.turns[-1][1]  # it waited for its own call, the last
    np.testing.assert_array_equal(last, outputs[-1])
    assert last.dtype == np.float64  # np.asarray's dtype is honoured
    assert all(end - began >= 0.01 for began, end in device.turns)  # 5 rows of 2 ms
    assert all(a[1] <= b[0] for a, b in zip(device.turns, device.turns[1:]))  # one at a time, in order
    assert abs(device.busy_s - 3 * 0.01) < 1e-9


def test_the_devices_of_processes_sharing_a_lock_file_take_turns(tmp_path):
    code = CALLS.format(benchmarks=str(BENCHMARKS), lock=str(tmp_path / "device.lock"))
    launches = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    runs = [json.loads(p.communicate(timeout=120)[0]) for p in launches]
    assert all(p.returncode == 0 for p in launches)
    assert [run["values"] for run in runs] == [[0.0, 1.0, 2.0, 3.0]] * 2
    turns = sorted(tuple(t) for run in runs for t in run["turns"])
    assert len(turns) == 8 and all(a[1] <= b[0] for a, b in zip(turns, turns[1:]))  # never two calls at once
