"""Shard discovery and readers on real files: every record becomes a Document or an ErrorRow,
corrupt shards give an ErrorRow with record_index None, nothing raises."""
from __future__ import annotations

import errno
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.io import sources
from pipeline.io.input_files import find_input
from pipeline.io.sources import ReadSpec, read_shard
from pipeline.records import Document, ErrorRow
from tests.conftest import no_free_file_descriptors, shards_of

SPEC = ReadSpec(text_field="text", id_field="id")
REPO = Path(__file__).resolve().parent.parent


def split(items):
    return [i for i in items if isinstance(i, Document)], [i for i in items if isinstance(i, ErrorRow)]


def test_jsonl_records_and_bad_lines_become_documents_or_error_rows(tmp_path):
    path = tmp_path / "a.jsonl"
    lines = [
        b'\xef\xbb\xbf{"id": 7, "text": "first, after a BOM", "label": "x", "query": "q"}\r\n',
        b'{"text": "no id here"}\n',
        b"\n",  # blank: not a record
        b"not json\n",
        b"[1, 2]\n",
        b'{"id": "n", "text": 5}\n',
        b'{"id": "e", "text": "   "}\n',
        b'{"id": "m", "body": "x"}\n',
        b'{"id": "u", "text": "bad \xff utf8"}\n',
    ]
    path.write_bytes(b"".join(lines))
    docs, errors = split(list(read_shard(str(path), SPEC)))
    assert [(d.doc_id, d.record_index) for d in docs] == [("7", 0), (f"{path}#1", 1)]
    assert docs[0].text == "first, after a BOM" and docs[0].fields == {"label": "x", "query": "q"}
    assert all(d.source == str(path) and d.read_ms >= 0 for d in docs)
    assert [(e.record_index, e.stage, e.error_type) for e in errors] == [
        (3, "parse", "invalid_json"), (4, "parse", "not_an_object"), (5, "parse", "bad_field_type"),
        (6, "parse", "empty_text"), (7, "parse", "missing_field"), (8, "parse", "invalid_utf8"),
    ]
    assert errors[0].raw == "not json" and errors[2].doc_id == "n"


def test_truncated_gzip_keeps_what_was_read_and_reports_the_shard(tmp_path):
    body = b"".join(json.dumps({"id": i, "text": f"document number {i} " * 20}).encode() + b"\n" for i in range(200))
    full = gzip.compress(body)
    good, cut = tmp_path / "good.jsonl.gz", tmp_path / "cut.jsonl.gz"
    good.write_bytes(full)
    cut.write_bytes(full[: len(full) // 2])
    docs, errors = split(list(read_shard(str(good), SPEC)))
    assert len(docs) == 200 and not errors
    docs, errors = split(list(read_shard(str(cut), SPEC)))
    assert 0 < len(docs) < 200
    assert len(errors) == 1 and errors[0].record_index is None and errors[0].stage == "read"


def test_parquet_rows_and_a_corrupt_parquet_file(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "text": ["one doc", None, "three"], "label": ["a", "b", None]}), path)
    docs, errors = split(list(read_shard(str(path), SPEC)))
    assert [(d.doc_id, d.record_index, d.fields) for d in docs] == [("1", 0, {"label": "a"}), ("3", 2, {})]
    assert [(e.record_index, e.error_type) for e in errors] == [(1, "missing_field")]
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not a parquet file")
    docs, errors = split(list(read_shard(str(bad), SPEC)))
    assert not docs and len(errors) == 1 and errors[0].record_index is None and errors[0].source == str(bad)


def test_a_damaged_parquet_row_group_keeps_every_row_of_the_groups_before_it(tmp_path):
    """A Parquet file is read one row group at a time (pyarrow's pre_buffer read every group's columns before the
    first batch: a whole file's text in memory). A damaged third group of three: its break is one read error row,
    and the first two groups' 2,000 rows are read (whole-file reading kept 1,536, its batches before the break)."""
    path = tmp_path / "groups.parquet"
    n = 3000
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(n)], "text": [f"text number {i} " * 5 for i in range(n)]}),
                   path, row_group_size=1000, compression="none")
    column = pq.ParquetFile(path).metadata.row_group(2).column(1)
    start = column.dictionary_page_offset or column.data_page_offset
    data = bytearray(path.read_bytes())
    data[start + 5 : start + 200] = b"\xff" * 195  # the third group's text pages
    path.write_bytes(bytes(data))
    docs, errors = split(list(read_shard(str(path), SPEC)))
    assert [d.doc_id for d in docs] == [f"d{i}" for i in range(2000)]
    assert [(e.stage, e.record_index) for e in errors] == [("read", None)]


def test_text_files_are_one_document_each_with_the_path_as_id(tmp_path):
    good, bad = tmp_path / "note.md", tmp_path / "bad.txt"
    good.write_text("# Title\n\nSome words.", encoding="utf-8")
    bad.write_bytes(b"\xff\xfe broken")
    docs, _ = split(list(read_shard(str(good), SPEC)))
    assert [(d.doc_id, d.record_index, d.text) for d in docs] == [(str(good), 0, "# Title\n\nSome words.")]
    _, errors = split(list(read_shard(str(bad), SPEC)))
    assert [(e.record_index, e.error_type) for e in errors] == [(0, "invalid_utf8")]


def test_missing_shard_is_an_error_row_not_a_crash(tmp_path):
    items = list(read_shard(str(tmp_path / "gone.jsonl"), SPEC))
    assert len(items) == 1 and isinstance(items[0], ErrorRow) and items[0].record_index is None


