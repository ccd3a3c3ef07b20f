"""The bad-input corpus (tests/make_bad_corpus.py, big cases included) through `docscore run` on the real
DirectRunner with the real MiniLM weights: every record ends as exactly one scores or errors row of the
expected kind, the summary accounts for all of them, duplicate doc_ids keep every row and are counted,
and past --max_error_fraction the run exits 4 after publishing. Then the bounds on their own: a line is
never held past --max_record_bytes, a 20 MB text is tokenised only as far as its windows need."""
from __future__ import annotations

import io
import json
import os
import random
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from make_bad_corpus import BIG_DOC_BYTES, make_corpus
from pipeline.io import sources
from pipeline.records import RAW_PREVIEW_CHARS, Document, ErrorRow
from pipeline.stages import preprocess
from tests.conftest import TEST_BATCH, TEST_MAX_LEN, TEST_STRIDE, direct_embeddings, read_summary, read_table, run_docscore, shards_of

RUN_ID = "bad"
MAX_CHUNKS = 8  # docscore's default --max_chunks


@pytest.fixture(scope="module")
def bad_run(tmp_path_factory):
    """One run over the whole corpus with the default --max_error_fraction (0.1); the big shards are
    generated here and removed afterwards."""
    root = tmp_path_factory.mktemp("bad_corpus")
    expected = json.loads(open(make_corpus(str(root / "in"), big_cases=True)).read())
    out = root / "out"
    code = run_docscore("--input", root / "in", "--output", out, "--run_id", RUN_ID, "--attention", "native",
                        "--max_seq_len", TEST_MAX_LEN, "--batch_size", TEST_BATCH, "--stride", TEST_STRIDE)
    big_text = open(root / "in" / "big_doc.jsonl", "rb").read(200_000)
    shards = len(shards_of(str(root / "in")))  # before the big ones go
    for name in ("big_doc.jsonl", "huge_line.jsonl"):
        os.remove(root / "in" / name)
    scores, _ = read_table(out, "scores", RUN_ID)
    errors, _ = read_table(out, "errors", RUN_ID)
    return {"code": code, "in": root / "in", "out": out, "expected": expected, "scores": scores, "errors": errors,
            "summary": read_summary(out, RUN_ID), "shards": shards, "big_prefix": json.loads(big_text + b'"}')["text"]}


def outcome_key(shard: str, index, outcome: str, error_type, doc_id) -> tuple:
    """(shard, record_index or -1, outcome, error_type, doc_id) with pandas' NaN for a null read as None."""
    return shard, -1 if index is None else int(index), outcome, error_type, doc_id if isinstance(doc_id, str) else None


@pytest.mark.integration
def test_past_the_error_fraction_the_run_exits_4_after_publishing(bad_run):
    counts = bad_run["summary"]["counts"]
    assert counts["error_fraction"] == pytest.approx(counts["errors"] / counts["records"]) and counts["error_fraction"] > 0.1
    assert bad_run["code"] == 4  # and yet the tables (read by the fixture) and the summary are published
    assert bad_run["summary"]["launch_id"] and bad_run["summary"]["files"]["scores"]  # committed


@pytest.mark.integration
def test_every_record_ends_as_exactly_one_row_of_the_expected_kind(bad_run):
    root = str(bad_run["in"])
    expected = []
    for e in bad_run["expected"]:
        doc_id = e["doc_id"]
        if e["outcome"] == "scored" and doc_id is None:
            doc_id = f"{root}/{e['shard']}#{e['record_index']}"  # documented: no id -> source#record_index
        expected.append(outcome_key(e["shard"], e["record_index"], e["outcome"], e["error_type"], doc_id))
    got = [outcome_key(os.path.basename(r.source), r.record_index, "scored", None, r.doc_id)
           for r in bad_run["scores"].itertuples()]
    for r in bad_run["errors"].itertuples():
        index = None if r.record_index is None or np.isnan(r.record_index) else r.record_index
        got.append(outcome_key(os.path.basename(r.source), index, "error", r.error_type, r.doc_id))
    assert sorted(got, key=repr) == sorted(expected, key=repr)
    assert all(r.source.startswith(root) for r in bad_run["scores"].itertuples())


