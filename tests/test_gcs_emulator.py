"""gs:// against gcp-storage-emulator: gcsfs and Beam's GCS filesystem, clean and through the
fault-injecting proxy (tests/gcs_support.py). Proves the storage layer the pipeline relies on
retries 503s and dropped connections without losing or duplicating data."""
from __future__ import annotations

import hashlib
import re

import fsspec
import pytest

from tests.conftest import shards_of

pytestmark = pytest.mark.integration  # README.md, "Development"

pytest_plugins = ["gcs_support"]


def payloads(n: int) -> dict[str, bytes]:
    return {f"shard-{i:03d}.jsonl": (f'{{"id": {i}, "text": "document {i}"}}\n' * (i + 1)).encode() for i in range(n)}


def test_gcsfs_round_trip_through_emulator(gcs):
    files = payloads(5)
    for name, data in files.items():
        with fsspec.open(gcs.url("in", name), "wb") as f:
            f.write(data)
    fs = fsspec.filesystem("gs")
    listed = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(gcs.url("in")))
    assert listed == sorted(files)
    for name, data in files.items():
        with fsspec.open(gcs.url("in", name), "rb") as f:
            assert f.read() == data
    fs.mv(gcs.url("in", "shard-000.jsonl"), gcs.url("moved", "shard-000.jsonl"))
    assert not fs.exists(gcs.url("in", "shard-000.jsonl"))
    assert fs.cat(gcs.url("moved", "shard-000.jsonl")) == files["shard-000.jsonl"]


def test_fault_proxy_fails_a_bounded_deterministic_share():
    from gcs_support import FaultSchedule

    runs = []
    for seed in (7, 7, 8):
        schedule = FaultSchedule(fault_rate=0.125, seed=seed)
        runs.append([schedule.next_action() for _ in range(800)])
        assert schedule.stats.faults == 100 and schedule.stats.fault_fraction == 0.125
    assert runs[0] == runs[1]  # same seed, same faults
    assert runs[0] != runs[2]
    actions = runs[0]
    assert {"503", "drop"} <= set(actions)
    longest = max(len(run) for run in "".join("x" if a != "pass" else " " for a in actions).split())
    assert longest <= 2


def test_gcsfs_survives_faults(faulty_gcs):
    """Writes and reads through a proxy that fails >= 10% of requests: gcsfs retries 503 and
    dropped connections (gcsfs.retry.is_retriable), so every byte arrives exactly once."""
    files = payloads(12)
    big = bytes(range(256)) * 40_000  # 10 MB: several requests per upload and per read
    fs = fsspec.filesystem("gs")
    for name, data in files.items():
        fs.pipe(faulty_gcs.url("in", name), data)
    with fs.open(faulty_gcs.url("in", "big.bin"), "wb", block_size=5 * 2**20) as f:
        f.write(big)
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(faulty_gcs.url("in"), refresh=True)) == sorted([*files, "big.bin"])
    for name, data in files.items():
        assert fs.cat(faulty_gcs.url("in", name)) == data
    with fs.open(faulty_gcs.url("in", "big.bin"), "rb", block_size=2**20) as f:
        assert hashlib.sha256(f.read()).digest() == hashlib.sha256(big).digest()
    stats = faulty_gcs.proxy.stats
    assert stats.requests >= 30
    assert stats.fault_fraction >= 0.1, stats
    assert stats.answered_503 > 0 and stats.dropped > 0, stats


def test_binary_objects_keep_every_byte_whatever_their_last_byte(gcs, tmp_path):
    """The emulator alone drops a "\\r" that ends an upload's data (the proxy sends it base64-encoded): a model
    directory uploaded for a test lost a byte of one checkpoint file about once in ten uploads."""
    from apache_beam.io.filesystems import FileSystems

    fs = gcs.fs()
    endings = [b"\r", b"\n", b"\r\n", b"\n\r", b"--==0==--", b"\x00", b"A"]
    for i, ending in enumerate(endings):
        data = bytes(range(256)) + ending
        fs.pipe(f"{gcs.bucket}/piped/{i}", data)
        (tmp_path / "dir").mkdir(exist_ok=True)
        (tmp_path / "dir" / str(i)).write_bytes(data)
        with FileSystems.create(gcs.url("beam", str(i))) as f:
            f.write(data)
        assert fs.cat(f"{gcs.bucket}/piped/{i}") == data, ending
        assert fs.cat(f"{gcs.bucket}/beam/{i}") == data, ending
    fs.put(str(tmp_path / "dir"), f"{gcs.bucket}/put", recursive=True)
    assert {name.rsplit("/", 1)[1]: fs.cat(name) for name in fs.find(f"{gcs.bucket}/put")} == \
        {str(i): bytes(range(256)) + ending for i, ending in enumerate(endings)}


