"""Shadow kernel arithmetic: which batches are shadowed, divergence of outputs and scores, the gate."""
from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.stages import shadow


def test_batch_choice_is_deterministic_and_close_to_the_fraction():
    batches = [[f"doc-{i}-{j}" for j in range(4)] for i in range(2000)]
    chosen = [shadow.is_shadowed(b, 0.25) for b in batches]
    assert chosen == [shadow.is_shadowed(list(reversed(b)), 0.25) for b in batches]  # order inside a batch does not matter
    assert 0.22 < sum(chosen) / len(chosen) < 0.28
    assert not any(shadow.is_shadowed(b, 0.0) for b in batches[:50])
    assert all(shadow.is_shadowed(b, 1.0) for b in batches[:50])
    # a larger fraction keeps every batch a smaller one chose (the same hash, a higher threshold)
    assert all(shadow.is_shadowed(b, 0.5) for b, c in zip(batches, chosen) if c)


def test_divergence_of_outputs_and_scores():
    primary = [np.array([0.6, 0.8], np.float32), np.array([1.0, 0.0], np.float32)]
    shadowed = [np.array([0.6, 0.81], np.float32), np.array([1.0, -0.002], np.float32)]
    d = shadow.measure(primary, shadowed, {"score": 0.9, "label": "a"}, {"score": 0.85, "label": "b"})
    assert d.output_max_abs == pytest.approx(0.01, abs=1e-6)
    assert d.output_mean_abs == pytest.approx(0.012 / 4, abs=1e-6)
    assert d.score_abs == pytest.approx(0.05) and d.label_flip and d.output_scale == 1.0
    # embed: no score, the final output is the embedding
    e = shadow.measure(primary, primary, {"score": None, "embedding": [0.6, 0.8]}, {"score": None, "embedding": [0.6, 0.7]})
    assert e.output_max_abs == 0.0 and e.score_abs == pytest.approx(0.1) and not e.label_flip
    # log-probs are large: the tolerance is relative to the outputs' scale
    logp = shadow.measure([np.array([-20.0, -3.0])], [np.array([-20.001, -3.0])], {"score": -23.0}, {"score": -23.001})
    assert logp.output_scale == 20.0
    assert shadow.passes(logp, 1e-4) and not shadow.passes(logp, 1e-5)
    with pytest.raises(ValueError, match="window outputs"):
        shadow.measure(primary, primary[:1], {}, {})


def test_tolerances_and_totals():
    assert shadow.tolerance_for("float32") < shadow.tolerance_for("bfloat16")
    assert shadow.tolerance_for("float32", 0.5) == 0.5
    with pytest.raises(ValueError, match="--shadow_tolerance"):
        shadow.tolerance_for("float16")
    fine = shadow.Divergence(1e-7, 1e-8, 1.0, 1e-7, False)
    off = shadow.Divergence(3e-5, 1e-6, 1.0, 2e-3, True)
    combine = shadow.ShadowTotals(1e-5)
    left = combine.add_input(combine.create_accumulator(), fine)
    right = combine.add_input(combine.add_input(combine.create_accumulator(), off), fine)
    totals = combine.extract_output(combine.merge_accumulators([left, right]))
    assert totals["documents"] == 3 and totals["documents_over_tolerance"] == 1 and totals["label_flips"] == 1
    assert totals["output_max_abs_diff"] == 3e-5 and totals["worst_ratio_to_tolerance"] == pytest.approx(3.0)
    assert totals["output_mean_abs_diff"] == pytest.approx((1e-8 + 1e-6 + 1e-8) / 3)
    assert totals["score_max_abs_diff"] == 2e-3 and not totals["passed"]
    assert totals["score_mean_abs_diff"] == pytest.approx((1e-7 + 2e-3 + 1e-7) / 3)
    # a document neither kernel scored (a one-token loglik document) is compared by its outputs, not by its score
    unscored = shadow.measure([np.array([-2.0])], [np.array([-2.0])], {"score": None}, {"score": None})
    both = combine.extract_output(combine.add_input(right, unscored))
    assert both["documents"] == 3 and both["score_mean_abs_diff"] == pytest.approx((2e-3 + 1e-7) / 2)
    only_unscored = combine.extract_output(combine.add_input(combine.create_accumulator(), unscored))
    assert only_unscored["score_max_abs_diff"] is None and only_unscored["score_mean_abs_diff"] is None
    empty = combine.extract_output(combine.create_accumulator())
    # nothing shadowed: the gate did not run, so it neither passed nor failed
    assert empty["documents"] == 0 and empty["passed"] is None and empty["output_mean_abs_diff"] is None
    assert math.isnan(shadow.measure([np.zeros(2)], [np.zeros(2)], {}, {"embedding": [1.0]}).score_abs)


