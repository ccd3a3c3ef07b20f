"""Where records come from: shard discovery and per-shard readers that stream Documents.

Holds plain functions (discover shards through fsspec, read one shard record by record into
Document or ErrorRow) and the thin Beam DoFn over them. Must not tokenise or score, and must never
raise on bad data: a bad record is an ErrorRow, a corrupt shard an ErrorRow with record_index None.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import time
import zlib
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import fsspec

from pipeline import tfds_reader
from pipeline.records import Document, ErrorRow

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz")
PARQUET_SUFFIXES = (".parquet",)
TEXT_SUFFIXES = (".txt", ".md")
ARRAY_RECORD_MARK = ".array_record"
SUPPORTED = ", ".join(JSONL_SUFFIXES + PARQUET_SUFFIXES + TEXT_SUFFIXES) + ", tfds:NAME"
KEPT_FIELDS = ("query", "label")  # record fields the tasks use, carried on the Document
ERRORS_TAG = "errors"


@dataclasses.dataclass(frozen=True)
class ReadSpec:
    """What a reader needs to turn a raw record into a Document."""

    text_field: str = "text"
    id_field: str | None = "id"
    tfds: tfds_reader.TfdsDataset | None = None


def shard_format(path: str) -> str | None:
    """jsonl | parquet | text | array_record, or None for a file we do not read."""
    name = path.rsplit("/", 1)[-1].lower()
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(TEXT_SUFFIXES):
        return "text"
    if ARRAY_RECORD_MARK in name:
        return "array_record"
    return None


def discover_shards(pattern: str, *, tfds_data_dir: str | None = None, split: str = "test") -> list[str]:
    """Expand --input to a sorted list of shard paths/URLs (a directory means every readable file in it).

    Raises FileNotFoundError when nothing matches and ValueError for files of an unknown format.
    """
    if pattern.startswith(tfds_reader.TFDS_PREFIX):
        if not tfds_data_dir:
            raise ValueError(f"--input {pattern}: pass --tfds_data_dir DIR (the data_dir the dataset was prepared in)")
        dataset = tfds_reader.locate_dataset(pattern, tfds_data_dir)
        return dataset.shard_paths(split)
    fs, _, paths = fsspec.get_fs_token_paths(pattern)
    hidden = lambda p: p.rsplit("/", 1)[-1].startswith(("_", "."))  # noqa: E731 - _SUCCESS, .crc, ...
    if not fsspec.core.has_magic(pattern) and len(paths) == 1 and fs.isdir(paths[0]):
        found = [p for p in fs.find(paths[0]) if not hidden(p) and shard_format(p)]
    else:
        found = [p for p in paths if not hidden(p) and fs.isfile(p)]
        unknown = [p for p in found if shard_format(p) is None]
        if unknown:
            raise ValueError(
                f"--input {pattern}: cannot read {unknown[0]}"
                + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
                + f"; use a pattern matching only {SUPPORTED} files"
            )
    if not found:
        raise FileNotFoundError(f"--input {pattern}: matches no readable shard ({SUPPORTED})")
    protocol = fsspec.core.split_protocol(pattern)[0]
    return sorted(fs.unstrip_protocol(p) if protocol not in (None, "file") else p for p in found)


def make_document(record: Any, source: str, index: int, spec: ReadSpec, read_ms: float) -> Document | ErrorRow:
    """One parsed record -> Document, or ErrorRow(stage=parse) naming the field problem."""
    if not isinstance(record, dict):
        return ErrorRow(source, index, "parse", "not_an_object", f"record is a {type(record).__name__}, not an object", raw=_raw(record))
    doc_id = _doc_id(record, source, index, spec.id_field)
    if spec.text_field not in record or record[spec.text_field] is None:
        return ErrorRow(
            source, index, "parse", "missing_field",
            f"record has no {spec.text_field!r} (--text_field); fields: {sorted(record)[:20]}", raw=_raw(record), doc_id=doc_id,
        )
    text = record[spec.text_field]
    if not isinstance(text, str):
        return ErrorRow(
            source, index, "parse", "bad_field_type",
            f"{spec.text_field!r} (--text_field) is a {type(text).__name__}, not a string", raw=_raw(record), doc_id=doc_id,
        )
    if not text.strip():
        return ErrorRow(source, index, "parse", "empty_text", f"{spec.text_field!r} is empty or whitespace", raw=_raw(record), doc_id=doc_id)
    fields = {k: record[k] for k in KEPT_FIELDS if k in record and record[k] is not None}
    return Document(doc_id=doc_id, text=text, source=source, record_index=index, fields=fields, read_ms=read_ms)


def _doc_id(record: dict, source: str, index: int, id_field: str | None) -> str:
    value = record.get(id_field) if id_field else None
    if value is None or isinstance(value, (dict, list)):
        return f"{source}#{index}"
    return str(value)


def _raw(record: Any) -> str:
    try:
        return json.dumps(record, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return repr(record)


def read_shard(path: str, spec: ReadSpec) -> Iterator[Document | ErrorRow]:
    """Stream one shard; never raises: unreadable parts become ErrorRows."""
    fmt = shard_format(path)
    readers = {"jsonl": _read_jsonl, "parquet": _read_parquet, "text": _read_text, "array_record": _read_array_record}
    if fmt is None:
        yield ErrorRow(path, None, "read", "unknown_format", f"cannot read {path}; supported: {SUPPORTED}")
        return
    try:
        yield from readers[fmt](path, spec)
    except Exception as e:  # a shard that cannot be opened or breaks mid-way
        yield ErrorRow(path, None, "read", type(e).__name__, f"{fmt} shard could not be read: {e}")


def _timed(records: Iterator[tuple[int, Any]], path: str, spec: ReadSpec) -> Iterator[Document | ErrorRow]:
    """Turn (index, record-or-ErrorRow) into Documents, charging each one the time since the last."""
    start = time.perf_counter()
    for index, record in records:
        if isinstance(record, ErrorRow):
            yield record
        else:
            yield make_document(record, path, index, spec, (time.perf_counter() - start) * 1000.0)
        start = time.perf_counter()


def _read_jsonl(path: str, spec: ReadSpec) -> Iterator[Document | ErrorRow]:
    def records() -> Iterator[tuple[int, Any]]:
        compression = "gzip" if path.lower().endswith(".gz") else None
        with fsspec.open(path, "rb", compression=compression) as f:
            try:
                for index, line in enumerate(f):
                    if index == 0 and line.startswith(b"\xef\xbb\xbf"):
                        line = line[3:]
                    if not line.strip():
                        continue  # blank lines are not records
                    try:
                        yield index, json.loads(line.decode("utf-8"))
                    except UnicodeDecodeError as e:
                        yield index, ErrorRow(path, index, "parse", "invalid_utf8", str(e), raw=line)
                    except (json.JSONDecodeError, RecursionError) as e:
                        yield index, ErrorRow(path, index, "parse", "invalid_json", str(e)[:300], raw=line)
            except (EOFError, OSError, zlib.error, gzip.BadGzipFile) as e:
                yield 0, ErrorRow(path, None, "read", type(e).__name__, f"shard ends early or is corrupt: {e}")

    yield from _timed(records(), path, spec)


def _read_parquet(path: str, spec: ReadSpec) -> Iterator[Document | ErrorRow]:
    import pyarrow.parquet as pq

    def records() -> Iterator[tuple[int, Any]]:
        with fsspec.open(path, "rb") as f:
            index = 0
            for batch in pq.ParquetFile(f).iter_batches(batch_size=512):
                for row in batch.to_pylist():
                    yield index, row
                    index += 1

    yield from _timed(records(), path, spec)


def _read_text(path: str, spec: ReadSpec) -> Iterator[Document | ErrorRow]:
    start = time.perf_counter()
    with fsspec.open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        yield ErrorRow(path, 0, "parse", "invalid_utf8", str(e), raw=data, doc_id=path)
        return
    record = {spec.text_field: text, "__id": path}
    yield make_document(record, path, 0, dataclasses.replace(spec, id_field="__id"), (time.perf_counter() - start) * 1000.0)


def _read_array_record(path: str, spec: ReadSpec) -> Iterator[Document | ErrorRow]:
    if spec.tfds is None:
        raise ValueError("array_record shards are read through --input tfds:NAME with --tfds_data_dir")

    def records() -> Iterator[tuple[int, Any]]:
        for index, data in enumerate(tfds_reader.iter_array_record(path)):
            try:
                yield index, tfds_reader.decode_example(data, spec.tfds)
            except Exception as e:  # a record that is not a valid tf.train.Example
                yield index, ErrorRow(path, index, "parse", "invalid_example", str(e)[:300], raw=data)

    yield from _timed(records(), path, spec)


class ReadShard(beam.DoFn):
    """Beam adapter: a shard path in, Documents out (ErrorRows on the 'errors' output)."""

    def __init__(self, spec: ReadSpec):
        self._spec = spec
        self._records = beam.metrics.Metrics.counter("docscore", "records_read")
        self._read_errors = beam.metrics.Metrics.counter("docscore", "read_errors")

    def process(self, path: str):
        for item in read_shard(path, self._spec):
            if isinstance(item, ErrorRow):
                if item.record_index is not None:
                    self._records.inc()
                self._read_errors.inc()
                yield beam.pvalue.TaggedOutput(ERRORS_TAG, item)
            else:
                self._records.inc()
                yield item
