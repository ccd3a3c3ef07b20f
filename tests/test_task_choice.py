"""--task=choice (pipeline/tasks/choice.py): multiple-choice scoring as lm-evaluation-harness does it. Through the
real `docscore run` CLI with a tiny random GPT-2 and a tiny converted Llama, each candidate's log-likelihood equals
transformers' over the same tokens (lm-evaluation-harness's pairing: the context's trailing whitespace moves to the
candidate, the candidate's tokens are those of context + candidate after the context's), and the chosen indexes and
the summary's accuracies equal those computed from transformers; bad records are error rows with their types; an
encoder model and records without `choices` are refused before any data is read."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from pipeline import tasks
from pipeline.records import Document
from pipeline.stages import scoring
from pipeline.stages.preprocess import WindowSpec, tokenize_documents
from pipeline.tasks import choice
from pipeline.tasks.base import DECODER, GoldTotals, RecordError
from tests.conftest import LONG_TEXT, SENTENCES, read_summary, read_table, run_docscore, write_jsonl

MAX_LEN = 64  # the tiny GPT-2's n_positions


def make_records() -> list[dict]:
    """~20 records from real sentences: the context is a sentence's head, the right candidate its tail, the others
    tails of other sentences; the separating space sits at the end of the context or the start of the candidates,
    there are 2-4 candidates, the gold index moves, one record has no gold, one a non-ASCII candidate (bytes !=
    characters) and one a context too long for a window (its head is cut)."""
    records = []
    for i, sentence in enumerate(SENTENCES):
        words = sentence.split(" ")
        for variant in range(2):
            cut = max(1, len(words) // 2 - variant)
            head, tail = " ".join(words[:cut]), " ".join(words[cut:])
            others = [" ".join(SENTENCES[(i + k) % len(SENTENCES)].split(" ")[cut:]) for k in (3, 5, 7)]
            candidates = [tail] + [o for o in others if o and o != tail][: 1 + (i + variant) % 3]
            gold = (i + variant) % len(candidates)
            candidates.insert(gold, candidates.pop(0))
            if variant:
                context, candidates = head + " ", candidates
            else:
                context, candidates = head, [" " + c for c in candidates]
            records.append({"id": f"q{i}-{variant}", "text": context, "choices": candidates, "label": gold})
    records = records[:20]
    records[2]["choices"][0] = " naïve café – déjà vu"
    del records[5]["label"]
    records[7]["text"] = LONG_TEXT + " " + records[7]["text"]
    records[8]["label"] = str(records[8]["label"])  # a gold index may be written as a string of digits
    return records


def reference_scores(tokenizer, model, records: list[dict], max_len: int) -> list[dict]:
    """Each record scored with transformers (float32) over lm-evaluation-harness's tokens: per candidate its summed
    log-prob, tokens and bytes, and whether the context's head had to be cut to fit max_len tokens."""
    import torch

    prefix = tokenizer.encode("a").ids[:-len(tokenizer.encode("a", add_special_tokens=False).ids)]
    out = []
    for record in records:
        context, logliks, tokens, nbytes, cut = record["text"], [], [], [], False
        spaces = len(context) - len(context.rstrip())
        for candidate in record["choices"]:
            ctx, cont = (context[:-spaces], context[-spaces:] + candidate) if spaces else (context, candidate)
            ctx_ids = tokenizer.encode(ctx, add_special_tokens=False).ids
            cont_ids = tokenizer.encode(ctx + cont, add_special_tokens=False).ids[len(ctx_ids):]
            keep = min(len(ctx_ids), max_len - len(prefix) - len(cont_ids))
            cut |= keep < len(ctx_ids)
            ids = torch.tensor([prefix + ctx_ids[len(ctx_ids) - keep:] + cont_ids])
            with torch.no_grad():
                logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
            n = len(cont_ids)
            targets = ids[0, -n:]
            logliks.append(float(logp[-n - 1:-1].gather(1, targets[:, None]).sum()))
            tokens.append(n)
            nbytes.append(len(cont.encode("utf-8")))
        out.append({"logliks": logliks, "tokens": tokens, "bytes": nbytes, "truncated": cut})
    return out


