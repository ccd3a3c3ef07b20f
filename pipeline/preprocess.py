"""Tokenisation: Document -> TokenizedDoc (model-input windows of <= --max_seq_len tokens).

Holds the pure tokenise function and its thin DoFn.
Must not batch, pad rows or call the model (pipeline/inference.py does).
"""
from __future__ import annotations

import dataclasses
import time

import apache_beam as beam
import numpy as np

from pipeline.records import Document, ErrorRow

ERRORS_TAG = "errors"
# A text longer than this is tokenised only as far as --max_chunks windows need (a prefix cut at a space,
# PREFIX_CHARS_PER_TOKEN characters a needed token, grown x4 until it holds them): a 20 MB document then
# costs milliseconds instead of a minute and gigabytes. Its n_tokens counts the prefix's tokens.
FULL_TOKENIZE_CHARS = 64 * 1024
PREFIX_CHARS_PER_TOKEN = 16  # English averages ~5 characters a token
NO_SPACE_SPARE_TOKENS = 256  # tokens kept past the windows when a prefix must be cut inside a word
MAX_PREFIX_CHARS_PER_TOKEN = 256  # the prefix stops growing here; the rest is not read (truncated=True)


@dataclasses.dataclass(frozen=True)
class WindowSpec:
    """How documents become windows."""

    max_len: int  # tokens per window, special tokens included
    stride: int  # text tokens shared by consecutive windows
    max_chunks: int  # windows kept per document


@dataclasses.dataclass
class TokenizedDoc:
    """A document as model-input windows (the text itself is dropped: it is not needed downstream)."""

    doc: Document
    windows: list[np.ndarray]
    n_tokens: int
    truncated: bool
    tokenize_ms: float
    query_windows: list[np.ndarray] = dataclasses.field(default_factory=list)  # similarity only


def tokenize_document(doc: Document, tokenizer, spec: WindowSpec, *, with_query: bool) -> TokenizedDoc:
    """Encode the document (and, for similarity, its `query` field) into windows. Raises on bad input."""
    start = time.perf_counter()
    texts = [doc.text]
    if with_query:
        query = doc.fields.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ValueError("similarity needs a non-empty string `query` field in each record")
        texts.append(query)
    encoded = [encode_text(tokenizer, text, spec) for text in texts]
    elapsed = (time.perf_counter() - start) * 1000.0
    return TokenizedDoc(
        doc=dataclasses.replace(doc, text=""),
        windows=list(encoded[0].windows),
        n_tokens=int(encoded[0].n_tokens),
        truncated=bool(encoded[0].truncated),
        tokenize_ms=elapsed,
        query_windows=list(encoded[1].windows) if with_query else [],
    )


def encode_text(tokenizer, text: str, spec: WindowSpec):
    """tokenizer.encode_windows of one text; a text over FULL_TOKENIZE_CHARS is tokenised from a prefix
    that yields at least one token more than spec.max_chunks windows hold (so the windows equal those of
    the whole text, and truncated is true)."""
    kwargs = {"max_len": spec.max_len, "stride": spec.stride, "max_windows": spec.max_chunks}
    content = spec.max_len - tokenizer.n_special
    needed = content + (spec.max_chunks - 1) * (content - spec.stride) + 1
    chars = max(FULL_TOKENIZE_CHARS, needed * PREFIX_CHARS_PER_TOKEN)
    while chars < len(text):
        cut = space_before(text, chars)
        encoded = tokenizer.encode_windows([text[: cut or chars]], **kwargs)[0]
        # a cut at whitespace leaves every token before it as in the whole text; a cut inside a run without
        # whitespace may change that run's last tokens, so those must lie past the windows
        if encoded.n_tokens >= needed + (0 if cut else NO_SPACE_SPARE_TOKENS):
            return encoded
        if chars >= needed * MAX_PREFIX_CHARS_PER_TOKEN:  # a degenerate text (one huge unknown word): stop here
            return dataclasses.replace(encoded, truncated=True)
        chars *= 4  # long words or unknown runs: fewer tokens a character than guessed
    return tokenizer.encode_windows([text], **kwargs)[0]


def space_before(text: str, end: int, look_back: int = 1024) -> int | None:
    """The position of the last whitespace before `end`, looking back at most look_back characters."""
    for i in range(end - 1, max(end - look_back, 0), -1):
        if text[i].isspace():
            return i
    return None


class Tokenize(beam.DoFn):
    """Beam adapter: Document in, TokenizedDoc out (ErrorRow on the 'errors' output)."""

    def __init__(self, model_spec, window_spec: WindowSpec, *, with_query: bool):
        self._model_spec = model_spec
        self._window_spec = window_spec
        self._with_query = with_query
        self._tokenizer = None

    def setup(self):
        from pipeline.inference import shared_model  # the process-wide model: tokenizer and weights load once

        self._tokenizer = shared_model(self._model_spec).tokenizer

    def process(self, doc: Document):
        try:
            yield tokenize_document(doc, self._tokenizer, self._window_spec, with_query=self._with_query)
        except Exception as e:  # a document the tokenizer cannot handle is an error row, not a crash
            yield beam.pvalue.TaggedOutput(
                ERRORS_TAG,
                ErrorRow(doc.source, doc.record_index, "tokenize", type(e).__name__, str(e), raw=doc.text, doc_id=doc.doc_id),
            )
