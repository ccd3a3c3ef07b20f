"""Custom-call attention kernels under a device mesh (kernels/mesh.py): each device runs the kernel on its own
shard (batch on "data", heads on "model"), never on inputs the partitioner gathered.

On 4 CPU devices in a subprocess (jax in this process already has one): splash_tpu and pallas_tpu in TPU
interpret mode, pallas_gpu in Pallas's interpreter (mha(interpret=True)), and cudnn's adapter through jax's XLA
path, each under a 2x2 mesh and the GPU ones also under a 4x1 and a 1x4 (a ragged 129-token case under the 2x2
alone; Auto axes, as models/sharding.py builds it; and pallas_gpu
once under jax.make_mesh's Explicit axes, entered with jax.set_mesh), inside jax.jit on inputs placed on the
mesh. The subprocess has 5
devices (XLA_FLAGS=--xla_force_host_platform_device_count=5) and its meshes take devices 1-4: TPU interpret mode's
callbacks copy their arguments to CPU device 0 (jax.io_callback), which hangs when device 0 is itself running the
interpreted kernel that waits on them (seen here with jax 0.10.2 at 129 tokens on a mesh over devices 0-3).
Each output equals the same kernel unsharded and the float64 reference (kernels/reference.py; padding, packed
segments, causal, grouped-query), keeps the inputs' layout, and the compiled program moves no q/k/v between
devices (no all-gather, all-to-all, collective-permute nor all-reduce in its HLO).
Then the dispatch path: attention() runs a custom-call kernel per shard and the pure-JAX ones as they were, and
MiniLM (models.load) under its own 2x2 mesh with splash_tpu (interpreted) equals MiniLM with xla.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import mesh, table

pytestmark = pytest.mark.integration  # README.md, "Development"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOLERANCE = {"float32": 2e-5, "bfloat16": 2e-2}


# --- how a call is split (no devices needed) ---------------------------------------------------------------

def test_batch_on_data_heads_on_model():
    split = mesh.plan({"data": 2, "model": 2}, batch=4, heads=12, kv_heads=12)
    assert (split.batch, split.heads, split.kv_repeat, split.note) == (("data",), "model", 1, "")
    assert [str(s) for s in split.specs()] == ["P('data', None, 'model', None)", "P('data', None)"]
    split = mesh.plan({"data": 4, "model": 1}, batch=8, heads=12, kv_heads=4)
    assert (split.batch, split.heads, split.kv_repeat) == (("data",), None, 1)


def test_grouped_query_kv_heads_repeated_the_fewest_times_that_divide_the_model_axis():
    assert mesh.plan({"data": 1, "model": 4}, batch=2, heads=12, kv_heads=4).kv_repeat == 1  # one kv head each
    assert mesh.plan({"data": 1, "model": 4}, batch=2, heads=12, kv_heads=2).kv_repeat == 2  # 2 -> 4
    assert mesh.plan({"data": 1, "model": 4}, batch=2, heads=8, kv_heads=1).kv_repeat == 4  # multi-query
    assert mesh.plan({"data": 1, "model": 4}, batch=2, heads=12, kv_heads=6).kv_repeat == 2  # 6 -> 12, 3 each
    assert mesh.plan({"data": 1, "model": 8}, batch=2, heads=24, kv_heads=12).kv_repeat == 2  # gcd 4: 12 -> 24


def test_repeated_kv_heads_still_serve_their_query_heads():
    """Query head h meets kv head h // groups after the repeat and the split over the model axis, as the
    unsplit contract says: every shard of 12 query heads over 2 kv heads on 4 model shards is right."""
    heads, kv_heads, model = 12, 2, 4
    repeat = mesh.plan({"model": model}, batch=1, heads=heads, kv_heads=kv_heads).kv_repeat
    repeated = np.repeat(np.arange(kv_heads), repeat)  # original kv head of each repeated one
    per_shard_q, per_shard_kv = heads // model, len(repeated) // model
    for shard in range(model):
        local_kv = repeated[shard * per_shard_kv:(shard + 1) * per_shard_kv]
        for local_h in range(per_shard_q):
            h = shard * per_shard_q + local_h
            assert local_kv[local_h // (per_shard_q // per_shard_kv)] == h // (heads // kv_heads)


def test_what_does_not_divide_is_left_whole_and_said():
    split = mesh.plan({"data": 2, "model": 4}, batch=8, heads=6, kv_heads=6)  # heads do not divide: rows do
    assert (split.batch, split.heads, split.note) == (("data", "model"), None, "")
    split = mesh.plan({"data": 2, "model": 4}, batch=2, heads=6, kv_heads=6)
    assert (split.batch, split.heads) == (("data",), None) and "every model shard computes all heads" in split.note
    split = mesh.plan({"data": 4, "model": 1}, batch=3, heads=4, kv_heads=4)
    assert split.batch == () and "batch 3 does not divide the data axis (4)" in split.note
    split = mesh.plan({"data": 2, "model": 1, "stage": 2}, batch=4, heads=4, kv_heads=4)
    assert split.batch == ("data",) and "mesh axes ['stage'] are neither data nor model" in split.note


def test_only_the_custom_call_kernels_are_split_by_dispatch():
    assert {n for n, impl in table.IMPLEMENTATIONS.items() if impl.custom_call} == {
        "pallas_tpu", "splash_tpu", "pallas_gpu", "cudnn"}


def test_no_mesh_or_one_device_calls_the_kernel_as_it_is():
    q = jnp.ones((2, 8, 4, 16))
    seen = []

    def call(q, k, v, **kw):
        seen.append(q.shape)
        return q

    mesh.call_per_shard(call, q, q, q, segment_ids=None, causal=False, scale=1.0)
    one = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
    with jax.sharding.use_abstract_mesh(one.abstract_mesh):
        assert mesh.usable_mesh() is None
        mesh.call_per_shard(call, q, q, q, segment_ids=None, causal=False, scale=1.0)
    assert seen == [(2, 8, 4, 16)] * 2


# --- the kernels on 4 CPU devices ------------------------------------------------------------------------

# argv: a JSON list of cases; prints one JSON report per case, one line each.
KERNELS_ON_FOUR_DEVICES = """
    import contextlib, faulthandler, json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.experimental.pallas import tpu as pltpu
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from kernels import mesh as kmesh
    from kernels.cudnn import cudnn_attention
    from kernels.pallas_gpu import pallas_gpu_attention
    from kernels.pallas_tpu import pallas_tpu_attention
    from kernels.reference import reference_attention
    from kernels.splash_tpu import splash_tpu_attention

    CALLS = {  # each kernel as the CPU can run it (tests/test_kernels_parity.py runs them so unsharded)
        "splash_tpu": lambda q, k, v, **kw: splash_tpu_attention(q, k, v, batch_loop=True, **kw),
        "pallas_tpu": pallas_tpu_attention,
        "pallas_gpu": lambda q, k, v, **kw: pallas_gpu_attention(q, k, v, interpret=True, **kw),
        "cudnn": lambda q, k, v, **kw: cudnn_attention(q, k, v, implementation="xla", **kw),
    }
    TPU_INTERPRETED = ("splash_tpu", "pallas_tpu")

    def rows(batch, length, one_segment):
        # packed: two segments then padding, three segments filling the row, one segment, all padding (cycled)
        seg = np.zeros((batch, length), np.int32)
        a, b = max(1, length * 2 // 5), max(1, length * 3 // 4)
        for r in range(batch):
            kind = r % 4
            if one_segment:
                seg[r, :(length if kind == 0 else a if kind == 1 else 1 if kind == 2 else 0)] = 1 + kind % 2
            elif kind == 0:
                seg[r, :a], seg[r, a:b] = 1, 2
            elif kind == 1:
                seg[r, :a], seg[r, a:b], seg[r, b:] = 1, 2, 3
            elif kind == 2:
                seg[r] = 1
        return seg

    def collectives(hlo):
        return {op: hlo.count(op + "(") + hlo.count(op + "-start(")
                for op in ("all-gather", "all-to-all", "collective-permute", "all-reduce")}

    for case in json.loads(sys.argv[1]):
        data, model = case["mesh"]
        explicit = case.get("explicit", False)  # jax.make_mesh's Explicit axes, entered with jax.set_mesh
        m = (jax.make_mesh((data, model), ("data", "model"), devices=jax.devices()[1:]) if explicit
             else Mesh(np.array(jax.devices()[1:]).reshape(data, model), ("data", "model")))  # Auto, as models
        batch, length, heads, kv_heads, dim = case["shape"]
        rng = np.random.default_rng(case.get("seed", 0))
        dtype = case.get("dtype", "float32")
        q, k, v = (jnp.asarray(rng.standard_normal(s), dtype) for s in
                   ((batch, length, heads, dim), (batch, length, kv_heads, dim), (batch, length, kv_heads, dim)))
        seg = rows(batch, length, case["kernel"] == "cudnn") if case["segments"] else None
        call, causal, scale = CALLS[case["kernel"]], case["causal"], dim ** -0.5
        capped = {"soft_cap": case["soft_cap"]} if "soft_cap" in case else {}  # dispatch's option, as it passes it

        split = kmesh.plan(dict(m.shape), batch, heads, kv_heads)
        qkv_spec, seg_spec = split.specs()
        kv_spec = qkv_spec if kv_heads % model == 0 else P(qkv_spec[0])  # indivisible kv heads: placed whole
        if explicit:  # rows split, heads whole: the kernel's specs are not the inputs'
            qkv_spec = kv_spec = P(qkv_spec[0])
        placed = [jax.device_put(q, NamedSharding(m, qkv_spec)), jax.device_put(k, NamedSharding(m, kv_spec)),
                  jax.device_put(v, NamedSharding(m, kv_spec))]
        if seg is not None:
            placed.append(jax.device_put(jnp.asarray(seg), NamedSharding(m, seg_spec)))

        def sharded(q, k, v, *s):
            with contextlib.nullcontext() if explicit else jax.sharding.use_abstract_mesh(m.abstract_mesh):
                return kmesh.call_per_shard(call, q, k, v, segment_ids=s[0] if s else None, causal=causal,
                                            scale=scale, name=case["kernel"], **capped)

        def whole(q, k, v, *s):
            return call(q, k, v, segment_ids=s[0] if s else None, causal=causal, scale=scale, **capped)

        faulthandler.dump_traceback_later(180, exit=True)  # a hung interpreter fails the test, with its stack
        interpret = case["kernel"] in TPU_INTERPRETED
        mode = pltpu.force_tpu_interpret_mode if interpret else contextlib.nullcontext
        with mode():  # unsharded, on one device
            one = jax.jit(whole)(*(jnp.asarray(x) for x in (q, k, v)), *(() if seg is None else (jnp.asarray(seg),)))
            one.block_until_ready()
        if interpret:  # the interpreter's simulated devices are set up per run: one device, then four
            pltpu.reset_tpu_interpret_mode_state()
        with mode(), jax.set_mesh(m) if explicit else contextlib.nullcontext():  # set_mesh: outside jit only
            fn = jax.jit(sharded)
            out = fn(*placed)
            out.block_until_ready()
            hlo = fn.lower(*placed).compile().as_text()
            jaxpr = str(jax.make_jaxpr(sharded)(*placed))
            # the problem shard_map removes: the same kernel on the same placed inputs without it (compiled only)
            unwrapped = collectives(jax.jit(whole).lower(*placed).compile().as_text()) if interpret else None
        if interpret:
            pltpu.reset_tpu_interpret_mode_state()
        faulthandler.cancel_dump_traceback_later()
        f32 = lambda x: np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)
        ref = reference_attention(f32(q), f32(k), f32(v), segment_ids=seg, causal=causal, scale=scale, **capped)
        out64 = f32(out)
        print(json.dumps({
            "case": case, "shape": list(out.shape), "dtype": str(out.dtype),
            "sharding": str(out.sharding.spec),
            "shard_shapes": sorted({tuple(s.data.shape) for s in out.addressable_shards}),
            "vs_whole": float(np.abs(out64 - f32(one)).max()), "vs_reference": float(np.abs(out64 - ref).max()),
            "nan": bool(np.isnan(out64).any()),
            "padding_zero": None if seg is None else bool((out64[seg == 0] == 0).all()),
            "collectives": collectives(hlo), "unwrapped_collectives": unwrapped, "shard_map": "shard_map" in jaxpr,
            "kv_repeat": split.kv_repeat,
        }), flush=True)
