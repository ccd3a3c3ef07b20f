"""Each task end to end on a tiny corpus with gold labels (real DirectRunner, real weights): the
summary's task metrics equal ones computed independently here from the table, and the scores equal
what the model gives when called directly (MiniLM) or what the Hugging Face reference gives (GPT-2)."""
from __future__ import annotations

import json
import math
import os
import shutil

import numpy as np
import pytest
import torch
import transformers
import yaml
from scipy import stats
from tokenizers import Tokenizer

from tests.conftest import SENTENCES, common_flags, direct_embeddings, read_summary, read_table, run_docscore, write_jsonl

pytestmark = pytest.mark.integration  # README.md, "Development"

SIMILARITY = [
    (SENTENCES[0], "conditional execution with if", 0.9),
    (SENTENCES[1], "looping over the items of a sequence", 1.0),
    (SENTENCES[2], "how to bake sourdough bread", 0.0),
    (SENTENCES[3], "loading and initializing a module", 0.8),
    (SENTENCES[4], "a recipe for tomato soup", 0.1),
    (SENTENCES[5], "how big an integer can be", 0.6),
    (SENTENCES[6], "the weather in the mountains", 0.0),
    (SENTENCES[7], "quotes around text in source code", 0.7),
]
CLASSIFY_LABELS = {
    "statement": "a Python statement such as if, for, while, import or raise",
    "expression": "Python operators and expressions such as comparisons, lambdas and slicings",
    "literal": "how numbers and strings are written as literals in source code",
}
CLASSIFY = [
    (SENTENCES[0], "statement"), (SENTENCES[1], "statement"), (SENTENCES[2], "expression"),
    (SENTENCES[3], "statement"), (SENTENCES[5], "literal"), (SENTENCES[6], "statement"),
    (SENTENCES[7], "literal"), (SENTENCES[8], "expression"), (SENTENCES[9], "statement"),
    (SENTENCES[10], "expression"), (SENTENCES[11], "statement"),
]


def test_similarity_scores_and_summary_correlations(tmp_path, minilm):
    shard = write_jsonl(tmp_path / "in" / "s.jsonl",
                        [{"id": f"s{i}", "text": t, "query": q, "label": g} for i, (t, q, g) in enumerate(SIMILARITY)])
    assert run_docscore("--input", shard, *common_flags("sim", tmp_path / "out"), "--task", "similarity",
                        "--attention", "native") == 0
    scores, _ = read_table(tmp_path / "out", "scores", "sim")
    scores = scores.sort_values("record_index")
    docs = direct_embeddings(minilm, [t for t, _, _ in SIMILARITY])
    queries = direct_embeddings(minilm, [q for _, q, _ in SIMILARITY])
    np.testing.assert_allclose(scores.score.to_numpy(), np.sum(docs * queries, axis=1), atol=1e-5)
    gold = scores.gold_label.astype(float).to_numpy()
    metrics = read_summary(tmp_path / "out", "sim")["task_metrics"]
    assert metrics["n_gold"] == len(SIMILARITY)
    assert metrics["spearman"] == pytest.approx(stats.spearmanr(scores.score, gold)[0], abs=1e-9)
    assert metrics["pearson"] == pytest.approx(stats.pearsonr(scores.score, gold)[0], abs=1e-9)


def test_an_integer_label_past_floats_range_is_no_gold_not_a_failed_run(tmp_path, minilm):
    """JSON holds integers of any size: one in `label` (checked by validation's peek at the first records, and
    past them by the run's correlations) crashed validation or failed the whole job (OverflowError)."""
    records = [{"id": f"s{i}", "text": t, "query": q, "label": g} for i, (t, q, g) in enumerate(SIMILARITY * 4)]
    for i in (0, 25):  # inside validation's peek, and past it
        records[i]["label"] = 10 ** 400
    shard = write_jsonl(tmp_path / "in" / "s.jsonl", records)
    assert run_docscore("--input", shard, *common_flags("big", tmp_path / "out"), "--task", "similarity",
                        "--attention", "native") == 0
    summary = read_summary(tmp_path / "out", "big")
    assert summary["counts"]["scored"] == len(records) and summary["counts"]["errors"] == 0
    assert summary["task_metrics"]["n_gold"] == len(records) - 2


