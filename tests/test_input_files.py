"""--input reads regular files only: named pipes (which would keep a reader waiting forever), sockets,
devices and broken links in an input directory or glob are skipped, one named explicitly is a
configuration error (exit 2), a symlinked directory is followed once but never into a loop, and a directory's
file reached through links is read once.
Checked on real files and with real `docscore run` processes."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TEST_BATCH, TEST_MAX_LEN, TEST_STRIDE, read_table, shards_of, write_jsonl

ROOT = Path(__file__).resolve().parent.parent


def special_files(directory: Path) -> None:
    """A named pipe, a socket, a link to the pipe and a broken link, all with shard names."""
    os.mkfifo(directory / "pipe.jsonl")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(directory / "socket.jsonl"))
    server.close()
    (directory / "to_pipe.jsonl").symlink_to(directory / "pipe.jsonl")
    (directory / "broken.jsonl").symlink_to(directory / "gone.jsonl")


def test_a_directory_or_glob_yields_only_its_regular_files(tmp_path):
    d = tmp_path / "d"
    write_jsonl(d / "a.jsonl", [{"text": "a"}])
    write_jsonl(tmp_path / "b.jsonl", [{"text": "b"}])
    (d / "to_b.jsonl").symlink_to(tmp_path / "b.jsonl")  # a link to a regular file is a regular file to read
    (d / "sub").mkdir()
    special_files(d)
    special_files(d / "sub")
    expected = [str(d / "a.jsonl"), str(d / "to_b.jsonl")]
    assert shards_of(str(d)) == expected
    assert shards_of(str(d / "*.jsonl")) == expected
    assert shards_of(str(d / "**" / "*.jsonl")) == expected


def test_a_directory_reads_each_real_file_once_whatever_links_name_it(tmp_path):
    """Before: latest.jsonl -> v1.jsonl beside v1.jsonl was read twice (every record a duplicate doc_id, no notice).
    The file's own name is kept; a link to a file the directory does not read otherwise (outside it, or under a
    hidden folder) is read under the link's name. A glob reads every path it matches."""
    d = tmp_path / "d"
    write_jsonl(d / "v1.jsonl", [{"id": "v1", "text": "version one"}])
    write_jsonl(d / "_staging" / "v2.jsonl", [{"id": "v2", "text": "staged"}])
    write_jsonl(tmp_path / "outside.jsonl", [{"id": "o", "text": "outside"}])
    (d / "latest.jsonl").symlink_to("v1.jsonl")
    (d / "also_latest.jsonl").symlink_to(d / "latest.jsonl")  # a link to the link: the same real file
    (d / "sub").mkdir()
    (d / "sub" / "v1.jsonl").symlink_to(d / "v1.jsonl")
    (d / "next.jsonl").symlink_to(d / "_staging" / "v2.jsonl")
    (d / "ext1.jsonl").symlink_to(tmp_path / "outside.jsonl")
    (d / "ext2.jsonl").symlink_to(tmp_path / "outside.jsonl")
    assert shards_of(str(d)) == [str(d / "ext1.jsonl"), str(d / "next.jsonl"), str(d / "v1.jsonl")]
    assert shards_of(str(d / "*latest.jsonl")) == [str(d / "also_latest.jsonl"), str(d / "latest.jsonl")]


def test_links_to_files_outside_a_folder_input_are_read_with_a_notice(tmp_path):
    """An unpacked upload can hold a link to /etc/passwd: it was read silently, its lines into the errors table's raw
    column. The run still reads links (a user's own on purpose) and says which lead outside the input."""
    from pipeline.io.input_files import linked_outside_notice

    d = tmp_path / "d"
    write_jsonl(d / "a.jsonl", [{"text": "a"}])
    write_jsonl(tmp_path / "secret.jsonl", [{"text": "s"}])
    (d / "inside.jsonl").symlink_to(d / "a.jsonl")
    (d / "leak.jsonl").symlink_to(tmp_path / "secret.jsonl")
    for pattern in (str(d), str(d / "*.jsonl"), str(d / "**" / "*.jsonl")):
        notice = linked_outside_notice(pattern, shards_of(pattern))
        assert notice == (f"--input {pattern}: 1 shard is a link to a file outside it (leak.jsonl -> "
                          f"{tmp_path / 'secret.jsonl'}), read like the others (a line that cannot be parsed goes to "
                          "the errors table's raw column); remove such links if they were not meant to be read")
    (d / "leak.jsonl").unlink()
    assert linked_outside_notice(str(d), shards_of(str(d))) is None  # a link inside the folder is no news
    assert linked_outside_notice(str(tmp_path / "secret.jsonl"), [str(tmp_path / "secret.jsonl")]) is None


