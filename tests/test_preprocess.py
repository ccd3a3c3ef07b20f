"""Windows: documents become windows with the real MiniLM tokenizer (tests/test_packing.py covers how
windows become fixed-shape model calls)."""
from __future__ import annotations

from pipeline.records import Document, ErrorRow
from pipeline.stages.preprocess import WindowSpec, tokenize_documents
from tests.conftest import LONG_TEXT


def test_tokenize_documents_windows_query_and_truncation(minilm):
    doc = Document("d", LONG_TEXT, "s", 0, fields={"query": "a short query"})
    [full] = tokenize_documents([doc], minilm.tokenizer, WindowSpec(max_len=32, stride=8, max_chunks=8), with_query=True)
    assert len(full.windows) == 3 and not full.truncated and full.n_tokens > 32
    assert all(len(w) <= 32 for w in full.windows) and len(full.query_windows) == 1
    assert full.doc.text == "" and full.tokenize_ms >= 0
    [cut] = tokenize_documents([doc], minilm.tokenizer, WindowSpec(max_len=32, stride=8, max_chunks=2), with_query=False)
    assert len(cut.windows) == 2 and cut.truncated and cut.query_windows == []
    # a similarity pair whose query is cut (the text whole) is truncated too: part of what it compares was not read
    [pair] = tokenize_documents([Document("q", "a short text", "s", 2, fields={"query": LONG_TEXT})], minilm.tokenizer,
                                WindowSpec(max_len=32, stride=8, max_chunks=2), with_query=True)
    assert len(pair.windows) == 1 and len(pair.query_windows) == 2 and pair.truncated
    [error] = tokenize_documents([Document("e", "text", "s", 1)], minilm.tokenizer, WindowSpec(32, 8, 8), with_query=True)
    assert isinstance(error, ErrorRow) and "query" in error.message and error.stage == "tokenize"