@pytest.mark.integration
def test_error_rows_carry_stage_type_message_and_a_truncated_raw_record(bad_run):
    errors = bad_run["errors"]
    assert set(errors.stage) <= {"read", "parse", "tokenize", "infer", "score"}
    assert (errors.message.str.len() > 0).all() and (errors.raw.str.len() <= RAW_PREVIEW_CHARS).all()
    by_type = {r.error_type: r for r in errors.itertuples()}
    assert by_type["record_too_large"].raw.startswith('{"id": "huge", "text": "xxx')
    assert "--max_record_bytes" in by_type["record_too_large"].message
    invalid_json = sorted(errors[errors.error_type == "invalid_json"].raw)
    assert invalid_json[0] == '{"id": "m-bad", "text": "unterminated' and "Exceeds the limit" in " ".join(errors.message)
    assert invalid_json[1].startswith('{"id": "m-digits"')
    assert "\ufffd" in by_type["invalid_utf8"].raw  # the undecodable bytes, shown replaced
    assert by_type["too_deeply_nested"].raw.startswith('{"id": "deep"') and len(by_type["too_deeply_nested"].raw) == RAW_PREVIEW_CHARS
    shard_rows = errors[errors.record_index.isna()]
    assert sorted(os.path.basename(s) for s in shard_rows.source) == ["corrupt.parquet", "truncated.jsonl.gz", "zero.parquet"]
    assert set(shard_rows.stage) == {"read"}
    # documented snake_case types, not the library's exception name (was read/EOFError, read/ArrowInvalid),
    # which stays in the message
    assert set(shard_rows.error_type) == {"corrupt_file"}
    messages = {os.path.basename(r.source): r.message for r in shard_rows.itertuples()}
    assert "EOFError" in messages["truncated.jsonl.gz"] and "ArrowInvalid" in messages["zero.parquet"]


@pytest.mark.integration
def test_the_summary_accounts_for_every_record_the_readers_saw(bad_run):
    counts, metrics = bad_run["summary"]["counts"], bad_run["summary"]["metrics"]
    scores, errors, expected = bad_run["scores"], bad_run["errors"], bad_run["expected"]
    assert counts["records"] == counts["records_read"] == len(scores) + len(errors) == len(expected)
    assert (counts["scored"], counts["errors"], counts["shard_errors"]) == (len(scores), len(errors), 3)
    assert counts["accounted"] is True
    assert sum(counts["errors_by_type"].values()) == len(errors)
    assert counts["errors_by_type"]["parse/not_an_object"] == 3
    # the readers' own counters: records (a whole-shard error is not a record) and shards
    assert metrics["docscore/records_read"] + counts["shard_errors"] == counts["records_read"]
    # every shard of the corpus was opened (a corrupt one too: its rows say how it ended); zero.jsonl gave nothing
    assert metrics["docscore/shards_read"] == bad_run["shards"], "docscore/shards_read is not the corpus's shard count"
    assert metrics["docscore/empty_shards"] == 1


@pytest.mark.integration
def test_duplicate_doc_ids_keep_every_row_and_are_counted(bad_run):
    dup = bad_run["scores"][bad_run["scores"].doc_id == "dup"]
    assert sorted((os.path.basename(s), i) for s, i in zip(dup.source, dup.record_index)) == [
        ("good.jsonl", 6), ("mixed.jsonl", 18), ("rows.parquet", 1)]
    counts = bad_run["summary"]["counts"]
    assert (counts["duplicate_doc_ids"], counts["duplicate_rows"]) == (1, 2)


@pytest.mark.integration
def test_the_20mb_document_is_scored_from_its_first_windows(bad_run, minilm):
    row = bad_run["scores"][bad_run["scores"].doc_id == "big-20mb"].iloc[0]
    assert row.truncated and row.n_chunks == MAX_CHUNKS
    assert TEST_MAX_LEN * MAX_CHUNKS < row.n_tokens < BIG_DOC_BYTES / 50  # a prefix was tokenised, not 20 MB
    # the same embedding as the first 200 kB alone give: the windows are the document's first ones
    direct = direct_embeddings(minilm, [bad_run["big_prefix"]], max_windows=MAX_CHUNKS)[0]
    assert np.max(np.abs(np.asarray(row.embedding, np.float64) - direct)) <= 1e-5


# ---- the bounds, without a pipeline ---------------------------------------------------------------