def test_a_shadow_kernel_giving_nan_is_counted_and_named_not_hidden_by_max():
    """max(0.1, NaN) keeps 0.1: a shadow kernel whose output was NaN failed the gate with figures under tolerance
    (1 over, max difference 1.2e-7, mean NaN) and a message that never said NaN. The NaN documents are counted."""
    fine = shadow.measure([np.ones(4, np.float32)], [np.ones(4, np.float32) + 1e-7], {"embedding": [0.5] * 4},
                          {"embedding": [0.5] * 4})
    broken = shadow.measure([np.ones(4, np.float32)], [np.full(4, np.nan, np.float32)], {"embedding": [0.5] * 4},
                            {"embedding": [np.nan] * 4})
    combine = shadow.ShadowTotals(1e-5)
    totals = combine.extract_output(combine.merge_accumulators(
        [combine.add_input(combine.create_accumulator(), fine), combine.add_input(combine.create_accumulator(), broken)]))
    assert totals["documents"] == 2 and totals["documents_over_tolerance"] == 1 and totals["documents_nan"] == 1
    assert totals["passed"] is False and totals["output_mean_abs_diff"] == pytest.approx(1e-7, rel=0.2)
    from pipeline import launch

    message = launch.shadow_gate_failure({"shadow": {**totals, "tolerance": 1e-5, "impl": "blockwise"},
                                          "kernel": {"resolved": "xla"}})
    assert "1 of them NaN from the shadow kernel alone" in message


# ---- end to end: docscore run with a shadow kernel (DirectRunner, MiniLM) ------------------------

from conftest import SENTENCES, common_flags, read_summary, read_table, run_docscore, write_jsonl  # noqa: E402
from kernels import table  # noqa: E402
from kernels.interface import Implementation  # noqa: E402
from kernels.xla import xla_attention  # noqa: E402


def perturbed_attention(q, k, v, *, segment_ids=None, causal=False, scale=None):
    """TEST ONLY: xla attention with every output 0.1% too large - a kernel that is subtly wrong."""
    return (xla_attention(q, k, v, segment_ids=segment_ids, causal=causal, scale=scale) * 1.001).astype(q.dtype)


@pytest.fixture
def perturbed_kernel(monkeypatch):
    implementation = Implementation(name="perturbed", backends=("cpu", "gpu", "tpu"), limits="test only",
                                    is_supported=lambda **_: (True, ""), call=perturbed_attention)
    monkeypatch.setitem(table.IMPLEMENTATIONS, "perturbed", implementation)
    return "perturbed"


@pytest.mark.integration
def test_a_perturbed_shadow_kernel_fails_the_gate(tmp_path, perturbed_kernel, capsys):
    shard = write_jsonl(tmp_path / "docs.jsonl", [{"id": f"s{i}", "text": t} for i, t in enumerate(SENTENCES[:6])])
    out = tmp_path / "out"
    from pipeline.stages import inference

    compiled_before = {id(m): m.compile_count for m in inference._MODELS.values()}
    code = run_docscore("--input", shard, *common_flags("bad", out), "--attention", "native",
                        "--shadow_attention", perturbed_kernel, "--shadow_fraction", "1")
    assert code == 3
    compiled = sum(m.compile_count - compiled_before.get(id(m), 0) for m in inference._MODELS.values())
    assert "shadow gate FAILED: 6 of 6 shadowed documents" in capsys.readouterr().err
    summary = read_summary(out, "bad")
    gate = summary["shadow"]
    assert (gate["impl"], gate["passed"], gate["documents"], gate["documents_over_tolerance"]) == ("perturbed", False, 6, 6)
    assert summary["compile"]["count"] == compiled >= 1  # the shadow kernel's programs are the run's compiles too
    # the shadow runs' time leaves compiling out, as infer_ms and the device's busy time (which holds it) do
    assert 0 < summary["shadow"]["time_ms"] <= summary["device"]["busy_s"] * 1000
    assert summary["gates"]["shadow"]["passed"] is False and "shadow gate FAILED" in summary["gates"]["shadow"]["message"]
    page = (out / "runs" / "run_id=bad" / "report.html").read_text()
    assert "class='banner failed'" in page and page.count("shadow gate FAILED") == 1  # said once, not twice
    scores, _ = read_table(out, "scores", "bad")
    assert set(scores.shadow_attention_impl) == {"perturbed"} and set(scores.attention_impl) == {"xla"}
    assert (scores.shadow_output_max_abs_diff > gate["tolerance"]).all()
    assert gate["output_max_abs_diff"] == scores.shadow_output_max_abs_diff.max()
    assert gate["score_max_abs_diff"] == scores.shadow_score_abs_diff.max() > 0


