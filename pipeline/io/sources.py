"""Where records come from: per-shard readers that stream Documents.

Holds plain functions (read one shard record by record into Document or ErrorRow) and the thin Beam
DoFn over them; which shards a run reads is pipeline/io/input_files.py. Must not tokenise or score, and must never
raise on bad data: a bad record is an ErrorRow, a corrupt shard an ErrorRow with record_index None.
"""
from __future__ import annotations

import dataclasses
import decimal
import errno
import gzip
import itertools
import json
import math
import sys
import time
import zlib
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import fsspec
from fsspec.implementations.local import LocalFileSystem

from pipeline.io import tfds_reader
from pipeline.io.input_files import SUPPORTED, local_size, shard_format
from pipeline.records import ERRORS_TAG, Batch, Document, ErrorRow, printable, utf8_size

KEPT_FIELDS = ("query", "label")  # record fields the tasks use, carried on the Document (scalars only)
# record fields carried as they are (lists): the task that uses them checks them, so that other tasks never fail on them
KEPT_AS_IS = ("choices",)
# A record (JSONL line, text file, Parquet text cell) larger than this becomes a `record_too_large` error
# row; a JSONL reader holds at most this much of one line. 32 MiB: far above real documents (the model
# reads at most --max_chunks windows of them) yet small enough that a few parallel readers fit a worker.
DEFAULT_MAX_RECORD_BYTES = 32 * 2**20
# a line of only these is blank, not a record: ASCII whitespace, and NUL (UTF-16's newline leaves one behind it)
BLANK_BYTES = b" \t\n\r\x0b\x0c\x00"
READ_CHUNK_BYTES = 2**20  # JSONL shards are read in chunks of this size, never whole
# Documents per element after reading: large enough that Beam's per-element work (~10 us a transform) is
# noise per document, small enough that a shard's chunks spread over parallel bundles and workers.
READ_CHUNK_DOCS = 256
UTF8_BOM = b"\xef\xbb\xbf"
RAW_PREVIEW_BYTES = 4000  # what an error row keeps of a record it could not hold (records.truncate_raw cuts further)


@dataclasses.dataclass(frozen=True)
class ReadSpec:
    """What a reader needs to turn a raw record into a Document."""

    text_field: str = "text"
    id_field: str | None = "id"
    tfds: tfds_reader.TfdsDataset | None = None
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    # the KEPT_FIELDS and KEPT_AS_IS fields the run's task reads: one of them that is not a scalar (or a cell
    # that cannot be read, bytes that are not UTF-8) is an error row; another such field is left off the Document
    # (embed never fails a record over a multi-label `label` or an unreadable `choices` cell it does not read)
    checked_fields: tuple[str, ...] = KEPT_FIELDS + KEPT_AS_IS
    # local shards' sizes when the run found them: one that is smaller when read was cut or rewritten meanwhile
    sizes: dict[str, int] = dataclasses.field(default_factory=dict)


def make_document(
    record: Any, source: str, index: int, spec: ReadSpec, read_ms: float, raw: bytes | str | None = None
) -> Document | ErrorRow:
    """One parsed record -> Document, or ErrorRow(stage=parse) naming the field problem. `raw` is the
    record as read (JSONL line); without it an error row shows the record re-serialised."""
    shown = (lambda: raw) if raw is not None else (lambda: _raw(record))  # noqa: E731 - only built for error rows
    if not isinstance(record, dict):
        return ErrorRow(source, index, "parse", "not_an_object", f"record is a {type(record).__name__}, not an object", raw=shown())
    doc_id = _doc_id(record, source, index, spec.id_field)
    if spec.text_field not in record:
        return ErrorRow(
            source, index, "parse", "missing_field",
            f"record has no {spec.text_field!r} (--text_field); fields: {sorted(record)[:20]}", raw=shown(), doc_id=doc_id,
        )
    if record[spec.text_field] is None:
        return ErrorRow(source, index, "parse", "missing_field", f"{spec.text_field!r} (--text_field) is null",
                        raw=shown(), doc_id=doc_id)
    text = record[spec.text_field]
    if not isinstance(text, str):
        return ErrorRow(
            source, index, "parse", "bad_field_type",
            f"{spec.text_field!r} (--text_field) is a {type(text).__name__}, not a string", raw=shown(), doc_id=doc_id,
        )
    if not text.strip():
        return ErrorRow(source, index, "parse", "empty_text", f"{spec.text_field!r} is empty or whitespace", raw=shown(), doc_id=doc_id)
    size = utf8_size(text)
    if size is None or utf8_size(doc_id) is None:
        return ErrorRow(
            source, index, "parse", "invalid_unicode",
            f"{spec.text_field!r} or the id holds a lone surrogate (an unpaired \\ud800-\\udfff escape), which is not "
            "valid Unicode text; fix the producer of this record", raw=shown(), doc_id=doc_id,
        )
    if size > spec.max_record_bytes:
        return ErrorRow(
            source, index, "read", "record_too_large",
            f"{spec.text_field!r} holds {size} bytes, more than --max_record_bytes={spec.max_record_bytes}; "
            "raise --max_record_bytes to score it", raw=text[:RAW_PREVIEW_BYTES], doc_id=doc_id,
        )
    fields = {k: plain_number(record[k]) for k in KEPT_FIELDS if k in record and record[k] is not None}
    for name, value in list(fields.items()):
        problem = field_problem(name, value)
        if problem is None:
            continue
        if name not in spec.checked_fields:  # the task never reads it: left off, the record still scored
            del fields[name]
            continue
        return ErrorRow(source, index, "parse", *problem, raw=shown(), doc_id=doc_id)
    fields.update((k, record[k]) for k in KEPT_AS_IS if record.get(k) is not None)
    return Document(doc_id=doc_id, text=text, source=source, record_index=index, fields=fields, read_ms=read_ms)