def test_discover_shards_glob_directory_and_refusals(tmp_path):
    (tmp_path / "d").mkdir()
    for name in ("b.jsonl", "a.parquet", "c.jsonl.gz", "_SUCCESS", "notes.yaml"):
        (tmp_path / "d" / name).write_text("")
    assert shards_of(str(tmp_path / "d")) == [str(tmp_path / "d" / n) for n in ("a.parquet", "b.jsonl", "c.jsonl.gz")]
    assert shards_of(str(tmp_path / "d" / "*.jsonl")) == [str(tmp_path / "d" / "b.jsonl")]
    # a glob of ? or [...] alone (fsspec expands only patterns with a *)
    assert shards_of(str(tmp_path / "d" / "?.jsonl")) == [str(tmp_path / "d" / "b.jsonl")]
    assert shards_of(str(tmp_path / "d" / "[ab].parquet")) == [str(tmp_path / "d" / "a.parquet")]
    with pytest.raises(FileNotFoundError, match="matches no readable shard"):
        shards_of(str(tmp_path / "d" / "*.txt"))
    with pytest.raises(ValueError, match="cannot read .*notes.yaml"):
        shards_of(str(tmp_path / "d" / "*"))
    (tmp_path / "other").mkdir()  # a directory of other formats only names them (README: skipped files are named)
    for name in ("a.csv", "b.tsv"):
        (tmp_path / "other" / name).write_text("")
    with pytest.raises(FileNotFoundError, match=r"matches no readable shard .*; it holds only files of other formats: "
                                                r".*a\.csv, .*b\.tsv"):
        shards_of(str(tmp_path / "other"))


def test_a_directory_is_read_with_its_subfolders_except_hidden_ones(tmp_path):
    """Files under `_`/`.` folders (Hadoop's _temporary, docscore's own _staging, .git) are skipped like `_`/`.`
    files, locally and through fsspec; a hidden folder named as the input itself is read."""
    for folder in ("", "sub", "sub/deeper", "_staging", ".git", "sub/_temporary", "sub/.cache"):
        (tmp_path / "d" / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / "d" / folder / "x.jsonl").write_text("")
    expected = [str(tmp_path / "d" / f / "x.jsonl").replace("//", "/") for f in ("", "sub", "sub/deeper")]
    assert shards_of(str(tmp_path / "d")) == sorted(expected)
    assert shards_of(str(tmp_path / "d" / "_staging")) == [str(tmp_path / "d" / "_staging" / "x.jsonl")]
    fs = fsspec.filesystem("memory")
    for folder in ("", "sub/", "_staging/", ".git/"):
        fs.pipe(f"/docscore-hidden/{folder}x.jsonl", b"")
    try:
        assert shards_of("memory://docscore-hidden") == [
            "memory:///docscore-hidden/sub/x.jsonl", "memory:///docscore-hidden/x.jsonl"]
    finally:
        fs.rm("/docscore-hidden", recursive=True)


def test_memory_filesystem_through_fsspec():
    fs = fsspec.filesystem("memory")
    fs.pipe("/docscore-test/x/one.jsonl", b'{"id": "m1", "text": "in memory"}\n')
    shards = shards_of("memory://docscore-test/x/*.jsonl")
    assert shards == ["memory:///docscore-test/x/one.jsonl"]  # fsspec's canonical memory URL
    docs, _ = split(list(read_shard(shards[0], SPEC)))
    assert [(d.doc_id, d.source) for d in docs] == [("m1", shards[0])]
    fs.rm("/docscore-test", recursive=True)


