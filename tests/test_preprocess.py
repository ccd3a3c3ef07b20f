"""Windows and length buckets: documents become windows with the real MiniLM tokenizer, and the batch
runner calls the model only with fixed shapes, mapping every output back to its row."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.inference import run_rows
from pipeline.preprocess import WindowSpec, bucket_for, bucket_lengths, tokenize_document
from pipeline.records import Document
from tests.conftest import LONG_TEXT


def test_bucket_ladder_is_capped_at_the_window_length():
    assert bucket_lengths(256) == (16, 32, 64, 128, 192, 256)
    assert bucket_lengths(100) == (16, 32, 64, 100)
    assert [bucket_for(n, bucket_lengths(100)) for n in (1, 16, 17, 64, 65, 100)] == [16, 16, 32, 64, 100, 100]


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


def test_run_rows_uses_fixed_shapes_and_returns_each_rows_output():
    rng = np.random.default_rng(0)
    rows = [rng.integers(1, 1000, size=n).astype(np.int32) for n in (3, 40, 16, 17, 64, 5, 33, 2, 9, 12)]
    shapes = []

    def call(input_ids, segment_ids):  # a per-row function of the real tokens only
        shapes.append(input_ids.shape)
        masked = np.where(segment_ids > 0, input_ids, 0)
        return np.stack([masked.sum(axis=1), segment_ids.sum(axis=1)], axis=1).astype(np.float32)

    outputs, timings, totals = run_rows(rows, call, max_len=64, batch_size=4)
    assert set(shapes) <= {(4, 16), (4, 32), (4, 64)}
    for row, out in zip(rows, outputs):
        assert out.tolist() == [float(row.sum()), float(len(row))]
    assert totals["calls"] == len(shapes)
    assert totals["real_tokens"] == sum(len(r) for r in rows)
    assert totals["computed_tokens"] == sum(b * n for b, n in shapes)
    assert sum(t.computed_tokens_per_row for t in timings) == pytest.approx(totals["computed_tokens"])
    assert sum(t.ms_per_row for t in timings) == pytest.approx(totals["ms"])


def test_run_rows_per_token_outputs_are_trimmed_to_each_row():
    rows = [np.arange(1, n + 1, dtype=np.int32) for n in (3, 7)]
    outputs, _, _ = run_rows(rows, lambda ids, seg: ids.astype(np.float32), max_len=16, batch_size=2, per_token=True)
    assert [o.tolist() for o in outputs] == [[1, 2, 3], [1, 2, 3, 4, 5, 6, 7]]