def field_problem(name: str, value: Any) -> tuple[str, str] | None:
    """Why a KEPT_FIELDS value cannot be carried, as (error_type, message): a Document carries a string that is
    valid Unicode, or a number."""
    if isinstance(value, str) and utf8_size(value) is None:
        return ("invalid_unicode", f"{name!r} holds a lone surrogate (an unpaired \\ud800-\\udfff escape), which is "
                                   "not valid Unicode text; fix the producer of this record")
    if not isinstance(value, (str, int, float, bool)):
        return "bad_field_type", f"{name!r} is a {type(value).__name__}; it must be a string or a number"
    return None


def plain_number(value: Any) -> Any:
    """A Parquet decimal cell as the int or float it equals (SQL and Spark exports hold numeric labels as
    decimals); any other value as it is."""
    if isinstance(value, decimal.Decimal) and value.is_finite():
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def read_at_most(f, limit: int, chunk_bytes: int = READ_CHUNK_BYTES) -> bytes:
    """Up to `limit` bytes of a binary file, read chunk_bytes at a time: f.read(limit) would reserve `limit`
    bytes at once (a MemoryError or OverflowError for a large --max_record_bytes, whatever the file's size)."""
    parts, held = [], 0
    while held < limit and (chunk := f.read(min(chunk_bytes, limit - held))):
        parts.append(chunk)
        held += len(chunk)
    return b"".join(parts)


# C0 control bytes other than tab, newlines, vertical tab and form feed: rare in text, while in UTF-16 every
# character of ASCII, Latin-1, Greek, Cyrillic, Hebrew or Arabic has one beside it (0x00, 0x03, 0x04, 0x05, 0x06)
CONTROL_BYTES = bytes([*range(0x00, 0x09), *range(0x0E, 0x20)])


def control_bytes(data: bytes) -> int:
    return len(data) - len(data.translate(None, CONTROL_BYTES))


def looks_like_utf16(data: bytes) -> bool:
    """At least a third of the bytes are control bytes: UTF-16 text (valid UTF-8 too when its characters
    are ASCII, Cyrillic, Greek, ...), not a UTF-8 text with a stray NUL."""
    return 0 < len(data) <= 3 * control_bytes(data)


GZIP_MAGIC = b"\x1f\x8b"


def invalid_utf8_message(error: UnicodeDecodeError, data: bytes) -> str:
    """A not-UTF-8 error, with what the bytes are instead where that is plain (gzip, UTF-16)."""
    if data[:2] == GZIP_MAGIC:  # a text file (JSONL shards are looked at first: unsplittable)
        return f"{error}; these bytes are gzip-compressed: decompress the file (compressed .txt and .md are not read)"
    if data[:2] in (b"\xff\xfe", b"\xfe\xff") or looks_like_utf16(data):
        return f"{error}; this looks like UTF-16 text: convert the file to UTF-8 (e.g. iconv -f UTF-16 -t UTF-8)"
    return str(error)