def test_whole_shard_errors_have_documented_types_and_keep_the_exception_in_the_message(tmp_path):
    """A shard that cannot be read is read/corrupt_file (its bytes are not its format) or
    read/unreadable_shard (it cannot be opened); the library's exception name (was the error_type:
    read/EOFError, read/ArrowInvalid) stays in the message."""
    body = b"".join(json.dumps({"id": i, "text": f"document number {i} " * 20}).encode() + b"\n" for i in range(200))
    full = gzip.compress(body)
    (tmp_path / "cut.jsonl.gz").write_bytes(full[: len(full) // 2])
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not a parquet file")
    (tmp_path / "zero.parquet").write_bytes(b"")
    (tmp_path / "garbage.jsonl.gz").write_bytes(b"not gzip at all\n" * 4)
    expected = {"cut.jsonl.gz": ("corrupt_file", "EOFError"), "bad.parquet": ("corrupt_file", "ArrowInvalid"),
                "zero.parquet": ("corrupt_file", "ArrowInvalid"), "garbage.jsonl.gz": ("corrupt_file", "BadGzipFile"),
                "gone.jsonl": ("unreadable_shard", "FileNotFoundError")}
    for name, (error_type, exception) in expected.items():
        _, errors = split(list(read_shard(str(tmp_path / name), SPEC)))
        shard_errors = [e for e in errors if e.record_index is None]
        assert [(e.stage, e.error_type) for e in shard_errors] == [("read", error_type)], name
        assert exception in shard_errors[0].message, (name, shard_errors[0].message)


def test_ids_that_are_json_scalars_keep_their_json_spelling_and_others_fall_back_to_the_position():
    from pipeline.io.sources import make_document

    ids = {True: "true", False: "false", 7: "7", "x": "x", None: "s#3"}
    for value, expected in ids.items():
        assert make_document({"id": value, "text": "t"}, "s", 3, SPEC, 0.0).doc_id == expected
    for value in ([1], {"a": 1}):
        assert make_document({"id": value, "text": "t"}, "s", 3, SPEC, 0.0).doc_id == "s#3"


def test_a_store_that_cannot_be_reached_is_raised_for_the_runner_not_turned_into_error_rows():
    """A refused connection (what gcsfs raises, from aiohttp, when the store is down) says nothing about the
    shard: read_shard raises it, so the runner retries the bundle or the job fails and nothing is published; as
    error rows the run would publish as complete without the shard's records. A missing file stays a row."""
    import asyncio
    import socket

    import aiohttp

    from pipeline.io.sources import is_transient

    with socket.socket() as probe:  # a free port, closed again: connections to it are refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def fetch() -> None:
        async with aiohttp.ClientSession() as session:
            await session.get(f"http://127.0.0.1:{port}/b/o/docs.jsonl")

    refused = []
    for attempt in (lambda: socket.create_connection(("127.0.0.1", port), timeout=5), lambda: asyncio.run(fetch())):
        with pytest.raises(OSError) as caught:
            attempt()
        refused.append(caught.value)
    assert all(is_transient(e) for e in refused), refused
    # what gcsfs raises once its own retries of a 503 or 429 answer are spent, as against a 403
    from gcsfs.retry import HttpError

    assert is_transient(HttpError({"code": 503, "message": "Service Unavailable"}))
    assert is_transient(HttpError({"code": 429, "message": "Too Many Requests"}))
    assert not is_transient(HttpError({"code": 403, "message": "Forbidden"}))
    with pytest.raises(FileNotFoundError) as missing:
        open("/no/such/dir/docs.jsonl")
    assert not is_transient(missing.value)
    _, errors = split(list(read_shard("/no/such/dir/docs.jsonl", SPEC)))
    assert [e.error_type for e in errors] == ["unreadable_shard"]


def test_transient_errors_are_told_apart_without_gcsfs_retry_module(monkeypatch):
    """gcsfs.retry is not documented API: a gcsfs that moved it must leave the storage error itself (is_transient
    answering from the connection errors alone), not replace it with an ImportError."""
    import sys

    from gcsfs.retry import HttpError

    from pipeline.io.sources import is_transient

    monkeypatch.setitem(sys.modules, "gcsfs.retry", None)  # `from gcsfs.retry import ...` now raises ImportError
    assert is_transient(ConnectionResetError("reset by peer"))
    assert is_transient(TimeoutError("timed out"))
    assert not is_transient(HttpError({"code": 403, "message": "Forbidden"}))
    assert not is_transient(FileNotFoundError("gone"))


def _string_column_with_invalid_utf8(cells: list[bytes]) -> pa.Array:
    """A Parquet string column holding the given bytes as they are (pyarrow's writers refuse invalid UTF-8)."""
    offsets = [0]
    for cell in cells:
        offsets.append(offsets[-1] + len(cell))
    return pa.Array.from_buffers(pa.string(), len(cells), [None, pa.py_buffer(pa.array(offsets, pa.int32()).buffers()[1]),
                                                           pa.py_buffer(b"".join(cells))])


def test_a_bad_parquet_cell_costs_only_its_record_and_unused_columns_are_not_read(tmp_path):
    """Before: the reader converted every column of a 512-row batch at once; one invalid UTF-8 cell or one
    timestamp past year 9999 in any column turned the rest of the file into one error row (null record_index)."""
    n = 1200
    year_90000 = 253_402_300_800_000 * 10  # ms since 1970: pyarrow reads it, Python's datetime cannot hold it
    stamps = pa.array([1_704_067_200_000] * 700 + [year_90000] + [1_704_067_200_000] * (n - 701), pa.int64())
    texts = [f"document {i}".encode() for i in range(n)]
    texts[5] = b"bad \xff utf8"
    table = pa.table({"id": [f"d{i}" for i in range(n)], "text": _string_column_with_invalid_utf8(texts),
                      "created": stamps.cast(pa.timestamp("ms")),  # year 90000 at row 700: unused, never read
                      "notes": _string_column_with_invalid_utf8([b"\xfe"] * n)})  # unused and all invalid
    path = tmp_path / "cells.parquet"
    pq.write_table(table, path)
    docs, errors = split(list(read_shard(str(path), SPEC)))
    assert len(docs) == n - 1 and [d.record_index for d in docs] == [i for i in range(n) if i != 5]
    assert [(e.record_index, e.stage, e.error_type, e.doc_id) for e in errors] == [(5, "parse", "invalid_utf8", "d5")]
    assert "'text'" in errors[0].message
    # a bad cell in a column the run uses (the id) is that record's error row, the others are scored
    ids = pa.array([0, year_90000, 0], pa.int64()).cast(pa.timestamp("ms"))
    pq.write_table(pa.table({"id": ids, "text": ["x", "y", "z"]}), tmp_path / "id.parquet")
    docs, errors = split(list(read_shard(str(tmp_path / "id.parquet"), SPEC)))
    assert [(d.doc_id, d.record_index) for d in docs] == [("1970-01-01 00:00:00", 0), ("1970-01-01 00:00:00", 2)]
    assert [(e.record_index, e.error_type, e.doc_id) for e in errors] == [(1, "bad_field_type", f"{tmp_path}/id.parquet#1")]
    assert "'id'" in errors[0].message and "OverflowError" in errors[0].message


def test_a_parquet_file_without_the_text_column_names_its_columns(tmp_path):
    pq.write_table(pa.table({"id": ["m0"], "body": ["no text column"]}), tmp_path / "m.parquet")
    _, errors = split(list(read_shard(str(tmp_path / "m.parquet"), SPEC)))
    assert [(e.record_index, e.error_type, e.doc_id) for e in errors] == [(0, "missing_field", "m0")]
    assert "columns: ['id', 'body']" in errors[0].message and "--text_field" in errors[0].message


def test_a_parquet_file_with_two_text_columns_is_one_error_not_a_guess(tmp_path):
    """pyarrow hands over one of two same-named columns: the run scored the second without a word."""
    table = pa.Table.from_arrays([pa.array(["i1"]), pa.array(["first text"]), pa.array(["other"])],
                                 names=["id", "text", "text"])
    pq.write_table(table, tmp_path / "twice.parquet")
    documents, errors = split(list(read_shard(str(tmp_path / "twice.parquet"), SPEC)))
    assert documents == [] and [(e.stage, e.error_type) for e in errors] == [("read", "ambiguous_column")]
    assert "'text' appears 2 times" in errors[0].message


def test_a_local_file_name_holding_double_colons_is_read_as_that_file(tmp_path):
    """Before: fsspec.open read `notes::v2.jsonl` as a chained URL and opened `notes` (or failed on its absence)."""
    (tmp_path / "notes").write_text('{"text": "WRONG FILE"}\n')
    (tmp_path / "notes::v2.jsonl").write_text('{"id": "j", "text": "the jsonl shard"}\n')
    (tmp_path / "notes::v2.jsonl.gz").write_bytes(gzip.compress(b'{"id": "g", "text": "the gzip shard"}\n'))
    (tmp_path / "readme::draft.txt").write_text("the text file")
    pq.write_table(pa.table({"id": ["p"], "text": ["the parquet shard"]}), tmp_path / "rows::v2.parquet")
    texts = {}
    for name in ("notes::v2.jsonl", "notes::v2.jsonl.gz", "readme::draft.txt", "rows::v2.parquet"):
        docs, errors = split(list(read_shard(str(tmp_path / name), SPEC)))
        assert not errors, (name, errors)
        texts[name] = [d.text for d in docs]
    assert texts == {"notes::v2.jsonl": ["the jsonl shard"], "notes::v2.jsonl.gz": ["the gzip shard"],
                     "readme::draft.txt": ["the text file"], "rows::v2.parquet": ["the parquet shard"]}
    # validation's look at the fields reads the same files (it looked at `notes`, and the --text_field check with it)
    from pipeline.input_checks import first_record_fields

    (tmp_path / "notes").write_text('{"body": "WRONG FILE"}\n')
    assert first_record_fields(str(tmp_path / "notes::v2.jsonl"), SPEC) == {"id", "text"}
    assert first_record_fields(str(tmp_path / "rows::v2.parquet"), SPEC) == {"id", "text"}


def test_ids_that_cannot_tell_a_record_apart_fall_back_to_the_position_and_bytes_are_decoded():
    """Before: an empty id was doc_id "", a NaN id "nan" and a Parquet binary id the repr "b'bin-a'"."""
    from pipeline.io.sources import decoded_record, make_document

    for value in ("", float("nan"), float("inf"), float("-inf")):
        assert make_document({"id": value, "text": "t"}, "s", 3, SPEC, 0.0).doc_id == "s#3", value
    assert make_document({"id": 1.5, "text": "t"}, "s", 3, SPEC, 0.0).doc_id == "1.5"
    # the readers whose records may hold bytes (Parquet binary columns, TFDS) decode them first
    assert make_document(decoded_record({"id": b"bin-a", "text": "t"}, "s", 3, SPEC), "s", 3, SPEC, 0.0).doc_id == "bin-a"
    row = decoded_record({"id": b"\xff\xfe", "text": "t"}, "s", 3, SPEC)
    assert (type(row), row.stage, row.error_type, row.doc_id) == (ErrorRow, "parse", "invalid_utf8", "s#3")
    assert "'id'" in row.message



def test_an_invalid_utf8_row_names_the_first_undecodable_field():
    """A record with several fields that are not UTF-8 is one invalid_utf8 row naming the first of them in the
    order the fields are read (the text, the id, then query and label), not the last one looked at."""
    from pipeline.io.sources import decoded_record

    row = decoded_record({"id": b"\xfc", "text": b"\xff", "query": b"\xfe", "label": b"\xfd"}, "s", 3, SPEC)
    assert (type(row), row.error_type) == (ErrorRow, "invalid_utf8")
    assert row.message.startswith("'text' holds bytes that are not valid UTF-8"), row.message
    row = decoded_record({"id": "ok", "text": "t", "query": b"\xfe", "label": b"\xfd"}, "s", 3, SPEC)
    assert row.message.startswith("'query' holds bytes"), row.message

def test_parquet_binary_id_and_text_columns_are_read_as_utf8_text(tmp_path):
    """Before: a binary id became "b'bin-a'" and a binary (un-annotated UTF-8) text column was bad_field_type
    on every row."""
    path = tmp_path / "bin.parquet"
    pq.write_table(pa.table({"id": pa.array([b"bin-a", b"\xff\xfe", b"bin-c"], pa.binary()),
                             "text": pa.array([b"binary text", b"two", b"bad \xff"], pa.binary()),
                             "label": pa.array([b"x", None, None], pa.large_binary())}), path)
    docs, errors = split(list(read_shard(str(path), SPEC)))
    assert [(d.doc_id, d.text, d.fields) for d in docs] == [("bin-a", "binary text", {"label": "x"})]
    assert [(e.record_index, e.error_type, e.doc_id) for e in errors] == [
        (1, "invalid_utf8", f"{path}#1"), (2, "invalid_utf8", "bin-c")]
    assert "'id'" in errors[0].message and "'text'" in errors[1].message
    views = tmp_path / "views.parquet"  # binary views and a dictionary of binary values are bytes too
    pq.write_table(pa.table({"id": pa.array([b"v0", b"v1"], pa.binary_view()),
                             "text": pa.array([b"view text", b"\xff"], pa.binary()).dictionary_encode()}), views)
    docs, errors = split(list(read_shard(str(views), SPEC)))
    assert [(d.doc_id, d.text) for d in docs] == [("v0", "view text")]
    assert [(e.doc_id, e.error_type) for e in errors] == [("v1", "invalid_utf8")]


def test_field_problems_name_what_is_wrong_with_the_field(tmp_path):
    """A null text says so (it was "record has no 'text'" while listing 'text'); a lone surrogate in `query` or
    `label` is invalid_unicode naming the field (it was bad_field_type, "'label' is a str; it must be a string")."""
    path = tmp_path / "fields.jsonl"
    path.write_text('{"id": "n", "text": null}\n'
                    '{"id": "l", "text": "dogs", "label": "lone \\ud800"}\n'
                    '{"id": "q", "text": "dogs", "query": "q \\udfff x"}\n', encoding="utf-8")
    docs, errors = split(list(read_shard(str(path), SPEC)))
    assert not docs
    assert [(e.doc_id, e.error_type) for e in errors] == [("n", "missing_field"), ("l", "invalid_unicode"),
                                                          ("q", "invalid_unicode")]
    assert errors[0].message == "'text' (--text_field) is null"
    assert errors[1].message.startswith("'label' holds a lone surrogate") and errors[2].message.startswith("'query'")


def test_parquet_decimal_labels_are_numbers_and_fixed_size_binary_text_is_text(tmp_path):
    """SQL and Spark exports hold numeric gold labels as decimals and may hold text as fixed-size binary."""
    import decimal

    path = tmp_path / "typed.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"],
                             "text": pa.array([b"abcd", b"efgh", b"\xff\xfe\xfd\xfc"], pa.binary(4)),
                             "label": pa.array([decimal.Decimal("0.50"), decimal.Decimal("3.00"), None],
                                               pa.decimal128(5, 2))}), path)
    docs, errors = split(list(read_shard(str(path), SPEC)))
    assert [(d.doc_id, d.text, d.fields) for d in docs] == [("a", "abcd", {"label": 0.5}), ("b", "efgh", {"label": 3})]
    assert [(e.doc_id, e.error_type) for e in errors] == [("c", "invalid_utf8")]