def test_classify_from_a_config_file_and_summary_accuracy_and_macro_f1(tmp_path, minilm, monkeypatch):
    from pipeline.stages import inference

    monkeypatch.setattr(inference, "_MODELS", {})  # this run loads its own model: its compiles are all this run's
    shard = write_jsonl(tmp_path / "in" / "c.jsonl",
                        [{"id": f"c{i}", "text": t, "label": g} for i, (t, g) in enumerate(CLASSIFY)])
    config = tmp_path / "classify.yaml"
    config.write_text(yaml.safe_dump({"input": str(shard), "task": "classify", "labels": CLASSIFY_LABELS,
                                      "temperature": 0.05}, sort_keys=False))
    assert run_docscore("--config", config, *common_flags("cls", tmp_path / "out"), "--attention", "native") == 0
    scores, _ = read_table(tmp_path / "out", "scores", "cls")
    scores = scores.sort_values("record_index")
    # predictions equal the zero-shot rule computed from direct model calls
    names = list(CLASSIFY_LABELS)
    cos = direct_embeddings(minilm, [t for t, _ in CLASSIFY]) @ direct_embeddings(minilm, list(CLASSIFY_LABELS.values())).T
    probs = np.exp(cos / 0.05) / np.exp(cos / 0.05).sum(axis=1, keepdims=True)
    assert list(scores.label) == [names[i] for i in probs.argmax(axis=1)]
    np.testing.assert_allclose(scores.score.to_numpy(), probs.max(axis=1), atol=1e-4)
    assert [[s["label"] for s in row] for row in scores.scores] == [names] * len(CLASSIFY)
    # the summary's metrics equal ones computed here from the table
    predicted, gold = list(scores.label), list(scores.gold_label)
    f1 = []
    for label in sorted(set(gold) | set(predicted)):
        tp = sum(p == g == label for p, g in zip(predicted, gold))
        fp = sum(p == label != g for p, g in zip(predicted, gold))
        fn = sum(g == label != p for p, g in zip(predicted, gold))
        f1.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    metrics = read_summary(tmp_path / "out", "cls")["task_metrics"]
    assert metrics["n_gold"] == len(CLASSIFY)
    assert metrics["accuracy"] == pytest.approx(np.mean([p == g for p, g in zip(predicted, gold)]))
    assert metrics["macro_f1"] == pytest.approx(np.mean(f1))
    assert metrics["accuracy"] >= 0.5  # zero-shot MiniLM gets most of these right
    # the compile count includes what the labels' embeddings compiled while the model loaded
    [loaded] = inference._MODELS.values()
    assert read_summary(tmp_path / "out", "cls")["compile"]["count"] == loaded.compile_count >= 1


def test_loglik_with_stride_0_is_refused_when_windows_start_without_a_special_token(tmp_path, tiny_gpt2_dir, capsys):
    """GPT-2 windows start with text: with no overlap the first token of each later window has no context to be
    scored from, so the run would count fewer tokens than the text holds. Refused before any data is read."""
    shard = write_jsonl(tmp_path / "in" / "l.jsonl", [{"id": "l0", "text": SENTENCES[0]}])
    assert run_docscore("--input", shard, *common_flags("s0", tmp_path / "out"), "--task", "loglik",
                        "--model", tiny_gpt2_dir, "--max_seq_len", "64", "--stride", "0") == 2
    assert "--stride=0 with --task=loglik" in capsys.readouterr().err
    assert not (tmp_path / "out" / "scores").exists()