def not_json_message(error: ValueError, line: bytes) -> str:
    """A JSON error; a line holding NUL bytes is UTF-16 text read as UTF-8 (ASCII in UTF-16 decodes as UTF-8)."""
    if b"\x00" in line:
        return f"{str(error)[:300]}; the line holds NUL bytes: if the file is UTF-16 text, convert it to UTF-8 (e.g. iconv -f UTF-16 -t UTF-8)"
    return str(error)[:300]


def decoded_record(record: dict, path: str, index: int, spec: ReadSpec) -> dict | ErrorRow:
    """The record with the bytes values of the fields a Document uses decoded as UTF-8 (a Parquet binary column
    or a TFDS string Tensor holds text as bytes), or an invalid_utf8 error row for the first that is not UTF-8.
    Only for readers whose records may hold bytes: a record parsed from JSON holds none."""
    decoded, undecodable = {}, None
    for name in (spec.text_field, spec.id_field, *KEPT_FIELDS):
        value = record.get(name) if name else None
        if isinstance(value, bytes):
            try:
                decoded[name] = value.decode("utf-8")
            except UnicodeDecodeError:
                if reads_field(spec, name):
                    undecodable = undecodable or name
                else:
                    decoded[name] = None  # the task never reads it: left off, the record still scored
    record = {**record, **decoded} if decoded else record
    if undecodable is not None:
        return ErrorRow(path, index, "parse", "invalid_utf8",
                        f"{undecodable!r} holds bytes that are not valid UTF-8 text; fix the producer of this record",
                        raw=_raw(record), doc_id=_doc_id(record, path, index, spec.id_field))
    return record


def _doc_id(record: dict, source: str, index: int, id_field: str | None) -> str:
    """The record's id as text (a whole number the same however it was stored: 1, 1.0); SOURCE#INDEX when it has
    none that can tell it apart (absent, null, empty,
    NaN or infinite, a list or an object, bytes that are not UTF-8, a cell that cannot be read)."""
    value = plain_number(record.get(id_field)) if id_field else None  # a decimal 7.00 is the id 7
    if value is None or value == "" or isinstance(value, (dict, list, bytes, BadCell, decimal.Decimal)):
        return f"{source}#{index}"  # a decimal left: NaN or infinite
    if isinstance(value, float) and not math.isfinite(value):
        return f"{source}#{index}"
    if isinstance(value, bool):  # JSON's spelling, not Python's True
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():  # 1.0 is the id 1 (an integer column pandas made float)
        return str(int(value))
    return str(value)


def _raw(record: Any) -> str:
    """The record as JSON for an error row (a lone surrogate replaced: it would break the errors table)."""
    try:
        return printable(json.dumps(record, ensure_ascii=False, default=str)[:RAW_PREVIEW_BYTES])
    except (TypeError, ValueError, RecursionError):
        return f"<a {type(record).__name__} that cannot be shown>"


def read_shard(path: str, spec: ReadSpec) -> Iterator[Document | ErrorRow]:
    """Stream one shard; never raises: unreadable parts become ErrorRows."""
    fmt = shard_format(path)
    if fmt is None:
        yield ErrorRow(path, None, "read", "unknown_format", f"cannot read {path}; supported: {SUPPORTED}")
        return
    changed = shard_changed(path, spec.sizes.get(path))
    if changed:
        yield changed
    try:
        for item in READERS[fmt](path, spec):
            yield _printable_error(item) if isinstance(item, ErrorRow) else item
    except Exception as e:  # a shard that cannot be opened or breaks mid-way
        if is_transient(e) or out_of_resources(e):
            raise
        what = shard_failure(e, "could not be read")
        yield _printable_error(ErrorRow(path, None, "read", read_error_type(e), f"{fmt} shard {what} ({type(e).__name__}: {e})"))
        return
    if not changed:  # cut while it was read: the records past the cut were never seen
        changed = shard_changed(path, spec.sizes.get(path))
        if changed:
            yield changed


def shard_changed(path: str, found: int | None) -> ErrorRow | None:
    """A read/shard_changed row when a local shard is now smaller than when the run found it (cut or rewritten
    while the run read its input), else None."""
    now = local_size(path)
    if found is None or now is None or now >= found:
        return None
    return ErrorRow(path, None, "read", "shard_changed",
                    f"the file is {now} bytes, {found} when the run found it: it was cut or rewritten while the "
                    "run read its input, so records may be missing from the tables; rerun once the input is whole")


