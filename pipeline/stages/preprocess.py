"""Tokenisation: Document -> TokenizedDoc (model-input windows of <= --max_seq_len tokens).

Holds the pure tokenise functions (a list of documents at a time: one batch encode) and their thin DoFn.
Must not pad or pack rows, nor load or call the model (pipeline/stages/inference.py does).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from typing import Any

import apache_beam as beam
import numpy as np

from pipeline import tasks
from pipeline.records import ERRORS_TAG, Batch, Document, ErrorRow
from pipeline.stages.long_text import (FULL_TOKENIZE_CHARS, NO_SPACE_SPARE_TOKENS,
                                       PREFIX_CHARS_PER_TOKEN, space_before)
from pipeline.tasks.base import RecordError



@dataclasses.dataclass(frozen=True)
class WindowSpec:
    """How documents become windows."""

    max_len: int  # tokens per window, special tokens included
    stride: int  # text tokens shared by consecutive windows
    max_chunks: int  # windows kept per document
    task: str | None = None  # the run's task: one with its own tokenize (Task.tokenize, e.g. choice) makes the windows


@dataclasses.dataclass
class TokenizedDoc:
    """A document as model-input windows (the text itself is dropped: it is not needed downstream)."""

    doc: Document
    windows: list[np.ndarray]
    n_tokens: int
    truncated: bool
    tokenize_ms: float
    query_windows: list[np.ndarray] = dataclasses.field(default_factory=list)  # similarity only
    spans: Any = None  # what a task's own tokenize says of the windows, for its score (TaskWindows.spans)


def tokenize_documents(docs: Sequence[Document], tokenizer, spec: WindowSpec, *,
                       with_query: bool) -> list[TokenizedDoc | ErrorRow]:
    """Each document (and, for similarity, its `query` field) as windows, in order: one batch encode for
    every text up to FULL_TOKENIZE_CHARS (the tokenizer's Rust batch path, on its own threads without
    the GIL), encode_text for longer ones. A document that cannot be tokenised is an ErrorRow in its
    place. tokenize_ms is the batch's time shared in proportion to characters."""
    task = tasks.get(spec.task) if spec.task else None
    if task is not None and task.tokenize is not None:
        return tokenize_by_task(docs, tokenizer, spec, task.tokenize)
    start = time.perf_counter()
    texts: list[str] = []
    queries: list[str] = []
    results: list[TokenizedDoc | ErrorRow | None] = []
    for doc in docs:
        query = doc.fields.get("query") if with_query else None
        if with_query and (problem := query_problem(query)):
            results.append(_error(doc, *problem))
            continue
        texts.append(doc.text)
        queries += [query] if with_query else []
        results.append(None)
    # an embedding task's texts get the model's document prompt, its queries the query prompt (models/tokenizer.py)
    embeds = task is None or "document" in task.prompt_roles
    encoded = iter(encode_texts(tokenizer, texts, spec, role="document" if embeds else None))
    encoded_queries = iter(encode_texts(tokenizer, queries, spec, role="query"))
    elapsed = (time.perf_counter() - start) * 1000.0
    chars = max(1, sum(len(t) for t in texts + queries))
    for k, doc in enumerate(docs):
        if results[k] is not None:
            continue
        text = next(encoded)
        query = next(encoded_queries) if with_query else None
        if isinstance(text, Exception) or isinstance(query, Exception):
            failed = text if isinstance(text, Exception) else query
            what = "text" if failed is text else "query"
            results[k] = _error(doc, "untokenizable", f"the model's tokenizer cannot encode this record's {what} "
                                f"({type(failed).__name__}: {str(failed)[:300]})")
        elif text.n_tokens == 0:
            results[k] = _error(doc, "empty_text", "the text has no tokens (only whitespace, control, zero-width or "
                                "combining characters)")
        elif with_query and query.n_tokens == 0:
            results[k] = _error(doc, "empty_text", "`query` has no tokens (only whitespace, control, zero-width or "
                                "combining characters)")
        else:
            share = elapsed * (len(doc.text) + (len(doc.fields["query"]) if with_query else 0)) / chars
            results[k] = TokenizedDoc(
                doc=doc.without_text(),
                windows=list(text.windows),
                n_tokens=int(text.n_tokens),
                truncated=bool(text.truncated or (with_query and query.truncated)),  # either part of the pair cut
                tokenize_ms=share,
                query_windows=list(query.windows) if with_query else [],
            )
    return results  # type: ignore[return-value]


