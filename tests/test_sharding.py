"""Data parallel through jax.sharding, on 4 CPU devices forced with
XLA_FLAGS=--xla_force_host_platform_device_count=4 in a subprocess (jax in this process already has one):
the model's inputs really are split over the 4 devices and its outputs equal the one-device ones."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from models.sharding import local_data_parallel
from tests.conftest import SENTENCES, TEST_BATCH, TEST_MAX_LEN

pytestmark = pytest.mark.integration  # README.md, "Development"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FOUR_DEVICES = """
    import json, sys
    import jax, numpy as np
    from models import sharding

    shardings = []  # what the model's batches were split into, seen through the real shard_rows
    real_shard_rows = sharding.DataParallel.shard_rows
    def recording_shard_rows(self, *arrays):
        placed, n = real_shard_rows(self, *arrays)
        shardings.append({"rows": n, "padded": int(placed[0].shape[0]),
                          "devices": sorted(d.id for d in placed[0].sharding.device_set),
                          "shard_shapes": [list(s.data.shape) for s in placed[0].addressable_shards]})
        return placed, n
    sharding.DataParallel.shard_rows = recording_shard_rows

    import models
    inputs = np.load(sys.argv[1])
    loaded = models.load("minilm-l6", attention="native")
    np.save(sys.argv[2], loaded.embed_packed(inputs["ids"], inputs["seg"], 1)[:, 0])
    print(json.dumps({"devices": jax.local_device_count(), "model_devices": loaded.parallel.n_devices,
                      "shardings": shardings}))
"""


def test_one_device_mesh_pads_nothing_but_empty_batches():
    parallel = local_data_parallel()
    assert parallel.n_devices == 1 and parallel.padded_rows(5) == 5 and parallel.padded_rows(0) == 1
    placed, n = parallel.shard_rows(np.ones((3, 4), np.int32), np.ones((3, 4), np.int32))
    assert n == 3 and [a.shape for a in placed] == [(3, 4), (3, 4)]


def test_batch_is_sharded_over_four_devices_with_one_device_results(minilm, tmp_path):
    rows = 6  # not a multiple of 4: the model pads to 8 rows and drops the padding's outputs
    encoded = minilm.tokenizer.encode_windows(SENTENCES[:rows], max_len=TEST_MAX_LEN, stride=0, max_windows=1)
    ids = np.zeros((TEST_BATCH, TEST_MAX_LEN), np.int32)
    seg = np.zeros((TEST_BATCH, TEST_MAX_LEN), np.int32)
    for r, doc in enumerate(encoded):
        ids[r, :len(doc.windows[0])], seg[r, :len(doc.windows[0])] = doc.windows[0], 1
    np.savez(tmp_path / "inputs.npz", ids=ids[:rows], seg=seg[:rows])
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(FOUR_DEVICES), str(tmp_path / "inputs.npz"),
                           str(tmp_path / "out.npy")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["devices"] == 4 and report["model_devices"] == 4
    assert report["shardings"] == [{"rows": rows, "padded": 8, "devices": [0, 1, 2, 3],
                                    "shard_shapes": [[2, TEST_MAX_LEN]] * 4}]
    four = np.load(tmp_path / "out.npy")
    one = minilm.embed_packed(ids, seg, 1)[:rows, 0]  # the shape the other tests compile: 8 rows, padding rows ignored
    assert four.shape == one.shape == (rows, 384)
    np.testing.assert_allclose(four, one, atol=1e-6)