def is_transient(error: BaseException) -> bool:
    """The store could not be reached or did not answer (connection refused or reset, a timeout, an HTTP client
    error, an answer gcsfs itself retries, such as 503 or 429, still failing after its retries): not a fault of the
    shard, so it is raised for the runner to retry the bundle (or fail the job, nothing published) instead of
    becoming error rows of a run that then publishes as complete without them."""
    import aiohttp  # gcsfs's HTTP client, a dependency of every install

    if isinstance(error, (ConnectionError, TimeoutError, aiohttp.ClientError)):
        return True
    try:  # gcsfs's own rule (which answers it retries), from a module gcsfs does not document
        from gcsfs.retry import is_retriable
    except ImportError:  # a gcsfs that moved it: the storage error itself must still reach the user
        return False
    return is_retriable(error)


# errnos that say this machine ran out of something (file descriptors: `ulimit -n` with many shards open at once;
# kernel memory), not that the shard is bad
# (models/errors.py SHORTAGES names the same for model files; importing it here would load JAX into every command
# that reads shards or options: tests/test_sources.py keeps the two equal)
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})


def out_of_resources(error: BaseException) -> bool:
    """The machine could not open or read the shard for want of a resource (RESOURCE_ERRNOS): raised, as an
    unreachable store is (is_transient), for the runner to retry the bundle or the job to fail with nothing
    published; as an error row the run would publish without the shard's records, replacing the previous run."""
    return isinstance(error, OSError) and error.errno in RESOURCE_ERRNOS


def unreachable_message(what: str, error: BaseException) -> str:
    """`what` (a flag and its path, or a run) lives on a store that could not be reached (is_transient, after
    gcsfs's retries): the underlying error and where to look."""
    return (f"{what}: cannot be reached ({type(error).__name__}: {str(error)[:300]}); check the network, "
            "the endpoint and the credentials (STORAGE_EMULATOR_HOST for an emulator)")


def shard_failure(error: BaseException, otherwise: str) -> str:
    """How a shard failed, for its error row: gone (deleted since discovery: a remote store answers 404 only
    once the shard is read) or `otherwise`."""
    return "is gone since the run found it" if isinstance(error, FileNotFoundError) else otherwise


def read_error_type(error: BaseException) -> str:
    """The error_type of a whole shard that could not be read (the exception's name stays in the message):
    corrupt_file - its bytes are not a valid file of its format (a truncated or damaged .gz, a file that is
    not Parquet, a zero-byte Parquet file); unreadable_shard - it could not be opened or read at all
    (permission denied, vanished since discovery, an I/O error)."""
    if isinstance(error, (EOFError, zlib.error, gzip.BadGzipFile, ValueError)):
        return "corrupt_file"
    if not isinstance(error, OSError) and type(error).__module__.startswith("pyarrow"):
        return "corrupt_file"  # ArrowInvalid is a ValueError; the rest of pyarrow's errors about file contents
    return "unreadable_shard"


def _printable_error(error: ErrorRow) -> ErrorRow:
    """The error row with any lone surrogate (from JSON escapes, field names, ids) replaced: the errors
    table's writer would fail on it, and with it the whole job."""
    fields = {name: printable(getattr(error, name)) for name in ("source", "message", "raw", "doc_id")
              if isinstance(getattr(error, name), str)}
    return dataclasses.replace(error, **fields)


def _timed(records: Iterator[tuple[int, Any, bytes | None]], path: str, spec: ReadSpec) -> Iterator[Document | ErrorRow]:
    """Turn (index, record-or-ErrorRow, raw bytes or None) into Documents, charging each one the time
    since the last."""
    start = time.perf_counter()
    for index, record, raw in records:
        if isinstance(record, ErrorRow):
            yield record
        else:
            try:
                yield make_document(record, path, index, spec, (time.perf_counter() - start) * 1000.0, raw)
            except Exception as e:  # one record's surprise must not cost the rest of the shard
                yield ErrorRow(path, index, "parse", type(e).__name__, str(e)[:300], raw=raw if raw is not None else "")
        start = time.perf_counter()


