"""Generate docscore's bad-input corpus: one shard per kind of damage, plus expected.json saying what
every record must end as (a scores row, or an errors row of a given error_type).

    python tests/make_bad_corpus.py OUT_DIR [--big]

--big adds the two large cases (a 20 MB document, a 52 MB line without a newline); tests generate
them in a temporary directory at test time. Must not import docscore: the expectations are written
from the cases themselves, independently of the readers they check.
"""
from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import zlib

import pyarrow as pa
import pyarrow.parquet as pq

EXPECTED = "expected.json"
BIG_DOC_BYTES = 20 * 10**6
HUGE_LINE_BYTES = 52 * 10**6  # > 50 MB, and over docscore's default --max_record_bytes (32 MiB)
DEEP = 100_000  # nesting levels: far past what Python's json parser accepts

WORDS = ("the reader streams every shard line by line and keeps what it can score while each bad record "
         "becomes one row in the errors table with its stage type message and a short copy of the raw text").split()


def sentence(i: int, n: int = 12) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n)) + f" (document {i})."


class Corpus:
    """Shards under `root` and the outcome expected for each record (source, record_index)."""

    def __init__(self, root: str):
        self.root = root
        self.expected: list[dict] = []
        os.makedirs(root, exist_ok=True)

    def path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def expect(self, name: str, index: int | None, outcome: str, error_type: str | None = None, doc_id: str | None = None,
               **extra) -> None:
        self.expected.append({"shard": name, "record_index": index, "outcome": outcome, "error_type": error_type,
                              "doc_id": doc_id, **extra})

    def jsonl(self, name: str, lines: list[tuple[bytes, str, str | None, str | None]], *, newline: bytes = b"\n",
              prefix: bytes = b"") -> None:
        """lines: (raw line, outcome, error_type, doc_id); outcome "blank" is not a record."""
        with open(self.path(name), "wb") as f:
            f.write(prefix + newline.join(raw for raw, *_ in lines) + newline)
        for index, (_, outcome, error_type, doc_id) in enumerate(lines):
            if outcome != "blank":
                self.expect(name, index, outcome, error_type, doc_id)

    def write_expected(self) -> str:
        with open(self.path(EXPECTED), "w", encoding="utf-8") as f:
            json.dump(self.expected, f, indent=1)
        return self.path(EXPECTED)


def record(doc_id: str | None, text, **more) -> bytes:
    body = ({} if doc_id is None else {"id": doc_id}) | ({"text": text} if text is not ... else {}) | more
    return json.dumps(body).encode()


def good(c: Corpus) -> None:
    c.jsonl("good.jsonl", [(record(f"good-{i}", sentence(i)), "scored", None, f"good-{i}") for i in range(6)]
            + [(record("dup", "the first of three records that share the id dup."), "scored", None, "dup")])


def mixed(c: Corpus) -> None:
    deep = b'{"id": "deep", "text": "nested", "meta": ' + b"[" * DEEP + b"]" * DEEP + b"}"
    c.jsonl("mixed.jsonl", [
        (record("m-ok-0", sentence(100)), "scored", None, "m-ok-0"),
        (b'{"id": "m-bad", "text": "unterminated', "error", "invalid_json", None),
        (b"[1, 2, 3]", "error", "not_an_object", None),
        (b'"just a string"', "error", "not_an_object", None),
        (b"42", "error", "not_an_object", None),
        (record("m-missing", ..., body="the text is in another field"), "error", "missing_field", "m-missing"),
        (record("m-number", 12345), "error", "bad_field_type", "m-number"),
        (record("m-list", ["a", "list", "of", "words"]), "error", "bad_field_type", "m-list"),
        (record("m-null", None), "error", "missing_field", "m-null"),
        (record("m-empty", ""), "error", "empty_text", "m-empty"),
        (record("m-space", " \t\n  \u3000 "), "error", "empty_text", "m-space"),
        (b'{"id": "m-utf8", "text": "bad bytes \xff\xfe here"}', "error", "invalid_utf8", None),
        (b'{"id": "m-surrogate", "text": "lone \\ud800 surrogate"}', "error", "invalid_unicode", "m-surrogate"),
        (b'{"id": "m-\\udc00", "\\ud801": 1}', "error", "missing_field", "m-?"),  # in the id and a field name
        # embed does not read `label`: a label no task could read is left off, the text scored (a classify run
        # makes it a bad_field_type row: tests/test_sources.py)
        (record("m-label", "a record whose label is not a scalar.", label={"a": [1, 2]}), "scored", None, "m-label"),
        (deep, "error", "too_deeply_nested", None),
        (b'{"id": "m-digits", "text": "x", "n": ' + b"7" * 5000 + b"}", "error", "invalid_json", None),
        (b"", "blank", None, None),
        (record("dup", "the second record with the id dup."), "scored", None, "dup"),
        (record(None, "a record without an id gets source#record_index."), "scored", None, None),
        (record("m-ok-1", "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e text survives."), "scored", None, "m-ok-1"),
    ])