def check_run_against_reference(out: Path, run_id: str, records: list[dict], reference: list[dict]) -> None:
    scores, _ = read_table(out, "scores", run_id)
    scores = scores.sort_values("record_index")
    assert list(scores.doc_id) == [r["id"] for r in records] and set(scores.task) == {"choice"}
    chosen, per_token, per_byte = [], [], []
    for row, ref in zip(scores.itertuples(), reference):
        got = [s["score"] for s in row.scores]
        assert [s["label"] for s in row.scores] == [str(i) for i in range(len(ref["logliks"]))]
        np.testing.assert_allclose(got, ref["logliks"], atol=1e-4, rtol=0)
        assert list(row.choice_tokens) == ref["tokens"] and list(row.choice_bytes) == ref["bytes"]
        assert bool(row.truncated) == ref["truncated"] and row.n_chunks == len(ref["logliks"])
        chosen.append(int(np.argmax(ref["logliks"])))
        per_token.append(int(np.argmax(np.divide(ref["logliks"], ref["tokens"]))))
        per_byte.append(int(np.argmax(np.divide(ref["logliks"], ref["bytes"]))))
        probs = np.exp(np.subtract(ref["logliks"], max(ref["logliks"])))
        assert row.score == pytest.approx(probs[chosen[-1]] / probs.sum(), abs=1e-4)
        assert row.read_ms >= 0 and row.tokenize_ms > 0 and row.infer_ms > 0 and row.postprocess_ms > 0
    assert list(scores.label) == [str(c) for c in chosen]
    assert len(set(chosen)) > 1  # the reference's choices vary, so equal labels are not a constant
    assert per_token != chosen and per_byte != chosen  # so each accuracy below tests its own normalisation
    gold = [None if "label" not in r else int(r["label"]) for r in records]
    assert list(scores.gold_label.fillna("none")) == ["none" if g is None else str(g) for g in gold]
    assert any(ref["truncated"] for ref in reference) and sum(ref["truncated"] for ref in reference) < len(records)
    summary = read_summary(out, run_id)
    assert summary["counts"]["errors"] == 0
    with_gold = [k for k, g in enumerate(gold) if g is not None]
    metrics = summary["task_metrics"]
    assert metrics["n_docs"] == len(records) and metrics["n_gold"] == len(with_gold)
    for name, picks in (("accuracy", chosen), ("accuracy_per_token", per_token), ("accuracy_per_byte", per_byte)):
        assert metrics[name] == pytest.approx(np.mean([picks[k] == gold[k] for k in with_gold]), abs=1e-12), name


def choice_flags(run_id: str, out: Path, model, max_len: int = MAX_LEN) -> list:
    return ["--output", out, "--run_id", run_id, "--task", "choice", "--model", model, "--attention", "native",
            "--max_seq_len", max_len, "--batch_size", 8, "--max_error_fraction", 1]


# ---------------------------------------------------------------- end to end against transformers

@pytest.mark.integration  # a whole job (README.md, "Development")
def test_gpt2_choices_match_transformers_logliks_and_accuracy(tmp_path, tiny_gpt2_dir, tiny_gpt2_hf):
    from tokenizers import Tokenizer

    records = make_records()
    shard = write_jsonl(tmp_path / "in" / "mc.jsonl", records)
    assert run_docscore("--input", shard, *choice_flags("mc", tmp_path / "out", tiny_gpt2_dir)) == 0
    tokenizer = Tokenizer.from_file(os.path.join(tiny_gpt2_dir, "tokenizer.json"))
    check_run_against_reference(tmp_path / "out", "mc", records, reference_scores(tokenizer, tiny_gpt2_hf, records, MAX_LEN))
    report = (tmp_path / "out" / "runs" / "run_id=mc" / "report.html").read_text(encoding="utf-8")
    assert "accuracy_per_byte" in report and "Confusion matrix" in report