"""


def four_devices(script: str, job, timeout: int = 900) -> list[dict]:
    """The reports `script` prints for `job` on 5 CPU devices (its meshes take devices 1-4: the docstring says why)."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=5"  # the suite's too (conftest)
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags)
    env.pop("DOCSCORE_DEVICE_MEMORY_BYTES", None)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script), json.dumps(job)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def kernel_cases() -> list[dict]:
    cases = []
    for kernel in ("splash_tpu", "pallas_tpu", "pallas_gpu", "cudnn"):
        # Each TPU-interpreted case costs 5-9 s whatever its size, so those kernels get the 2x2 mesh (rows and heads
        # split) and one bfloat16 case between them; how a mesh is split is kernels.mesh's, the same for every kernel,
        # and the cheap kernels take the 4x1 and 1x4 meshes.
        tpu = kernel in ("splash_tpu", "pallas_tpu")
        for data, model in ((2, 2),) if tpu else ((2, 2), (4, 1), (1, 4)):
            # packed segments and padding, causal, grouped-query (4 query heads over 2 kv heads)
            cases.append({"kernel": kernel, "mesh": [data, model], "shape": [4, 7, 4, 2, 32], "causal": True,
                          "segments": True, "seed": 1})
        # a ragged length (129: one block plus a tail), multi-query (kv heads repeated for the model axis), no segment
        # ids: on the mesh that splits both rows and heads
        cases.append({"kernel": kernel, "mesh": [2, 2], "shape": [4, 129, 4, 1, 32], "causal": False,
                      "segments": False, "seed": 2})
        if kernel != "pallas_tpu":
            cases.append({"kernel": kernel, "mesh": [2, 2], "shape": [4, 7, 4, 4, 32],
                          "causal": False, "segments": True, "seed": 3, "dtype": "bfloat16"})
    # Gemma 2's attention-logit soft cap reaches splash_tpu on every shard (a cap of 0.5 changes every output)
    cases.append({"kernel": "splash_tpu", "mesh": [2, 2], "shape": [4, 7, 4, 2, 32], "causal": True,
                  "segments": True, "seed": 5, "soft_cap": 0.5})
    # Explicit mesh axes: the inputs (rows split, heads whole) are resharded to the kernel's specs first
    cases.append({"kernel": "pallas_gpu", "mesh": [2, 2], "shape": [4, 7, 4, 2, 32], "causal": True,
                  "segments": True, "seed": 4, "explicit": True})
    return cases


