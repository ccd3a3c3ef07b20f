"""--task=classify: zero-shot labels from the --labels descriptions (encoder): the descriptions are embedded
once per model load; a gold `label` gives the run's accuracy and macro-F1."""
from __future__ import annotations

from pipeline.stages import scoring
from pipeline.tasks.base import ENCODER, Prepared, Task


def prepare(labels, embed):
    names = tuple(labels)
    return Prepared(label_names=names, label_embeddings=embed([labels[n] for n in names]))


def score(outputs, settings):
    return scoring.score_classify(outputs.window_outputs, outputs.label_names, outputs.label_embeddings,
                                  settings.temperature)


def prediction(fields, gold):
    return fields.get("label"), gold


def metrics(totals):
    return scoring.classify_metrics(totals.pairs)


TASK = Task(name="classify", model=ENCODER, score=score, takes_labels=True, prepare=prepare,
            prediction=prediction, gathers="gold_pairs", metrics=metrics, chart="labels")