def test_parquet_float32_labels_and_ids_are_the_decimals_written_not_their_binary_expansion(tmp_path):
    """A float32 column of 0.1 holds 0.100000001490116...: read as float64 it would be gold_label
    '0.10000000149011612' where the JSONL of the same data says 0.1."""
    path = tmp_path / "f32.parquet"
    pq.write_table(pa.table({"id": pa.array([0.7, 2.0, None], pa.float32()), "text": ["x", "y", "z"],
                             "label": pa.array([0.1, None, 3.4028235e38], pa.float32())}), path)
    docs = list(read_shard(str(path), SPEC))
    assert [(d.doc_id, d.fields) for d in docs] == [
        ("0.7", {"label": 0.1}), ("2", {}), (f"{path}#2", {"label": 3.4028235e38})]


def test_a_text_file_in_utf16_without_a_byte_order_mark_is_an_error_row_not_scored_garbage(tmp_path):
    """UTF-16 of ASCII, Cyrillic or Greek text without a BOM decodes as UTF-8 (control bytes between the
    characters); it is an invalid_utf8 row that says what the file is. UTF-8 text with a stray NUL is text."""
    import dataclasses

    texts = {"ascii_le.txt": ("hello world in ascii", "utf-16-le"), "ascii_be.txt": ("hello world", "utf-16-be"),
             "cyrillic.txt": ("привет мир, как дела сегодня", "utf-16-le"), "greek.txt": ("Καλημέρα κόσμε", "utf-16-le")}
    for name, (text, encoding) in texts.items():
        path = tmp_path / name
        path.write_bytes(text.encode(encoding))
        docs, errors = split(list(read_shard(str(path), SPEC)))
        assert docs == [] and [e.error_type for e in errors] == ["invalid_utf8"], name
        assert "UTF-16" in errors[0].message and "convert the file to UTF-8" in errors[0].message, errors[0].message
    stray = tmp_path / "stray.txt"
    stray.write_bytes("plain UTF-8 text with one stray \x00 byte in it".encode())
    [doc] = list(read_shard(str(stray), SPEC))
    assert isinstance(doc, Document) and "stray" in doc.text
    # a --max_record_bytes far above any file (or what a machine could hold) still reads a small file
    [doc] = list(read_shard(str(stray), dataclasses.replace(SPEC, max_record_bytes=10**20)))
    assert isinstance(doc, Document) and doc.text.startswith("plain")