def test_batched_tokenization_gives_the_windows_of_one_by_one(minilm):
    """One batch encode of many documents (short, long past FULL_TOKENIZE_CHARS, with queries, unusual
    characters) gives each document exactly the windows, counts and truncation of encoding it alone."""
    import numpy as np

    from pipeline.stages.preprocess import FULL_TOKENIZE_CHARS

    texts = ["short one", LONG_TEXT, "naïve café – 東京 🙂 " * 40, "word " * (FULL_TOKENIZE_CHARS // 4),
             "x" * (FULL_TOKENIZE_CHARS + 10), "tabs\tand\nnew lines", LONG_TEXT[:500]]
    docs = [Document(f"d{i}", t, "s", i, fields={"query": f"query {i}"}) for i, t in enumerate(texts)]
    spec = WindowSpec(max_len=64, stride=8, max_chunks=4)
    for with_query in (False, True):
        batched = tokenize_documents(docs, minilm.tokenizer, spec, with_query=with_query)
        for doc, together in zip(docs, batched):
            [alone] = tokenize_documents([doc], minilm.tokenizer, spec, with_query=with_query)
            assert (together.n_tokens, together.truncated) == (alone.n_tokens, alone.truncated)
            for a, b in zip(together.windows + together.query_windows, alone.windows + alone.query_windows, strict=True):
                np.testing.assert_array_equal(a, b)


def test_text_without_tokens_is_an_empty_text_error_in_its_place(minilm):
    docs = [Document("a", "fine text", "s", 0), Document("z", "\u200b\u200b \u0301\x07", "s", 1),
            Document("b", "more text", "s", 2)]
    out = tokenize_documents(docs, minilm.tokenizer, WindowSpec(32, 8, 8), with_query=False)
    assert [type(x).__name__ for x in out] == ["TokenizedDoc", "ErrorRow", "TokenizedDoc"]
    assert (out[1].error_type, out[1].doc_id, out[1].stage) == ("empty_text", "z", "tokenize")


def test_similarity_query_problems_are_error_rows_of_documented_types(minilm):
    """A similarity record whose `query` is absent, not a string, blank or without tokens is an error row of
    the type README lists, in its place; the records around it are scored."""
    queries = {"ok": "a query", "absent": None, "number": 5, "flag": True, "blank": "  \t", "no_tokens": "\u200b\u0301"}
    docs = [Document(name, "fine text", "s", i, fields={} if q is None else {"query": q})
            for i, (name, q) in enumerate(queries.items())]
    out = tokenize_documents(docs, minilm.tokenizer, WindowSpec(32, 8, 8), with_query=True)
    assert type(out[0]).__name__ == "TokenizedDoc" and len(out[0].query_windows) == 1
    assert [(e.doc_id, e.stage, e.error_type) for e in out[1:]] == [
        ("absent", "tokenize", "missing_field"), ("number", "tokenize", "bad_field_type"),
        ("flag", "tokenize", "bad_field_type"), ("blank", "tokenize", "empty_text"),
        ("no_tokens", "tokenize", "empty_text")]
    assert all("query" in e.message for e in out[1:])



def test_tokenized_lists_are_cut_to_the_beam_batch_token_budget(minilm):
    """Tokenize on a real Beam runner: a read list of documents comes out as consecutive lists of at most the
    budget's model tokens (a document larger than the budget alone), every document once and in order; a
    document without tokens goes to the errors output."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from pipeline.stages.inference import ModelSpec
    from pipeline.stages.preprocess import Tokenize, tokens_of

    texts = [f"document {i} " + "word " * (i % 7) * 5 for i in range(40)] + [" ".join([LONG_TEXT] * 3)]
    docs = [Document(f"d{i}", t, "s", i) for i, t in enumerate(texts)]
    docs.insert(3, Document("blank", "\u200b", "s", 99))
    budget = 120
    expected = [d.doc_id for d in docs if d.doc_id != "blank"]

    def check(lists):  # each list: [(doc_id, model tokens), ...]
        assert len(lists) > 1
        for batch in lists:
            assert sum(size for _, size in batch) <= budget or len(batch) == 1, batch
        in_order = sorted(lists, key=lambda batch: expected.index(batch[0][0]))
        assert [doc_id for batch in in_order for doc_id, _ in batch] == expected
        assert [("d40", tokens_of([long_doc]))] in lists  # LONG_TEXT's windows alone are over the budget

    spec = WindowSpec(max_len=32, stride=8, max_chunks=8)
    [long_doc] = tokenize_documents([docs[-1]], minilm.tokenizer, spec, with_query=False)
    assert tokens_of([long_doc]) > budget
    with beam.Pipeline() as p:
        out = (p | beam.Create([docs])
               | beam.ParDo(Tokenize(ModelSpec("minilm-l6"), spec, with_query=False, max_tokens=budget))
               .with_outputs("errors", main="docs"))
        assert_that(out.docs | beam.Map(lambda batch: [(d.doc.doc_id, tokens_of([d])) for d in batch]), check)
        assert_that(out.errors | beam.Map(lambda e: (e.doc_id, e.error_type)), equal_to([("blank", "empty_text")]),
                    label="errors")


def test_a_text_the_tokenizer_fails_on_is_an_untokenizable_error_row_quoting_it():
    """A Unigram vocabulary without an unknown token raises on a piece it cannot encode: the row was typed by the
    exception's class ("Exception") with the tokenizer's bare message; the documents around it are scored."""
    import tokenizers

    from models.tokenizer import DocTokenizer

    model = tokenizers.models.Unigram([("a", -1.0), ("b", -1.0)], unk_id=None)
    tokenizer = DocTokenizer(tokenizers.Tokenizer(model), max_seq_len=16)
    docs = [Document(name, text, "s", i) for i, (name, text) in enumerate((("ok", "ab"), ("bad", "abc"), ("also", "ba")))]
    out = tokenize_documents(docs, tokenizer, WindowSpec(16, 2, 4), with_query=False)
    assert [type(x).__name__ for x in out] == ["TokenizedDoc", "ErrorRow", "TokenizedDoc"]
    assert (out[1].stage, out[1].error_type, out[1].doc_id) == ("tokenize", "untokenizable", "bad")
    assert out[1].message.startswith("the model's tokenizer cannot encode this record's text (Exception: ")
    assert "unk_id" in out[1].message


def test_a_long_text_is_cut_at_the_last_whitespace_of_any_kind_after_the_pieces_start():
    """long_text's cuts: the last (or, for a context's tail, the first) of every CUT_SPACES kind, never at the
    piece's own start (a piece beginning at the previous cut's space and holding no other would be empty, and
    encode_text would read it forever), and never at characters a tokenizer does not split words at."""
    from pipeline.stages.long_text import CUT_SPACES, space_after, space_before

    assert set(CUT_SPACES) == {" ", "\n", "\t", "\r"}
    text = "ab cd\tef\ngh\rij"
    assert space_before(text, len(text)) == text.index("\r")
    assert space_before(text, text.index("\r")) == text.index("\n")
    assert space_before(text, text.index("\n")) == text.index("\t")
    assert space_before(text, text.index("\t")) == text.index(" ")
    assert space_after(text, 0) == text.index(" ")
    assert space_after(text, text.index(" ") + 1) == text.index("\t")
    assert space_after(text, text.index("\n")) == text.index("\n")  # at `start` itself
    assert space_after("\nab cd", 0) == 0
    assert space_after("abcd", 0) is None
    run = " " + "x" * 10  # the only space is where the piece starts: no cut in it
    assert space_before(run, len(run), 0) is None
    assert space_before("ab" + run, len(run) + 2, 1) == 2
    assert space_before("a\x1cb\u00a0c\u3000d", 7) is None  # BERT deletes \x1c; Metaspace keeps Unicode spaces