def tokens_of(docs: Sequence[TokenizedDoc]) -> int:
    """A list of documents' weight for Beam's BatchElements: the tokens of their model rows."""
    return max(1, sum(len(w) for doc in docs for w in doc.windows + doc.query_windows))


def within_budget(docs: Sequence[TokenizedDoc], max_tokens: int | None) -> list[Batch]:
    """The documents in order, as consecutive lists of at most max_tokens model tokens each (tokens_of; a
    document larger than that alone), so that no element RunInference batches by tokens is bigger than one
    Beam batch (--batch_size x --max_seq_len x --calls_per_beam_batch). None: one list."""
    if max_tokens is None:
        return [Batch(docs)] if docs else []
    lists: list[Batch] = []
    current, tokens = Batch(), 0
    for doc in docs:
        size = tokens_of([doc])
        if current and tokens + size > max_tokens:
            lists.append(current)
            current, tokens = Batch(), 0
        current.append(doc)
        tokens += size
    return lists + ([current] if current else [])


def tokenize_by_task(docs: Sequence[Document], tokenizer, spec: WindowSpec, tokenize) -> list[TokenizedDoc | ErrorRow]:
    """The task's own tokenize (Task.tokenize) of the list, one document at a time when the list fails (so a
    text the tokenizer cannot handle is one error row); tokenize_ms is the list's time shared by window tokens."""
    start = time.perf_counter()
    try:
        made = tokenize(docs, tokenizer, spec.max_len)
    except Exception:  # one bad text fails the whole list: find it below
        made = []
        for doc in docs:
            try:
                made += tokenize([doc], tokenizer, spec.max_len)
            except Exception as e:  # a text the tokenizer cannot handle is an error row, not a crash
                made.append(RecordError(type(e).__name__, str(e)))
    elapsed = (time.perf_counter() - start) * 1000.0
    tokens = max(1, sum(len(w) for m in made if not isinstance(m, RecordError) for w in m.windows))
    results: list[TokenizedDoc | ErrorRow] = []
    for doc, m in zip(docs, made, strict=True):
        if isinstance(m, RecordError):
            results.append(_error(doc, m.error_type, str(m)))
            continue
        results.append(TokenizedDoc(doc=doc.without_text(), windows=list(m.windows), n_tokens=m.n_tokens,
                                    truncated=m.truncated, tokenize_ms=elapsed * sum(len(w) for w in m.windows) / tokens,
                                    spans=m.spans))
    return results


def encode_texts(tokenizer, texts: Sequence[str], spec: WindowSpec, *, role: str | None = None) -> list:
    """encode_text of each text (with `role`'s prompt: DocTokenizer.encode_windows), the short ones in one batch; a
    text the tokenizer fails on gives its exception in its place (the batch is then retried text by text to find
    it)."""
    if not texts:
        return []
    short = [i for i, text in enumerate(texts) if len(text) <= FULL_TOKENIZE_CHARS]
    out: list = [None] * len(texts)
    kwargs = {"max_len": spec.max_len, "stride": spec.stride, "max_windows": spec.max_chunks, "role": role}
    try:
        for i, encoded in zip(short, tokenizer.encode_windows([texts[i] for i in short], **kwargs)):
            out[i] = encoded
    except Exception:  # one bad text fails the whole batch: find it below
        pass
    for i, text in enumerate(texts):
        if out[i] is None:
            try:
                out[i] = encode_text(tokenizer, text, spec, role=role)
            except Exception as e:  # a text the tokenizer cannot handle is an error row, not a crash
                out[i] = e
    return out