@pytest.mark.integration
def test_llama_choices_match_transformers_logliks_and_accuracy(tmp_path):
    """The Llama tokenizer puts <s> first: it stays first when the context's head is cut."""
    import torch
    import transformers
    from tokenizers import Tokenizer

    from models.hf_import import convert_hf_dir
    from tests.test_models_llama import build_hf

    src = build_hf(tmp_path / "hf", "llama")
    convert_hf_dir(str(src), str(tmp_path / "model"))
    records = make_records()
    shard = write_jsonl(tmp_path / "in" / "mc.jsonl", records)
    max_len = 128
    assert run_docscore("--input", shard, *choice_flags("mc", tmp_path / "out", tmp_path / "model", max_len)) == 0
    tokenizer = Tokenizer.from_file(str(src / "tokenizer.json"))
    assert tokenizer.encode("a").ids[0] == 1  # <s>
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    check_run_against_reference(tmp_path / "out", "mc", records, reference_scores(tokenizer, model, records, max_len))


# ---------------------------------------------------------------- bad records and refusals

BAD_RECORDS = [
    # (record, stage, error_type) in record order; None: scored
    ({"id": "ok", "text": "The if statement is used for", "choices": [" conditional execution", " loops"], "label": 0},
     None, None),
    ({"id": "no-choices", "text": "The if statement is used for"}, "tokenize", "missing_choices"),
    ({"id": "not-a-list", "text": "A for loop", "choices": "iterates or not"}, "tokenize", "bad_choices"),
    ({"id": "a-number", "text": "A for loop", "choices": [" iterates", 3]}, "tokenize", "bad_choices"),
    ({"id": "empty", "text": "A for loop", "choices": []}, "tokenize", "empty_choices"),
    ({"id": "gold-high", "text": "A for loop", "choices": [" a", " b"], "label": 2}, "tokenize", "gold_out_of_range"),
    ({"id": "gold-negative", "text": "A for loop", "choices": [" a", " b"], "label": "-1"}, "tokenize",
     "gold_out_of_range"),
    ({"id": "gold-word", "text": "A for loop", "choices": [" a", " b"], "label": "b"}, "tokenize", "bad_gold"),
    ({"id": "gold-bool", "text": "A for loop", "choices": [" a", " b"], "label": True}, "tokenize", "bad_gold"),
    ({"id": "gold-half", "text": "A for loop", "choices": [" a", " b"], "label": 0.5}, "tokenize", "bad_gold"),
    ({"id": "empty-choice", "text": "A for loop", "choices": [" a", ""]}, "tokenize", "empty_choice"),
    ({"id": "surrogate", "text": "A for loop", "choices": [" a", " \ud800"]}, "tokenize", "invalid_unicode"),
    ({"id": "too-long", "text": "A for loop", "choices": [" a", " " + LONG_TEXT]}, "tokenize", "choice_too_long"),
    ({"id": "no-context", "choices": [" a", " b"]}, "parse", "missing_field"),
    ({"id": "blank-context", "text": "  ", "choices": [" a", " b"]}, "parse", "empty_text"),
    ({"id": "ok-2", "text": "Lambda expressions are used to create", "choices": [" anonymous functions", " soup"],
      "label": 1.0}, None, None),
]


@pytest.mark.integration
def test_bad_records_are_error_rows_and_the_rest_are_scored(tmp_path, tiny_gpt2_dir):
    shard = write_jsonl(tmp_path / "in" / "bad.jsonl", [r for r, _, _ in BAD_RECORDS])
    assert run_docscore("--input", shard, *choice_flags("bad", tmp_path / "out", tiny_gpt2_dir)) == 0
    scores, _ = read_table(tmp_path / "out", "scores", "bad")
    errors, _ = read_table(tmp_path / "out", "errors", "bad")
    assert sorted(scores.doc_id) == ["ok", "ok-2"]
    assert sorted(scores.gold_label) == ["0", "1"]  # 1.0 reads as index 1
    got = {row.record_index: (row.stage, row.error_type) for row in errors.itertuples()}
    assert got == {i: (stage, kind) for i, (_, stage, kind) in enumerate(BAD_RECORDS) if stage}
    assert all(errors.message.str.len() > 10)
    summary = read_summary(tmp_path / "out", "bad")
    assert summary["counts"]["errors"] == len(got) and summary["task_metrics"]["n_gold"] == 2


