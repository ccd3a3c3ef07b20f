"""Models over several devices through jax.sharding (models/sharding.py), on 4 CPU devices forced with
XLA_FLAGS=--xla_force_host_platform_device_count=4 in a subprocess (jax in this process already has one):
rows split over the data axis, weight matrices over the model axis when one device's memory budget
(DOCSCORE_DEVICE_MEMORY_BYTES) cannot hold the model, outputs equal to the one-device ones (f32, 1e-5),
the summary naming the mesh and why, and a model no device layout can hold refused before data is read."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from models import sharding
from models.architecture import param_shapes
from pipeline.telemetry import memory
from tests.conftest import SENTENCES, TEST_BATCH, TEST_MAX_LEN, common_flags, read_summary, run_docscore, write_jsonl

pytestmark = pytest.mark.integration  # README.md, "Development"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# argv: a JSON object {model, method, inputs, out, run (docscore run argv or null)}; prints one JSON report.
FOUR_DEVICES = """
    import json, sys
    import jax, numpy as np
    from models import sharding

    job = json.loads(sys.argv[1])
    calls = []  # what the model's batches were split into, seen through the real shard_rows
    real_shard_rows = sharding.MeshLayout.shard_rows
    def recording_shard_rows(self, *arrays):
        placed, n = real_shard_rows(self, *arrays)
        calls.append({"rows": n, "padded": int(placed[0].shape[0]),
                      "devices": sorted(d.id for d in placed[0].sharding.device_set),
                      "shard_shapes": sorted(list(s.data.shape) for s in placed[0].addressable_shards)})
        return placed, n
    sharding.MeshLayout.shard_rows = recording_shard_rows

    import models
    from pipeline.launch import main
    rc = main(job["run"]) if job["run"] else None
    loaded = models.load(job["model"], attention="native")
    inputs = np.load(job["inputs"])
    if job["method"] == "embed_packed":
        out = loaded.embed_packed(inputs["ids"], inputs["seg"], 1)[:, 0]
    else:
        out = loaded.token_logprobs(inputs["ids"], inputs["seg"])
    np.save(job["out"], out)
    params = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(loaded._state)[0]:
        name = sharding.path_name(path)
        if "/stacked/" in name or not name.startswith("layers/"):  # one entry per parameter of each stacked run
            params[name] = {"spec": str(leaf.sharding.spec), "devices": len(leaf.sharding.device_set),
                            "shards": sorted(list(s.data.shape) for s in leaf.addressable_shards)}
    print(json.dumps({"devices": jax.local_device_count(), "layout": loaded.parallel.summary(), "rc": rc,
                      "calls": calls[-1:], "params": params}))
"""


def four_devices(tmp_path, *, model: str, method: str, ids: np.ndarray, seg: np.ndarray, budget: int | None = None,
                 run: list[str] | None = None) -> tuple[dict, np.ndarray]:
    """(the subprocess's report, its model outputs) on 4 CPU devices, with a per-device budget if given."""
    np.savez(tmp_path / "inputs.npz", ids=ids, seg=seg)
    job = {"model": model, "method": method, "inputs": str(tmp_path / "inputs.npz"), "out": str(tmp_path / "out.npy"),
           "run": run}
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4")
    env.pop(sharding.BUDGET_ENV, None)
    if budget is not None:
        env[sharding.BUDGET_ENV] = str(budget)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(FOUR_DEVICES), json.dumps(job)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), np.load(tmp_path / "out.npy")