def test_bounded_lines_splits_like_splitlines_at_every_chunk_size():
    rng = random.Random(0)
    lines = [bytes(rng.choice(b"ab\r{} ") for _ in range(rng.choice([0, 1, 5, 40, 300]))) for _ in range(200)]
    data = b"\n".join(lines)  # the last line has no newline
    for chunk in (1, 2, 7, 64, 4096):
        got = list(sources.bounded_lines(io.BytesIO(data), max_bytes=10_000, chunk_bytes=chunk))
        want = [line[:-1] if line.endswith(b"\r") else line for line in data.split(b"\n")]
        assert [line for line, _ in got] == want
        assert all(size == len(line) for line, size in got)
        # the same lines over max_bytes are skipped: their sizes leave the CRLF's \r out as well
        skipped = list(sources.bounded_lines(io.BytesIO(data), max_bytes=0, chunk_bytes=chunk))
        assert [size for _, size in skipped] == [len(line) for line in want]


def test_an_over_long_line_is_skipped_without_being_held_whole():
    long_line = b'{"text": "' + b"y" * (8 * 2**20) + b'"}'
    data = io.BytesIO(b'{"text": "first"}\n' + long_line + b'\n{"text": "after"}\n')
    tracemalloc.start()
    try:
        got = list(sources.bounded_lines(data, max_bytes=2**16, chunk_bytes=2**16))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [(line[:12], size) for line, size in got] == [
        (b'{"text": "fi', 17), (b'{"text": "yy', len(long_line)), (b'{"text": "af', 17)]
    assert len(got[1][0]) == sources.RAW_PREVIEW_BYTES
    assert peak < 2**20, f"held {peak} bytes reading an 8 MiB line with max_bytes 64 KiB"


def test_max_record_bytes_applies_to_every_format(tmp_path):
    spec = sources.ReadSpec(max_record_bytes=2048)
    big, small = "z " * 2000, "a short document"
    (tmp_path / "a.jsonl").write_text(json.dumps({"id": "s", "text": small}) + "\n" + json.dumps({"id": "b", "text": big}) + "\n")
    pq.write_table(pa.table({"id": ["s", "b"], "text": [small, big]}), tmp_path / "b.parquet")
    (tmp_path / "c.txt").write_text(big)
    for name in ("a.jsonl", "b.parquet", "c.txt"):
        items = list(sources.read_shard(str(tmp_path / name), spec))
        too_large = [i for i in items if isinstance(i, ErrorRow)]
        assert [i.error_type for i in too_large] == ["record_too_large"], name
        assert too_large[0].record_index == (0 if name == "c.txt" else 1)
        assert [d.text for d in items if isinstance(d, Document)] == ([] if name == "c.txt" else [small])



