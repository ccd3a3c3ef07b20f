"""--task=classify: zero-shot labels from the --labels descriptions (encoder): the descriptions are embedded
once per model load; a gold `label` gives the run's accuracy and macro-F1."""
from __future__ import annotations

import numpy as np

from pipeline.stages import scoring
from pipeline.tasks.base import EMBEDDER, Prepared, Task


def prepare(labels, embed):
    names = tuple(labels)
    embeddings = embed([labels[n] for n in names])
    # a label embedded as NaN (a value overflowed inside the model) or as zeros (its norm overflowed) has no
    # direction: every document would tie on it, the first label winning with a NaN score
    unusable = [n for n, e in zip(names, embeddings) if not (np.isfinite(e).all() and np.any(e))]
    if unusable:
        raise ValueError(f"--labels: the model embeds the description of {unusable[0]!r} ({labels[unusable[0]]!r}) as "
                         f"{'NaN' if np.isnan(embeddings[names.index(unusable[0])]).any() else 'zeros'}: a value "
                         "overflowed inside the model, so no document can be compared with it; describe the class in "
                         "other words, or check the model's weights and --dtype")
    return Prepared(label_names=names, label_embeddings=embeddings)


def score(outputs, settings):
    return scoring.score_classify(outputs.window_outputs, outputs.label_names, outputs.label_embeddings,
                                  settings.temperature)


def prediction(fields, gold):
    return fields.get("label"), gold


def metrics(totals):
    return scoring.classify_metrics(totals.pairs)


TASK = Task(name="classify", model=EMBEDDER, score=score, takes_labels=True, prepare=prepare,
            prediction=prediction, gathers="gold_pairs", metrics=metrics, chart="labels")
