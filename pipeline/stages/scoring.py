"""Task scoring and summary metrics, as pure functions of numpy arrays and plain values.

Per document: window outputs -> one scores-row fragment (embed, similarity, classify, loglik, choice).
Per run: Spearman/Pearson (scipy.stats), accuracy/macro-F1, corpus perplexity.
The task modules (pipeline/tasks/) call these; this module must not import them, Beam, files or the model.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np


# ---------------------------------------------------------------- per document

def pool_windows(window_embeddings: Sequence[np.ndarray]) -> np.ndarray:
    """Document embedding: the mean of its (normalised) window embeddings, L2-normalised again."""
    if len(window_embeddings) == 1:  # most documents: the mean is the window itself (np.mean costs ~10 us)
        mean = np.asarray(window_embeddings[0], np.float64)
    else:
        mean = np.mean(np.stack([np.asarray(w, np.float64) for w in window_embeddings]), axis=0)
    norm = math.sqrt(float(mean @ mean))  # np.linalg.norm's own formula, without its checks
    return (mean / norm if norm > 0 else mean).astype(np.float32)


def score_embed(window_embeddings: Sequence[np.ndarray]) -> dict[str, Any]:
    """The embedding as a float32 array, the table column's type: it converts to a Parquet column far faster
    than lists of Python floats (benchmarks/README.md, "Two small costs")."""
    return {"score": None, "embedding": pool_windows(window_embeddings)}


def softmax(values: np.ndarray) -> np.ndarray:
    """scipy.special.softmax's formula (the max subtracted first), without its import, which every command's
    start-up would pay, or its per-call dispatch, which costs more than the formula at one document's size."""
    exps = np.exp(values - np.max(values))
    return exps / exps.sum()


def score_similarity(window_embeddings: Sequence[np.ndarray], query_embeddings: Sequence[np.ndarray]) -> dict[str, Any]:
    """Cosine between the document and its query (both pooled and normalised), within [-1, 1]: the float32
    unit vectors' dot can pass 1 by ~1e-8, where arccos of the column would be NaN."""
    doc, query = pool_windows(window_embeddings), pool_windows(query_embeddings)
    return {"score": float(np.clip(np.dot(doc.astype(np.float64), query.astype(np.float64)), -1.0, 1.0))}  # NaN stays NaN


def score_classify(
    window_embeddings: Sequence[np.ndarray], label_names: Sequence[str], label_embeddings: np.ndarray, temperature: float
) -> dict[str, Any]:
    """Zero-shot: softmax(cosine(document, label description) / temperature); the top label wins."""
    doc = pool_windows(window_embeddings).astype(np.float64)
    cosines = np.asarray(label_embeddings, np.float64) @ doc
    with np.errstate(over="ignore"):  # max first: a tiny temperature then gives -inf (probability 0), not NaN
        probs = softmax((cosines - cosines.max()) / temperature)
    top = int(np.argmax(probs))
    return {
        "score": float(probs[top]),
        "label": str(label_names[top]),
        "scores": [{"label": str(n), "score": float(p)} for n, p in zip(label_names, probs)],
    }


def loglik_positions(window_len: int, window_index: int, stride: int, prefix_len: int, suffix_len: int = 0,
                     last: bool = True) -> slice:
    """Positions t of a window's next-token log-probs (t predicts token t+1) that score tokens not
    already scored by the previous window (windows overlap by `stride` text tokens after `prefix_len`
    special tokens). The `suffix_len` special tokens the tokenizer ends every window with (an end of
    sequence) are scored once, in the document's last window: elsewhere the text goes on."""
    first_new = 1 if window_index == 0 else max(1, prefix_len + stride)
    return slice(first_new - 1, window_len - 1 - (0 if last else suffix_len))


def score_loglik(window_logprobs: Sequence[np.ndarray], stride: int, prefix_len: int, suffix_len: int = 0,
                 truncated: bool = False) -> dict[str, Any]:
    """Total log-likelihood of the document's tokens (each counted once), their count, perplexity. The
    end-of-sequence tokens after the last window count only when that window is the document's end (not
    truncated: there the text goes on, and no end of sequence is in the document)."""
    total, count = 0.0, 0
    for i, logprobs in enumerate(window_logprobs):
        last = i == len(window_logprobs) - 1 and not truncated
        positions = loglik_positions(len(logprobs), i, stride, prefix_len, suffix_len, last=last)
        picked = np.asarray(logprobs, np.float64)[positions]
        total += float(picked.sum())
        count += int(picked.size)
    # no token scored (one token and nothing before it to predict it from): no score, not 0.0, the best one
    return {"score": total if count else None, "perplexity": perplexity(total, count), "loglik_tokens": count}


