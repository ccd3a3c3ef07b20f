"""--task=embed: each document's pooled, normalised embedding (encoder); no score, no metrics."""
from __future__ import annotations

from pipeline.stages import scoring
from pipeline.tasks.base import EMBEDDER, Task


def score(outputs, settings):
    return scoring.score_embed(outputs.window_outputs)


TASK = Task(name="embed", model=EMBEDDER, score=score)