def test_bytes_that_are_gzip_or_utf16_say_so(tmp_path):
    """A gzip file named .jsonl is one shard error that says how to name it (not a row of garbage per line it
    happens to hold); a gzip file named .txt says to decompress it (renaming it .gz would not be read); a UTF-16
    export is not UTF-8: the error rows say what the files are instead."""
    gz = tmp_path / "packed.jsonl"
    gz.write_bytes(gzip.compress("".join(f'{{"id": "{i}", "text": "x {i}"}}\n' for i in range(300)).encode()))
    gz_text = tmp_path / "notes.txt"
    gz_text.write_bytes(gzip.compress(b"hello\n" * 50))
    _, gz_errors = split(list(read_shard(str(gz), SPEC)))
    assert [(e.record_index, e.error_type) for e in gz_errors] == [(None, "corrupt_file")]
    assert "gzip-compressed but its name does not end in .gz: rename it packed.jsonl.gz" in gz_errors[0].message
    [text_error] = read_shard(str(gz_text), SPEC)
    assert text_error.error_type == "invalid_utf8" and "gzip-compressed: decompress the file" in text_error.message
    # UTF-16 JSONL: tests/test_sources.py test_a_jsonl_shard_in_utf16_or_with_cr_line_endings_is_one_shard_error


RECORDS = [{"id": f"r{i}", "text": f"record {i}: \u0a0a \u010a ä"} for i in range(4)]  # U+0A0A, U+010A: a 0x0A byte
JSONL = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in RECORDS)


