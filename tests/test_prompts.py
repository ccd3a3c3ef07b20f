"""Prompts: the text a sentence-transformers model puts before a document and before a query (its
config_sentence_transformers.json `prompts`: a document's is the first of "document", "passage", "corpus", as
encode_document's documentation picks it, a query's "query"). `docscore convert` records them; every window of an
embedding task's document (and classify's label descriptions) starts with the document prompt, every window of
similarity's `query` with the query prompt, tokenised with the text as sentence-transformers tokenises a prompt
and text, so embeddings and scores equal SentenceTransformer.encode's given the same prompt."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from models.model_dir import METADATA, read_metadata
from models.tokenizer import DocTokenizer
from pipeline.stages.long_text import FULL_TOKENIZE_CHARS
from pipeline.stages.preprocess import WindowSpec, encode_text, tokenize_documents
from pipeline.records import Document
from tests.conftest import SENTENCES, byte_level_bpe, read_summary, read_table, run_docscore, write_jsonl
from tests.test_convert import convert, sentence_transformers_dir
from tests.test_summary_doc import doc_rows, key_paths, pattern

E5 = {"query": "query: ", "passage": "passage: "}  # a space at the prompt's end: the text's first token takes it
QWEN3 = {"query": "Instruct: Given a question, retrieve passages that answer it\nQuery:", "document": ""}


def bpe_tokenizer(prompts: dict[str, str]) -> DocTokenizer:
    from tokenizers import processors

    tokenizer = byte_level_bpe(["<|endoftext|>"])
    tokenizer.post_processor = processors.TemplateProcessing(single="$A <|endoftext|>",
                                                             special_tokens=[("<|endoftext|>", 0)])
    return DocTokenizer(tokenizer, max_seq_len=32, prompts=prompts)


def test_a_prompt_and_its_text_are_the_tokens_of_both_together_and_every_window_starts_with_the_prompt():
    tokenizer = bpe_tokenizer({"document": "passage: ", "query": "query: "})
    texts = [SENTENCES[0], "how many", " leading space", "(brackets)", ""]
    for role, prompt in (("document", "passage: "), ("query", "query: ")):
        for text, (lead, ids) in zip(texts, tokenizer.prompted_ids(texts, role)):
            assert np.array_equal(np.concatenate([lead, ids]), tokenizer.encode_ids([prompt + text])[0]), text
            assert 0 < len(lead) <= tokenizer.prompt_tokens(role) and (len(ids) > 0) == (len(text) > 0)
    lead, ids = tokenizer.prompted_ids(["the model"], "query")[0]
    assert len(lead) < tokenizer.prompt_tokens("query")  # " the" took the prompt's space: one token, "Ġthe"

    long_text = " ".join(SENTENCES * 3)
    doc = tokenizer.encode_windows([long_text], max_len=24, stride=4, role="query")[0]
    assert len(doc.windows) > 2 and doc.n_tokens == len(ids := tokenizer.prompted_ids([long_text], "query")[0][1])
    lead = tokenizer.prompted_ids([long_text], "query")[0][0]
    for window in doc.windows:
        assert len(window) <= 24 and np.array_equal(window[:len(lead)], lead) and window[-1] == 0
    text_ids = np.concatenate([w[len(lead):-1] for w in doc.windows[:1]])
    assert np.array_equal(text_ids, ids[:len(text_ids)])
    assert tokenizer.encode_windows(["x"], role=None)[0].windows[0].tolist() == tokenizer.encode_ids(["x"])[0].tolist() + [0]
    assert tokenizer.prompted_ids([""], "document")[0][1].size == 0  # nothing of its own: an empty_text error row


def test_a_text_past_the_piecewise_limit_gets_the_same_prompted_windows_as_tokenised_whole():
    tokenizer = bpe_tokenizer({"document": "passage: "})
    text = (" ".join(SENTENCES) + " ") * (FULL_TOKENIZE_CHARS // len(" ".join(SENTENCES)) + 2)
    assert len(text) > FULL_TOKENIZE_CHARS
    spec = WindowSpec(max_len=32, stride=4, max_chunks=5)
    pieces = encode_text(tokenizer, text, spec, role="document")
    whole = tokenizer.encode_windows([text], max_len=32, stride=4, max_windows=5, role="document")[0]
    assert [w.tolist() for w in pieces.windows] == [w.tolist() for w in whole.windows] and pieces.truncated


def test_documents_of_an_embedding_task_get_the_document_prompt_and_queries_the_query_prompt():
    tokenizer = bpe_tokenizer({"document": "passage: ", "query": "query: "})
    doc = Document(source="s", record_index=0, doc_id="a", text="how many", fields={"query": "what is"})
    spec = WindowSpec(max_len=32, stride=4, max_chunks=5, task="similarity")
    [tokenized] = tokenize_documents([doc], tokenizer, spec, with_query=True)
    assert tokenized.windows[0].tolist() == tokenizer.encode_ids(["passage: how many"])[0].tolist() + [0]
    assert tokenized.query_windows[0].tolist() == tokenizer.encode_ids(["query: what is"])[0].tolist() + [0]
    assert tokenized.n_tokens == len(tokenizer.prompted_ids(["how many"], "document")[0][1])
    [unprompted] = tokenize_documents([doc], tokenizer, WindowSpec(32, 4, 5, task="loglik"), with_query=False)
    assert unprompted.windows[0].tolist() == tokenizer.encode_ids(["how many"])[0].tolist() + [0]  # a language model's


def prompted_bert(tmp_path: Path, settings: dict) -> Path:
    src = sentence_transformers_dir(tmp_path / "st")
    (src / "config_sentence_transformers.json").write_text(json.dumps(settings))
    return src


@pytest.mark.integration
def test_embed_similarity_and_classify_equal_sentence_transformers_with_its_prompts(tmp_path, capsys):
    """e5's layout (query: / passage:): --task embed gives encode_document's embeddings, similarity the cosine of
    encode_query's and encode_document's, classify embeds its label descriptions as documents; the summary names
    the prompts. Without them the embeddings differ, so the comparison tells."""
    from sentence_transformers import SentenceTransformer

    src = prompted_bert(tmp_path, {"prompts": E5, "default_prompt_name": None})
    code, message = convert(src, tmp_path / "model", capsys)
    assert code == 0 and "mean pooling, document prompt 'passage: ', query prompt 'query: ', fingerprint" in message, message
    assert json.loads((tmp_path / "model" / METADATA).read_text())["prompts"] == {"document": "passage: ",
                                                                                "query": "query: "}
    st = SentenceTransformer(str(src), device="cpu")
    texts, queries = SENTENCES[:6], SENTENCES[6:12]
    records = [{"id": f"d{i}", "text": t, "query": q} for i, (t, q) in enumerate(zip(texts, queries))]
    shard = write_jsonl(tmp_path / "in" / "d.jsonl", records)
    labels = {"animals": "a sentence about animals", "work": "a sentence about work"}

    def run(task: str, *extra: str):
        assert run_docscore("--input", shard, "--output", tmp_path / "out", "--run_id", task, "--task", task,
                            "--model", tmp_path / "model", "--batch_size", "2", *extra) == 0
        scores, _ = read_table(tmp_path / "out", "scores", task)
        return scores.sort_values("record_index")

    # sentence-transformers 6.3's encode_document puts its own empty "document" placeholder first, so the prompt is
    # passed as such
    documents = st.encode(texts, prompt="passage: ", normalize_embeddings=True).astype(np.float64)
    ours = np.stack(run("embed").embedding.map(np.asarray)).astype(np.float64)
    assert np.sum(ours * documents, axis=1).min() >= 0.99999
    plain = st.encode(texts, normalize_embeddings=True).astype(np.float64)
    assert np.sum(ours * plain, axis=1).max() < 0.999  # the prompt changed them
    summary = read_summary(tmp_path / "out", "embed")
    assert summary["model"]["prompts"] == {"document": "passage: "}  # what this run put before its texts
    documented = [pattern(key) for key in doc_rows()]  # docs/summary.md documents every key, the prompts' too
    assert not [path for path in key_paths(summary)[0] if not any(p.match(path) for p in documented)]

    expected = np.sum(st.encode(queries, prompt="query: ", normalize_embeddings=True) * documents, axis=1)
    np.testing.assert_allclose(run("similarity").score.to_numpy(), expected, atol=2e-5)
    assert read_summary(tmp_path / "out", "similarity")["model"]["prompts"] == {"document": "passage: ", "query": "query: "}

    described = st.encode(list(labels.values()), prompt="passage: ", normalize_embeddings=True).astype(np.float64)
    logits = documents @ described.T / 0.05
    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    classified = run("classify", "--labels", ";".join(f"{k}={v}" for k, v in labels.items()))
    got = np.array([[s["score"] for s in row] for row in classified.scores])
    np.testing.assert_allclose(got, probabilities, atol=1e-3)


@pytest.mark.integration
@pytest.mark.parametrize("prompts", [QWEN3, E5], ids=["qwen3", "e5"])
def test_a_decoder_embedders_query_prompt_through_similarity_equals_sentence_transformers(prompts, tmp_path, capsys):
    """Qwen3-Embedding's instruction before queries only (its document prompt is empty), and e5's prompts on a
    byte-level BPE, where the prompt's last space joins the text's first token."""
    from sentence_transformers import SentenceTransformer

    from tests.test_decoder_embedders import build_st_decoder

    src = build_st_decoder(tmp_path / "st", "qwen3-lasttoken")
    (src / "config_sentence_transformers.json").write_text(json.dumps({"prompts": prompts}))
    code, message = convert(src, tmp_path / "model", capsys)
    assert code == 0, message
    recorded = {role: text for role, text in (("document", prompts.get("document", prompts.get("passage"))),
                                              ("query", prompts["query"])) if text}
    assert read_metadata(str(tmp_path / "model")).prompts == recorded
    st = SentenceTransformer(str(src), device="cpu")
    texts, queries = SENTENCES[:6], [" ".join(s.split()[:3]) for s in SENTENCES[6:12]]  # one window with the prompt
    shard = write_jsonl(tmp_path / "in" / "d.jsonl",
                        [{"id": f"d{i}", "text": t, "query": q} for i, (t, q) in enumerate(zip(texts, queries))])
    assert run_docscore("--input", shard, "--output", tmp_path / "out", "--run_id", "s", "--task", "similarity",
                        "--model", tmp_path / "model", "--batch_size", "2", "--stride", "8") == 0  # a 64-token model
    scores, _ = read_table(tmp_path / "out", "scores", "s")
    expected = np.sum(st.encode(queries, prompt=recorded["query"], normalize_embeddings=True)
                      * st.encode(texts, prompt=recorded.get("document"), normalize_embeddings=True), axis=1)
    np.testing.assert_allclose(scores.sort_values("record_index").score.to_numpy(), expected, atol=2e-5)


def test_prompts_are_read_as_sentence_transformers_picks_them_and_a_mean_without_them_is_refused(tmp_path, capsys):
    """The default prompt stands in for a role without its own; an empty prompt is none; a Pooling that leaves the
    prompt out of its mean is refused; a --max_seq_len with no room beside the prompt is refused before data."""
    from models.hf_import import sentence_transformers_prompts

    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"search": "search_document: ", "query": ""}, "default_prompt_name": "search"}))
    assert sentence_transformers_prompts(str(tmp_path), "mean") == {"document": "search_document: "}
    assert sentence_transformers_prompts(str(tmp_path), None) == {}  # a language model has none
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"corpus": "c: ", "passage": "p: ", "query": "q: "}}))
    assert sentence_transformers_prompts(str(tmp_path), "mean") == {"document": "p: ", "query": "q: "}

    src = prompted_bert(tmp_path / "bert", {"prompts": E5})
    pooling = json.loads((src / "1_Pooling" / "config.json").read_text())
    (src / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "include_prompt": False}))
    code, message = convert(src, tmp_path / "refused", capsys)
    assert code == 2 and "include_prompt false leaves the prompt's tokens out of the mean" in message, message

    (src / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (src / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"query": "one two three " * 3}}))
    assert convert(src, tmp_path / "model", capsys)[0] == 0
    shard = write_jsonl(tmp_path / "in" / "d.jsonl", [{"id": "a", "text": "hello", "query": "hi"}])
    code = run_docscore("--input", shard, "--output", tmp_path / "out", "--run_id", "r", "--task", "similarity",
                        "--model", tmp_path / "model", "--max_seq_len", "11")
    err = capsys.readouterr().err
    assert code == 2 and "--max_seq_len=11 leaves no room for text beside the model's 9-token prompt" in err, err


def test_a_cls_pooling_that_leaves_the_prompt_out_is_refused(tmp_path, capsys):
    """sentence-transformers masks the prompt's tokens ([CLS] with them) before pooling when include_prompt is false,
    so its CLS pooling takes the first token after the prompt, not [CLS]: docscore, which pools [CLS], refuses it."""
    from sentence_transformers import SentenceTransformer

    src = sentence_transformers_dir(tmp_path / "st", pooling={"pooling_mode_cls_token": True, "include_prompt": False})
    (src / "config_sentence_transformers.json").write_text(json.dumps({"prompts": E5}))
    st = SentenceTransformer(str(src), device="cpu")
    left_out = st.encode(SENTENCES[:2], prompt="passage: ", normalize_embeddings=True)
    st.set_pooling_include_prompt(True)
    included = st.encode(SENTENCES[:2], prompt="passage: ", normalize_embeddings=True)
    assert np.sum(left_out * included, axis=1).max() < 0.99  # the prompt's tokens, [CLS] among them, were left out
    code, message = convert(src, tmp_path / "model", capsys)
    assert code == 2 and "include_prompt false leaves the prompt's tokens out of CLS pooling" in message, message
    assert not (tmp_path / "model").exists()


@pytest.mark.integration
def test_a_pooling_that_leaves_prompts_out_converts_without_prompts_and_refuses_a_runs_prompt(tmp_path, capsys):
    """include_prompt false and no saved prompts: the model converts (its unprompted embeddings are the model's) and
    metadata.json records it, so a --document_prompt, which docscore would pool with the text (min cosine 0.996
    to SentenceTransformer.encode(prompt=...) when it ran), is refused before data naming the flag."""
    from sentence_transformers import SentenceTransformer

    from models.model_dir import read_metadata

    src = sentence_transformers_dir(tmp_path / "st", pooling={"pooling_mode_mean_tokens": True, "include_prompt": False})
    code, message = convert(src, tmp_path / "model", capsys)
    assert code == 0 and "refuses --document_prompt and --query_prompt with it" in message, message
    assert read_metadata(str(tmp_path / "model")).include_prompt is False
    shard = write_jsonl(tmp_path / "in" / "d.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(SENTENCES[:4])])
    flags = ["--input", shard, "--output", tmp_path / "out", "--task", "embed", "--model", tmp_path / "model"]
    assert run_docscore(*flags, "--run_id", "plain") == 0
    scores, _ = read_table(tmp_path / "out", "scores", "plain")
    ours = np.stack(scores.sort_values("record_index").embedding.map(np.asarray)).astype(np.float64)
    expected = SentenceTransformer(str(src), device="cpu").encode(SENTENCES[:4], normalize_embeddings=True)
    assert np.sum(ours * expected, axis=1).min() >= 0.99999
    capsys.readouterr()
    assert run_docscore(*flags, "--run_id", "prompted", "--document_prompt", "query: ") == 2
    err = capsys.readouterr().err
    assert "--document_prompt: --model" in err and "include_prompt false" in err and "drop --document_prompt" in err, err
    assert run_docscore(*flags, "--run_id", "empty", "--document_prompt", "") == 0  # no prompt: nothing to leave out


@pytest.mark.integration
def test_a_runs_prompts_replace_the_models_and_a_prompt_no_text_of_the_task_takes_is_refused(tmp_path, capsys,
                                                                                            monkeypatch):
    """--document_prompt / --query_prompt put a model card's task prompt in place of the model's ('' none): the
    embeddings are SentenceTransformer.encode's with that prompt, and the summary says which were used; a flag
    whose role the task has no text of is refused before any data is read."""
    from sentence_transformers import SentenceTransformer

    from pipeline.io import sources

    src = prompted_bert(tmp_path, {"prompts": E5})
    assert convert(src, tmp_path / "model", capsys)[0] == 0
    st = SentenceTransformer(str(src), device="cpu")
    texts, queries = SENTENCES[:4], SENTENCES[4:8]
    shard = write_jsonl(tmp_path / "in" / "d.jsonl",
                        [{"id": f"d{i}", "text": t, "query": q} for i, (t, q) in enumerate(zip(texts, queries))])

    def run(run_id: str, task: str, *flags: str) -> int:
        return run_docscore("--input", shard, "--output", tmp_path / "out", "--run_id", run_id, "--task", task,
                            "--model", tmp_path / "model", "--batch_size", "2", *flags)

    for run_id, flag, prompt in (("classification", "task: classification | query: ", "task: classification | query: "),
                                 ("none", "", None)):
        assert run(run_id, "embed", "--document_prompt", flag) == 0
        scores, _ = read_table(tmp_path / "out", "scores", run_id)
        ours = np.stack(scores.sort_values("record_index").embedding.map(np.asarray)).astype(np.float64)
        expected = st.encode(texts, prompt=prompt, normalize_embeddings=True).astype(np.float64)
        assert np.sum(ours * expected, axis=1).min() >= 0.99999, run_id
        assert read_summary(tmp_path / "out", run_id)["model"]["prompts"] == ({"document": prompt} if prompt else {})

    assert run("sim", "similarity", "--query_prompt", "question: ") == 0
    scores, _ = read_table(tmp_path / "out", "scores", "sim")
    expected = np.sum(st.encode(queries, prompt="question: ", normalize_embeddings=True)
                      * st.encode(texts, prompt="passage: ", normalize_embeddings=True), axis=1)
    np.testing.assert_allclose(scores.sort_values("record_index").score.to_numpy(), expected, atol=2e-5)
    assert read_summary(tmp_path / "out", "sim")["model"]["prompts"] == {"document": "passage: ", "query": "question: "}

    capsys.readouterr()
    monkeypatch.setattr(sources, "read_shard", lambda *a, **k: pytest.fail("a shard was read before the refusal"))
    assert run("q", "embed", "--query_prompt", "question: ") == 2
    assert "--query_prompt: --task=embed puts no query prompt anywhere (only --task similarity embeds a query)" in \
        capsys.readouterr().err
    assert run("l", "loglik", "--document_prompt", "x: ") == 2
    assert "--task=loglik scores token log-probabilities, which no prompt is put before" in capsys.readouterr().err


@pytest.mark.integration
def test_a_runs_prompt_too_long_for_its_windows_is_refused_naming_its_flag(tmp_path, capsys, monkeypatch):
    """A --document_prompt or --query_prompt that leaves a window no room for text (or for --stride) is the run's
    own, not the model's: the refusal, before any data is read, says which flag to shorten, not only to raise a
    --max_seq_len that may already be the model's."""
    from pipeline.io import sources

    src = prompted_bert(tmp_path, {"prompts": E5})
    assert convert(src, tmp_path / "model", capsys)[0] == 0
    shard = write_jsonl(tmp_path / "in" / "d.jsonl", [{"id": "d0", "text": SENTENCES[0], "query": SENTENCES[1]}])
    monkeypatch.setattr(sources, "read_shard", lambda *a, **k: pytest.fail("a shard was read before the refusal"))

    def refusal(task: str, *flags: str) -> str:
        capsys.readouterr()
        assert run_docscore("--input", shard, "--output", tmp_path / "out", "--task", task, "--model",
                            tmp_path / "model", *flags) == 2
        return capsys.readouterr().err

    err = refusal("embed", "--document_prompt", "word " * 500)
    assert "beside --document_prompt's 500-token prompt and the special tokens; shorten --document_prompt" in err, err
    err = refusal("similarity", "--query_prompt", "word " * 20, "--max_seq_len", "24", "--stride", "2")
    assert "beside --query_prompt's 20-token prompt; lower --stride, shorten --query_prompt" in err, err
    # the model's own prompt: no flag to shorten
    err = refusal("embed", "--max_seq_len", "8", "--stride", "4")
    assert "beside the model's 2-token prompt; lower --stride or raise --max_seq_len" in err, err
