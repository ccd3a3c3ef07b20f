"""Windows: documents become windows with the real MiniLM tokenizer (tests/test_packing.py covers how
windows become fixed-shape model calls)."""
from __future__ import annotations

import pytest

from pipeline.preprocess import WindowSpec, tokenize_document
from pipeline.records import Document
from tests.conftest import LONG_TEXT


def test_tokenize_document_windows_query_and_truncation(minilm):
    doc = Document("d", LONG_TEXT, "s", 0, fields={"query": "a short query"})
    full = tokenize_document(doc, minilm.tokenizer, WindowSpec(max_len=32, stride=8, max_chunks=8), with_query=True)
    assert len(full.windows) == 3 and not full.truncated and full.n_tokens > 32
    assert all(len(w) <= 32 for w in full.windows) and len(full.query_windows) == 1
    assert full.doc.text == "" and full.tokenize_ms >= 0
    cut = tokenize_document(doc, minilm.tokenizer, WindowSpec(max_len=32, stride=8, max_chunks=2), with_query=False)
    assert len(cut.windows) == 2 and cut.truncated and cut.query_windows == []
    with pytest.raises(ValueError, match="query"):
        tokenize_document(Document("e", "text", "s", 1), minilm.tokenizer, WindowSpec(32, 8, 8), with_query=True)
