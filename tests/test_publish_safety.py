"""What a publish may delete: only what this launch owns. Two launches of one run_id stage side by side
under _staging/run_id=ID/<uuid>/; one finishing removes only its own staging directory, and the shared
parents only when empty (never recursively, even when a listing missed the other's files). A symlinked
partition, or a link inside one, is removed as a link: its target's files are never touched."""
from __future__ import annotations

import os
from pathlib import Path

from fsspec.implementations.local import LocalFileSystem

from pipeline.io import sinks


def stage(spec: sinks.OutputSpec, tag: str) -> dict[str, list[str]]:
    written = {}
    for table in sinks.TABLES:
        path = Path(spec.staging) / table / "part-00000-of-00001.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"{tag} {table}".encode())
        written[table] = [str(path)]
    return written


def partition(spec: sinks.OutputSpec, table: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(spec.partition(table)).iterdir())}


def two_launches(tmp_path: Path) -> tuple[sinks.OutputSpec, dict, sinks.OutputSpec, dict]:
    out = str(tmp_path / "out")
    a = sinks.OutputSpec.for_run(out, "same", "parquet")
    b = sinks.OutputSpec.for_run(out, "same", "parquet")
    assert a.staging != b.staging and Path(a.staging).parent == Path(b.staging).parent
    return a, stage(a, "a"), b, stage(b, "b")


def test_a_launch_removes_only_its_own_staging_and_the_other_launch_still_publishes(tmp_path):
    a, written_a, b, written_b = two_launches(tmp_path)
    sinks.publish(a, {"run_id": "same", "launch": "a"}, written_a)
    assert not Path(a.staging).exists()
    assert all(Path(p).read_bytes() == f"b {t}".encode() for t, ps in written_b.items() for p in ps)
    sinks.publish(b, {"run_id": "same", "launch": "b"}, written_b)  # used to fail: FileNotFoundError
    assert partition(b, "scores") == {"_SUCCESS": b"", "part-00000-of-00001.parquet": b"b scores"}
    assert not (tmp_path / "out" / "_staging").exists()  # the last launch out removes the empty parents


def test_a_listing_that_missed_the_other_launch_does_not_delete_its_files(tmp_path, monkeypatch):
    """The shared parents are removed only if empty, by the filesystem's own check (rmdir), not by
    a listing followed by a recursive delete: here a listing of _staging that shows nothing (an
    eventually consistent listing, or the other launch's writer landing just after it)."""
    a, written_a, b, written_b = two_launches(tmp_path)
    shared = {str(Path(a.staging).parent), str(Path(a.staging).parent.parent)}
    real_ls = LocalFileSystem.ls

    def stale_ls(self, path, detail=False, **kwargs):
        return [] if self._strip_protocol(path).rstrip("/") in shared else real_ls(self, path, detail, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "ls", stale_ls)
    sinks.publish(a, {"run_id": "same"}, written_a)
    assert not Path(a.staging).exists()
    assert all(Path(p).read_bytes() == f"b {t}".encode() for t, ps in written_b.items() for p in ps)
    monkeypatch.setattr(LocalFileSystem, "ls", real_ls)
    sinks.publish(b, {"run_id": "same"}, written_b)
    assert partition(b, "errors") == {"_SUCCESS": b"", "part-00000-of-00001.parquet": b"b errors"}


def test_a_symlinked_partition_is_replaced_by_a_directory_and_its_target_untouched(tmp_path):
    spec = sinks.OutputSpec.for_run(str(tmp_path / "out"), "x", "parquet")
    written = stage(spec, "new")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_bytes(b"keep me")
    (elsewhere / "part-00000-of-00001.parquet").write_bytes(b"someone else's")
    (elsewhere / sinks.SUCCESS).write_bytes(b"")
    scores = Path(spec.partition("scores"))
    scores.parent.mkdir(parents=True)
    scores.symlink_to(elsewhere, target_is_directory=True)
    # and inside the (real) errors partition: a link to another directory and a link to a file
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.txt").write_bytes(b"keep me too")
    errors = Path(spec.partition("errors"))
    errors.mkdir(parents=True)
    (errors / "linked_dir").symlink_to(other, target_is_directory=True)
    (errors / "linked_file").symlink_to(other / "data.txt")

    sinks.publish(spec, {"run_id": "x"}, written)

    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == {
        "precious.txt": b"keep me", "part-00000-of-00001.parquet": b"someone else's", sinks.SUCCESS: b""}
    assert {p.name: p.read_bytes() for p in other.iterdir()} == {"data.txt": b"keep me too"}
    assert not scores.is_symlink() and scores.is_dir()
    assert partition(spec, "scores") == {"_SUCCESS": b"", "part-00000-of-00001.parquet": b"new scores"}
    assert partition(spec, "errors") == {"_SUCCESS": b"", "part-00000-of-00001.parquet": b"new errors"}


def test_a_symlinked_staging_directory_is_unlinked_not_emptied(tmp_path):
    spec = sinks.OutputSpec.for_run(str(tmp_path / "out"), "x", "parquet")
    real = tmp_path / "real_staging"
    written = {}
    for table in sinks.TABLES:
        (real / table).mkdir(parents=True)
        (real / table / "part-00000-of-00001.parquet").write_bytes(table.encode())
        written[table] = [os.path.join(spec.staging, table, "part-00000-of-00001.parquet")]
    Path(spec.staging).parent.mkdir(parents=True)
    Path(spec.staging).symlink_to(real, target_is_directory=True)
    sinks.publish(spec, {"run_id": "x"}, written)
    assert not os.path.lexists(spec.staging)
    assert {p.name for p in real.iterdir()} == set(sinks.TABLES)
    assert partition(spec, "scores") == {"_SUCCESS": b"", "part-00000-of-00001.parquet": b"scores"}