def query_problem(query) -> tuple[str, str] | None:
    """Why a similarity record's `query` field cannot be scored, as (error_type, message), or None."""
    if query is None:
        return "missing_field", "--task similarity needs a `query` field (a string) in each record"
    if not isinstance(query, str):
        return "bad_field_type", f"`query` is a {type(query).__name__}; --task similarity needs a string"
    if not query.strip():
        return "empty_text", "`query` is empty or whitespace"
    return None


def _error(doc: Document, error_type: str, message: str) -> ErrorRow:
    return ErrorRow(doc.source, doc.record_index, "tokenize", error_type, message, raw=doc.text, doc_id=doc.doc_id)


def encode_text(tokenizer, text: str, spec: WindowSpec, *, role: str | None = None):
    """tokenizer.encode_windows of one text (with `role`'s prompt); a text over FULL_TOKENIZE_CHARS is tokenised in pieces of a
    bounded size, each cut at whitespace where it has some, until they yield one token more than spec.max_chunks
    windows hold (so the windows equal those of the whole text, and truncated is true) or the text ends. A
    piece costs the same whatever the text, so a long run the tokenizer makes few tokens of (a hex dump, a
    20 MB word) is read past, not the end of what is read. The one exception to equal windows: a run without
    whitespace longer than a piece is cut inside, and gives a token or a few per piece where the whole text
    would give its own (README.md says so); tokenizing such a run whole cost seconds and gigabytes."""
    kwargs = {"max_len": spec.max_len, "stride": spec.stride, "max_windows": spec.max_chunks}
    if len(text) <= FULL_TOKENIZE_CHARS:
        return tokenizer.encode_windows([text], role=role, **kwargs)[0]
    content = spec.max_len - tokenizer.n_special
    needed = content + (spec.max_chunks - 1) * (content - spec.stride) + 1
    piece = max(FULL_TOKENIZE_CHARS, needed * PREFIX_CHARS_PER_TOKEN)
    pieces, n_ids, start, lead = [], 0, 0, None
    while start < len(text):
        end = min(len(text), start + piece)
        cut = space_before(text, end, start) if end < len(text) else end
        end = cut if cut is not None else end
        if lead is None:  # the prompt is tokenised with the first piece, as with the whole text
            lead, ids = tokenizer.prompted_ids([text[start:end]], role)[0]
            pieces.append(ids)
        else:
            pieces.append(tokenizer.encode_ids([text[start:end]])[0])
        n_ids += len(pieces[-1])
        start = end
        # a cut at whitespace leaves every token before it as in the whole text; a cut inside a run without
        # whitespace may change that run's last tokens, so those must lie past the windows
        if n_ids >= needed + (0 if cut is not None else NO_SPACE_SPARE_TOKENS):
            break
    ids = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
    return tokenizer.windows(ids, lead=lead if lead is not None else np.zeros(0, np.int32), **kwargs)


class Tokenize(beam.DoFn):
    """Beam adapter: a list of Documents in, their TokenizedDocs out in lists of at most max_tokens model
    tokens (within_budget; ErrorRows on the 'errors' output). Loads only the tokenizer, not the model."""

    def __init__(self, model_spec, window_spec: WindowSpec, *, with_query: bool, max_tokens: int | None = None):
        self._model_spec = model_spec
        self._window_spec = window_spec
        self._with_query = with_query
        self._max_tokens = max_tokens
        self._tokenizer = None

    def setup(self):
        import models

        self._tokenizer = models.load_tokenizer(self._model_spec.name, cache_dir=self._model_spec.cache_dir)
        if self._model_spec.prompts:  # the run's --document_prompt / --query_prompt
            self._tokenizer = self._tokenizer.with_prompts(dict(self._model_spec.prompts))

    def process(self, docs: Batch):
        tokenized = []
        for item in tokenize_documents(docs, self._tokenizer, self._window_spec, with_query=self._with_query):
            if isinstance(item, ErrorRow):
                yield beam.pvalue.TaggedOutput(ERRORS_TAG, item)
            else:
                tokenized.append(item)
        yield from within_budget(tokenized, self._max_tokens)