def test_loglik_matches_the_transformers_reference(tmp_path, tiny_gpt2_dir, tiny_gpt2_hf):
    texts = SENTENCES[:6]
    shard = write_jsonl(tmp_path / "in" / "l.jsonl", [{"id": f"l{i}", "text": t} for i, t in enumerate(texts)])
    assert run_docscore("--input", shard, *common_flags("ll", tmp_path / "out"), "--task", "loglik",
                        "--model", tiny_gpt2_dir, "--attention", "native", "--max_seq_len", "64") == 0
    scores, _ = read_table(tmp_path / "out", "scores", "ll")
    scores = scores.sort_values("record_index")
    assert (scores.n_chunks == 1).all()  # one window each, so the reference below is the whole document
    tokenizer = Tokenizer.from_file(os.path.join(tiny_gpt2_dir, "tokenizer.json"))
    totals, counts = [], []
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tokenizer.encode(text).ids])
            logp = torch.log_softmax(tiny_gpt2_hf(ids).logits[0, :-1].double(), dim=-1)
            totals.append(float(logp.gather(1, ids[0, 1:, None]).sum()))
            counts.append(ids.shape[1] - 1)
    np.testing.assert_allclose(scores.score.to_numpy(), totals, atol=1e-3, rtol=1e-5)
    np.testing.assert_allclose(scores.perplexity.to_numpy(), [math.exp(-t / c) for t, c in zip(totals, counts)], rtol=1e-4)
    metrics = read_summary(tmp_path / "out", "ll")["task_metrics"]
    assert metrics["loglik_tokens"] == sum(counts)
    assert metrics["corpus_perplexity"] == pytest.approx(math.exp(-sum(totals) / sum(counts)), rel=1e-4)


