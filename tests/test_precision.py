"""--dtype -> matmul precision (models/precision.py): float32 means true float32 dots, also in the
programs a LoadedModel lowers (XLA's GPU default may run float32 dots as TF32); bfloat16 stays native;
TF32 only as the named choice --matmul_precision tf32 (float32 on a GPU), refused elsewhere before any
data is read, and recorded in the summary."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.xla import xla_attention
from models.precision import choice_problem, matmul_precision, with_matmul_precision
from tests.conftest import common_flags, read_summary, run_docscore

pytest_plugins = ["gcs_support"]


def test_dtype_to_precision():
    assert matmul_precision("float32") == "highest"
    assert matmul_precision("bfloat16") == "default"
    with pytest.raises(ValueError, match="no matmul precision is defined for dtype 'tf32'"):
        matmul_precision("tf32")


def test_dots_without_their_own_precision_trace_under_it():
    x = jnp.ones((4, 4), jnp.float32)
    dot = lambda a, b: a @ b
    assert "HIGHEST" in str(jax.make_jaxpr(with_matmul_precision(dot, "highest"))(x, x))
    assert "HIGHEST" not in str(jax.make_jaxpr(with_matmul_precision(dot, "default"))(x, x))
    # an explicit precision is still the dot's own
    explicit = lambda a, b: jnp.matmul(a, b, precision=jax.lax.Precision.DEFAULT)
    assert "HIGHEST" not in str(jax.make_jaxpr(with_matmul_precision(explicit, "highest"))(x, x))


def test_float32_model_lowers_every_dot_at_highest(minilm):
    """The whole float32 embed program, attention kernel included (its einsums name no precision)."""
    assert minilm.dtype == "float32" and minilm.matmul_precision == "highest"
    ids, seg = np.ones((2, 16), np.int32), np.ones((2, 16), np.int32)
    # the program _run compiles (private: the lowered text is the only place precision shows)
    text = minilm._functions["embed_packed"].lower(minilm._state, ids, seg, 1).as_text()
    dots = re.findall(r"stablehlo\.dot_general.*", text)
    assert dots and all("HIGHEST" in line for line in dots), [d for d in dots if "HIGHEST" not in d][:2]


def test_named_choices():
    assert matmul_precision("float32", "float32") == matmul_precision("float32") == "highest"
    assert matmul_precision("float32", "tf32") == "TF32_TF32_F32"  # jax's explicit dot algorithm preset
    assert choice_problem("float32", None, "cpu") is None and choice_problem("bfloat16", None, "tpu") is None
    assert choice_problem("float32", "tf32", "gpu") is None and choice_problem("float32", "float32", "tpu") is None
    assert "needs a GPU" in choice_problem("float32", "tf32", "tpu")
    assert "applies to --dtype float32 only" in choice_problem("bfloat16", "float32")
    assert "is not known" in choice_problem("float32", "tensorfloat32")
    with pytest.raises(ValueError, match="--matmul_precision=tf32 applies to --dtype float32 only"):
        matmul_precision("bfloat16", "tf32")


def _dots_of(fn, *args, platform: str) -> list[str]:
    """The dot_general lines of `fn` lowered for `platform` (lowering needs no such device here)."""
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    text = jax.jit(fn).trace(*shapes).lower(lowering_platforms=(platform,)).as_text()
    return re.findall(r"stablehlo\.dot_general.*", text)


@pytest.mark.parametrize("choice,mark", [("float32", "HIGHEST"), ("tf32", "lhs_precision_type = tf32")])
def test_the_choice_reaches_the_compiled_matmuls(choice, mark):
    """A dense layer and the attention kernel's einsums (which name no precision of their own), traced the way
    LoadedModel traces a model (with_matmul_precision) and lowered for a GPU from this CPU machine: every
    dot carries the choice (tf32: the TF32 x TF32 -> float32 algorithm; float32: HIGHEST)."""
    def layer(x, w, seg):
        h = x @ w  # [B, L, 64]
        q = h.reshape(*h.shape[:2], 4, 16)
        return xla_attention(q, q, q, segment_ids=seg, causal=False)

    x, w = jnp.ones((2, 8, 32), jnp.float32), jnp.ones((32, 64), jnp.float32)
    seg = jnp.ones((2, 8), jnp.int32)
    dots = _dots_of(with_matmul_precision(layer, matmul_precision("float32", choice)), x, w, seg, platform="cuda")
    assert len(dots) == 3 and all(mark in d for d in dots), dots
    other = "lhs_precision_type = tf32" if choice == "float32" else "HIGHEST"
    assert not any(other in d for d in dots)


@pytest.mark.parametrize("flags,message", [
    (["--matmul_precision", "tf32"], "--matmul_precision=tf32 needs a GPU"),
    (["--matmul_precision", "tf32", "--dtype", "bfloat16"], "--matmul_precision=tf32 applies to --dtype float32 only"),
    (["--matmul_precision", "float32", "--dtype", "bfloat16"], "drop --matmul_precision, or use --dtype float32"),
    (["--matmul_precision", "tensorfloat32"], "--matmul_precision=tensorfloat32 is not known"),
])
def test_an_impossible_choice_exits_2_before_reading_data(flags, message, tmp_path, corpus, no_data_read, capsys):
    rc = run_docscore("--input", corpus, "--output", tmp_path / "out", "--run_id", "r1", *flags)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert message in err, err
    assert no_data_read == [] and not (tmp_path / "out" / "scores").exists()


@pytest.mark.parametrize("flags,expected", [(["--matmul_precision", "float32"], "highest"),
                                            (["--dtype", "bfloat16"], "default")])
def test_the_summary_records_the_precision(flags, expected, tmp_path, corpus):
    out = tmp_path / "out"
    assert run_docscore("--input", corpus, *common_flags("p1", out), *flags) == 0
    model = read_summary(out, "p1")["model"]
    assert model["matmul_precision"] == expected
    assert model["dtype"] == ("bfloat16" if "bfloat16" in flags else "float32")


def _model_dots(loaded, method: str, *static: int) -> list[str]:
    """The dot_general lines of the program LoadedModel.start compiles for `method`, lowered for a GPU from this
    CPU machine (private _functions/_state: the lowered text is the only place precision shows)."""
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), loaded._state)
    ids = jax.ShapeDtypeStruct((2, 16), jnp.int32)
    text = loaded._functions[method].trace(shapes, ids, ids, *static).lower(lowering_platforms=("cuda",)).as_text()
    return re.findall(r"stablehlo\.dot_general.*", text)


@pytest.mark.parametrize("choice,mark", [(None, "HIGHEST"), ("float32", "HIGHEST"), ("tf32", "lhs_precision_type = tf32")])
def test_a_loaded_model_compiles_the_precision_it_records(choice, mark, minilm, tiny_gpt2_dir):
    """models.load(matmul_precision=...) -> every dot of the model's programs at that precision (dense layers,
    attention, GPT-2's tied LM head), the one LoadedModel.matmul_precision and the summary name; the encoder's
    pooling einsum alone stays HIGHEST. tf32 cannot load on this CPU, so the loaded models are rebuilt with the
    choice (dataclasses.replace runs LoadedModel's tracing set-up again)."""
    import dataclasses

    import models

    gpt2 = models.load(tiny_gpt2_dir, attention="native")
    for loaded, method, static in ((minilm, "embed_packed", (1,)), (gpt2, "token_logprobs", ())):
        chosen = dataclasses.replace(loaded, precision_choice=choice)
        assert chosen.matmul_precision == matmul_precision("float32", choice)
        dots = _model_dots(chosen, method, *static)
        others = [d for d in dots if mark not in d]  # the pooling einsum under tf32, nothing else
        assert len(others) == (1 if method == "embed_packed" and choice == "tf32" else 0), others
        assert len(dots) >= 6 and all("HIGHEST" in d for d in others), dots


def test_tf32_is_refused_by_the_loader_off_gpu(minilm):
    import models

    with pytest.raises(models.ModelLoadError, match="--matmul_precision=tf32 needs a GPU"):
        models.load("minilm-l6", attention="native", matmul_precision="tf32")


def test_tf32_for_gpu_workers_reaches_their_model_spec_and_the_summary(gcs_corpus, tmp_path):
    """A Dataflow GPU run: validation checks the model on this CPU at its own precision, and the workers'
    ModelSpec (what shared_model loads) and the summary carry tf32."""
    from pipeline.options import parse_options
    from pipeline.runs.summary import launch_facts
    from pipeline.validate import validate

    _, eo = parse_options(["--input", gcs_corpus, "--output", "bq:docscore-test.evals.nightly", "--run_id", "r1",
                           "--temp_location", "gs://docscore-test-bucket/tmp", "--project", "docscore-test", "--region", "r",
                           "--matmul_precision", "tf32", "--target_backend", "gpu", "--runner", "DataflowRunner",
                           "--sdk_container_image", "img:test", "--experiments", "no_use_multiple_sdk_containers",
                           "--dataflow_service_options", "worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver"])
    plan = validate(eo)
    assert plan.model_spec.matmul_precision == "tf32"
    facts = launch_facts(eo, plan, 0.0)
    model = facts["model"]
    assert facts["runner"] == {"runner": "DataflowRunner"}  # not the DirectRunner's defaults Beam gives every run
    assert model["matmul_precision"] == "TF32_TF32_F32"
    assert model["sharding"]["mesh"] is None and "each gpu worker" in model["sharding"]["reason"]  # not this CPU's
