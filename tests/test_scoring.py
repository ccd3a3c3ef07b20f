"""Task scoring and summary metrics as pure functions, checked against hand computations, and the rows and error rows
postprocess makes of them."""
from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.stages import scoring


def unit(v):
    v = np.asarray(v, np.float64)
    return v / np.linalg.norm(v)


def test_pool_windows_is_the_normalised_mean():
    a, b = unit([1, 0, 0]), unit([0, 1, 0])
    np.testing.assert_allclose(scoring.pool_windows([a, b]), unit([1, 1, 0]), atol=1e-7)
    embedding = scoring.score_embed([a])["embedding"]
    assert embedding.dtype == np.float32  # the scores.embedding column's type (pyarrow converts it at once)
    np.testing.assert_allclose(embedding, a, atol=1e-7)


def test_similarity_is_the_cosine_of_pooled_document_and_query():
    doc, query = unit([1, 2, 3]), unit([3, 2, 1])
    assert scoring.score_similarity([doc], [query])["score"] == pytest.approx(float(doc @ query), abs=1e-7)


def test_similarity_stays_within_minus_one_and_one():
    """A document scored against itself: its float32 unit vector's float64 dot with itself passes 1 (by 1.1e-8
    for this one), which the score must not (arccos of the column)."""
    v = np.random.default_rng(0).standard_normal((3, 384)).astype(np.float32)[2]
    pooled = scoring.pool_windows([v]).astype(np.float64)
    assert pooled @ pooled > 1.0
    assert scoring.score_similarity([v], [v])["score"] == 1.0
    assert scoring.score_similarity([v], [-v])["score"] == -1.0
    broken = np.full(384, np.nan, np.float32)  # a model output gone NaN stays NaN (metrics then say None), not -1
    assert math.isnan(scoring.score_similarity([broken], [v])["score"])
    assert math.isnan(scoring.score_similarity([v], [broken])["score"])


def test_classify_softmax_with_temperature_and_top_label():
    doc = unit([1, 0.2, 0])
    labels = np.stack([unit([1, 0, 0]), unit([0, 1, 0]), unit([0, 0, 1])])
    result = scoring.score_classify([doc], ["a", "b", "c"], labels, temperature=0.1)
    cos = labels @ doc
    expected = np.exp(cos / 0.1) / np.exp(cos / 0.1).sum()
    assert result["label"] == "a" and result["score"] == pytest.approx(expected[0], rel=1e-6)
    assert [s["label"] for s in result["scores"]] == ["a", "b", "c"]
    np.testing.assert_allclose([s["score"] for s in result["scores"]], expected, rtol=1e-6)  # float32 pooling


def test_a_temperature_near_zero_gives_the_top_label_all_of_the_probability():
    """cosines / 1e-320 were inf and their softmax NaN for every label, every document labelled the first one."""
    doc = unit([1, 0.2, 0])
    labels = np.stack([unit([0, 1, 0]), unit([1, 0, 0]), unit([0, 0, 1])])
    result = scoring.score_classify([doc], ["a", "b", "c"], labels, temperature=1e-320)
    assert result["label"] == "b" and [s["score"] for s in result["scores"]] == [0.0, 1.0, 0.0]


def test_a_perplexity_past_floats_range_is_inf_and_the_log_likelihood_stays():
    """A very sharp or broken model's mean of 63,152 nats per token: math.exp raised OverflowError, and each such
    document became a `score` error row, leaving the scores and the corpus perplexity without the worst documents."""
    result = scoring.score_loglik([np.array([-1.0, -6e4, -8e4, 0.0])], stride=0, prefix_len=0)
    assert (result["score"], result["perplexity"], result["loglik_tokens"]) == (-140001.0, math.inf, 3)
    assert scoring.corpus_perplexity([-140001.0, -2.0], [3, 2]) == math.inf
    assert scoring.perplexity(-709.0, 1) == pytest.approx(math.exp(709.0))


def test_loglik_counts_each_token_once_across_overlapping_windows():
    # a text of 10 tokens, windows of 6 with 2 overlapping (no special tokens): [0..5], [4..9]
    tokens = np.arange(10)
    logp = {t: -0.1 * (t + 1) for t in tokens}  # log p(token t | tokens before t)
    w0 = np.array([logp[t] for t in range(1, 6)] + [0.0])  # position i predicts token i+1
    w1 = np.array([logp[t] for t in range(5, 10)] + [0.0])  # window 1 starts at token 4
    result = scoring.score_loglik([w0, w1], stride=2, prefix_len=0)
    assert result["loglik_tokens"] == 9  # tokens 1..9: token 0 has no context
    assert result["score"] == pytest.approx(sum(logp[t] for t in range(1, 10)))
    assert result["perplexity"] == pytest.approx(math.exp(-result["score"] / 9))