def strict_json(text: str):
    """json.loads refusing NaN and Infinity, which are not JSON (other readers than Python's refuse them)."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.integration
def test_a_model_too_sharp_for_floats_perplexity_keeps_its_documents(tmp_path, tiny_gpt2_dir, tiny_gpt2_hf):
    """The tiny GPT-2 with its token embeddings x2000 and final norm x50: a mean of tens of thousands of nats per
    token, whose perplexity exp() cannot hold. Each document was a `score/OverflowError` error row ("math range
    error"); now each is scored, its log-likelihood that of transformers, its perplexity inf, null in JSON lines
    and in summary.json (valid JSON: Python's json wrote a bare Infinity/NaN)."""
    from models.hf_import import convert_hf_dir

    with torch.no_grad():
        tiny_gpt2_hf.transformer.wte.weight.mul_(2000)
        tiny_gpt2_hf.transformer.ln_f.weight.mul_(50)
    try:
        tiny_gpt2_hf.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    finally:
        with torch.no_grad():  # the session's reference model, as other tests expect it
            tiny_gpt2_hf.transformer.wte.weight.div_(2000)
            tiny_gpt2_hf.transformer.ln_f.weight.div_(50)
    shutil.copy(os.path.join(os.path.dirname(tiny_gpt2_dir), "hf", "tokenizer.json"), tmp_path / "hf")
    convert_hf_dir(str(tmp_path / "hf"), str(tmp_path / "sharp"))
    texts = SENTENCES[:3]
    shard = write_jsonl(tmp_path / "in" / "l.jsonl", [{"id": f"l{i}", "text": t} for i, t in enumerate(texts)])
    assert run_docscore("--input", shard, *common_flags("sharp", tmp_path / "out"), "--task", "loglik",
                        "--model", tmp_path / "sharp", "--attention", "native", "--max_seq_len", "64",
                        "--output_format", "jsonl", "--max_error_fraction", "0") == 0
    scores, files = read_table(tmp_path / "out", "scores", "sharp")
    for f in files:
        [strict_json(line) for line in open(f, encoding="utf-8") if line.strip()]
    summary = strict_json((tmp_path / "out" / "runs" / "run_id=sharp" / "summary.json").read_text())
    assert summary["counts"]["scored"] == 3 and summary["counts"]["errors"] == 0
    assert scores.perplexity.isna().all() and summary["task_metrics"]["corpus_perplexity"] is None
    sharp = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf")).eval()
    tokenizer = Tokenizer.from_file(os.path.join(tiny_gpt2_dir, "tokenizer.json"))
    with torch.no_grad():
        totals = []
        for text in texts:
            ids = torch.tensor([tokenizer.encode(text).ids])
            logp = torch.log_softmax(sharp(ids).logits[0, :-1].double(), dim=-1)
            totals.append(float(logp.gather(1, ids[0, 1:, None]).sum()))
    assert min(-t / len(tokenizer.encode(x).ids) for t, x in zip(totals, texts)) > 710  # past exp()'s range
    np.testing.assert_allclose(scores.sort_values("record_index").score.to_numpy(), totals, rtol=1e-3)
    # Parquet keeps the inf, and the run's report is written: matplotlib refused a histogram range with inf in it
    assert run_docscore("--input", shard, *common_flags("sharp_pq", tmp_path / "out"), "--task", "loglik",
                        "--model", tmp_path / "sharp", "--attention", "native", "--max_seq_len", "64") == 0
    assert (read_table(tmp_path / "out", "scores", "sharp_pq")[0].perplexity == math.inf).all()
    assert (tmp_path / "out" / "runs" / "run_id=sharp_pq" / "report.html").exists()


def bert_with_an_inf_token(tmp_path) -> tuple[list[str], str]:
    """A small BERT converted twice: tmp_path/hf/docscore as built, tmp_path/hf_inf/docscore with the embedding of a
    token that only the returned bad text holds set to inf. (The three clean texts, the bad text.)"""
    from safetensors.numpy import load_file, save_file

    from models.hf_import import convert_hf_dir
    from tests.test_convert import CORPUS, build_hf_bert

    build_hf_bert(tmp_path / "hf")
    tokenizer = Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    clean, bad = CORPUS[:3], CORPUS[3]
    [overflows, *_] = sorted(set(tokenizer.encode(bad).ids) - {i for t in clean for i in tokenizer.encode(t).ids})
    shutil.copytree(tmp_path / "hf", tmp_path / "hf_inf")
    [weights_file] = (tmp_path / "hf_inf").glob("*.safetensors")
    weights = load_file(weights_file)
    weights["bert.embeddings.word_embeddings.weight"][overflows] = np.inf
    save_file(weights, weights_file, metadata={"format": "pt"})
    for name in ("hf", "hf_inf"):
        convert_hf_dir(str(tmp_path / name), str(tmp_path / name / "docscore"))
    return clean, bad


@pytest.mark.integration
def test_a_document_whose_output_is_nan_is_an_error_row_and_its_row_mates_are_scored(tmp_path):
    """A small BERT with one token's embedding set to inf: a document holding that token overflows (NaN), and
    attention's 0 x NaN made every document packed into its row NaN too: NaN embeddings, classify naming the
    first label with a NaN score. Now that document is one `infer/nan_output` row and the others get the
    embeddings the same model without the inf gives them."""
    clean, bad = bert_with_an_inf_token(tmp_path)
    texts = [clean[0], bad, clean[1], clean[2]]
    shard = write_jsonl(tmp_path / "in" / "d.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)])
    out = tmp_path / "out"
    for run_id, model in (("nan", "hf_inf"), ("clean", "hf")):
        assert run_docscore("--input", shard, *common_flags(run_id, out), "--task", "embed", "--attention", "native",
                            "--model", tmp_path / model / "docscore", "--max_seq_len", "64") == 0
    errors, _ = read_table(out, "errors", "nan")
    assert errors[["doc_id", "stage", "error_type"]].values.tolist() == [["d1", "infer", "nan_output"]]
    scores = read_table(out, "scores", "nan")[0].set_index("doc_id")
    expected = read_table(out, "scores", "clean")[0].set_index("doc_id")
    assert sorted(scores.index) == ["d0", "d2", "d3"]
    for doc_id in scores.index:
        np.testing.assert_allclose(np.stack(scores.loc[doc_id, "embedding"]), np.stack(expected.loc[doc_id, "embedding"]),
                                   atol=1e-5)
    assert read_summary(out, "nan")["counts"]["errors"] == 1


@pytest.mark.integration
def test_embeddings_whose_norm_overflowed_to_zeros_are_error_rows(tmp_path):
    """A BERT whose last layer norm scales one feature by 1e30: the L2 norm of every embedding overflows and the
    embeddings come out as zeros (transformers' normalize does the same). They were scored: every cosine 0,
    classify the first label. Each is an `infer/zero_output` error row."""
    from safetensors.numpy import load_file, save_file

    from models.hf_import import convert_hf_dir
    from tests.test_convert import CORPUS, build_hf_bert

    build_hf_bert(tmp_path / "hf")
    [weights_file] = (tmp_path / "hf").glob("*.safetensors")
    weights = load_file(weights_file)
    weights["bert.encoder.layer.1.output.LayerNorm.weight"][0] = 1e30  # (1e30 x)^2 overflows for any |x| > 2e-11
    save_file(weights, weights_file, metadata={"format": "pt"})
    convert_hf_dir(str(tmp_path / "hf"), str(tmp_path / "big"))
    shard = write_jsonl(tmp_path / "in" / "d.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(CORPUS[:4])])
    assert run_docscore("--input", shard, *common_flags("zero", tmp_path / "out"), "--task", "embed", "--attention",
                        "native", "--model", tmp_path / "big", "--max_seq_len", "64", "--max_error_fraction", "1") == 0
    errors, _ = read_table(tmp_path / "out", "errors", "zero")
    assert sorted(errors.doc_id) == ["d0", "d1", "d2", "d3"] and set(errors.error_type) == {"zero_output"}
    assert read_summary(tmp_path / "out", "zero")["counts"]["scored"] == 0


@pytest.mark.integration
@pytest.mark.parametrize("mode", [[], ["--direct_running_mode", "multi_processing", "--direct_num_workers", "2"]])
def test_a_label_description_the_model_embeds_as_nan_is_refused_before_data(tmp_path, no_data_read, capsys, mode):
    """classify with a label whose description holds the token that overflows: its embedding was NaN, and every
    document got the first label with a NaN score and an accuracy over those (exit 0). Refused before any data is
    read, naming --labels, the label and the fix, in worker processes too (they failed the job with tracebacks)."""
    clean, bad = bert_with_an_inf_token(tmp_path)
    shard = write_jsonl(tmp_path / "in" / "d.jsonl", [{"id": f"d{i}", "text": t, "label": "a"} for i, t in enumerate(clean)])
    out = tmp_path / "out"
    code = run_docscore("--input", shard, *common_flags("lab", out), "--task", "classify", "--attention", "native",
                        "--model", tmp_path / "hf_inf" / "docscore", "--max_seq_len", "64",
                        "--labels", f"a={clean[0]};b={bad}", *mode)
    assert code == 2 and not out.exists()
    [message] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("docscore run:")]
    assert message.startswith(f"docscore run: --labels: the model embeds the description of 'b' ({bad!r}) as NaN: a "
                              "value overflowed inside the model")


@pytest.mark.integration
def test_a_long_label_description_is_split_into_windows_as_a_document_is(tmp_path):
    """A document whose text is a label's description has cosine 1 to that label however long it is: labels are
    embedded with the documents' --stride and --max_chunks (they were cut with stride 0), so the classify scores
    equal the softmax of the embed run's cosines."""
    long_text = " ".join(SENTENCES * 3)  # several windows at the test's --max_seq_len
    other = SENTENCES[0]
    shard = write_jsonl(tmp_path / "in" / "docs.jsonl", [{"id": "long", "text": long_text}, {"id": "other", "text": other}])
    out = tmp_path / "out"
    assert run_docscore("--input", shard, *common_flags("emb", out), "--task", "embed", "--attention", "native") == 0
    assert run_docscore("--input", shard, *common_flags("cls", out), "--task", "classify", "--attention", "native",
                        "--temperature", "1", "--labels", f"long={long_text};other={other}") == 0
    embedded = read_table(out, "scores", "emb")[0].set_index("doc_id")
    vectors = {d: np.asarray(embedded.loc[d, "embedding"], np.float64) for d in ("long", "other")}
    assert embedded.loc["long", "n_chunks"] > 2  # the long text is several windows
    for row in read_table(out, "scores", "cls")[0].itertuples():
        cosines = np.array([vectors[row.doc_id] @ vectors[label] for label in ("long", "other")])
        expected = np.exp(cosines) / np.exp(cosines).sum()
        got = {s["label"]: s["score"] for s in row.scores}
        assert np.allclose([got["long"], got["other"]], expected, atol=1e-5), (row.doc_id, got, expected)