def test_a_jsonl_shard_in_utf16_or_with_cr_line_endings_is_one_shard_error_naming_the_fix(tmp_path):
    """Before: UTF-16 was split at 0x0A bytes inside characters (4 records became 12 error rows of garbage), and
    CR-only line endings made the shard one line ('Extra data'). Now each is one read/corrupt_file row (record_index
    None: its records are not counted as read) that names the encoding or line endings and the fix; CRLF, and one
    record ending in a lone CR, still read."""
    shards = {"bom_le.jsonl": (JSONL.encode("utf-16"), "shard is UTF-16 text", "iconv -f UTF-16 -t UTF-8"),
              "bom_be.jsonl": (b"\xfe\xff" + JSONL.encode("utf-16-be"), "shard is UTF-16 text", "iconv -f UTF-16 "),
              "plain_le.jsonl": (JSONL.encode("utf-16-le"), "shard is UTF-16LE text", "iconv -f UTF-16LE -t UTF-8"),
              "plain_be.jsonl.gz": (gzip.compress(JSONL.encode("utf-16-be")), "shard is UTF-16BE text", "-f UTF-16BE"),
              "mac.jsonl": (JSONL.replace("\n", "\r").encode(), "shard's lines end in CR alone", "convert the line "
                            "endings to LF"),
              "mac.jsonl.gz": (gzip.compress(JSONL.replace("\n", "\r").encode()), "end in CR alone", "to LF")}
    for name, (data, cause, fix) in shards.items():
        (tmp_path / name).write_bytes(data)
        items = list(read_shard(str(tmp_path / name), SPEC))
        assert [(type(i).__name__, i.record_index, i.stage, i.error_type) for i in items] == [
            ("ErrorRow", None, "read", "corrupt_file")], (name, items)
        assert cause in items[0].message and fix in items[0].message, (name, items[0].message)
    (tmp_path / "windows.jsonl").write_bytes(JSONL.replace("\n", "\r\n").encode())
    (tmp_path / "one.jsonl").write_bytes(b'{"id": "only", "text": "one record"}\r')
    assert [d.text for d in read_shard(str(tmp_path / "windows.jsonl"), SPEC)] == [r["text"] for r in RECORDS]
    assert [d.doc_id for d in read_shard(str(tmp_path / "one.jsonl"), SPEC)] == ["only"]


def test_an_input_whose_every_peeked_jsonl_shard_cannot_be_split_is_refused_before_the_job(tmp_path):
    """Validation's peek sees what the reader would: when no peeked shard can be split into records (UTF-16, CR-only
    line ends), the run is exit 2 naming the file and the fix; one readable shard beside them runs (their rows say it)."""
    from pipeline.options import ConfigError, parse_options
    from pipeline.input_checks import check_fields

    (tmp_path / "a.jsonl").write_bytes(JSONL.encode("utf-16"))
    (tmp_path / "b.jsonl").write_bytes(JSONL.replace("\n", "\r").encode())
    _, eo = parse_options(["--input", str(tmp_path), "--output", str(tmp_path / "out")])
    shards = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    with pytest.raises(ConfigError, match=rf"^--input {tmp_path}: {shards[0]}: shard is UTF-16 text.*iconv .*\(nor does "
                                          r"the other shard looked at\)"):
        check_fields(eo, shards, SPEC)
    (tmp_path / "c.jsonl").write_text(JSONL)
    check_fields(eo, [*shards, str(tmp_path / "c.jsonl")], SPEC)


def test_a_remote_name_holding_double_colons_is_read_as_that_object():
    """Before: a memory:// or gs:// shard named `notes::v2.jsonl` was opened as the chained URL `notes` then
    `v2.jsonl` (read/unreadable_shard 'gone since the run found it'), and naming it was exit 2 ('does not exist')."""
    from pipeline.input_checks import first_record_fields

    fs = fsspec.filesystem("memory")
    fs.pipe_file("/docscore-colons/notes::v2.jsonl", b'{"id": "c", "text": "the shard"}\n')
    fs.pipe_file("/docscore-colons/notes", b'{"body": "WRONG FILE"}\n')  # what the chained URL would open
    fs.pipe_file("/docscore-colons/gz::v2.jsonl.gz", gzip.compress(b'{"id": "g", "text": "the gzip shard"}\n'))
    url = "memory:///docscore-colons/notes::v2.jsonl"
    try:
        assert shards_of("memory://docscore-colons/") == ["memory:///docscore-colons/gz::v2.jsonl.gz", url]
        assert shards_of(url) == [url]
        assert [(d.doc_id, d.text) for d in read_shard(url, SPEC)] == [("c", "the shard")]
        gz_docs = list(read_shard("memory:///docscore-colons/gz::v2.jsonl.gz", SPEC))
        assert [d.text for d in gz_docs] == ["the gzip shard"], gz_docs
        assert first_record_fields(url, SPEC) == {"id", "text"}
    finally:
        fs.rm("/docscore-colons", recursive=True)


@pytest.mark.parametrize("name, says", [
    ("z.jsonl.zst", "it is zstd-compressed JSON lines, and docscore decompresses gzip only: decompress it (zstd -d), "
                    "or recompress it with gzip as .jsonl.gz"),
    ("z.jsonl.bz2", "it is bzip2-compressed JSON lines"), ("z.ndjson.xz", "it is xz-compressed JSON lines"),
    ("z.json.gz", "if it holds one JSON object per line (as Spark's part-*.json files do), rename it to .jsonl.gz"),
    ("part-00000-1a2b.json", "rename it to .jsonl;"), ("notes.txt.gz", "it is a gzip-compressed .txt file"),
    ("data.csv", "it is in no format docscore reads (.jsonl, ")])
def test_a_file_of_a_near_miss_format_is_refused_naming_the_fix(tmp_path, name, says):
    """Before: naming one file said 'use a pattern matching only .jsonl, ... files', whatever the file was."""
    (tmp_path / name).write_bytes(b"{}\n")
    with pytest.raises(ValueError) as refused:
        find_input(str(tmp_path / name))
    message = str(refused.value)
    assert message.startswith(f"--input {tmp_path / name}: cannot read {tmp_path / name}: ") and says in message, message
    assert "use a pattern" not in message
    with pytest.raises(ValueError, match=r"\*: cannot read .*; use a pattern matching only"):  # a glob: the pattern's
        find_input(str(tmp_path / "*"))