def perplexity(total_loglik: float, tokens: int) -> float | None:
    """exp(-total / tokens); inf past float's range (a mean above ~709.8 nats per token, a broken or very sharp
    model: its log-likelihood is still a number); None without tokens."""
    if not tokens:
        return None
    try:
        return math.exp(-total_loglik / tokens)
    except OverflowError:
        return math.inf


def continuation_logliks(window_logprobs: Sequence[np.ndarray], continuation_tokens: Sequence[int]) -> list[float]:
    """Per window, the log-likelihood of its last n tokens given the ones before (choice: a candidate after
    its context): the next-token log-probs at the n positions before the window's last, summed in float64."""
    logliks = []
    for logprobs, n in zip(window_logprobs, continuation_tokens, strict=True):
        if not 0 < n < len(logprobs):
            raise ValueError(f"a window of {len(logprobs)} tokens cannot score a continuation of {n}")
        logliks.append(float(np.asarray(logprobs, np.float64)[len(logprobs) - 1 - n : len(logprobs) - 1].sum()))
    return logliks


# ---------------------------------------------------------------- per run

def _correlation(test: str, x: Sequence[float], y: Sequence[float]) -> float | None:
    """scipy.stats.<test>(x, y).statistic, or None where it is undefined (fewer than 2 pairs, a constant side)."""
    if len(x) < 2:
        return None
    from scipy import stats  # here, not at the top: its import is slow and only a run's metrics need it

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.ConstantInputWarning)  # constant input: nan, reported as None
        value = float(getattr(stats, test)(np.asarray(x, np.float64), np.asarray(y, np.float64)).statistic)
    return value if math.isfinite(value) else None


def pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    return _correlation("pearsonr", x, y)


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Ties get their average rank."""
    return _correlation("spearmanr", x, y)


def accuracy(predicted: Sequence[str], gold: Sequence[str]) -> float | None:
    if not gold:
        return None
    return sum(p == g for p, g in zip(predicted, gold)) / len(gold)


def macro_f1(predicted: Sequence[str], gold: Sequence[str], labels: Sequence[str] | None = None) -> float | None:
    """Mean F1 over `labels` (default: every label seen in gold or predictions; as sklearn's macro)."""
    if not gold:
        return None
    labels = sorted(set(gold) | set(predicted)) if labels is None else list(labels)
    f1s = []
    for label in labels:
        tp = sum(p == label and g == label for p, g in zip(predicted, gold))
        fp = sum(p == label and g != label for p, g in zip(predicted, gold))
        fn = sum(p != label and g == label for p, g in zip(predicted, gold))
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return float(np.mean(f1s))


def corpus_perplexity(total_logliks: Sequence[float], token_counts: Sequence[int]) -> float | None:
    """exp(- sum of log-likelihoods / sum of scored tokens) over the whole corpus."""
    return perplexity(sum(total_logliks), sum(token_counts))


def as_number(value: Any) -> float | None:
    """A gold similarity label as a float (None when it is not a number, or an integer past float's range; text
    with an underscore, which Python's float() reads as a digit separator, is not a number: "1_0" is not 10)."""
    if isinstance(value, bool) or (isinstance(value, str) and "_" in value):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def similarity_metrics(pairs: Sequence[tuple[Any, Any]]) -> dict[str, Any]:
    """(cosine, gold) pairs -> spearman, pearson over the pairs whose gold is a number."""
    numeric = [(p, as_number(g)) for p, g in pairs if as_number(g) is not None]
    xs, ys = [p for p, _ in numeric], [g for _, g in numeric]
    return {"n_gold": len(numeric), "spearman": spearman(xs, ys), "pearson": pearson(xs, ys)}


def classify_metrics(pairs: Sequence[tuple[Any, Any]]) -> dict[str, Any]:
    """(label, gold label) pairs -> accuracy, macro_f1."""
    predicted, gold = [str(p) for p, _ in pairs], [str(g) for _, g in pairs]
    return {"n_gold": len(gold), "accuracy": accuracy(predicted, gold), "macro_f1": macro_f1(predicted, gold)}
