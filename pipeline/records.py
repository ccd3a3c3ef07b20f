"""Records that flow through the pipeline and the schemas of the tables it writes.

Holds plain dataclasses (one per kind of element) and the explicit pyarrow schemas of the
scores and errors tables. Must not hold any logic beyond construction and conversion.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import apache_beam as beam
import pyarrow as pa

RAW_PREVIEW_CHARS = 1000  # errors table keeps at most this much of the raw record
ERRORS_TAG = "errors"  # the tagged output every stage sends its ErrorRows to


@dataclasses.dataclass
class Document:
    """One input record that parsed into a document."""

    doc_id: str
    text: str
    source: str
    record_index: int
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)  # query, label, ...
    read_ms: float = 0.0

    def without_text(self) -> "Document":
        """The document once tokenised: its text is not needed downstream (dataclasses.replace costs more)."""
        return Document(doc_id=self.doc_id, text="", source=self.source, record_index=self.record_index,
                        fields=self.fields, read_ms=self.read_ms)


@dataclasses.dataclass
class ErrorRow:
    """One input record (or whole shard) that could not be scored."""

    source: str
    record_index: int | None  # None: the error is about the whole shard
    stage: str  # read | parse | tokenize | infer | score
    error_type: str
    message: str
    raw: str = ""
    doc_id: str | None = None

    def __post_init__(self):
        self.raw = truncate_raw(self.raw)
        self.message = self.message[:RAW_PREVIEW_CHARS]


def truncate_raw(raw: Any) -> str:
    if isinstance(raw, bytes):
        raw = raw[: RAW_PREVIEW_CHARS * 4].decode("utf-8", errors="replace")
    elif not isinstance(raw, str):
        raw = repr(raw)
    return raw[:RAW_PREVIEW_CHARS]


def utf8_size(text: str) -> int | None:
    """Bytes of `text` in UTF-8 (ASCII text is not encoded), or None when it holds a lone surrogate
    (JSON allows the escape "\\ud800"; no Parquet or UTF-8 writer accepts the result)."""
    if text.isascii():
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def printable(text: str) -> str:
    """`text` with any lone surrogate replaced: no Parquet or UTF-8 writer accepts one."""
    return text.encode("utf-8", errors="replace").decode("utf-8")


class Batch(list):
    """Records that travel between pipeline stages as ONE Beam element (documents, tokenized documents,
    model outputs, table rows). Beam's default coder encodes a plain list item by item (one pickle per
    record); a list of this type is pickled whole, in one call."""

    def __reduce__(self):
        return Batch, (list(self),)


class BatchCoder(beam.coders.Coder):
    """Beam's coder for a PCollection of Batch (graph.py declares them): Beam's pickling of the whole list,
    with a size estimate from the first record. Beam samples the size of most elements of a PCollection
    that has few, and pickling every sampled list whole was a large share of a job's host time
    (benchmarks/PERF_NOTES.md, "Host time per document"). Only Coder's public methods are overridden:
    Beam builds the coder's implementation from encode, decode and estimate_size."""

    def __init__(self):
        self._whole = beam.coders.PickleCoder()

    def encode(self, value: Batch) -> bytes:
        return self._whole.encode(value)

    def decode(self, encoded: bytes) -> Batch:
        return self._whole.decode(encoded)

    def estimate_size(self, value: Batch) -> int:
        return len(self.encode(Batch(value[:1]))) * len(value) if value else 8

    def to_type_hint(self):
        return Batch


beam.coders.registry.register_coder(Batch, BatchCoder)


TIMING_COLUMNS = ("read_ms", "tokenize_ms", "infer_ms", "postprocess_ms")

SCORES_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("record_index", pa.int64(), nullable=False),
        pa.field("task", pa.string(), nullable=False),
        # embed: null; similarity: cosine; classify: top prob; loglik: total log-likelihood; choice: the chosen
        # candidate's probability among the candidates (softmax of their log-likelihoods)
        pa.field("score", pa.float64()),
        pa.field("label", pa.string()),  # classify: predicted label; choice: chosen index
        pa.field("gold_label", pa.string()),  # the record's own `label` field, when present (choice: its index)
        # classify: each label's probability; choice: each candidate's log-likelihood (label: its index)
        pa.field("scores", pa.list_(pa.struct([("label", pa.string()), ("score", pa.float64())]))),
        pa.field("embedding", pa.list_(pa.float32())),
        pa.field("perplexity", pa.float64()),  # loglik only
        pa.field("choice_tokens", pa.list_(pa.int64())),  # choice only: each candidate's scored tokens
        pa.field("choice_bytes", pa.list_(pa.int64())),  # choice only: each candidate's UTF-8 bytes
        pa.field("n_tokens", pa.int64(), nullable=False),
        pa.field("n_chunks", pa.int64(), nullable=False),
        pa.field("truncated", pa.bool_(), nullable=False),
        pa.field("model_id", pa.string(), nullable=False),
        pa.field("attention_impl", pa.string(), nullable=False),
        *[pa.field(name, pa.float64(), nullable=False) for name in TIMING_COLUMNS],
        # --shadow_attention: null unless this document's batch also ran through the shadow kernel
        pa.field("shadow_attention_impl", pa.string()),
        pa.field("shadow_output_max_abs_diff", pa.float64()),  # max |model output difference| over its windows
        pa.field("shadow_output_mean_abs_diff", pa.float64()),
        pa.field("shadow_score_abs_diff", pa.float64()),  # |score difference|; embed: max |embedding difference|
        pa.field("shadow_label_flip", pa.bool_()),  # classify: the shadow kernel predicts another label
    ]
)

ERRORS_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("doc_id", pa.string()),
        pa.field("source", pa.string(), nullable=False),
        pa.field("record_index", pa.int64()),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("error_type", pa.string(), nullable=False),
        pa.field("message", pa.string(), nullable=False),
        pa.field("raw", pa.string(), nullable=False),
    ]
)


def error_to_row(error: ErrorRow, run_id: str) -> dict[str, Any]:
    return {"run_id": run_id, **dataclasses.asdict(error)}


def finite_or_none(value: Any) -> Any:
    """`value` with every non-finite float in it (nested lists, dicts, numpy arrays) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "tolist"):  # a numpy array or scalar: Python values
        return finite_or_none(value.tolist())
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value