def test_beam_gcs_filesystem_uses_the_emulator(gcs):
    """apache_beam.io.gcp honours STORAGE_EMULATOR_HOST (through google-cloud-storage), so Beam's
    own gs:// writes, renames and matches reach the emulator; gcsfs sees the same objects."""
    from apache_beam.io.filesystems import FileSystems

    data = b"written by beam\n" * 100
    with FileSystems.create(gcs.url("beam", "part-0.tmp")) as f:
        f.write(data)
    FileSystems.rename([gcs.url("beam", "part-0.tmp")], [gcs.url("beam", "part-0.txt")])
    matched = [m.path for m in FileSystems.match([gcs.url("beam", "*")])[0].metadata_list]
    assert matched == [gcs.url("beam", "part-0.txt")]
    with FileSystems.open(gcs.url("beam", "part-0.txt")) as f:
        assert f.read() == data
    assert fsspec.filesystem("gs").cat(gcs.url("beam", "part-0.txt")) == data


def test_beam_gcs_filesystem_survives_faults(faulty_gcs):
    """Beam's GcsIO retries (google-cloud-storage's retry policy) through the same faults."""
    from apache_beam.io.filesystems import FileSystems

    blobs = {f"part-{i}.txt": f"line {i}\n".encode() * (50 * (i + 1)) for i in range(6)}
    for name, data in blobs.items():
        with FileSystems.create(faulty_gcs.url("beam", name + ".tmp")) as f:
            f.write(data)
    FileSystems.rename([faulty_gcs.url("beam", n + ".tmp") for n in blobs], [faulty_gcs.url("beam", n) for n in blobs])
    matched = sorted(m.path for m in FileSystems.match([faulty_gcs.url("beam", "*")])[0].metadata_list)
    assert matched == sorted(faulty_gcs.url("beam", n) for n in blobs)
    for name, data in blobs.items():
        with FileSystems.open(faulty_gcs.url("beam", name)) as f:
            assert f.read() == data
    stats = faulty_gcs.proxy.stats
    assert stats.fault_fraction >= 0.1 and stats.faults > 0, stats


@pytest.mark.parametrize("path", ["in/", "in/docs.jsonl", "in/*.jsonl"], ids=["directory", "file", "glob"])
def test_an_input_in_a_bucket_that_does_not_exist_is_exit_2_naming_the_bucket(gcs, tmp_path, path, no_data_read, capsys):
    from tests.conftest import common_flags, run_docscore

    url = f"gs://{gcs.bucket}-missing/{path}"
    rc = run_docscore("--input", url, *common_flags("b1", tmp_path / "out"))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert (f"--input {url}: bucket gs://{gcs.bucket}-missing does not exist, or is not visible with these "
            f"credentials; check the bucket name (gcloud storage ls gs://{gcs.bucket}-missing)") in err, err
    assert not no_data_read and not (tmp_path / "out" / "scores").exists()


def test_an_output_in_a_bucket_that_does_not_exist_or_with_glob_characters_is_exit_2(gcs, tmp_path, no_data_read, capsys):
    from tests.conftest import common_flags, run_docscore

    fsspec.filesystem("gs").pipe(gcs.url("in", "docs.jsonl"), b'{"id": 1, "text": "x"}\n')
    out = f"gs://{gcs.bucket}-missing/out"
    assert run_docscore("--input", gcs.url("in", "docs.jsonl"), *common_flags("o1", out)) == 2
    err = capsys.readouterr().err
    assert f"--output {out}: bucket gs://{gcs.bucket}-missing does not exist, or is not visible" in err, err
    # gcsfs reads [1] as a pattern when the run's files are moved into place: the run failed after reading all data
    bracketed = gcs.url("o[1]")
    assert run_docscore("--input", gcs.url("in", "docs.jsonl"), *common_flags("o2", bracketed)) == 2
    assert f"--output {bracketed} holds glob characters" in capsys.readouterr().err
    assert not no_data_read


@pytest.mark.parametrize("path", ["in/", "in/docs.jsonl"], ids=["directory", "file"])
def test_an_input_path_missing_from_its_bucket_is_exit_2_naming_the_path(gcs, tmp_path, path, no_data_read, capsys):
    """The bucket exists and holds other objects; the path --input names is neither an object nor a folder."""
    from tests.conftest import common_flags, run_docscore

    fsspec.filesystem("gs").pipe(gcs.url("other", "docs.jsonl"), b'{"id": 1, "text": "elsewhere"}\n')
    url = gcs.url(path)
    rc = run_docscore("--input", url, *common_flags("p1", tmp_path / "out"))
    err = capsys.readouterr().err
    missing = url.rstrip("/")
    assert rc == 2, err
    assert (f"--input {url}: {missing} does not exist: no object of that name and none under {missing}/; "
            "check the path") in err, err
    assert not no_data_read and not (tmp_path / "out" / "scores").exists()