@pytest.mark.parametrize("name, kind", [("pipe.jsonl", "a named pipe (FIFO)"), ("socket.jsonl", "a socket"),
                                        ("to_pipe.jsonl", "a named pipe (FIFO)"), ("broken.jsonl", "a broken symbolic link")])
def test_an_input_naming_a_file_that_is_not_regular_is_a_configuration_error(name, kind, tmp_path):
    special_files(tmp_path)
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / name} is {kind}, not a regular file")):
        shards_of(str(tmp_path / name))
    with pytest.raises(ValueError, match="is a character device, not a regular file"):
        shards_of("/dev/null")


def test_symlinked_directories_are_followed_once_and_never_into_a_loop(tmp_path):
    d, other = tmp_path / "d", tmp_path / "other"
    write_jsonl(d / "real" / "x.jsonl", [{"text": "x"}])
    write_jsonl(other / "y.jsonl", [{"text": "y"}])
    write_jsonl(tmp_path / "beside.jsonl", [{"text": "outside the input, reachable only through a loop"}])
    (d / "again").symlink_to(d / "real")         # the same directory twice: listed once, under its real name
    (d / "elsewhere").symlink_to(other)          # a data directory linked in: followed
    (d / "real" / "loop").symlink_to(d)          # a loop back to the input: never followed
    (d / "real" / "up").symlink_to(tmp_path)     # a link to a directory above the input: a loop too
    (d / "root").symlink_to("/")                 # the whole file system: a loop (it holds the link)
    (other / "back").symlink_to(d)               # a loop through the followed link
    assert shards_of(str(d)) == [str(d / "elsewhere" / "y.jsonl"), str(d / "real" / "x.jsonl")]
    assert shards_of(str(d / "**" / "*.jsonl")) == [str(d / "real" / "x.jsonl")]  # fsspec's ** follows no link