@pytest.mark.integration  # loads MiniLM
def test_an_encoder_model_is_refused_before_reading_data(tmp_path, capsys, no_data_read):
    shard = write_jsonl(tmp_path / "in" / "mc.jsonl", make_records()[:2])
    rc = run_docscore("--input", shard, "--output", tmp_path / "out", "--run_id", "r1", "--task", "choice",
                      "--model", "minilm-l6", "--attention", "native")
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "--task=choice needs a decoder (GPT-2 or Llama-family) model but --model minilm-l6 is bert" in err, err
    assert "pass a GPT-2 or Llama-family model directory" in err, err
    assert no_data_read == [] and not (tmp_path / "out" / "scores").exists()


@pytest.mark.integration
def test_records_without_choices_are_refused_before_reading_data(tmp_path, tiny_gpt2_dir, capsys, no_data_read):
    shard = write_jsonl(tmp_path / "in" / "plain.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(SENTENCES)])
    rc = run_docscore("--input", shard, *choice_flags("r1", tmp_path / "out", tiny_gpt2_dir))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "--task=choice needs a `choices` field in each record" in err and "choose another --task" in err, err
    assert len(no_data_read) == 1 and not (tmp_path / "out" / "scores").exists()  # only validation's schema peek
    text = tmp_path / "text" / "a.txt"  # a plain text file is one record with no field but its text
    text.parent.mkdir()
    text.write_text("The capital of France is")
    rc = run_docscore("--input", text.parent, *choice_flags("r2", tmp_path / "out", tiny_gpt2_dir))
    err = capsys.readouterr().err
    assert rc == 2 and "needs a `choices` field in each record" in err and "is a plain text file" in err, err


# ---------------------------------------------------------------- the task's parts

def test_the_task_is_registered_as_a_decoder_task_with_its_own_windows():
    task = tasks.get("choice")
    assert task is choice.TASK and task.model is DECODER and task.per_token and task.tokenize is choice.tokenize
    assert task.record_fields == ("choices",) and task.gathers == "gold_pairs" and task.chart == "labels"


def test_gold_index_accepts_integers_and_digit_strings_only():
    # NaN is pandas' missing value: no gold, as in every task
    assert [choice.gold_index(v, 3) for v in (0, 2, "1", " 2 ", 1.0, None, float("nan"))] == [0, 2, 1, 2, 1, None, None]
    for value, kind in ((3, "gold_out_of_range"), (-1, "gold_out_of_range"), ("-1", "gold_out_of_range"),
                        ("x", "bad_gold"), (True, "bad_gold"), (1.5, "bad_gold"), (float("inf"), "bad_gold"),
                        ([0], "bad_gold"), ("١", "bad_gold"), ("--1", "bad_gold"), ("1-2", "bad_gold")):
        with pytest.raises(RecordError) as raised:
            choice.gold_index(value, 3)
        assert raised.value.error_type == kind, value


def test_trailing_whitespace_of_the_context_moves_to_the_candidate():
    assert choice.split_pair("Answer: ", "Paris") == ("Answer:", " Paris")
    assert choice.split_pair("Answer:", " Paris") == ("Answer:", " Paris")
    assert choice.split_pair("Answer:\n\n", "Paris") == ("Answer:", "\n\nParis")


def test_windows_are_prefix_context_tail_and_candidate(tiny_gpt2_dir):
    """The windows the pipeline feeds the model, built from the tokenizer directly; a long context keeps its tail."""
    import models

    tokenizer = models.load_tokenizer(tiny_gpt2_dir)
    assert len(tokenizer.prefix) == 0  # GPT-2: no special tokens, the context's first token predicts nothing
    docs = [Document("a", "The if statement is used for ", "s", 0, {"choices": ["conditional execution", "loops"]}),
            Document("b", LONG_TEXT, "s", 1, {"choices": [" and more."], "label": 0})]
    a, b = tokenize_documents(docs, tokenizer, WindowSpec(MAX_LEN, 0, 1, task="choice"), with_query=False)
    [ctx] = tokenizer.encode_ids(["The if statement is used for"])
    for window, candidate, n in zip(a.windows, [" conditional execution", " loops"], a.spans.tokens):
        whole = tokenizer.encode_ids(["The if statement is used for" + candidate])[0]
        np.testing.assert_array_equal(window, np.concatenate([ctx, whole[len(ctx):]]))
        assert n == len(whole) - len(ctx)
    assert a.spans.bytes == (22, 6) and a.spans.gold is None and not a.truncated
    assert a.n_tokens == len(ctx) + sum(a.spans.tokens) and a.tokenize_ms > 0
    [long_ctx] = tokenizer.encode_ids([LONG_TEXT])
    [window] = b.windows
    assert len(window) == MAX_LEN and b.truncated and b.spans.gold == 0
    np.testing.assert_array_equal(window[: MAX_LEN - b.spans.tokens[0]], long_ctx[len(long_ctx) - MAX_LEN + b.spans.tokens[0]:])


def test_a_huge_context_is_tokenized_only_as_far_back_as_a_window_reaches(tiny_gpt2_dir, monkeypatch):
    """A context of megabytes gave its candidates the windows of the whole text, but tokenized all of it once per
    candidate (seconds and gigabytes): now only a tail, with the same windows."""
    import models

    tokenizer = models.load_tokenizer(tiny_gpt2_dir)
    huge = " ".join(f"{LONG_TEXT} word{i}" for i in range(2000))
    assert len(huge) > 300_000
    choices = [" and more.", " or less than that."]
    [whole] = tokenizer.encode_ids([huge])
    want = []
    for candidate in choices:
        cont = tokenizer.encode_ids([huge + candidate])[0][len(whole):]
        want.append(np.concatenate([whole[len(whole) - (MAX_LEN - len(cont)):], cont]))
    seen = []
    encode_ids = tokenizer.encode_ids
    monkeypatch.setattr(tokenizer, "encode_ids", lambda texts: seen.extend(map(len, texts)) or encode_ids(texts))
    [doc] = tokenize_documents([Document("h", huge, "s", 0, {"choices": choices})], tokenizer,
                               WindowSpec(MAX_LEN, 0, 1, task="choice"), with_query=False)
    for window, expected in zip(doc.windows, want):
        np.testing.assert_array_equal(window, expected)
    assert doc.truncated and max(seen) < 100_000
    # one run without whitespace that the tokenizer merges into few tokens: a cut inside it could change the
    # tokens right before the candidate, so such a context is tokenized whole
    monkeypatch.setattr(tokenizer, "encode_ids", encode_ids)
    run = "a" * 300_001 + " yes or no?"
    [whole] = encode_ids([run])
    cont = encode_ids([run + " yes"])[0][len(whole):]
    [doc] = tokenize_documents([Document("r", run, "s", 0, {"choices": [" yes"]})], tokenizer,
                               WindowSpec(MAX_LEN, 0, 1, task="choice"), with_query=False)
    np.testing.assert_array_equal(doc.windows[0], np.concatenate([whole[len(whole) - (MAX_LEN - len(cont)):], cont]))


def test_a_list_the_tokenizer_fails_on_is_retried_record_by_record(tiny_gpt2_dir, monkeypatch):
    import models

    tokenizer = models.load_tokenizer(tiny_gpt2_dir)
    real = tokenizer.encode_ids

    def encode_ids(texts):
        if any("boom" in t for t in texts):
            raise RuntimeError("the tokenizer failed")
        return real(texts)

    monkeypatch.setattr(tokenizer, "encode_ids", encode_ids)
    docs = [Document("a", "A for loop", "s", 0, {"choices": [" iterates"]}),
            Document("b", "boom", "s", 1, {"choices": [" x"]})]
    ok, bad = tokenize_documents(docs, tokenizer, WindowSpec(MAX_LEN, 0, 1, task="choice"), with_query=False)
    assert len(ok.windows) == 1 and (bad.stage, bad.error_type, bad.doc_id) == ("tokenize", "RuntimeError", "b")


class Outputs:
    def __init__(self, windows, spans):
        self.window_outputs, self.query_outputs, self.label_names, self.label_embeddings = list(windows), [], (), None
        self.spans = spans


def test_score_sums_each_candidates_log_probs_and_picks_by_each_normalisation():
    # position t holds log p(token t + 1); the last position predicts past the window and is never read
    a = np.log([0.9, 0.5, 0.5, 0.25, 7.0])  # 2 candidate tokens: log(.5) + log(.25)
    b = np.log([0.9, 0.5, 0.2, 7.0])  # 1 candidate token: log(.2)
    spans = choice.ChoiceSpans(tokens=(2, 1), bytes=(2, 20), gold=0)
    fields = choice.score(Outputs([a, b], spans), None)
    assert [s["score"] for s in fields["scores"]] == pytest.approx([np.log(0.125), np.log(0.2)])
    assert fields["label"] == "1" and fields["score"] == pytest.approx(0.2 / 0.325)  # -2.08 < -1.61
    assert fields["label_per_token"] == "0" and fields["label_per_byte"] == "1"  # -2.08/2 > -1.61; -2.08/2 < -1.61/20
    assert fields["gold_label"] == "0" and fields["choice_tokens"] == [2, 1] and fields["choice_bytes"] == [2, 20]
    assert choice.prediction(fields, 0) == (("1", "0", "1"), "0")
    with pytest.raises(ValueError, match="a window of 5 tokens cannot score a continuation of 5"):
        scoring.continuation_logliks([a], [5])  # nothing before it predicts its first token


def test_candidates_all_impossible_to_the_model_are_not_a_choice():
    """A model whose logits overflowed gives every candidate a log-likelihood of -inf: softmax made the score NaN
    and argmax chose candidate 0, counted in accuracy. It is a score error (an error row); one impossible
    candidate among possible ones is still a choice."""
    spans = choice.ChoiceSpans(tokens=(1, 1), bytes=(1, 1), gold=1)
    impossible = np.array([0.0, -np.inf, 0.0])
    with pytest.raises(ValueError, match="every candidate's log-likelihood is -inf"):
        choice.score(Outputs([impossible, impossible], spans), None)
    fields = choice.score(Outputs([impossible, np.log([0.5, 0.5, 1.0])], spans), None)
    assert fields["label"] == "1" and fields["score"] == 1.0


def test_equal_candidates_get_one_score_and_the_first_of_them_wins(tiny_gpt2_dir):
    """The same candidate twice is one window twice; the model, run on the copies in different rows of a batch,
    gave them log-probs differing in the last float32 bits, so a later copy could win over the first (and the
    label changed with the rest of the corpus). Equal windows now share the first copy's score."""
    import models

    tokenizer = models.load_tokenizer(tiny_gpt2_dir)
    doc = Document("t", "and/or cleanup", "s", 0, {"choices": [' ":"', ' ":"', ' ":" suite]', ' ":"'], "label": 0})
    [tokenized] = tokenize_documents([doc], tokenizer, WindowSpec(MAX_LEN, 0, 1, task="choice"), with_query=False)
    assert tokenized.spans.same_as == (0, 0, 2, 0)
    # a context cut to fit can make two windows of the same tokens whose candidates differ in length: not equal
    context = np.array([7] * 10, np.int32)
    cut = choice._windows("c", ["a", "aa"], None, np.zeros(0, np.int32), context,
                          [np.array([7], np.int32), np.array([7, 7], np.int32)], max_len=4)
    assert [w.tolist() for w in cut.windows] == [[7, 7, 7, 7]] * 2 and cut.spans.same_as == (0, 1)
    first = np.log([0.9, 0.5, 0.5, 7.0])
    noisy = [first, first + np.array([0, 0, 1e-7, 0]), np.log([0.9, 0.5, 0.1, 0.1, 7.0])[: len(first)], first + 2e-7]
    spans = choice.ChoiceSpans(tokens=(1, 1, 1, 1), bytes=(4, 4, 10, 4), gold=0, same_as=(0, 0, 2, 0))
    fields = choice.score(Outputs(noisy, spans), None)
    assert fields["label"] == fields["label_per_token"] == fields["label_per_byte"] == "0"
    assert len({s["score"] for i, s in enumerate(fields["scores"]) if i != 2}) == 1


def test_metrics_are_the_accuracy_of_each_normalisation():
    pairs = [(("0", "0", "1"), "0"), (("1", "0", "1"), "1"), (("2", "2", "2"), "0")]
    assert choice.metrics(GoldTotals(4, pairs, 0.0, 0)) == {
        "n_docs": 4, "n_gold": 3, "accuracy": pytest.approx(2 / 3), "accuracy_per_token": pytest.approx(1 / 3),
        "accuracy_per_byte": pytest.approx(1 / 3)}
    assert choice.metrics(GoldTotals(2, [], 0.0, 0))["accuracy"] is None



def test_each_normalisations_accuracy_is_reported_under_its_own_name():
    """The three accuracies differ when the picks do: per token right twice, per byte once (the metrics test
    above has them equal, so swapping the names went unnoticed)."""
    pairs = [(("0", "0", "1"), "0"), (("1", "1", "0"), "1"), (("0", "1", "0"), "0")]
    assert choice.metrics(GoldTotals(3, pairs, 0.0, 0)) == {
        "n_docs": 3, "n_gold": 3, "accuracy": 1.0, "accuracy_per_token": pytest.approx(2 / 3),
        "accuracy_per_byte": pytest.approx(1 / 3)}
    # from a scored record: candidate 1 by log-likelihood and per byte, candidate 0 (the gold) per token
    a, b = np.log([0.9, 0.5, 0.5, 0.25, 7.0]), np.log([0.9, 0.5, 0.2, 7.0])
    fields = choice.score(Outputs([a, b], choice.ChoiceSpans(tokens=(2, 1), bytes=(2, 20), gold=0)), None)
    prediction, gold = choice.prediction(fields, 0)
    metrics = choice.metrics(GoldTotals(1, [(prediction, gold)], 0.0, 0))
    assert (metrics["accuracy"], metrics["accuracy_per_token"], metrics["accuracy_per_byte"]) == (0.0, 1.0, 0.0)


def test_the_score_of_long_candidates_is_a_probability_not_nan():
    """Long candidates have log-likelihoods around -800, whose exp underflows to 0: the chosen candidate's
    probability among them is still e / (1 + e) for logliks -800 and -801, not NaN (0 / 0)."""
    spans = choice.ChoiceSpans(tokens=(1, 1), bytes=(1, 1), gold=0)
    fields = choice.score(Outputs([np.array([0.0, -800.0, 0.0]), np.array([0.0, -801.0, 0.0])], spans), None)
    assert fields["label"] == "0"
    assert fields["score"] == pytest.approx(1 / (1 + np.exp(-1.0)))

@pytest.mark.integration
def test_a_gold_under_another_name_gets_a_notice_not_silence(tmp_path, tiny_gpt2_dir, capsys):
    """lm-evaluation-harness's records keep the gold in `gold`: the run says it is not read instead of leaving the
    accuracy out without a word."""
    records = [{"id": r["id"], "context": r["text"], "choices": r["choices"], "gold": r["label"]} for r in make_records()[:3]]
    shard = write_jsonl(tmp_path / "in" / "mc.jsonl", records)
    assert run_docscore("--input", shard, *choice_flags("g", tmp_path / "out", tiny_gpt2_dir), "--text_field", "context") == 0
    notice = "--task=choice reads the gold from a record's `label` field; "
    captured = capsys.readouterr()
    assert notice in captured.out + captured.err
    summary = read_summary(tmp_path / "out", "g")
    assert any(n.startswith(notice) and "has `gold`" in n for n in summary["notices"])
    assert summary["task_metrics"]["n_gold"] == 0 and summary["task_metrics"]["accuracy"] is None


def test_stride_and_max_chunks_which_choice_does_not_take_are_not_checked_against_it(tmp_path, tiny_gpt2_dir):
    """README: --stride and --max_chunks do not apply to choice (each candidate is one window): a stride as long as a
    short window, or max_chunks 0, must not refuse the run (a model converted at a short window could not run choice
    at all without passing a --stride that does nothing)."""
    shard = write_jsonl(tmp_path / "in" / "mc.jsonl", make_records()[:3])
    flags = choice_flags("short", tmp_path / "out", tiny_gpt2_dir)
    assert run_docscore("--input", shard, *flags, "--max_seq_len", "32", "--stride", "32", "--max_chunks", "0") == 0
    assert run_docscore("--input", shard, *choice_flags("plain", tmp_path / "out", tiny_gpt2_dir), "--max_seq_len", "32") == 0
    short, plain = (read_table(tmp_path / "out", "scores", run)[0] for run in ("short", "plain"))
    assert len(short) >= 2 and list(short.score) == list(plain.score)  # the flags change nothing