def test_near_miss_formats_a_glob_or_directory_leaves_out_name_the_fix(tmp_path):
    from pipeline.io.input_files import skipped_notice

    (tmp_path / "b.csv").write_text("x")
    (tmp_path / "z.jsonl.zst").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match=r"holds only files of other formats: .*b\.csv, .*z\.jsonl\.zst "
                                                r"\(z\.jsonl\.zst: it is zstd-compressed JSON lines"):
        find_input(str(tmp_path))
    with pytest.raises(ValueError, match=r"cannot read .*b\.csv \(and 1 more\); use a pattern matching only .* files "
                                         r"\(z\.jsonl\.zst: it is zstd-compressed JSON lines"):
        find_input(str(tmp_path / "*"))
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    notice = skipped_notice(str(tmp_path), find_input(str(tmp_path)).skipped)
    assert notice.endswith("(z.jsonl.zst: it is zstd-compressed JSON lines, and docscore decompresses gzip only: "
                           "decompress it (zstd -d), or recompress it with gzip as .jsonl.gz)"), notice


def test_a_directory_input_names_the_files_it_leaves_out(tmp_path):
    """A directory --input reads the files of readable formats; the others (a .csv, a .json, a .bz2) are left out
    and listed, so the run can say so (validate's notice), while hidden folders stay unlisted."""
    from pipeline.io.input_files import find_input
    from pipeline.io.input_files import skipped_notice

    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    for name in ("d.csv", "e.json", "f.jsonl.bz2", "_tmp/z.csv", ".git/config"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x")
    found = find_input(str(tmp_path))
    assert found.shards == [str(tmp_path / "a.jsonl")]
    assert found.skipped == [str(tmp_path / n) for n in ("d.csv", "e.json", "f.jsonl.bz2")]
    notice = skipped_notice(str(tmp_path), found.skipped)
    assert "3 files in no format docscore reads were left out (d.csv, e.json, f.jsonl.bz2)" in notice
    assert find_input(str(tmp_path / "a.jsonl")).skipped == [] and skipped_notice(str(tmp_path), []) is None


def test_a_whole_number_id_is_the_same_id_stored_as_int_or_float(tmp_path):
    """pandas writes an integer id column with a missing value as float64: its 1.0 must join a JSONL's 1 (and a
    decimal 7.00 too)."""
    import decimal

    (tmp_path / "a.jsonl").write_text('{"id": 1, "text": "x"}\n{"id": 2.0, "text": "y"}\n{"id": 2.5, "text": "z"}\n')
    pq.write_table(pa.table({"id": pa.array([1.0, None, 3e20], pa.float64()), "text": ["x", "y", "z"]}),
                   tmp_path / "b.parquet")
    pq.write_table(pa.table({"id": pa.array([decimal.Decimal("7.00"), decimal.Decimal("2.50"), None], pa.decimal128(5, 2)),
                             "text": ["x", "y", "z"]}), tmp_path / "c.parquet")  # a SQL export's decimal ids
    ids = [d.doc_id for name in ("a.jsonl", "b.parquet", "c.parquet") for d in read_shard(str(tmp_path / name), SPEC)]
    assert ids == ["1", "2", "2.5", "1", f"{tmp_path / 'b.parquet'}#1", "300000000000000000000",
                   "7", "2.5", f"{tmp_path / 'c.parquet'}#2"]


def test_a_field_the_task_does_not_read_never_fails_its_record(tmp_path):
    """A multi-label `label` (a list) or a `query` object: an error row for the task that reads the field (its
    value could not be scored), left off the document for a task that does not (embed, loglik)."""
    import dataclasses

    path = tmp_path / "a.jsonl"
    path.write_text('{"id": "a", "text": "x", "label": [1, 2], "query": {"q": 1}}\n')
    [error] = read_shard(str(path), SPEC)  # the default: both fields checked
    assert isinstance(error, ErrorRow) and error.error_type == "bad_field_type"
    [doc] = read_shard(str(path), dataclasses.replace(SPEC, checked_fields=()))
    assert isinstance(doc, Document) and doc.fields == {}
    [error] = read_shard(str(path), dataclasses.replace(SPEC, checked_fields=("query",)))  # similarity reads it
    assert isinstance(error, ErrorRow) and "'query' is a dict" in error.message


def test_a_parquet_field_the_task_does_not_read_never_fails_its_record(tmp_path):
    """As for JSONL: a `label` of bytes that are not UTF-8, a `label` column written twice, a `choices` cell
    pyarrow cannot convert (a timestamp past year 9999) are left off for a task that does not read them, and
    fail the record (or, for the ambiguous column, the shard) for one that does."""
    import dataclasses

    bad_bytes = tmp_path / "bytes.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["doc a", "doc b"],
                             "label": pa.array([b"\xff", b"ok"], pa.binary())}), bad_bytes)
    twice = tmp_path / "twice.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array(["doc c", "doc d"]), pa.array(["x", "y"]), pa.array(["x", "z"])],
                                        names=["text", "label", "label"]), twice)
    far = tmp_path / "far.parquet"
    pq.write_table(pa.table({"text": ["doc e"], "choices": pa.array([[2**62]], pa.list_(pa.timestamp("us")))}), far)
    embed = dataclasses.replace(SPEC, checked_fields=())
    for path, fields in ((bad_bytes, [{}, {"label": "ok"}]), (twice, [{}, {}]), (far, [{}])):
        docs = list(read_shard(str(path), embed))
        assert all(isinstance(d, Document) for d in docs), docs
        assert [d.fields for d in docs] == fields
    reads_label = dataclasses.replace(SPEC, checked_fields=("label",))
    assert [getattr(d, "error_type", None) for d in read_shard(str(bad_bytes), reads_label)] == ["invalid_utf8", None]
    assert [d.error_type for d in read_shard(str(twice), reads_label)] == ["ambiguous_column"]
    [error] = read_shard(str(far), dataclasses.replace(SPEC, checked_fields=("choices",)))
    assert isinstance(error, ErrorRow) and error.error_type == "bad_field_type"