def budget_for(config, model_size: int) -> int:
    """A per-device budget that holds the parameters split over `model_size` devices and no fewer."""
    budget = math.ceil(sharding.bytes_per_device(param_shapes(config), model_size) / sharding.PARAM_SHARE) + 1
    assert sharding.bytes_per_device(param_shapes(config), model_size // 2 or 1) > sharding.PARAM_SHARE * budget \
        or model_size == 1
    return budget


def minilm_rows(minilm, rows: int) -> tuple[np.ndarray, np.ndarray]:
    encoded = minilm.tokenizer.encode_windows(SENTENCES[:rows], max_len=TEST_MAX_LEN, stride=0, max_windows=1)
    ids = np.zeros((TEST_BATCH, TEST_MAX_LEN), np.int32)
    seg = np.zeros((TEST_BATCH, TEST_MAX_LEN), np.int32)
    for r, doc in enumerate(encoded):
        ids[r, :len(doc.windows[0])], seg[r, :len(doc.windows[0])] = doc.windows[0], 1
    return ids, seg


def test_one_device_mesh_pads_nothing_but_empty_batches():
    parallel = sharding.local_data_parallel()
    assert (parallel.mesh.devices.size, parallel.data_size, parallel.model_size) == (1, 1, 1)
    assert parallel.padded_rows(5) == 5 and parallel.padded_rows(0) == 1
    placed, n = parallel.shard_rows(np.ones((3, 4), np.int32), np.ones((3, 4), np.int32))
    assert n == 3 and [a.shape for a in placed] == [(3, 4), (3, 4)]


def test_weights_split_on_heads_mlp_and_vocabulary_norms_copied(minilm):
    spec = lambda name, shape: sharding.partition_spec(name, shape, 4)
    assert spec("layers/0/attention/query/kernel", (384, 384)) == P(None, "model")  # output columns: heads
    assert spec("layers/0/attention/key/bias", (384,)) == P("model")
    assert spec("layers/0/attention/output/kernel", (384, 384)) == P("model", None)  # input rows: heads
    assert spec("layers/0/attention/output/bias", (384,)) == P()
    assert spec("layers/0/feed_forward/gate/kernel", (64, 112)) == P(None, "model")  # Llama's gated MLP
    assert spec("layers/0/feed_forward/down/kernel", (1536, 384)) == P("model", None)
    assert spec("token_embedding/embedding", (320, 64)) == P("model", None)  # vocabulary
    assert spec("embeddings/word/embedding", (30522, 384)) == P(None, "model")  # 30522 % 4: hidden instead
    assert spec("lm_head/kernel", (64, 320)) == P(None, "model")
    assert spec("layers/0/attention_norm/scale", (64,)) == spec("embeddings/position/embedding", (512, 384)) == P()
    assert spec("layers/0/feed_forward/up/kernel", (64, 110)) == P()  # indivisible: copied
    assert sharding.partition_spec("layers/0/attention/query/kernel", (384, 384), 1) == P()
    # stacked blocks (models/layers.py StackedBlocks): the leading layer axis whole, the rest as one block's
    assert spec("layers/stacked/attention/query/kernel", (6, 384, 384)) == P(None, None, "model")
    assert spec("layers/stacked/feed_forward/down/kernel", (6, 1536, 384)) == P(None, "model", None)
    assert spec("layers/stacked/attention_norm/scale", (6, 384)) == spec("layers/stacked/feed_forward/up/kernel", (6, 64, 110)) == P()
    shapes = param_shapes(minilm.config)
    whole = sharding.bytes_per_device(shapes, 1)
    assert whole == memory.parameter_count(minilm.config) * 4
    assert whole / 4 < sharding.bytes_per_device(shapes, 4) < whole / 2  # embeddings' hidden split, norms copied


def test_the_mesh_follows_the_budget_on_one_device(minilm, monkeypatch):
    shapes = param_shapes(minilm.config)
    monkeypatch.setenv(sharding.BUDGET_ENV, str(budget_for(minilm.config, 1)))
    chosen = sharding.choose_layout(shapes)
    assert chosen.summary()["mesh"] == {"data": 1, "model": 1}
    assert "fit one device" in chosen.reason and sharding.BUDGET_ENV in chosen.reason
    monkeypatch.setenv(sharding.BUDGET_ENV, str(10 * 2**20))
    with pytest.raises(sharding.ModelDoesNotFit, match=r"parameters \(86.1 MiB\) cannot fit this host: split over "
                                                        r"all 1 cpu device\(s\) each would hold 86.1 MiB"):
        sharding.choose_layout(shapes)


class FakeDevice:
    def __init__(self, id: int, stats: dict | None, platform: str = "gpu"):
        self.id, self.platform, self._stats = id, platform, stats

    def memory_stats(self):
        return self._stats


def test_the_room_is_the_fullest_devices_free_memory_or_the_host_shared(monkeypatch):
    import psutil

    monkeypatch.delenv(sharding.BUDGET_ENV, raising=False)
    gib = 2**30
    devices = [FakeDevice(0, {"bytes_limit": 16 * gib, "bytes_in_use": gib}),
               FakeDevice(1, {"bytes_limit": 16 * gib, "bytes_in_use": 4 * gib})]
    assert sharding.device_room(devices) == (12 * gib, "free on gpu:1 (memory_stats)")
    cpus = [FakeDevice(i, None, "cpu") for i in range(4)]  # CPU devices report no allocator: they share the host
    room, source = sharding.device_room(cpus)
    assert abs(room - psutil.virtual_memory().available // 4) < 2**28 and "shared by 4 cpu" in source
    monkeypatch.setenv(sharding.BUDGET_ENV, str(3 * gib))
    assert sharding.device_room(devices) == (3 * gib, f"the {sharding.BUDGET_ENV} budget")


def test_a_model_no_layout_can_hold_is_refused_before_data_is_read(monkeypatch, corpus, tmp_path, capsys, no_data_read):
    from pipeline.stages import inference

    monkeypatch.setattr(inference, "_MODELS", {})  # load again under the small budget
    monkeypatch.setenv(sharding.BUDGET_ENV, str(10 * 2**20))
    rc = run_docscore("--input", corpus, "--output", tmp_path / "out", "--run_id", "r1")
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "--model minilm-l6" in err and "cannot fit this host" in err and sharding.BUDGET_ENV in err, err
    assert no_data_read == [] and not (tmp_path / "out" / "scores").exists()


def test_rows_split_over_four_devices_when_the_model_fits_one(minilm, tmp_path):
    rows = 6  # not a multiple of 4: the model pads to 8 rows and drops the padding's outputs
    ids, seg = minilm_rows(minilm, rows)
    report, four = four_devices(tmp_path, model="minilm-l6", method="embed_packed", ids=ids[:rows], seg=seg[:rows])
    assert report["devices"] == 4 and report["layout"]["mesh"] == {"data": 4, "model": 1}
    assert report["calls"] == [{"rows": rows, "padded": 8, "devices": [0, 1, 2, 3],
                                "shard_shapes": [[2, TEST_MAX_LEN]] * 4}]
    assert report["params"]["layers/stacked/attention/query/kernel"]["shards"] == [[6, 384, 384]] * 4  # a copy on each
    one = minilm.embed_packed(ids, seg, 1)[:rows, 0]  # the shape the other tests compile: 8 rows, padding rows ignored
    assert four.shape == one.shape == (rows, 384)
    np.testing.assert_allclose(four, one, atol=1e-6)


def test_minilm_split_over_four_devices_equals_one_device_and_the_summary_says_so(minilm, tmp_path):
    rows = 6
    ids, seg = minilm_rows(minilm, rows)
    corpus = write_jsonl(tmp_path / "in" / "docs.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(SENTENCES)])
    out = tmp_path / "out"
    # --batch_size 6 runs as 8 rows a call, a multiple of the 4 devices: the summary records what ran
    run = ["--input", str(corpus), *common_flags("s4", out), "--attention", "native", "--batch_size", "6"]
    report, four = four_devices(tmp_path, model="minilm-l6", method="embed_packed", ids=ids[:rows], seg=seg[:rows],
                                budget=budget_for(minilm.config, 4), run=run)
    assert report["layout"]["mesh"] == {"data": 1, "model": 4}
    assert report["calls"] == [{"rows": rows, "padded": rows, "devices": [0, 1, 2, 3], "shard_shapes": [[rows, TEST_MAX_LEN]] * 4}]
    params = report["params"]
    # the blocks' parameters are stacked on a leading layer axis (6 layers), never split; the rest as one block's
    assert params["layers/stacked/attention/query/kernel"] == {"spec": "P(None, None, 'model')", "devices": 4,
                                                               "shards": [[6, 384, 96]] * 4}
    assert params["layers/stacked/feed_forward/down/kernel"]["shards"] == [[6, 384, 384]] * 4
    assert params["embeddings/word/embedding"]["shards"] == [[30522, 96]] * 4
    assert params["layers/stacked/output_norm/scale"]["shards"] == [[6, 384]] * 4  # copied
    np.testing.assert_allclose(four, minilm.embed_packed(ids, seg, 1)[:rows, 0], atol=1e-5, rtol=0)

    assert report["rc"] == 0
    batching = read_summary(out, "s4")["batching"]
    assert batching["batch_size"] == 8 and batching["beam_batch_tokens"] == 8 * TEST_MAX_LEN * batching["calls_per_beam_batch"]
    summary = read_summary(out, "s4")["model"]["sharding"]
    assert summary["mesh"] == {"data": 1, "model": 4} and len(summary["devices"]) == 4
    assert "split over 4 devices" in summary["reason"] and sharding.BUDGET_ENV in summary["reason"], summary


def packed_rows(vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, segment ids) of 6 rows of 64 tokens: whole rows, packed segments and padding, each row starting at id 1."""
    rng = np.random.default_rng(3)
    ids = rng.integers(3, vocab_size, (6, 64)).astype(np.int32)
    seg = np.ones((6, 64), np.int32)
    seg[1, 20:], seg[2, 40:], seg[3, 10:30], seg[3, 30:] = 2, 0, 2, 3  # packed rows and padding
    ids[:, 0] = 1
    return ids, seg


def test_a_llama_split_over_two_devices_per_row_shard_equals_one_device(tmp_path):
    """A tiny Llama (grouped-query, untied head) as a 2 x 2 mesh: rows over 2, weights over 2; a loglik run's
    summary says so."""
    import models
    from models.hf_import import convert_hf_dir
    from tests.test_models_llama import build_hf

    hf_dir = build_hf(tmp_path / "hf", "llama")
    model_dir = str(tmp_path / "docscore")
    convert_hf_dir(str(hf_dir), model_dir)
    loaded = models.load(model_dir, attention="native")
    ids, seg = packed_rows(loaded.config.vocab_size)
    corpus = write_jsonl(tmp_path / "in" / "docs.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(SENTENCES)])
    out = tmp_path / "out"
    run = ["--input", str(corpus), *common_flags("l4", out), "--task", "loglik", "--model", model_dir,
           "--attention", "native"]
    report, four = four_devices(tmp_path, model=model_dir, method="token_logprobs", ids=ids, seg=seg,
                                budget=budget_for(loaded.config, 2), run=run)
    assert report["layout"]["mesh"] == {"data": 2, "model": 2}
    assert report["calls"][0]["shard_shapes"] == [[3, 64]] * 4  # each row shard on both devices of its model shard
    params = report["params"]
    layers = loaded.config.num_layers  # stacked on a leading axis, never split
    assert params["layers/stacked/attention/key/kernel"]["shards"] == [[layers, 64, 16]] * 4  # 2 kv heads x 16: one head each
    assert params["layers/stacked/feed_forward/gate/kernel"]["shards"] == [[layers, 64, 56]] * 4
    assert params["lm_head/kernel"]["spec"] == "P(None, 'model')"
    np.testing.assert_allclose(four, loaded.token_logprobs(ids, seg), atol=1e-5, rtol=1e-5)  # sums in another order

    assert report["rc"] == 0
    summary = read_summary(out, "l4")
    assert summary["model"]["sharding"]["mesh"] == {"data": 2, "model": 2}
    assert summary["counts"]["scored"] == len(SENTENCES)


def decoder_on_four_devices(tmp_path, model_type: str, **config):
    """A tiny random `model_type` decoder (tests/test_models_llama.py build_hf), converted, its packed rows' token
    log-likelihoods computed on one device and on a 2 x 2 mesh its memory budget forces: (loaded model, ids,
    segment ids, the four-device run's report, its log-likelihoods)."""
    import models
    from models.hf_import import convert_hf_dir
    from tests.test_models_llama import build_hf

    hf_dir = build_hf(tmp_path / "hf", model_type, **config)
    model_dir = str(tmp_path / "docscore")
    convert_hf_dir(str(hf_dir), model_dir)
    loaded = models.load(model_dir, attention="native")
    ids, seg = packed_rows(loaded.config.vocab_size)
    report, four = four_devices(tmp_path, model=model_dir, method="token_logprobs", ids=ids, seg=seg,
                                budget=budget_for(loaded.config, 2))
    return loaded, ids, seg, report, four


def test_an_olmo2_whose_q_norm_spans_the_heads_a_model_axis_splits_equals_one_device(tmp_path):
    """OLMo 2 normalises q (and k) by one RMSNorm over all its heads, which a 2 x 2 mesh splits over the model axis:
    the norm's scale is copied to every device and its mean taken across them, so the split model scores as one
    device does."""
    loaded, ids, seg, report, four = decoder_on_four_devices(tmp_path, "olmo2")
    assert report["layout"]["mesh"] == {"data": 2, "model": 2}
    params, layers = report["params"], loaded.config.num_layers
    assert params["layers/stacked/attention/query/kernel"]["shards"] == [[layers, 64, 32]] * 4  # 2 of 4 heads each
    assert params["layers/stacked/attention/query_norm/scale"]["shards"] == [[layers, 64]] * 4  # all heads' scale
    np.testing.assert_allclose(four, loaded.token_logprobs(ids, seg), atol=1e-5, rtol=1e-5)  # sums in another order


def test_a_gemma3_stacked_by_its_periods_split_over_two_devices_per_row_shard_equals_one_device(tmp_path):
    """Gemma 3's blocks stacked by their repeating period (models/layers.py block_runs: local, local, global twice,
    then two local ones) as a 2 x 2 mesh: each stacked parameter split as one block's, its repeat axis whole."""
    local, full = "sliding_attention", "full_attention"
    loaded, ids, seg, report, four = decoder_on_four_devices(
        tmp_path, "gemma3", num_hidden_layers=8, layer_types=[local, local, full] * 2 + [local] * 2)
    assert report["layout"]["mesh"] == {"data": 2, "model": 2}
    params = report["params"]
    # the period's global layer (position 2) twice: 4 query heads x 32 split in two
    assert params["layers/0/stacked/2/attention/query/kernel"] == {"spec": "P(None, None, 'model')", "devices": 4,
                                                                   "shards": [[2, 64, 64]] * 4}
    assert params["layers/1/stacked/feed_forward/down/kernel"]["shards"] == [[2, 56, 64]] * 4  # the two local ones after
    assert params["layers/0/stacked/0/post_attention_norm/scale"]["shards"] == [[2, 64]] * 4  # copied
    np.testing.assert_allclose(four, loaded.token_logprobs(ids, seg), atol=1e-5, rtol=1e-5)  # sums in another order