@pytest.mark.parametrize("flags, message", [
    (["--shadow_attention", "native"], "--shadow_attention=native resolves to xla, the kernel --attention=native already runs"),
    (["--shadow_attention", "flash", "--shadow_fraction", "0"], "--shadow_fraction=0.0 must be in (0, 1]"),
    (["--shadow_attention", "pallas_tpu"], "--shadow_attention=pallas_tpu cannot run on cpu"),
    (["--shadow_attention", "flash", "--shadow_tolerance", "-1"], "--shadow_tolerance=-1.0 must be > 0"),
])
def test_shadow_configuration_errors_exit_2_before_reading(tmp_path, capsys, flags, message):
    shard = write_jsonl(tmp_path / "docs.jsonl", [{"id": "a", "text": SENTENCES[0]}])
    assert run_docscore("--input", shard, *common_flags("cfg", tmp_path / "out"), "--attention", "native", *flags) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out" / "scores").exists()


@pytest.mark.parametrize("primary, suggested, not_suggested", [
    ("native", "use --shadow_attention=flash (blockwise on cpu) (", "native"),
    ("flash", "use --shadow_attention=native (", "flash"),
])
def test_a_refused_shadow_kernel_suggests_a_kernel_the_run_does_not_already_run(tmp_path, capsys, primary, suggested,
                                                                                not_suggested):
    """Shadowing with the primary kernel compares nothing, so a refusal does not suggest it."""
    shard = write_jsonl(tmp_path / "docs.jsonl", [{"id": "a", "text": SENTENCES[0]}])
    assert run_docscore("--input", shard, *common_flags("cfg", tmp_path / "out"), "--attention", primary,
                        "--shadow_attention", "cudnn") == 2
    err = capsys.readouterr().err
    assert "--shadow_attention=cudnn cannot run on cpu: it needs a GPU; " + suggested in err
    assert f"--shadow_attention={not_suggested}" not in err and "auto" not in err


def test_a_shadow_kernel_the_model_rules_out_is_refused_naming_its_own_flag(tmp_path, capsys, monkeypatch):
    """A kernel that runs the pipeline's rows but not this model's attention is refused at the model's load:
    the message names --shadow_attention (the flag that chose it), not --attention."""
    implementation = Implementation(name="no_models", backends=("cpu",), limits="test only",
                                    is_supported=lambda **info: (info.get("heads") is None, "test: no model's heads"),
                                    call=xla_attention)
    monkeypatch.setitem(table.IMPLEMENTATIONS, "no_models", implementation)
    shard = write_jsonl(tmp_path / "docs.jsonl", [{"id": "a", "text": SENTENCES[0]}])
    assert run_docscore("--input", shard, *common_flags("cfg", tmp_path / "out"), "--attention", "native",
                        "--shadow_attention", "no_models") == 2
    err = capsys.readouterr().err
    assert "--shadow_attention=no_models cannot run on cpu: test: no model's heads" in err and "--attention=no_models" not in err


def test_a_shadow_kernel_that_fails_the_batch_leaves_the_primary_batchs_metrics(tmp_path, monkeypatch):
    """The shadow kernel's error turns the batch into infer error rows; the primary kernel still ran and compiled
    it, and the summary says so (they were lost when the shadow raised)."""
    def failing(q, k, v, *, segment_ids=None, causal=False, scale=None):
        raise ValueError("this shadow kernel cannot run the pipeline's rows")

    implementation = Implementation(name="failing", backends=("cpu",), limits="test only",
                                    is_supported=lambda **_: (True, ""), call=failing)
    monkeypatch.setitem(table.IMPLEMENTATIONS, "failing", implementation)
    shard = write_jsonl(tmp_path / "docs.jsonl", [{"id": f"s{i}", "text": t} for i, t in enumerate(SENTENCES[:4])])
    out = tmp_path / "out"
    assert run_docscore("--input", shard, *common_flags("fails", out), "--attention", "native",
                        "--shadow_attention", "failing", "--shadow_fraction", "1") == 0
    summary = read_summary(out, "fails")
    assert summary["counts"]["errors_by_type"] == {"infer/ValueError": 4}
    assert summary["compile"]["model_calls"] >= 1 and summary["device"]["busy_s"] > 0