@pytest.fixture(scope="module")
def kernel_reports() -> list[dict]:
    return four_devices(KERNELS_ON_FOUR_DEVICES, kernel_cases())


def test_custom_call_kernels_per_shard_equal_unsharded_and_reference(kernel_reports):
    cases = kernel_cases()
    assert [r["case"] for r in kernel_reports] == cases
    for report in kernel_reports:
        case = report["case"]
        data, model = case["mesh"]
        batch, length, heads, kv_heads, dim = case["shape"]
        where = f"{case['kernel']} on {data}x{model}, {case['shape']}"
        dtype = case.get("dtype", "float32")
        assert report["shape"] == [batch, length, heads, dim] and report["dtype"] == dtype, where
        assert report["shard_map"], where
        # batch over data, heads over model: each device holds its shard of the output, as of the inputs
        assert report["shard_shapes"] == [[batch // data, length, heads // model, dim]], (where, report)
        # the same kernel on each shard: bit for bit, but for XLA's fusion of cudnn's fallback path
        assert report["vs_whole"] <= (1e-6 if dtype == "float32" else 1e-2), (where, report)
        assert report["vs_reference"] <= TOLERANCE[dtype], (where, report)
        assert not report["nan"] and report["padding_zero"] in (None, True), (where, report)
        assert report["collectives"] == {"all-gather": 0, "all-to-all": 0, "collective-permute": 0,
                                         "all-reduce": 0}, (where, report)
        assert report["kv_repeat"] == (model // np.gcd(kv_heads, model) if model > 1 else 1), where


def test_without_shard_map_the_partitioner_gathers_the_tpu_kernels_inputs(kernel_reports):
    """What the check above would catch: the interpreted TPU kernels called as they are on the same placed inputs
    compile to a program that gathers q/k/v (XLA: "Involuntary full rematerialization")."""
    unwrapped = [r["unwrapped_collectives"] for r in kernel_reports
                 if r["case"]["kernel"] in ("pallas_tpu", "splash_tpu")]
    assert len(unwrapped) == 6 and all(c["all-gather"] > 0 for c in unwrapped), unwrapped


# argv: {"ids": [[...]], "seg": [[...]]}; prints one JSON report.
MODEL_ON_FOUR_DEVICES = """
    import dataclasses, faulthandler, json, math, os, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.experimental.pallas import tpu as pltpu
    import kernels, models
    from kernels import table
    from kernels.splash_tpu import splash_tpu_attention
    from models import loader, sharding
    from models.architecture import param_shapes

    faulthandler.dump_traceback_later(600, exit=True)
    job = json.loads(sys.argv[1])
    ids, seg = np.asarray(job["ids"], np.int32), np.asarray(job["seg"], np.int32)
    # splash_tpu as this CPU can run it: TPU interpret mode, one example per kernel call; still a custom call
    splash = table.IMPLEMENTATIONS["splash_tpu"]
    table.IMPLEMENTATIONS["splash_tpu"] = dataclasses.replace(
        splash, backends=("cpu", "tpu"),
        call=lambda q, k, v, **kw: splash_tpu_attention(q, k, v, batch_loop=True, **kw))
    choose = loader.choose_layout  # the model's own mesh choice, over devices 1-4 (the test's docstring says why)
    loader.choose_layout = lambda params, devices=None: choose(params, jax.devices()[1:])

    # dispatch: under a mesh of several devices a custom-call kernel runs in shard_map, xla as it was
    mesh = sharding.layout(jax.devices()[1:], 2).mesh
    q = jnp.ones((4, 16, 4, 8))
    def jaxpr_of(impl):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return str(jax.make_jaxpr(lambda q: kernels.attention(q, q, q, impl=impl))(q))
    report = {"dispatch": {impl: "shard_map" in jaxpr_of(impl) for impl in ("splash_tpu", "xla", "blockwise")}}

    native = models.load("minilm-l6", attention="native")
    expected = native.embed_packed(ids, seg, 1)[:, 0]
    report["runs"] = []
    budget = math.ceil(sharding.bytes_per_device(param_shapes(native.config), 2) / sharding.PARAM_SHARE) + 1
    os.environ[sharding.BUDGET_ENV] = str(budget)  # the model split over 2 (2x2); the kernel cases hold a 4x1 mesh
    loaded = models.load("minilm-l6", attention="splash_tpu")
    with pltpu.force_tpu_interpret_mode():
        got = loaded.embed_packed(ids, seg, 1)[:, 0]
    pltpu.reset_tpu_interpret_mode_state()
    report["runs"].append({"attention": loaded.attention, "mesh": loaded.parallel.summary()["mesh"],
                           "max_error": float(np.abs(got - expected).max()), "shape": list(got.shape)})
    print(json.dumps(report))
"""


def test_minilm_with_a_custom_call_kernel_under_its_mesh_equals_xla(minilm):
    """models.load under the model's own 2x2 mesh with splash_tpu (TPU interpret mode, registered for cpu here):
    every attention call goes through dispatch into shard_map, and the embeddings equal xla's."""
    from tests.test_sharding import minilm_rows

    ids, seg = minilm_rows(minilm, 6)
    report = four_devices(MODEL_ON_FOUR_DEVICES, {"ids": ids.tolist(), "seg": seg.tolist()})[-1]
    assert report["dispatch"] == {"splash_tpu": True, "xla": False, "blockwise": False}
    assert [r["mesh"] for r in report["runs"]] == [{"data": 2, "model": 2}]
    for run in report["runs"]:
        assert run["attention"] == "splash_tpu" and run["shape"] == [len(ids), 384], run
        assert run["max_error"] <= 1e-5, run
