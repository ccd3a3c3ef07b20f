"""--task=similarity: cosine between each document and its record's `query` (encoder); a numeric gold
`label` gives the run's Spearman and Pearson correlations."""
from __future__ import annotations

from pipeline.stages import scoring
from pipeline.tasks.base import EMBEDDER, Task


def score(outputs, settings):
    return scoring.score_similarity(outputs.window_outputs, outputs.query_outputs)


def prediction(fields, gold):
    return fields.get("score"), gold


def metrics(totals):
    return scoring.similarity_metrics(totals.pairs)


TASK = Task(name="similarity", model=EMBEDDER, score=score, with_query=True, numeric_gold=True,
            prediction=prediction, gathers="gold_pairs", metrics=metrics,
            chart="scores", chart_column="score", chart_axis="score (cosine)")