def test_a_shard_cut_after_the_run_found_it_is_a_shard_error_beside_what_it_still_holds(tmp_path):
    """Input rewritten while the run reads it (`: > shard`, a shorter copy): its lost records are in no table, so
    a shard error says so (the error gate then fails the run); a file that grew is read whole, no error."""
    import dataclasses

    from pipeline.io.input_files import shard_sizes

    cut, grown = tmp_path / "cut.jsonl", tmp_path / "grown.jsonl"
    for path in (cut, grown):
        path.write_text("".join(json.dumps({"id": f"{path.stem}{i}", "text": "x"}) + "\n" for i in range(10)))
    spec = dataclasses.replace(SPEC, sizes=shard_sizes([str(cut), str(grown), "gs://bucket/remote.jsonl"]))
    assert set(spec.sizes) == {str(cut), str(grown)}  # remote objects are not checked
    cut.write_text("".join(json.dumps({"id": f"cut{i}", "text": "x"}) + "\n" for i in range(3)))
    with grown.open("a") as f:
        f.write(json.dumps({"id": "grown10", "text": "x"}) + "\n")
    docs, errors = split(list(read_shard(str(cut), spec)))
    assert len(docs) == 3 and [(e.record_index, e.error_type) for e in errors] == [(None, "shard_changed")]
    assert "when the run found it: it was cut or rewritten while the run read its input" in errors[0].message
    docs, errors = split(list(read_shard(str(grown), spec)))
    assert len(docs) == 11 and errors == []


def test_a_shard_cut_while_it_is_being_read_is_a_shard_error_at_the_end(tmp_path):
    """The cut comes after the read began (the size matched when the reader opened it): the records past the cut
    were never seen, so the reader checks the size again when it is done."""
    import dataclasses

    from pipeline.io.input_files import shard_sizes

    shard = tmp_path / "midway.jsonl"
    shard.write_text("".join(json.dumps({"id": f"m{i}", "text": "x" * 200}) + "\n" for i in range(2000)))
    spec = dataclasses.replace(SPEC, sizes=shard_sizes([str(shard)]))
    items = read_shard(str(shard), spec)
    first = next(items)
    with shard.open("r+b") as f:  # cut to a tenth while the reader is inside the file
        f.truncate(shard.stat().st_size // 10)
    docs, errors = split([first, *items])
    assert len(docs) < 2000 and errors, errors
    # the line the cut went through may be an invalid_json row before it; the shard error comes last
    assert (errors[-1].record_index, errors[-1].error_type) == (None, "shard_changed"), errors
    assert [e.error_type for e in errors[:-1]] in ([], ["invalid_json"]), errors


def test_a_folder_under_input_that_cannot_be_listed_is_refused_not_silently_left_out(tmp_path, monkeypatch):
    """Its files would be missing from the run with no row saying so (an unreadable file is an error row): the input
    is refused naming the folder. A hidden folder (_tmp/, .git/) is skipped as before. Tests run as root, for whom
    chmod 000 hides nothing, so the listing is refused as it is for another user."""
    for folder in ("in/sub", "in/_tmp", "in/lost+found"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "docs.jsonl").write_text('{"id": "a", "text": "x"}\n')
    (tmp_path / "in" / "top.jsonl").write_text('{"id": "b", "text": "y"}\n')
    real_scandir = os.scandir
    locked = {str(tmp_path / "in" / folder) for folder in ("sub", "_tmp", "lost+found")}  # lost+found: a mount point's

    def scandir(path="."):
        if str(path).rstrip("/") in locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(PermissionError, match=r"the folder .*/in/sub cannot be listed, so its files would be missing"):
        find_input(str(tmp_path / "in"))
    locked.discard(str(tmp_path / "in" / "sub"))
    assert [p.rsplit("/", 1)[-1] for p in find_input(str(tmp_path / "in")).shards] == ["docs.jsonl", "top.jsonl"]


def test_every_input_format_has_a_reader_and_a_row_in_readmes_formats_table():
    """A format is one SUFFIXES entry (input_files.py) and one reader (sources.READERS); README's table of formats
    lists its file endings (docs/DESIGN.md, "An input format")."""
    from pathlib import Path

    from pipeline.io.input_files import SUFFIXES
    from pipeline.io.sources import READERS

    assert set(READERS) == {*SUFFIXES, "array_record"}
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme.split("| format | files | one document per |", 1)[1].split("\n\n", 1)[0]
    missing = [suffix for suffixes in SUFFIXES.values() for suffix in suffixes if suffix.removesuffix(".gz") not in table]
    assert missing == [], f"README.md's table of input formats does not list {missing}"



def test_a_shard_this_machine_has_no_file_descriptor_for_is_raised_not_an_error_row(tmp_path):
    """EMFILE says nothing about the shard: as a read/unreadable_shard row the run would publish (exit 4, or 0 with
    --max_error_fraction 1) without the shard's records, replacing the previous run of the run_id. Raised, the runner
    retries the bundle or the job fails with nothing published. A shard the user may not read stays a row."""
    shard = tmp_path / "docs.jsonl"
    shard.write_text(json.dumps({"id": "a", "text": "some text"}) + "\n")
    assert split(list(read_shard(str(tmp_path / "gone.jsonl"), SPEC)))[1]  # every module reading imports, loaded while it can be
    with no_free_file_descriptors(), pytest.raises(OSError) as caught:
        list(read_shard(str(shard), SPEC))
    assert caught.value.errno == errno.EMFILE
    assert [e.error_type for e in split(list(read_shard(str(shard), SPEC)))[1]] == []  # descriptors back: read



def test_reading_shards_treats_as_the_machines_the_errnos_models_do_and_loads_no_jax():
    """sources keeps its own copy of models.errors.SHORTAGES' errnos: importing models would load JAX into every
    command that reads shards or options (docscore report and compare took twice as long to start)."""
    from models.errors import SHORTAGES

    assert sources.RESOURCE_ERRNOS == frozenset(SHORTAGES)
    probe = "import sys, pipeline.io.sources, pipeline.runs.report, pipeline.runs.compare; print('jax' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-2000:]