def test_loglik_scores_the_end_of_sequence_token_once_in_the_last_window():
    # windows <s> text </s> (prefix 1, suffix 1) of 8 tokens, 6 of text, 2 overlapping: text tokens 0..5, 4..9, 8..11
    logp_text = {t: -0.1 * (t + 1) for t in range(12)}  # log p(text token t | the tokens before it)
    logp_eos = -3.0  # log p(</s> | the text so far)

    def window(first: int, last: int) -> np.ndarray:  # position i predicts token i + 1
        predicts = [logp_text[t] for t in range(first, last + 1)] + [logp_eos]
        return np.array(predicts + [0.0])

    windows = [window(0, 5), window(4, 9), window(8, 11)]
    result = scoring.score_loglik(windows, stride=2, prefix_len=1, suffix_len=1)
    assert result["loglik_tokens"] == 12 + 1  # every text token once, and one end of sequence
    assert result["score"] == pytest.approx(sum(logp_text.values()) + logp_eos)
    # --max_chunks cut the document after these windows: its text goes on, so no end of sequence is scored
    cut = scoring.score_loglik(windows, stride=2, prefix_len=1, suffix_len=1, truncated=True)
    assert cut["loglik_tokens"] == 12 and cut["score"] == pytest.approx(sum(logp_text.values()))


def test_spearman_and_pearson_by_hand_with_ties_and_undefined_cases():
    x, y = [1.0, 2.0, 3.0, 4.0], [10.0, 10.0, 20.0, 40.0]  # y's tie shares ranks 1 and 2: 1.5 each
    assert scoring.pearson(x, y) == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-12)
    assert scoring.spearman(x, y) == pytest.approx(np.corrcoef(x, [1.5, 1.5, 3.0, 4.0])[0, 1], abs=1e-12)
    assert scoring.spearman([1.0, 2.0, 3.0], [9.0, 4.0, 1.0]) == pytest.approx(-1.0)  # monotone, not linear
    assert scoring.spearman([1.0], [2.0]) is None and scoring.pearson([], []) is None  # fewer than 2 pairs
    assert scoring.pearson([1.0, 2.0, 3.0], [5.0, 5.0, 5.0]) is None  # a constant side: undefined, not nan
    assert scoring.spearman([1.0, 2.0, 3.0], [5.0, 5.0, 5.0]) is None


def test_accuracy_and_macro_f1_by_hand():
    gold = ["a", "a", "b", "b", "c"]
    pred = ["a", "b", "b", "b", "a"]
    assert scoring.accuracy(pred, gold) == pytest.approx(3 / 5)
    f1_a = 2 * 1 / (2 * 1 + 1 + 1)  # tp 1, fp 1 (last), fn 1 (second)
    f1_b = 2 * 2 / (2 * 2 + 1 + 0)
    f1_c = 0.0
    assert scoring.macro_f1(pred, gold) == pytest.approx((f1_a + f1_b + f1_c) / 3)



def test_macro_f1_counts_a_label_only_ever_predicted():
    """As sklearn's macro F1 (f1_score(gold, predicted, average="macro") is 1/3 here): a label the model predicts
    but no gold names (c) is a class with F1 0, and the mean is over a, b and c; over the gold labels alone it
    would be 1/2, a wrong prediction of an unseen label costing less than a wrong one of a seen label."""
    predicted, gold = ["a", "a", "c"], ["a", "a", "b"]
    assert scoring.macro_f1(predicted, gold) == pytest.approx((1.0 + 0.0 + 0.0) / 3)
    assert scoring.classify_metrics(list(zip(predicted, gold)))["macro_f1"] == pytest.approx(1 / 3)


def test_two_gold_pairs_have_a_correlation():
    """Two pairs are the fewest a correlation is defined for: +1 or -1 (scipy's), not None, so a run with two
    labelled similarity records still reports its correlations."""
    assert scoring.pearson([0.1, 0.9], [0.0, 1.0]) == pytest.approx(1.0)
    assert scoring.pearson([0.1, 0.9], [1.0, 0.0]) == pytest.approx(-1.0)
    assert scoring.spearman([0.1, 0.9], [1.0, 0.0]) == pytest.approx(-1.0)
    m = scoring.similarity_metrics([(0.1, 0.0), (0.9, 1.0)])
    assert m["n_gold"] == 2 and m["pearson"] == pytest.approx(1.0) and m["spearman"] == pytest.approx(1.0)


def test_softmax_of_very_negative_log_likelihoods_is_finite():
    """A long candidate's log-likelihood is hundreds of nats below 0: exp(-800) underflows to 0, so the max is
    subtracted first (as scipy.special.softmax), or every probability would be 0 / 0 = NaN."""
    with np.errstate(all="raise"):  # an underflow to 0 / 0 is an error here, not a warning
        probs = scoring.softmax(np.array([-800.0, -801.0]))
    assert probs == pytest.approx([1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1))])