def test_a_text_of_exactly_max_record_bytes_is_a_document_and_one_byte_more_is_too_large(tmp_path):
    """--max_record_bytes is the largest record scored: a .txt file and a Parquet text cell of exactly that many
    UTF-8 bytes (two-byte characters here: bytes, not characters, are counted) are documents; one byte more is a
    record_too_large row."""
    limit = 200
    exact, over = "\u00e9" * (limit // 2), "\u00e9" * (limit // 2) + "a"
    assert (len(exact.encode()), len(over.encode())) == (limit, limit + 1)
    spec = sources.ReadSpec(max_record_bytes=limit)
    (tmp_path / "exact.txt").write_text(exact, encoding="utf-8")
    (tmp_path / "over.txt").write_text(over, encoding="utf-8")
    pq.write_table(pa.table({"id": ["exact", "over"], "text": [exact, over]}), tmp_path / "cells.parquet")
    [doc] = sources.read_shard(str(tmp_path / "exact.txt"), spec)
    assert isinstance(doc, Document) and doc.text == exact
    [row] = sources.read_shard(str(tmp_path / "over.txt"), spec)
    assert isinstance(row, ErrorRow) and row.error_type == "record_too_large"
    doc, row = sources.read_shard(str(tmp_path / "cells.parquet"), spec)
    assert isinstance(doc, Document) and (doc.doc_id, doc.text) == ("exact", exact)
    assert isinstance(row, ErrorRow) and (row.doc_id, row.error_type) == ("over", "record_too_large")

class RecordingTokenizer:
    """The real tokenizer, recording how many characters each call was given."""

    def __init__(self, tokenizer):
        self._tokenizer, self.lengths = tokenizer, []
        self.n_special = tokenizer.n_special

    def encode_windows(self, texts, **kwargs):
        self.lengths += [len(t) for t in texts]
        return self._tokenizer.encode_windows(texts, **kwargs)

    def encode_ids(self, texts):
        self.lengths += [len(t) for t in texts]
        return self._tokenizer.encode_ids(texts)

    def prompted_ids(self, texts, role):
        self.lengths += [len(t) for t in texts]
        return self._tokenizer.prompted_ids(texts, role)

    def windows(self, ids, **kwargs):
        return self._tokenizer.windows(ids, **kwargs)


def test_a_20mb_text_is_tokenised_only_as_far_as_its_windows_need(minilm):
    words = "a plain english sentence keeps coming back again and again "
    text = (words * (BIG_DOC_BYTES // len(words) + 1))[:BIG_DOC_BYTES]
    spec = preprocess.WindowSpec(max_len=256, stride=32, max_chunks=MAX_CHUNKS)
    recording = RecordingTokenizer(minilm.tokenizer)
    encoded = preprocess.encode_text(recording, text, spec)
    assert max(recording.lengths) <= 1_000_000 and sum(recording.lengths) <= 2_000_000, recording.lengths
    whole_enough = minilm.tokenizer.encode_windows([text[:300_000]], max_len=256, stride=32, max_windows=MAX_CHUNKS)[0]
    assert encoded.truncated and len(encoded.windows) == MAX_CHUNKS
    assert [w.tolist() for w in encoded.windows] == [w.tolist() for w in whole_enough.windows]
    # a text without whitespace (one unknown "word"): read in pieces of bounded size, each a few [UNK]s
    recording.lengths = []
    blob = preprocess.encode_text(recording, "x" * BIG_DOC_BYTES, spec)
    assert max(recording.lengths) <= 1_000_000 and not blob.truncated and blob.n_tokens < 1000
    # such a run before real text (a hex dump, then an article) is read past: the article fills the windows (it
    # was one [UNK] window, truncated, the article never read); a run of characters without tokens before a
    # few words (3 million combining accents) is read to the end, not truncated
    article = words * 2000
    dump = preprocess.encode_text(minilm.tokenizer, "0f" * 550_000 + "\n" + article, spec)
    article_ids = minilm.tokenizer.encode_ids([article])[0].tolist()
    assert dump.truncated and len(dump.windows) == MAX_CHUNKS
    as_text = lambda ids: " " + " ".join(map(str, ids)) + " "  # noqa: E731 - a contiguous run of ids as text
    assert as_text(dump.windows[-1][1:-1]) in as_text(article_ids)
    accents = "a" + "\u0301" * 3_000_000 + " tail words"
    assert preprocess.encode_text(minilm.tokenizer, accents, spec).windows[0].tolist() == \
        minilm.tokenizer.encode_windows([accents], max_len=256, stride=32, max_windows=MAX_CHUNKS)[0].windows[0].tolist()
    # a word of thousands of characters across a piece's end is not cut (whitespace was looked for 1,024
    # characters back: one [UNK] became two), nor is one that \x1c-\x1f sit in (Python's whitespace, which BERT
    # deletes: the cut fell there, and one word was read as two)
    for text in [("w" * 150 + " ") * 430 + "x" * 3000 + " end"] + [
            ("w" * 150 + " ") * 433 + "a" * 100 + separator + "b" * 700 + " end" for separator in "\x1c\x1d\x1e\x1f"]:
        straddling = preprocess.encode_text(minilm.tokenizer, text, spec)
        assert straddling.n_tokens == len(minilm.tokenizer.encode_ids([text])[0]) and not straddling.truncated
    # short texts are tokenised whole, as before
    short = preprocess.encode_text(minilm.tokenizer, words * 10, spec)
    assert short.n_tokens == len(minilm.tokenizer.encode_ids([words * 10])[0]) and not short.truncated
    # a text that starts with more characters without tokens than a prefix reads (spaces, zero-width spaces):
    # its tokens are those of the text after them, not "no tokens"
    for filler in (" ", "\u200b", " \u200b\n"):
        padded = filler * (BIG_DOC_BYTES // len(filler)) + words * 10
        assert preprocess.encode_text(minilm.tokenizer, padded, spec).windows[0].tolist() == short.windows[0].tolist()


def test_a_shard_name_that_is_not_utf8_is_refused_before_reading(tmp_path):
    """Every row carries its shard's name as `source`: one no table can hold would fail the whole job."""
    os.makedirs(tmp_path / "in")
    with open(os.fsencode(tmp_path / "in") + b"/\xff.jsonl", "w") as f:
        f.write('{"text": "x"}\n')
    with pytest.raises(ValueError, match="not valid UTF-8; rename it"):
        shards_of(str(tmp_path / "in"))


def test_a_bom_and_a_crlf_do_not_count_toward_max_record_bytes(tmp_path):
    """Before: a line of exactly --max_record_bytes was record_too_large when it ended in \\r\\n or began with a BOM."""
    limit = 200
    record = '{"id": "edge", "text": "' + "a" * (limit - 26) + '"}'
    assert len(record) == limit
    over = '{"id": "over", "text": "' + "a" * (limit - 25) + '"}'
    (tmp_path / "crlf.jsonl").write_bytes(record.encode() + b"\r\n" + over.encode() + b"\r\n")
    (tmp_path / "bom.jsonl").write_bytes(sources.UTF8_BOM + record.encode() + b"\n" + over.encode() + b"\n")
    (tmp_path / "both.jsonl").write_bytes(sources.UTF8_BOM + record.encode() + b"\r\n" + sources.UTF8_BOM + over.encode())
    for name in ("crlf.jsonl", "bom.jsonl", "both.jsonl"):
        items = list(sources.read_shard(str(tmp_path / name), sources.ReadSpec(max_record_bytes=limit)))
        assert [(type(i).__name__, i.record_index, getattr(i, "error_type", None)) for i in items] == [
            ("Document", 0, None), ("ErrorRow", 1, "record_too_large")], name
        assert f"line of {limit + 1} bytes" in items[1].message, name


def check(tmp_path, shards: list, *flags: str, checked: tuple[str, ...] = ()) -> None:
    """input_checks.check_fields for `docscore run --input tmp_path FLAGS`, with the fields the task reads (`checked`,
    as validate_plan sets them)."""
    from pipeline.options import parse_options
    from pipeline.input_checks import check_fields

    _, eo = parse_options(["--input", str(tmp_path), "--output", str(tmp_path / "out"), *flags])
    spec = sources.ReadSpec(text_field=eo.text_field, id_field=eo.id_field or None, checked_fields=checked)
    check_fields(eo, [str(s) for s in shards], spec)


LABELS = ("--task", "classify", "--labels", "a=an a;b=a b")


def test_a_parquet_column_whose_type_can_never_work_is_refused_naming_the_flag_column_and_type(tmp_path):
    """Before: an int64 or struct text column (or a struct id, an int query, a list label) ran the whole job and
    every row was parse/bad_field_type, exit 4. Validation reads the schema, so it refuses before the job; types the
    reader takes pass (a binary or dictionary text, a null label column: records without a gold), and JSONL, whose
    types vary record by record, is left to the reader."""
    from pipeline.options import ConfigError

    def shard(name: str, **columns) -> str:
        pq.write_table(pa.table({"text": ["a text", "another"], **columns}), tmp_path / name)
        return str(tmp_path / name)

    int_text = tmp_path / "int.parquet"
    pq.write_table(pa.table({"text": [1, 2]}), int_text)
    refused = {
        "--text_field=text: the column 'text' of {} is int64, which is never a document text": ([int_text], ()),
        "--text_field=body: the column 'body' of {} is struct<text: string>, which is never a document text":
            ([shard("s.parquet", body=[{"text": "x"}, {"text": "y"}])], ("--text_field", "body")),
        "--id_field=meta: the column 'meta' of {} is struct<k: int64>, which is never an id":
            ([shard("m.parquet", meta=[{"k": 1}, {"k": 2}])], ("--id_field", "meta")),
        "--task=similarity: the column 'query' of {} is int64, which is never a query":
            ([shard("q.parquet", query=[1, 2])], ("--task", "similarity")),
        "--task=classify: the column 'label' of {} is list<element: string>, which is never a gold label":
            ([shard("l.parquet", label=[["a"], ["b"]])], LABELS),
        "--task=choice: the column 'choices' of {} is list<element: int64>, which is never a list of candidate strings":
            ([shard("c.parquet", choices=[[1], [2]])], ("--task", "choice")),
    }
    checked = {"similarity": ("query", "label"), "classify": ("label",), "choice": ("label", "choices")}
    for message, (shards, flags) in refused.items():
        task = flags[1] if flags[:1] == ("--task",) else None
        with pytest.raises(ConfigError) as error:
            check(tmp_path, shards, *flags, checked=checked.get(task, ()))
        assert str(error.value).startswith(message.format(shards[0])), str(error.value)
        lost = ("so every row's doc_id would fall back to SOURCE#RECORD_INDEX" if flags[:1] == ("--id_field",)
                else "so every row would be an error row")  # what a run with that column does
        assert lost in str(error.value), str(error.value)
    fine = [shard("bin.parquet", id=[1, 2]), shard("null_label.parquet", label=pa.array([None, None]))]
    pq.write_table(pa.table({"text": pa.array([b"a", b"b"])}), tmp_path / "binary.parquet")
    pq.write_table(pa.table({"text": pa.array(["a", "b"]).dictionary_encode()}), tmp_path / "dict.parquet")
    pq.write_table(pa.table({"text": pa.array(["a", "b"], pa.large_string())}), tmp_path / "large.parquet")
    for name in (*fine, "binary.parquet", "dict.parquet", "large.parquet"):
        check(tmp_path, [tmp_path / name], *LABELS, checked=("label",))
    check(tmp_path, [int_text, fine[0]])  # one bad shard among good ones: its rows are error rows
    (tmp_path / "int.jsonl").write_text('{"text": 5}\n')
    check(tmp_path, [tmp_path / "int.jsonl"])


@pytest.mark.integration
def test_docscore_run_on_an_int64_text_column_exits_2_before_reading_data(tmp_path, capsys, no_data_read):
    pq.write_table(pa.table({"id": [1, 2], "text": [10, 20]}), tmp_path / "nums.parquet")
    code = run_docscore("--input", tmp_path / "nums.parquet", "--output", tmp_path / "out", "--run_id", "t",
                        "--attention", "native", "--max_seq_len", TEST_MAX_LEN, "--stride", TEST_STRIDE)
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"--text_field=text: the column 'text' of {tmp_path / 'nums.parquet'} is int64" in err
    assert not (tmp_path / "out" / "scores").exists()


def test_a_missing_field_message_says_what_was_looked_at_and_why_a_name_that_looks_present_is_not(tmp_path):
    """Before: '--id_field=uid: F has no such field (it has: text)' for records 25-29 having uid; a dotted name and a
    Hive partition folder (lang=en/) got the same words, with no hint that neither is read."""
    from pipeline.options import ConfigError
    from pipeline.input_checks import unread_gold_notice

    late = tmp_path / "late_uid.jsonl"
    late.write_text("".join(json.dumps({"text": f"t{i}", **({"uid": i} if i >= 25 else {})}) + "\n" for i in range(30)))
    nested = tmp_path / "nested.jsonl"
    nested.write_text("".join(json.dumps({"body": {"text": f"t{i}"}}) + "\n" for i in range(3)))
    (tmp_path / "lang=en").mkdir()
    partitioned = tmp_path / "lang=en" / "part.parquet"
    pq.write_table(pa.table({"text": ["a"]}), partitioned)
    expected = {
        (late, ("--id_field", "uid")):
            f"--id_field=uid: {late} has no such field in its first 20 records, the records looked at before the run "
            "starts (fields seen: text); pass --id_field with a top-level field the records have, or leave it out: "
            "each id then falls back to SOURCE#RECORD_INDEX",
        (nested, ("--text_field", "body.text")):
            f"--text_field=body.text: {nested} has no such field in any of its 3 records (fields seen: body); dotted "
            "paths are not followed (body.text would be a top-level field of that name, not `text` inside `body`): "
            "flatten the records, or pass --text_field with the top-level field",
        (partitioned, ("--id_field", "lang")):
            f"--id_field=lang: {partitioned} has no such field (it has: text); `lang=en` in its path is a partition "
            "folder, and partition folders are not read as fields: write lang into the records, or pass --id_field",
    }
    for (shard, flags), message in expected.items():
        with pytest.raises(ConfigError) as error:
            check(tmp_path, [shard], *flags)
        assert str(error.value).startswith(message), str(error.value)
    (tmp_path / "label=sports").mkdir()
    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "label=sports" / "part.parquet")
    notice = unread_gold_notice("classify", str(tmp_path / "label=sports" / "part.parquet"), sources.ReadSpec())
    assert "`label=sports` in its path is a partition folder, which is not read as a field" in notice
