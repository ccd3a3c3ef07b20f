"""--task=embed: each document's pooled, normalised embedding (encoder); no score, no metrics."""
from __future__ import annotations

from pipeline.stages import scoring
from pipeline.tasks.base import ENCODER, Task


def score(outputs, settings):
    return scoring.score_embed(outputs.window_outputs)


TASK = Task(name="embed", model=ENCODER, score=score)