def test_gs_inputs_that_exist_are_discovered_and_an_empty_match_is_still_named_so(gcs):

    fs = fsspec.filesystem("gs")
    for name in ("a.jsonl", "sub/b.jsonl", "notes.yaml"):
        fs.pipe(gcs.url("in", name), b'{"id": 1, "text": "x"}\n')
    assert shards_of(gcs.url("in") + "/") == [gcs.url("in", "a.jsonl"), gcs.url("in", "sub/b.jsonl")]
    assert shards_of(gcs.url("in", "a.jsonl")) == [gcs.url("in", "a.jsonl")]
    assert shards_of(gcs.url("in", "*.jsonl")) == [gcs.url("in", "a.jsonl")]
    with pytest.raises(FileNotFoundError, match="matches no readable shard"):  # a folder without a shard exists
        shards_of(gcs.url("in", "*.parquet"))
    with pytest.raises(ValueError, match=f"cannot read {gcs.url('in', 'notes.yaml')};"):  # named as the user wrote it
        shards_of(gcs.url("in", "*"))
    from pipeline.io.input_files import find_input

    assert find_input(gcs.url("in")).skipped == [gcs.url("in", "notes.yaml")]  # a directory lists what it leaves out
    with pytest.raises(FileNotFoundError, match=r"it matches only folders \(" + re.escape(gcs.url("in", "sub")) + r"\)"
                       + r".*add the files' part, e\.g\. " + re.escape(gcs.url("in", "s*", "*"))):
        shards_of(gcs.url("in", "s*"))  # as for a local glob of folders: the fix, not only "matches no shard"


def test_gs_names_holding_glob_characters_and_folder_placeholders(gcs):
    """An object or folder named a[1] is that object or folder (as a local path is), not a pattern matching
    nothing; the zero-byte `sub/` keys a console makes for folders are neither shards nor files left out."""
    from pipeline.io.input_files import find_input

    fs = fsspec.filesystem("gs")
    fs.pipe(gcs.url("br", "a[1].jsonl"), b'{"id": 1, "text": "x"}\n')
    fs.pipe(gcs.url("br", "d[1]", "b.jsonl"), b'{"id": 2, "text": "y"}\n')
    fs.pipe(gcs.url("br", "a2.jsonl"), b'{"id": 3, "text": "z"}\n')
    assert shards_of(gcs.url("br", "a[1].jsonl")) == [gcs.url("br", "a[1].jsonl")]
    assert shards_of(gcs.url("br", "d[1]") + "/") == [gcs.url("br", "d[1]", "b.jsonl")]
    assert shards_of(gcs.url("br", "a[2].jsonl")) == [gcs.url("br", "a2.jsonl")]  # no such object: a pattern
    from google.cloud import storage  # gcsfs writes "ph/" as the object "ph": the console's keys keep the /

    for key in ("ph/", "ph/sub/"):
        storage.Client().bucket(gcs.bucket).blob(key).upload_from_string(b"")
    fs.pipe(gcs.url("ph", "sub", "c.jsonl"), b'{"id": 4, "text": "w"}\n')
    assert find_input(gcs.url("ph") + "/") == ([gcs.url("ph", "sub", "c.jsonl")], [])


def test_a_gs_object_whose_name_holds_double_colons_is_read_as_that_object(gcs, tmp_path, capsys):
    """Before: gs://b/in/notes::v2.jsonl was opened as the chained URL `gs://b/in/notes` then `v2.jsonl` (a directory
    input's shard became read/unreadable_shard 'gone since the run found it'), and naming it was exit 2 ('does not
    exist'). README: a path that exists as written is that object, `::` and all."""
    from pipeline.io.sources import ReadSpec, read_shard
    from pipeline.input_checks import first_record_fields

    fs = fsspec.filesystem("gs")
    url = gcs.url("cc", "notes::v2.jsonl")
    fs.pipe(url, b'{"id": "c", "text": "the shard"}\n')
    fs.pipe(gcs.url("cc", "notes"), b'{"body": "the object a chained URL would open"}\n')
    assert shards_of(gcs.url("cc") + "/") == [url]
    assert shards_of(url) == [url]
    assert [(d.doc_id, d.text) for d in read_shard(url, ReadSpec())] == [("c", "the shard")]
    assert first_record_fields(url, ReadSpec()) == {"id", "text"}