def test_shadowing_with_the_primarys_own_kernel_suggests_a_kernel_that_runs():
    """The "nothing to compare" refusal names another kernel that runs this model there: on a GPU in float32
    flash is refused (cudnn and pallas_gpu need 16-bit inputs), so it is blockwise, not flash."""
    from pipeline.stages.inference import ModelSpec, shared_model
    from pipeline.validate import other_kernel

    loaded = shared_model(ModelSpec("minilm-l6", attention="native", dtype="float32"))
    assert other_kernel("xla", "cpu", "float32", loaded) == "flash"
    assert other_kernel("blockwise", "cpu", "float32", loaded) == "native"
    assert other_kernel("xla", "gpu", "float32", loaded) == "blockwise"
    assert other_kernel("xla", "gpu", "bfloat16", loaded) == "flash"


def test_the_shadow_kernel_embeds_the_label_descriptions_itself():
    """classify's label embeddings are computed again through the shadow kernel at load, so a shadowed batch
    compares the two kernels end to end, labels included (not the primary's labels beside the shadow's documents)."""
    from pipeline import tasks
    from pipeline.stages.inference import FlaxModelHandler, ModelSpec, texts_embedder
    from pipeline.stages import batching

    labels = {"sport": "sports and games", "food": "cooking recipes with long descriptions " * 4}
    handler = FlaxModelHandler(ModelSpec("minilm-l6", attention="native"), task="classify", max_len=32, batch_size=8,
                               calls_per_beam_batch=32, kernel="xla", labels=labels,
                               shadow_spec=shadow.ShadowSpec("flash", "blockwise", 1.0, None, "float32"))
    model = handler.load_model()
    assert (model.loaded.attention, model.shadow_loaded.attention) == ("xla", "blockwise")
    shapes = batching.settings_for("cpu", batch_size=8).call_shapes(32)
    expected = tasks.get("classify").prepare(labels, texts_embedder(model.shadow_loaded, shapes, (0, 8)))
    np.testing.assert_array_equal(model.shadow_label_embeddings, expected.label_embeddings)
    # the two kernels' label embeddings differ in their last bits, so the check above tells them apart
    assert not np.array_equal(model.label_embeddings, expected.label_embeddings)


@pytest.mark.integration
def test_a_shadow_kernel_giving_nan_on_classify_fails_the_gate_not_the_run(tmp_path, monkeypatch, capsys):
    """The shadow kernel embeds the label descriptions too: when it gives NaN there, that is its divergence, which the
    gate reports over the published outputs (exit 3), not a fault of --labels that ends the run with nothing
    published (as it did: "--labels: the model embeds the description of 'a' as NaN")."""
    def nan_attention(q, k, v, *, segment_ids=None, causal=False, scale=None):
        return xla_attention(q, k, v, segment_ids=segment_ids, causal=causal, scale=scale) * np.nan

    monkeypatch.setitem(table.IMPLEMENTATIONS, "nan", Implementation(
        name="nan", backends=("cpu",), limits="test only", is_supported=lambda **_: (True, ""), call=nan_attention))
    shard = write_jsonl(tmp_path / "docs.jsonl", [{"id": f"s{i}", "text": t} for i, t in enumerate(SENTENCES[:4])])
    out = tmp_path / "out"
    assert run_docscore("--input", shard, *common_flags("nan", out), "--task", "classify", "--attention", "native",
                        "--labels", "code=about programming;food=about cooking",
                        "--shadow_attention", "nan", "--shadow_fraction", "1") == 3
    assert "4 of them NaN from the shadow kernel alone" in capsys.readouterr().err
    summary = read_summary(out, "nan")
    assert summary["counts"]["scored"] == 4 and summary["counts"]["errors"] == 0
    assert (summary["shadow"]["documents"], summary["shadow"]["documents_nan"]) == (4, 4)
    scores, _ = read_table(out, "scores", "nan")
    assert set(scores.label) <= {"code", "food"} and scores.score.notna().all()  # the primary's results, whole