def bounded_lines(f, max_bytes: int, chunk_bytes: int = READ_CHUNK_BYTES, head: bytes = b"") -> Iterator[tuple[bytes, int]]:
    """The lines of a binary file as (line, its size in bytes), newline excluded, reading chunk_bytes at a
    time after `head` (bytes already read from it). A line longer than max_bytes is never held whole: it is
    skipped to its end and yielded as (its first RAW_PREVIEW_BYTES bytes, its full size). A last line without a
    newline is a line too."""
    read = getattr(f, "read1", f.read)  # read1: what is there now (a truncated .gz still gives what precedes the break)
    held = bytearray()
    skipped = -1  # bytes of an over-long line skipped so far (held keeps its preview); -1: none
    last = 0  # the line's last byte so far: a CRLF's \r is not the record's, also on a line that was skipped
    for chunk in itertools.chain([head] if head else [], iter(lambda: read(chunk_bytes), b"")):
        start = 0
        while start < len(chunk):
            newline = chunk.find(b"\n", start)
            end = len(chunk) if newline < 0 else newline
            if end > start:
                last = chunk[end - 1]
            if skipped >= 0:
                skipped += end - start
            else:
                held += chunk[start:end]
                if len(held) > max_bytes:
                    skipped = len(held)
                    del held[RAW_PREVIEW_BYTES:]
            if newline < 0:
                break
            yield _line(held, skipped, last)
            held, skipped, start, last = bytearray(), -1, newline + 1, 0
    if held or skipped >= 0:
        yield _line(held, skipped, last)


def _line(held: bytearray, skipped: int, last: int) -> tuple[bytes, int]:
    if skipped >= 0:
        return bytes(held), skipped - (last == 13)  # 13: a CRLF's \r ended the skipped line
    line = bytes(held[:-1] if held.endswith(b"\r") else held)  # CRLF line ends
    return line, len(line)


def open_shard(path: str, compression: str | None = None):
    """A shard opened for binary reading, with the file system of its protocol (local without one): fsspec.open
    reads `::` in a name (notes::v2.jsonl, gs://b/notes::v2.jsonl) as a chained URL and opens another file."""
    protocol = fsspec.core.split_protocol(path)[0]
    fs = LocalFileSystem() if protocol is None else fsspec.filesystem(protocol)
    if not isinstance(fs, LocalFileSystem):  # the object as it is now, not as a listing in this process cached it
        fs.invalidate_cache(path)  # (gcsfs lists a key holding // as a folder of size 0, and would read nothing)
    return fsspec.core.OpenFile(fs, path, "rb", compression=compression)  # closes the file under a gzip reader too


def jsonl_records(path: str, spec: ReadSpec) -> Iterator[tuple[int, Any, bytes | None]]:
    """A JSONL shard's records as (line index, the parsed JSON value or its ErrorRow, the raw line or None);
    blank lines are no records. What the reader turns into Documents, and what validation peeks at."""
    compression = "gzip" if path.lower().endswith(".gz") else None
    with open_shard(path, compression) as f:
        try:
            head = read_head(f)
            problem = unsplittable(head, path, compression)
            if problem:  # read line by line, every line would be an error row of garbage
                yield 0, ErrorRow(path, None, "read", "corrupt_file", problem), None
                return
            # a BOM and a CRLF's \r are not part of the record: a line may hold them on top of --max_record_bytes
            for index, (line, size) in enumerate(bounded_lines(f, spec.max_record_bytes + len(UTF8_BOM) + 1, head=head)):
                if line.startswith(UTF8_BOM):  # a UTF-8 BOM (first line, or shards concatenated)
                    line, size = line[len(UTF8_BOM):], size - len(UTF8_BOM)
                if size > spec.max_record_bytes:
                    yield index, ErrorRow(
                        path, index, "read", "record_too_large",
                        f"line of {size} bytes is longer than --max_record_bytes={spec.max_record_bytes}; it was "
                        "skipped without being read whole (raise --max_record_bytes to score it)",
                        raw=line[:RAW_PREVIEW_BYTES],
                    ), None
                    continue
                if not line.strip(BLANK_BYTES):
                    continue  # blank lines are not records
                try:
                    yield index, json.loads(line.decode("utf-8")), line
                except UnicodeDecodeError as e:
                    yield index, ErrorRow(path, index, "parse", "invalid_utf8", invalid_utf8_message(e, line), raw=line), None
                except RecursionError:
                    yield index, ErrorRow(
                        path, index, "parse", "too_deeply_nested",
                        f"JSON nested deeper than Python's parser allows (~{sys.getrecursionlimit()} levels)", raw=line,
                    ), None
                except ValueError as e:  # JSONDecodeError, or a number too long to convert
                    yield index, ErrorRow(path, index, "parse", "invalid_json", not_json_message(e, line), raw=line), None
        except (EOFError, OSError, zlib.error, gzip.BadGzipFile) as e:
            if is_transient(e):
                raise
            what = shard_failure(e, "ends early or is corrupt")
            yield 0, ErrorRow(path, None, "read", read_error_type(e), f"shard {what} ({type(e).__name__}: {e})"), None


HEAD_BYTES = 2**16  # what unsplittable judges a JSONL shard by: a CR-only shard is seen when its first record is shorter