def test_one_object_is_read_with_credentials_that_may_read_but_not_list_its_bucket(gcs_emulator, tmp_path):
    """Credentials that may get objects but not list the bucket (objectViewer on a prefix, legacyObjectReader): one
    named object is still an input (the bucket check's 403 refused it); a glob, which needs the listing, is refused
    naming the permission."""
    import gcsfs
    from gcs_support import FaultProxy, create_bucket, gcs_environment, unique_bucket_name


    bucket = unique_bucket_name()
    create_bucket(gcs_emulator.url, bucket)
    proxy = FaultProxy(gcs_emulator.port, fault_rate=0, forbid_listing=True).start()
    try:
        with gcs_environment(proxy.url, tmp_path):
            gcsfs.GCSFileSystem().pipe(f"{bucket}/in/docs.jsonl", b'{"id": 1, "text": "x"}\n')
            assert shards_of(f"gs://{bucket}/in/docs.jsonl") == [f"gs://{bucket}/in/docs.jsonl"]
            with pytest.raises(PermissionError, match=f"may not list bucket gs://{bucket}"):
                shards_of(f"gs://{bucket}/in/*.jsonl")
    finally:
        proxy.stop()


def test_an_object_deleted_after_the_run_found_it_is_an_error_row_saying_so(gcs):
    from pipeline.io.sources import ReadSpec, read_shard

    fs = fsspec.filesystem("gs")
    fs.pipe(gcs.url("gone", "docs.jsonl"), b'{"id": 1, "text": "x"}\n')
    (shard,) = shards_of(gcs.url("gone") + "/")
    fs.rm_file(shard)
    (row,) = read_shard(shard, ReadSpec())
    assert row.error_type == "unreadable_shard" and "shard is gone since the run found it" in row.message, row


@pytest.mark.integration
def test_reading_a_runs_parquet_tables_from_gs_closes_every_file_it_opens(gcs, tmp_path):
    """report and compare read a run's Parquet parts on gs://: a file left open for the garbage collector outlives
    gcsfs's event loop, and every such command ended with asyncio's "Task was destroyed but it is pending!"."""
    import subprocess
    import sys

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 2000  # a part of a few MB: gcsfs reads it with its background prefetcher
    table = pa.table({"doc_id": [f"d{i}" for i in range(rows)],
                      "embedding": list(np.random.default_rng(0).random((rows, 384), dtype=np.float32))})
    local = tmp_path / "part.parquet"
    pq.write_table(table, local)
    gcs.fs().put(str(local), gcs.url("out", "scores", "part.parquet"))
    script = ("import sys, gcsfs, pyarrow as pa; from pipeline.io import sinks; from pipeline.records import SCORES_SCHEMA; "
              "fs = gcsfs.GCSFileSystem(); path = sys.argv[1]; "
              "print(sinks.read_parts(fs, [path], ('doc_id', 'embedding'), SCORES_SCHEMA).num_rows); "
              "print(sum(b.num_rows for b in sinks.iter_parts(fs, [path], "
              "pa.schema([SCORES_SCHEMA.field('doc_id'), SCORES_SCHEMA.field('embedding')]))))")
    done = subprocess.run([sys.executable, "-c", script, gcs.url("out", "scores", "part.parquet")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == [str(rows), str(rows)], done.stderr[-2000:]
    assert "Task was destroyed but it is pending" not in done.stderr, done.stderr[-2000:]


def test_a_gs_object_whose_key_holds_a_double_slash_is_read_after_the_folder_is_listed(gcs):
    """Keys like in//x.jsonl (a path joined onto a prefix that already ended in /) are found by listing the folder;
    gcsfs's cached listing then took the key for a folder of size 0, so its reader in the same process (a local
    run) read nothing: its records were missing from both tables, exit 0."""
    from pipeline.io.input_files import find_input
    from pipeline.io.sources import ReadSpec, read_shard

    fs = fsspec.filesystem("gs")
    fs.pipe(f"{gcs.bucket}/ds//x.jsonl", b'{"id": "x", "text": "under a double slash"}\n')
    fs.pipe(gcs.url("ds", "y.jsonl"), b'{"id": "y", "text": "beside it"}\n')
    shards = find_input(gcs.url("ds")).shards
    assert shards == [f"gs://{gcs.bucket}/ds//x.jsonl", gcs.url("ds", "y.jsonl")]
    assert [[d.doc_id for d in read_shard(shard, ReadSpec())] for shard in shards] == [["x"], ["y"]]