def test_task_metrics_and_corpus_perplexity():
    m = scoring.similarity_metrics([(0.9, "1.0"), (0.1, 0), (0.5, "x"), (0.4, 0.5)])
    assert m["n_gold"] == 3 and m["spearman"] == pytest.approx(1.0)
    assert scoring.corpus_perplexity([-10.0, -5.0], [4, 6]) == pytest.approx(math.exp(15 / 10))


def test_a_gold_label_that_names_nothing_is_no_gold():
    """JSON NaN/Infinity (and Parquet NaN) labels counted as classes "nan"/"inf" in accuracy and macro-F1; they
    are no gold now, as similarity already read them. JSON true/false read as JSON spells them, as ids do."""
    from pipeline.stages.postprocess import gold_value

    assert gold_value(float("nan")) is None and gold_value(float("inf")) is None and gold_value(None) is None
    assert (gold_value(True), gold_value(False)) == ("true", "false")
    assert (gold_value("sports"), gold_value(3), gold_value(2.5)) == ("sports", 3, 2.5)


def test_a_document_with_no_scored_token_has_no_loglik_score():
    """A one-token text under a tokenizer without a start token: nothing precedes its token to predict it, so
    nothing is scored; 0.0 would be the best log-likelihood of the corpus."""
    result = scoring.score_loglik([np.array([-1.5])], stride=2, prefix_len=0)
    assert (result["score"], result["perplexity"], result["loglik_tokens"]) == (None, None, 0)


def test_gold_labels_are_read_as_the_class_names_are():
    """A whole float is its integer class (pandas writes 1.0 for an integer column with a missing value);
    text golds lose surrounding whitespace as --labels names do; empty or non-finite golds are no gold."""
    from pipeline.stages.postprocess import gold_value

    assert [gold_value(v) for v in (1.0, 2, 2.5, " sports ", "", "  ", float("nan"), True, 1e20)] == [
        1, 2, 2.5, "sports", None, None, None, "true", 10**20]
    assert scoring.classify_metrics([("1", gold_value(1.0)), ("2", gold_value(" 2"))])["accuracy"] == 1.0
    assert scoring.as_number("1_0") is None and scoring.as_number(" 0.5 ") == 0.5  # float() would read 1_0 as 10


def _similarity_doc(query_embedding, fields=None):
    """One similarity document scored by postprocess: a text of one 10-token window and a query of one 6-token
    window, with the model's outputs for them (the query's as given)."""
    from pipeline.records import Document
    from pipeline.stages.inference import InferenceOutput
    from pipeline.stages.preprocess import TokenizedDoc

    doc = Document("d", "", "s.jsonl", 0, fields or {})
    tokenized = TokenizedDoc(doc, [np.arange(10)], 8, False, 0.0, query_windows=[np.arange(6)])
    output = InferenceOutput([np.full(4, 0.5, np.float32)], [np.asarray(query_embedding, np.float32)], 1.0, 16.0,
                             "m", "xla", "f", "cpu")
    return tokenized, output


def test_a_nan_query_embedding_is_an_error_row_not_a_nan_score():
    """A query whose embedding overflowed to NaN makes the similarity NaN: the document is an infer/nan_output
    error row, as a NaN in its text's windows is, not a scored row whose score is NaN."""
    from pipeline.stages.postprocess import ScoreSpec, score_documents

    tokenized, output = _similarity_doc(np.full(4, np.nan))
    rows, stats, errors = score_documents(ScoreSpec(task="similarity", run_id="r"), [tokenized], [output])
    assert rows == [] and stats == []
    assert [(e.stage, e.error_type, e.doc_id) for e in errors] == [("infer", "nan_output", "d")]


def test_a_similarity_row_counts_its_text_chunks_and_its_query_tokens():
    """n_chunks is the text's windows (the document's chunks; one here), while the model's tokens (window_tokens,
    hence padding_efficiency) include the query's windows, which the model computed too."""
    from pipeline.stages.postprocess import ScoreSpec, score_documents

    tokenized, output = _similarity_doc(np.full(4, 0.5), {"label": 0.5})
    [row], [stats], errors = score_documents(ScoreSpec(task="similarity", run_id="r"), [tokenized], [output])
    assert errors == [] and row["score"] == pytest.approx(1.0)
    assert row["n_chunks"] == 1 and row["n_tokens"] == 8
    assert stats.window_tokens == 10 + 6


def test_a_record_without_a_label_has_a_null_gold_label():
    """gold_label is null for a record without a label (not the string 'None', which would read as a class
    named None) and the label's text for one that has it."""
    from pipeline.stages.postprocess import ScoreSpec, score_documents

    spec = ScoreSpec(task="similarity", run_id="r")
    gold_labels = []
    for fields in ({}, {"label": 0.5}):
        tokenized, output = _similarity_doc(np.full(4, 0.5), fields)
        [row], _, _ = score_documents(spec, [tokenized], [output])
        gold_labels.append(row["gold_label"])
    assert gold_labels == [None, "0.5"]