def read_head(f) -> bytes:
    """Up to HEAD_BYTES of a shard's first bytes (read1: a truncated .gz still gives what precedes the break)."""
    return getattr(f, "read1", f.read)(HEAD_BYTES)


def unsplittable(head: bytes, path: str, compression: str | None) -> str | None:
    """Why a JSONL shard whose first bytes (read with `compression`) are `head` cannot be split into its records
    at all, naming the fix, or None: gzip bytes under a plain name, UTF-16 text (whose 0x0A bytes are not all
    newlines), or lines ended by CR alone (no LF to split on)."""
    name = path.rsplit("/", 1)[-1]
    if compression is None and head[:2] == GZIP_MAGIC:
        return f"shard is gzip-compressed but its name does not end in .gz: rename it {name}.gz (or decompress it)"
    # a byte order mark, or (RFC 4627) two ASCII characters such as `{"` in UTF-16, each a NUL and a non-NUL
    little, big = head[1:4:2] == b"\0\0" and 0 not in head[0:4:2], head[0:4:2] == b"\0\0" and 0 not in head[1:4:2]
    if head[:2] in (b"\xff\xfe", b"\xfe\xff") or ((little or big) and looks_like_utf16(head)):
        encoding = "UTF-16" if head[:2] in (b"\xff\xfe", b"\xfe\xff") else "UTF-16LE" if little else "UTF-16BE"
        return (f"shard is {encoding} text, and JSON lines are read as UTF-8 (split at every 0x0A byte, which UTF-16 "
                f"has inside characters): convert it to UTF-8 (e.g. iconv -f {encoding} -t UTF-8 {name} > utf8/{name})")
    if b"\n" not in head and b"\r" in head.rstrip(BLANK_BYTES):  # a JSON text holds a raw CR only between tokens
        return (f"shard's lines end in CR alone (old Mac line endings), and JSON lines are split at LF: its records "
                f"would read as one line; convert the line endings to LF (e.g. tr '\\r' '\\n' < {name} > lf/{name})")
    return None


def unsplittable_shard(path: str) -> str | None:
    """unsplittable for a JSONL shard by path (what validation's peek asks); None when it cannot be opened too:
    the reader reports that as an error row."""
    compression = "gzip" if path.lower().endswith(".gz") else None
    try:
        with open_shard(path, compression) as f:
            return unsplittable(read_head(f), path, compression)
    except Exception:
        return None


def _read_jsonl(path: str, spec: ReadSpec) -> Iterator[Document | ErrorRow]:
    yield from _timed(jsonl_records(path, spec), path, spec)


def _read_parquet(path: str, spec: ReadSpec) -> Iterator[Document | ErrorRow]:
    import pyarrow.parquet as pq

    def records() -> Iterator[tuple[int, Any, None]]:
        with open_shard(path) as f:
            # pre_buffer (pyarrow's default) reads every row group's columns before the first batch: a file's
            # whole text in memory; read one row group at a time instead
            parquet = pq.ParquetFile(f, pre_buffer=False)
            names = parquet.schema_arrow.names
            # only the columns a Document carries: a bad cell in any other column must not cost its record
            columns = [name for name in dict.fromkeys(used_fields(spec))
                       if name in names and (names.count(name) == 1 or reads_field(spec, name))]
            twice = [name for name in columns if names.count(name) > 1]  # a field the task does not read is left off
            if twice:  # pyarrow would hand over one of them: which one the run scored would be a guess
                yield 0, ErrorRow(path, None, "read", "ambiguous_column",
                                  f"the column {twice[0]!r} appears {names.count(twice[0])} times in this Parquet file's "
                                  "schema, so which one to read is ambiguous; write the file with one column of that "
                                  "name"), None
                return
            has_text = spec.text_field in names
            holds_bytes = any(f.name in columns and _bytes_type(f.type) for f in parquet.schema_arrow)
            index = 0
            batches = (batch for group in range(parquet.num_row_groups)
                       for batch in parquet.iter_batches(batch_size=512, columns=columns, row_groups=[group]))
            for batch in batches:
                batch = float32_as_written(batch)
                try:
                    rows, cell_by_cell = batch.to_pylist(), False
                except Exception:  # a cell pyarrow cannot convert: find it, so that only its record is an error row
                    rows, cell_by_cell = _rows_cell_by_cell(batch), True
                for record in rows:
                    if cell_by_cell or not has_text:
                        record = _parquet_record(record, path, index, spec, names)
                    if holds_bytes and isinstance(record, dict):
                        record = decoded_record(record, path, index, spec)
                    yield index, record, None
                    index += 1

    yield from _timed(records(), path, spec)


