"""Shadow kernel arithmetic: which batches are shadowed, divergence of outputs and scores, the gate."""
from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline import shadow


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
    combine = shadow.ShadowTotals()
    left = combine.add_input(combine.create_accumulator(), (fine, 1e-5))
    right = combine.add_input(combine.add_input(combine.create_accumulator(), (off, 1e-5)), (fine, 1e-5))
    totals = combine.extract_output(combine.merge_accumulators([left, right]))
    assert totals["documents"] == 3 and totals["documents_over_tolerance"] == 1 and totals["label_flips"] == 1
    assert totals["output_max_abs_diff"] == 3e-5 and totals["worst_ratio_to_tolerance"] == pytest.approx(3.0)
    assert totals["output_mean_abs_diff"] == pytest.approx((1e-8 + 1e-6 + 1e-8) / 3)
    assert totals["score_max_abs_diff"] == 2e-3 and not totals["passed"]
    empty = combine.extract_output(combine.create_accumulator())
    assert empty["documents"] == 0 and empty["passed"] and empty["output_mean_abs_diff"] is None
    assert math.isnan(shadow.measure([np.zeros(2)], [np.zeros(2)], {}, {"embedding": [1.0]}).score_abs)