def bom_crlf(c: Corpus) -> None:
    c.jsonl("bom_crlf.jsonl", [(record(f"crlf-{i}", sentence(200 + i)), "scored", None, f"crlf-{i}") for i in range(3)],
            newline=b"\r\n", prefix=b"\xef\xbb\xbf")


def truncated_gzip(c: Corpus, n: int = 300) -> None:
    """A gzip shard cut in the middle: the lines whose bytes decompress before the cut are records;
    the cut itself is one shard error row."""
    body = b"".join(record(f"gz-{i}", sentence(300 + i)) + b"\n" for i in range(n))
    data = gzip.compress(body, mtime=0)
    cut = data[: len(data) // 2]
    readable = zlib.decompressobj(wbits=31).decompress(cut)  # what any gzip reader can get before the cut
    complete = readable.count(b"\n")
    assert 0 < complete < n
    with open(c.path("truncated.jsonl.gz"), "wb") as f:
        f.write(cut)
    for i in range(complete):
        c.expect("truncated.jsonl.gz", i, "scored", None, f"gz-{i}")
    c.expect("truncated.jsonl.gz", None, "error", "corrupt_file")


def parquet(c: Corpus) -> None:
    table = pa.table({"id": ["pq-0", "dup", "pq-2", "pq-3"],
                      "text": [sentence(400), "the third record with the id dup, in a parquet shard.", None, "  "]})
    pq.write_table(table, c.path("rows.parquet"))
    for i, (outcome, error_type) in enumerate([("scored", None), ("scored", None), ("error", "missing_field"), ("error", "empty_text")]):
        c.expect("rows.parquet", i, outcome, error_type, table["id"][i].as_py())
    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": ["x"], "text": ["never read"]}), buffer)
    whole = buffer.getvalue()
    with open(c.path("corrupt.parquet"), "wb") as f:
        f.write(whole[: len(whole) // 2])  # footer gone: not a Parquet file any more
    c.expect("corrupt.parquet", None, "error", "corrupt_file")


def zero_byte(c: Corpus) -> None:
    open(c.path("zero.jsonl"), "wb").close()  # no records: nothing to expect
    open(c.path("zero.parquet"), "wb").close()  # not a Parquet file: one shard error
    c.expect("zero.parquet", None, "error", "corrupt_file")


def text_file(c: Corpus) -> None:
    with open(c.path("note.md"), "w", encoding="utf-8") as f:
        f.write("# A markdown note\n\nA whole file is one document; its path is its id.\n")
    c.expect("note.md", 0, "scored", None, c.path("note.md"))


def big(c: Corpus) -> None:
    """A 20 MB document (scored from its first windows, truncated) and a 52 MB line without a newline
    (an error row, skipped without being held whole) after a good line."""
    words = " ".join(WORDS) + " "
    text = (words * (BIG_DOC_BYTES // len(words) + 1))[:BIG_DOC_BYTES]
    with open(c.path("big_doc.jsonl"), "wb") as f:
        f.write(record("big-20mb", text) + b"\n")
    c.expect("big_doc.jsonl", 0, "scored", None, "big-20mb", truncated=True)
    with open(c.path("huge_line.jsonl"), "wb") as f:
        f.write(record("before-huge", "a good line before the huge one.") + b"\n")
        f.write(b'{"id": "huge", "text": "')
        chunk = b"x" * 2**20
        for _ in range(HUGE_LINE_BYTES // len(chunk)):
            f.write(chunk)  # no closing quote, no newline: the file ends inside the line
    c.expect("huge_line.jsonl", 0, "scored", None, "before-huge")
    c.expect("huge_line.jsonl", 1, "error", "record_too_large", None)


def make_corpus(root: str, *, big_cases: bool) -> str:
    """Write every case under root; returns the path of expected.json."""
    c = Corpus(root)
    for case in (good, mixed, bom_crlf, truncated_gzip, parquet, zero_byte, text_file):
        case(c)
    if big_cases:
        big(c)
    return c.write_expected()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--big", action="store_true", help="add the 20 MB document and the 52 MB line")
    args = parser.parse_args()
    print(make_corpus(args.out_dir, big_cases=args.big))


if __name__ == "__main__":
    main()