def string_column(arrow_type) -> bool:
    """A Parquet column type of strings: string, large_string, string_view, or a dictionary of one."""
    import pyarrow as pa

    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_string_view(arrow_type)


def text_column(arrow_type) -> bool:
    """Whether the Parquet reader reads this column type's cells as text: strings, or bytes decoded as UTF-8
    (decoded_record). Any other type (int64, a struct, a list, null) gives no text in any row."""
    return string_column(arrow_type) or _bytes_type(arrow_type)


def scalar_column(arrow_type) -> bool:
    """Whether a Parquet column type's cells can be a KEPT_FIELDS value (field_problem: a string or a number)."""
    import pyarrow as pa

    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    return (text_column(arrow_type) or pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)
            or pa.types.is_decimal(arrow_type) or pa.types.is_boolean(arrow_type))


def _bytes_type(arrow_type) -> bool:
    """A Parquet column type whose cells are bytes (text when they are UTF-8), a dictionary of them included."""
    import pyarrow as pa

    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    return (pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type)
            or pa.types.is_fixed_size_binary(arrow_type) or pa.types.is_binary_view(arrow_type))


def float32_as_written(batch):
    """The batch with its float32 columns as the float64 of their shortest decimal text: a float32 gold of 0.1
    is 0.1 as JSONL would give it, not 0.10000000149011612 (the float32's exact value) in gold_label."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for i, field in enumerate(batch.schema):
        if pa.types.is_float32(field.type):
            column = pc.cast(pc.cast(batch.column(i), pa.string()), pa.float64())
            batch = batch.set_column(i, pa.field(field.name, pa.float64(), field.nullable), column)
    return batch


def used_fields(spec: ReadSpec) -> tuple[str, ...]:
    """The record fields a Document is made of: the text, the id and the fields the tasks use."""
    return (spec.text_field, *((spec.id_field,) if spec.id_field else ()), *KEPT_FIELDS, *KEPT_AS_IS)


def reads_field(spec: ReadSpec, name: str) -> bool:
    """Whether a bad value of field `name` fails its record: the text, the id, and the fields the task reads; any
    other field a Document may carry is left off instead."""
    return name in (spec.text_field, spec.id_field) or name in spec.checked_fields


@dataclasses.dataclass(frozen=True)
class BadCell:
    """A Parquet cell that pyarrow cannot turn into a Python value (invalid UTF-8, a timestamp past year 9999)."""

    error: Exception

    def __str__(self) -> str:  # how the record's raw JSON shows it
        return f"<unreadable cell: {type(self.error).__name__}>"


def _rows_cell_by_cell(batch) -> list[dict[str, Any]]:
    """A batch's rows with each cell converted on its own: a cell that cannot be converted is a BadCell."""
    columns = {name: _column_values(batch.column(i)) for i, name in enumerate(batch.schema.names)}
    return [{name: values[row] for name, values in columns.items()} for row in range(batch.num_rows)]


def _column_values(column) -> list[Any]:
    """A batch column as Python values, a BadCell where a cell cannot be converted."""
    try:
        return column.to_pylist()
    except Exception:
        return [_cell_value(column, i) for i in range(len(column))]


def _cell_value(column, i: int) -> Any:
    try:
        return column[i].as_py()
    except Exception as e:
        return BadCell(e)


def _parquet_record(record: dict, path: str, index: int, spec: ReadSpec, names: list[str]) -> dict | ErrorRow:
    """The row as a record, or an error row for a cell that cannot be read or a file without the text column
    (named with the file's columns: the row holds only the columns read)."""
    unread = [name for name, value in record.items() if isinstance(value, BadCell) and not reads_field(spec, name)]
    if unread:  # a cell of a field the task never reads: left off, the record still scored
        record = {**record, **dict.fromkeys(unread)}
    bad = next(((name, value) for name, value in record.items() if isinstance(value, BadCell)), None)
    if bad is not None:
        name, cell = bad
        error_type = "invalid_utf8" if isinstance(cell.error, UnicodeDecodeError) else "bad_field_type"
        return ErrorRow(
            path, index, "parse", error_type,
            f"column {name!r} of this row cannot be read ({type(cell.error).__name__}: {str(cell.error)[:200]}); "
            "fix the producer of this file", raw=_raw(record), doc_id=_doc_id(record, path, index, spec.id_field),
        )
    if spec.text_field not in names:
        return ErrorRow(
            path, index, "parse", "missing_field",
            f"the file has no column {spec.text_field!r} (--text_field); columns: {names[:20]}", raw=_raw(record),
            doc_id=_doc_id(record, path, index, spec.id_field),
        )
    return record


