"""The task registry (pipeline/tasks/): the five tasks and what each says about itself, and a fifth task
defined here, registered with one line (monkeypatch), running through the real pipeline end to end."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline import tasks
from pipeline.stages import scoring
from pipeline.tasks.base import DECODER, EMBEDDER, GoldTotals, Prepared, Task
from tests.conftest import LONG_TEXT, SENTENCES, common_flags, direct_embeddings, read_summary, read_table, run_docscore, write_jsonl


class Outputs:
    def __init__(self, windows, queries=(), label_names=(), label_embeddings=None):
        self.window_outputs, self.query_outputs = list(windows), list(queries)
        self.label_names, self.label_embeddings = tuple(label_names), label_embeddings
        self.spans, self.truncated = None, False


class Settings:
    temperature, stride, prefix_len, suffix_len = 0.05, 0, 0, 0


def unit(v):
    v = np.asarray(v, np.float32)
    return v / np.linalg.norm(v)


def test_the_registry_lists_the_five_tasks():
    assert list(tasks.TASKS) == ["embed", "similarity", "classify", "loglik", "choice"]
    assert all(task.name == name for name, task in tasks.TASKS.items())
    with pytest.raises(ValueError, match="unknown task 'summarize'; the tasks are embed, similarity, classify, loglik, choice"):
        tasks.get("summarize")


def test_each_task_says_what_it_needs_and_computes():
    embed, similarity, classify, loglik, choice = (tasks.get(n) for n in tasks.TASKS)
    assert [t.model for t in (embed, similarity, classify)] == [EMBEDDER] * 3 and loglik.model is choice.model is DECODER
    assert [t.with_query for t in tasks.TASKS.values()] == [False, True, False, False, False]
    assert [t.per_token for t in tasks.TASKS.values()] == [False, False, False, True, True]
    assert [t.takes_labels for t in tasks.TASKS.values()] == [False, False, True, False, False]
    assert [t.gathers for t in tasks.TASKS.values()] == ["nothing", "gold_pairs", "gold_pairs", "sums", "gold_pairs"]
    assert [t.chart for t in tasks.TASKS.values()] == ["lengths", "scores", "labels", "scores", "labels"]
    assert [t.tokenize is not None for t in tasks.TASKS.values()] == [False, False, False, False, True]
    assert loglik.chart_column == "perplexity" and similarity.chart_axis == "score (cosine)"
    assert EMBEDDER.refuse("embed", "gpt", "gpt2").startswith("--task=embed needs a model that embeds (an encoder")
    assert "--model gpt is a gpt2 language model, converted without a pooling; use --task=loglik" in EMBEDDER.refuse(
        "embed", "gpt", "gpt2")
    # an encoder always embeds; a decoder only when converted with a pooling; a language-model task takes any decoder
    assert [EMBEDDER.accepts(*m) for m in (("bert", "mean"), ("modernbert", "cls"), ("llama", None), ("llama", "lasttoken"),
                                           ("gpt2", "mean"))] == [True, True, False, True, True]
    assert [DECODER.accepts(*m) for m in (("bert", "mean"), ("llama", None), ("llama", "lasttoken"), ("gpt2", None))] == [
        False, True, True, True]
    assert DECODER.refuse("loglik", "minilm-l6", "bert").startswith("--task=loglik needs a decoder (GPT-2 or Llama-family) model")


def test_tasks_score_with_the_scoring_functions():
    a, b = unit([1, 0, 0]), unit([0, 1, 0])
    fields = tasks.get("embed").score(Outputs([a, b]), Settings())
    np.testing.assert_array_equal(fields["embedding"], scoring.score_embed([a, b])["embedding"])
    assert tasks.get("similarity").score(Outputs([a], [a]), Settings())["score"] == pytest.approx(1.0)
    prepared = tasks.get("classify").prepare({"x": "about x", "y": "about y"}, lambda texts: np.stack([a, b]))
    assert isinstance(prepared, Prepared) and prepared.label_names == ("x", "y")
    np.testing.assert_array_equal(prepared.label_embeddings, np.stack([a, b]))
    out = Outputs([a], label_names=prepared.label_names, label_embeddings=prepared.label_embeddings)
    assert tasks.get("classify").score(out, Settings())["label"] == "x"
    assert tasks.get("embed").prepare({}, None) == Prepared()
    ll = tasks.get("loglik").score(Outputs([np.log([0.5, 0.25, 0.5])]), Settings())
    assert ll["loglik_tokens"] == 2 and tasks.get("loglik").prediction(ll, "gold") == (ll["score"], 2)
    assert tasks.get("classify").prediction({"label": "x", "score": 0.9}, "y") == ("x", "y")
    assert tasks.get("embed").prediction(fields, "y") == (None, "y")


def test_tasks_contribute_their_run_metrics():
    pairs = [(0.9, "1.0"), (0.1, 0), (0.5, "x"), (0.4, 0.5)]
    sim = tasks.get("similarity").metrics(GoldTotals(4, pairs, 0.0, 0))
    assert sim["n_gold"] == 3 and sim["spearman"] == pytest.approx(1.0)
    cls = tasks.get("classify").metrics(GoldTotals(3, [("a", "a"), ("b", "a"), ("b", "b")], 0.0, 0))
    assert cls["n_gold"] == 3 and cls["accuracy"] == pytest.approx(2 / 3)
    ll = tasks.get("loglik").metrics(GoldTotals(2, [], -15.0, 10))
    assert ll == {"n_docs": 2, "loglik_tokens": 10, "total_loglik": -15.0,
                  "corpus_perplexity": pytest.approx(np.exp(1.5))}
    assert tasks.get("embed").metrics(GoldTotals(2, [], 0.0, 0)) == {}


# ---------------------------------------------------------------- a fifth task, defined and registered here

def embed_norm_score(outputs, settings):
    """The embedding, and as score the length of the mean of its (unit) window embeddings: 1 when every
    window agrees, less when the windows of a long document point different ways."""
    fields = scoring.score_embed(outputs.window_outputs)
    mean = np.mean(np.stack([np.asarray(w, np.float64) for w in outputs.window_outputs]), axis=0)
    return {**fields, "score": float(np.linalg.norm(mean))}


def embed_norm_prediction(fields, gold):
    return fields["score"], 1


def embed_norm_metrics(totals):
    return {"n_docs": totals.documents, "mean_norm": totals.prediction_sum / totals.gold_sum if totals.gold_sum else None}


EMBED_NORM = Task(name="embed_norm", model=EMBEDDER, score=embed_norm_score, prediction=embed_norm_prediction,
                  gathers="sums", metrics=embed_norm_metrics, chart="scores", chart_axis="window agreement")


def test_the_docs_name_every_registered_task():
    """A task added to the registry is one a user can find: README's synopsis and table of tasks, DESIGN.md's
    synopsis and docs/summary.md's `task` key name it (docs/DESIGN.md, "A task")."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme, design = (root / "README.md").read_text(), (root / "docs" / "DESIGN.md").read_text()
    summary_doc = (root / "docs" / "summary.md").read_text()
    synopsis = "[--task " + "|".join(tasks.TASKS) + "]"
    assert synopsis in readme and synopsis in design, f"README.md and docs/DESIGN.md's synopses should read {synopsis}"
    table = readme.split("### Tasks", 1)[1].split("\n\n", 2)[1]
    task_key = next(line for line in summary_doc.splitlines() if line.startswith("| `task` |"))
    for name in tasks.TASKS:
        assert f"| `{name}` |" in table, f"README.md's table of tasks has no row for {name}"
        assert name in task_key, f"docs/summary.md's `task` row does not name {name}"

