"""Shadow kernel: a deterministic fraction of batches also runs through a second attention kernel,
and this module says which batches, how far the shadow's outputs and scores are from the primary's,
and whether that passes the tolerance for the dtype. Pure functions plus one CombineFn.
Must not load or run models (pipeline/stages/inference.py does) nor write files.
"""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
import numpy as np

# Largest max-absolute-difference of model outputs allowed, per compute dtype, relative to the
# outputs' scale (max(1, max |primary output|)): embeddings are unit vectors, log-probs are not.
# Set well above the kernels' measured differences (benchmarks/PERF_NOTES.md) to leave room for other
# inputs and backends.
TOLERANCE = {"float32": 1e-5, "bfloat16": 1e-2}


@dataclasses.dataclass(frozen=True)
class ShadowSpec:
    """The checked --shadow_* flags: which kernel shadows, on which share of batches, within what."""

    attention: str  # as requested (--shadow_attention): native | flash | IMPL
    kernel: str  # as resolved for the target backend
    fraction: float
    tolerance: float
    dtype: str

    def summary(self) -> dict[str, Any]:
        return {"attention": self.attention, "impl": self.kernel, "fraction": self.fraction,
                "tolerance": self.tolerance, "dtype": self.dtype}


@dataclasses.dataclass(frozen=True)
class Divergence:
    """How one document's shadow result differs from its primary result."""

    output_max_abs: float  # over every element of every window output (and query window)
    output_mean_abs: float
    output_scale: float  # max(1, max |primary output|): what the tolerance is relative to
    score_abs: float  # |score - shadow score|; embed: max |embedding - shadow embedding|
    label_flip: bool  # classify: the shadow predicts another label


def is_shadowed(doc_ids: Sequence[str], fraction: float) -> bool:
    """Whether a batch runs through the shadow kernel too: a hash of its documents, so the same batch
    is always chosen (or not) and about `fraction` of batches are."""
    if fraction <= 0.0:
        return False
    if fraction >= 1.0:
        return True
    digest = hashlib.sha256("\x00".join(sorted(doc_ids)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < fraction


def measure(
    primary_outputs: Sequence[np.ndarray],
    shadow_outputs: Sequence[np.ndarray],
    primary_fields: dict[str, Any],
    shadow_fields: dict[str, Any],
) -> Divergence:
    """One document: its window outputs from both kernels and the task fields scored from each."""
    if len(primary_outputs) != len(shadow_outputs):
        raise ValueError(f"shadow produced {len(shadow_outputs)} window outputs for {len(primary_outputs)} windows")
    a = np.concatenate([np.asarray(x, np.float64).ravel() for x in primary_outputs])
    b = np.concatenate([np.asarray(x, np.float64).ravel() for x in shadow_outputs])
    diff = np.abs(a - b)
    score_a, score_b = primary_fields.get("score"), shadow_fields.get("score")
    if score_a is not None and score_b is not None:
        score_abs = abs(float(score_a) - float(score_b))
    else:  # embed: the final output is the embedding
        ea, eb = (np.asarray([] if f.get("embedding") is None else f["embedding"], np.float64)
                  for f in (primary_fields, shadow_fields))
        score_abs = float(np.max(np.abs(ea - eb))) if ea.size and ea.shape == eb.shape else float("nan")
    return Divergence(
        output_max_abs=float(diff.max()) if diff.size else 0.0,
        output_mean_abs=float(diff.mean()) if diff.size else 0.0,
        output_scale=max(1.0, float(np.max(np.abs(a))) if a.size else 1.0),
        score_abs=score_abs,
        label_flip=primary_fields.get("label") != shadow_fields.get("label"),
    )


def tolerance_for(dtype: str, override: float | None = None) -> float:
    if override is not None:
        return float(override)
    if dtype not in TOLERANCE:
        raise ValueError(f"no shadow tolerance for dtype {dtype!r}; pass --shadow_tolerance or use {sorted(TOLERANCE)}")
    return TOLERANCE[dtype]


def passes(divergence: Divergence, tolerance: float) -> bool:
    return divergence.output_max_abs <= tolerance * divergence.output_scale


class ShadowTotals(beam.CombineFn):
    """Divergences of the shadowed documents -> the summary's "shadow" section (without config).
    "passed": True / False, or None when no document was shadowed (the gate did not run)."""

    def __init__(self, tolerance: float):
        self._tolerance = tolerance

    def create_accumulator(self):
        return {"documents": 0, "over": 0, "flips": 0, "nan": 0, "out_max": 0.0, "out_mean_sum": 0.0, "score_max": 0.0,
                "score_sum": 0.0, "scored": 0, "worst_ratio": 0.0}

    def add_input(self, acc, divergence: Divergence):
        tolerance = self._tolerance
        acc["documents"] += 1
        acc["over"] += 0 if passes(divergence, tolerance) else 1
        acc["flips"] += int(divergence.label_flip)
        if np.isnan(divergence.output_max_abs):  # the shadow kernel's output is NaN (the primary's never is here)
            acc["nan"] += 1
            return acc
        acc["out_max"] = max(acc["out_max"], divergence.output_max_abs)
        acc["out_mean_sum"] += divergence.output_mean_abs
        if not np.isnan(divergence.score_abs):
            acc["score_max"] = max(acc["score_max"], divergence.score_abs)
            acc["score_sum"] += divergence.score_abs
            acc["scored"] += 1
        acc["worst_ratio"] = max(acc["worst_ratio"], divergence.output_max_abs / (tolerance * divergence.output_scale))
        return acc

    def merge_accumulators(self, accumulators):
        merged = self.create_accumulator()
        for acc in accumulators:
            for key in ("documents", "over", "flips", "nan", "out_mean_sum", "score_sum", "scored"):
                merged[key] += acc[key]
            for key in ("out_max", "score_max", "worst_ratio"):
                merged[key] = max(merged[key], acc[key])
        return merged

    def extract_output(self, acc) -> dict[str, Any]:
        n = acc["documents"]
        return {
            "documents": n,
            "documents_over_tolerance": acc["over"],
            "label_flips": acc["flips"],
            "documents_nan": acc["nan"],
            "output_max_abs_diff": acc["out_max"] if n else None,  # no document compared: no difference measured
            "output_mean_abs_diff": acc["out_mean_sum"] / (n - acc["nan"]) if n > acc["nan"] else None,
            # over the documents with a score from both kernels (a one-token loglik document has none)
            "score_max_abs_diff": acc["score_max"] if acc["scored"] else None,
            "score_mean_abs_diff": acc["score_sum"] / acc["scored"] if acc["scored"] else None,
            "worst_ratio_to_tolerance": acc["worst_ratio"] if n else None,
            # no shadowed document compared nothing: neither passed nor failed (the launcher says why)
            "passed": acc["over"] == 0 if n else None,
        }
