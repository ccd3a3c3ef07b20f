"""--task=loglik: each document's log-likelihood and perplexity under a decoder (per-token log-probs);
the run's corpus perplexity from sums, in constant memory."""
from __future__ import annotations

from pipeline.stages import scoring
from pipeline.tasks.base import DECODER, Task


def score(outputs, settings):
    return scoring.score_loglik(outputs.window_outputs, settings.stride, settings.prefix_len, settings.suffix_len,
                                truncated=outputs.truncated)


def prediction(fields, gold):
    """(total log-likelihood, scored tokens): the run sums both (a document with no scored token adds 0, 0)."""
    return fields.get("score") or 0.0, fields.get("loglik_tokens")


def metrics(totals):
    return {
        "n_docs": totals.documents,
        "loglik_tokens": int(totals.gold_sum),
        "total_loglik": totals.prediction_sum,
        "corpus_perplexity": scoring.corpus_perplexity([totals.prediction_sum], [totals.gold_sum]),
    }


TASK = Task(name="loglik", model=DECODER, score=score, per_token=True, prediction=prediction, gathers="sums",
            metrics=metrics, chart="scores", chart_column="perplexity", chart_axis="perplexity per document")