def docscore_run(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", "run", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.integration
def test_docscore_run_scores_an_input_directory_holding_a_named_pipe_instead_of_hanging(tmp_path):
    """Before: the reader opened the pipe and waited for a writer forever."""
    d = tmp_path / "in"
    write_jsonl(d / "docs.jsonl", [{"id": f"d{i}", "text": f"document number {i}"} for i in range(3)])
    special_files(d)
    out = tmp_path / "out"
    done = docscore_run("--input", str(d), "--output", str(out), "--run_id", "r1", "--attention", "native",
                        "--max_seq_len", str(TEST_MAX_LEN), "--batch_size", str(TEST_BATCH), "--stride", str(TEST_STRIDE),
                        "--no_progress", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    scores, _ = read_table(out, "scores", "r1")
    assert sorted(scores["doc_id"]) == ["d0", "d1", "d2"]
    errors, _ = read_table(out, "errors", "r1")
    assert len(errors) == 0


@pytest.mark.integration
def test_docscore_run_naming_a_named_pipe_exits_2_with_its_path(tmp_path):
    os.mkfifo(tmp_path / "docs.jsonl")
    done = docscore_run("--input", str(tmp_path / "docs.jsonl"), "--output", str(tmp_path / "out"), "--run_id", "r1",
                        timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"--input {tmp_path / 'docs.jsonl'}: " in done.stderr and "is a named pipe (FIFO), not a regular file" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out" / "scores").exists()


def test_an_input_that_exists_as_written_is_that_file_or_directory_not_a_pattern(tmp_path):
    """Before: `a[1].jsonl` was a glob matching `a1.jsonl` (or nothing), `b*c.jsonl` matched `bxc.jsonl` too,
    and `d::e.jsonl` was a chained URL naming `d`."""
    for name in ("a1.jsonl", "a[1].jsonl", "bxc.jsonl", "b*c.jsonl", "d", "d::e.jsonl", "f?.jsonl", "fx.jsonl"):
        write_jsonl(tmp_path / name, [{"text": name}])
    for name in ("a[1].jsonl", "b*c.jsonl", "d::e.jsonl", "f?.jsonl"):
        assert shards_of(str(tmp_path / name)) == [str(tmp_path / name)], name
    assert shards_of(f"file://{tmp_path}/a[1].jsonl") == [str(tmp_path / "a[1].jsonl")]
    write_jsonl(tmp_path / "runs[2024]" / "x.jsonl", [{"text": "x"}])
    assert shards_of(str(tmp_path / "runs[2024]")) == [str(tmp_path / "runs[2024]" / "x.jsonl")]
    # a pattern that is not itself a path stays a pattern
    assert shards_of(str(tmp_path / "a[0-9].jsonl")) == [str(tmp_path / "a1.jsonl")]
    assert shards_of(str(tmp_path / "f?.jsonl").replace("?", "[x]")) == [str(tmp_path / "fx.jsonl")]


def test_array_record_shards_in_a_path_input_are_refused_naming_tfds_input(tmp_path):
    """Before: they were discovered, and each became a read/corrupt_file error row of a run that published."""
    from pipeline.options import ConfigError, parse_options
    from pipeline.validate import validate

    d = tmp_path / "prepared"
    write_jsonl(d / "docs.jsonl", [{"text": "a document"}])
    for split in ("test", "train"):
        (d / f"odd_docs-{split}.array_record-00000-of-00001").write_bytes(b"\0" * 64)
    with pytest.raises(ValueError, match=r"odd_docs-test\.array_record-00000-of-00001 \(and 1 more\) is a TFDS "
                                         r"array_record shard.*--input tfds:NAME --tfds_data_dir DIR"):
        shards_of(str(d))
    with pytest.raises(ValueError, match="--input tfds:NAME"):
        shards_of(str(d / "*.array_record-*"))
    _, eo = parse_options(["--input", str(d), "--output", str(tmp_path / "out")])
    with pytest.raises(ConfigError, match="--input tfds:NAME --tfds_data_dir DIR"):
        validate(eo)


def test_hidden_names_are_skipped_below_a_glob_but_a_file_named_explicitly_is_read(tmp_path):
    """Before: `dir/**/*.jsonl` read files under `_tmp/` (only the last name part was checked), and
    `--input dir/_train.jsonl` was refused as matching no readable shard."""
    for name in ("a.jsonl", "_train.jsonl", ".hidden.jsonl", "_tmp/x.jsonl", "sub/.cache/y.jsonl", "sub/z.jsonl"):
        write_jsonl(tmp_path / "d" / name, [{"text": name}])
    d = tmp_path / "d"
    assert shards_of(str(d / "**" / "*.jsonl")) == [str(d / "a.jsonl"), str(d / "sub" / "z.jsonl")]
    assert shards_of(str(d / "*.jsonl")) == [str(d / "a.jsonl")]
    assert shards_of(str(d / "_train.jsonl")) == [str(d / "_train.jsonl")]
    assert shards_of(str(d / ".hidden.jsonl")) == [str(d / ".hidden.jsonl")]
    assert shards_of(str(d / "_tmp" / "*.jsonl")) == [str(d / "_tmp" / "x.jsonl")]  # a hidden fixed prefix is named
    # a `_`/`.` part the glob writes itself is asked for, below the first wildcard too
    write_jsonl(tmp_path / "d" / "sub" / "_ok" / "w.jsonl", [{"text": "w"}])
    assert shards_of(str(d / "*" / "_ok" / "*.jsonl")) == [str(d / "sub" / "_ok" / "w.jsonl")]
    assert shards_of(str(d / "sub" / ".cach*" / "*.jsonl")) == [str(d / "sub" / ".cache" / "y.jsonl")]
    assert shards_of(str(d / "**" / "_ok" / "*.jsonl")) == [str(d / "sub" / "_ok" / "w.jsonl")]


def test_format_suffixes_are_read_whatever_their_case(tmp_path):
    """Files exported by tools that write upper-case names (DOCS.JSONL, Notes.TXT) are shards, not skipped files."""
    from pipeline.io.input_files import find_input, shard_format

    assert [shard_format(n) for n in ("A.JSONL", "b.Jsonl.GZ", "c.PARQUET", "d.TXT", "e.Md", "f.CSV")] == [
        "jsonl", "jsonl", "parquet", "text", "text", None]
    d = tmp_path / "d"
    write_jsonl(d / "DOCS.JSONL", [{"text": "upper"}])
    write_jsonl(d / "docs.jsonl", [{"text": "lower"}])
    assert find_input(str(d)) == ([str(d / "DOCS.JSONL"), str(d / "docs.jsonl")], [])


def test_a_link_into_a_sibling_folder_whose_name_extends_the_inputs_is_outside_it(tmp_path):
    """`data` and `data_private` share a prefix, not a folder: a link from one to the other leads outside."""
    from pipeline.io.input_files import linked_outside_notice

    d = tmp_path / "data"
    write_jsonl(d / "a.jsonl", [{"text": "a"}])
    write_jsonl(tmp_path / "data_private" / "secret.jsonl", [{"text": "s"}])
    (d / "leak.jsonl").symlink_to(tmp_path / "data_private" / "secret.jsonl")
    notice = linked_outside_notice(str(d), shards_of(str(d)))
    assert notice is not None and f"(leak.jsonl -> {tmp_path / 'data_private' / 'secret.jsonl'})" in notice