def _read_text(path: str, spec: ReadSpec) -> Iterator[Document | ErrorRow]:
    start = time.perf_counter()
    with open_shard(path) as f:
        size = f.size if getattr(f, "size", None) is not None else None
        if size is not None and size > spec.max_record_bytes:
            yield ErrorRow(
                path, 0, "read", "record_too_large",
                f"file of {size} bytes is larger than --max_record_bytes={spec.max_record_bytes}; it was not read "
                "(raise --max_record_bytes to score it)", raw=f.read(RAW_PREVIEW_BYTES), doc_id=path,
            )
            return
        data = read_at_most(f, spec.max_record_bytes + 1)
    if len(data) > spec.max_record_bytes:  # a file system that did not know the size
        yield ErrorRow(path, 0, "read", "record_too_large",
                       f"file is larger than --max_record_bytes={spec.max_record_bytes}", raw=data[:RAW_PREVIEW_BYTES], doc_id=path)
        return
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        yield ErrorRow(path, 0, "parse", "invalid_utf8", invalid_utf8_message(e, data), raw=data, doc_id=path)
        return
    if looks_like_utf16(data):  # valid UTF-8 too when every character is ASCII or the NULs pair up
        yield ErrorRow(path, 0, "parse", "invalid_utf8",
                       f"{control_bytes(data)} of its {len(data)} bytes are control bytes (such as NUL): this looks "
                       "like UTF-16 text without a byte order mark; convert the file to UTF-8 (e.g. iconv -f UTF-16LE "
                       "-t UTF-8)", raw=data, doc_id=path)
        return
    record = {spec.text_field: text, "__id": path}
    yield make_document(record, path, 0, dataclasses.replace(spec, id_field="__id"), (time.perf_counter() - start) * 1000.0)


def _read_array_record(path: str, spec: ReadSpec) -> Iterator[Document | ErrorRow]:
    if spec.tfds is None:
        raise ValueError("array_record shards are read through --input tfds:NAME with --tfds_data_dir")

    def records() -> Iterator[tuple[int, Any, None]]:
        for index, data in enumerate(tfds_reader.iter_array_record(path)):
            try:
                yield index, decoded_record(tfds_reader.decode_example(data, spec.tfds), path, index, spec), None
            except Exception as e:  # a record that is not a valid tf.train.Example
                yield index, ErrorRow(path, index, "parse", "invalid_example", str(e)[:300], raw=data), None

    yield from _timed(records(), path, spec)


# input_files.shard_format's formats -> their readers (one per input_files.SUFFIXES entry, and TFDS's array_record)
READERS = {"jsonl": _read_jsonl, "parquet": _read_parquet, "text": _read_text, "array_record": _read_array_record}


class ReadShard(beam.DoFn):
    """Beam adapter: a shard path in, lists of up to `chunk_docs` Documents out (one element per list, so
    the stages after it pay Beam's per-element cost once per chunk, not per document), ErrorRows on the
    'errors' output. Counters (namespace docscore): records_read (records the readers saw: Documents +
    record error rows), shards_read, and empty_shards (shards without a single record, e.g. zero-byte
    files)."""

    def __init__(self, spec: ReadSpec, chunk_docs: int = READ_CHUNK_DOCS):
        self._spec = spec
        self._chunk_docs = chunk_docs
        self._records = beam.metrics.Metrics.counter("docscore", "records_read")
        self._read_errors = beam.metrics.Metrics.counter("docscore", "read_errors")
        self._shards = beam.metrics.Metrics.counter("docscore", "shards_read")
        self._empty_shards = beam.metrics.Metrics.counter("docscore", "empty_shards")

    def process(self, path: str):
        self._shards.inc()
        items, chunk = 0, Batch()
        for item in read_shard(path, self._spec):
            items += 1
            if isinstance(item, ErrorRow):
                if item.record_index is not None:
                    self._records.inc()
                self._read_errors.inc()
                yield beam.pvalue.TaggedOutput(ERRORS_TAG, item)
                continue
            self._records.inc()
            chunk.append(item)
            if len(chunk) >= self._chunk_docs:
                yield chunk
                chunk = Batch()
        if chunk:
            yield chunk
        if items == 0:
            self._empty_shards.inc()