def test_a_new_task_is_one_module_and_one_registry_line():
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(tasks.TASKS, "embed_norm", EMBED_NORM)
        assert tasks.get("embed_norm") is EMBED_NORM and "embed_norm" in tasks.TASKS
    assert "embed_norm" not in tasks.TASKS


@pytest.mark.integration  # a whole job (README.md, "Development")
def test_a_task_registered_in_a_test_runs_through_the_real_pipeline(tmp_path, monkeypatch, minilm):
    monkeypatch.setitem(tasks.TASKS, "embed_norm", EMBED_NORM)
    texts = SENTENCES[:4] + [LONG_TEXT]
    shard = write_jsonl(tmp_path / "in" / "s.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)])
    assert run_docscore("--input", shard, *common_flags("norm", tmp_path / "out"), "--task", "embed_norm",
                        "--attention", "native") == 0
    scores, _ = read_table(tmp_path / "out", "scores", "norm")
    scores = scores.sort_values("record_index")
    assert len(scores) == len(texts)
    assert set(scores.task) == {"embed_norm"}
    table = np.stack([np.asarray(e, np.float64) for e in scores.embedding])
    assert np.max(np.abs(table - direct_embeddings(minilm, texts))) <= 1e-5
    norms = scores.score.to_numpy()
    assert norms[:4] == pytest.approx(1.0, abs=1e-5)  # one window each
    assert scores.n_chunks.iloc[4] > 1 and 0 < norms[4] < 1 - 1e-3  # the long document's windows disagree
    summary = read_summary(tmp_path / "out", "norm")
    assert summary["counts"]["errors"] == 0
    assert summary["task_metrics"] == {"n_docs": len(texts), "mean_norm": pytest.approx(norms.mean(), abs=1e-9)}
