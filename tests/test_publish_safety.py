"""What a publish may delete: only what this launch owns. Two launches of one run_id stage side by side
under _staging/run_id=ID/<uuid>/; one finishing removes only its own staging directory, and the shared
parents only when empty (never recursively, even when a listing missed the other's files). A symlinked
partition is refused (nothing written or deleted through it); a link inside one is removed as a link,
its target's files never touched."""
from __future__ import annotations

import os
from pathlib import Path

from fsspec.implementations.local import LocalFileSystem

import pytest

from pipeline.io import run_commit, sinks
from pipeline.runs import publish
from tests.test_publish import FACTS, STATS


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


def visible(spec: sinks.OutputSpec, table: str) -> list[bytes]:
    return [Path(f).read_bytes() for f in run_commit.committed_files(spec.output, spec.run_id, table)]




def publish_launch(spec: sinks.OutputSpec, written: dict[str, list[str]]) -> dict:
    return publish.publish_run(spec, dict(FACTS, run_id=spec.run_id), STATS, written, derived=False)


def two_launches(tmp_path: Path) -> tuple[sinks.OutputSpec, dict, sinks.OutputSpec, dict]:
    out = str(tmp_path / "out")
    a = sinks.OutputSpec.for_run(out, "same", "parquet")
    b = sinks.OutputSpec.for_run(out, "same", "parquet")
    assert a.staging != b.staging and Path(a.staging).parent == Path(b.staging).parent
    return a, stage(a, "a"), b, stage(b, "b")


def test_a_launch_removes_only_its_own_staging_and_the_other_launch_still_publishes(tmp_path):
    a, written_a, b, written_b = two_launches(tmp_path)
    publish_launch(a, written_a)
    assert not Path(a.staging).exists()
    assert all(Path(p).read_bytes() == f"b {t}".encode() for t, ps in written_b.items() for p in ps)
    publish_launch(b, written_b)  # used to fail: FileNotFoundError
    assert visible(b, "scores") == [b"b scores"]
    # a's file stays only as the replaced run's, for readers that read a's summary, until the grace period ends
    assert sorted(partition(b, "scores")) == sorted(f"part-{x.launch}-00000-of-00001.parquet" for x in (a, b))
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
    publish_launch(a, written_a)
    assert not Path(a.staging).exists()
    assert all(Path(p).read_bytes() == f"b {t}".encode() for t, ps in written_b.items() for p in ps)
    monkeypatch.setattr(LocalFileSystem, "ls", real_ls)
    publish_launch(b, written_b)
    assert visible(b, "errors") == [b"b errors"]


def test_a_symlinked_partition_is_refused_and_its_target_untouched_and_links_inside_are_removed_as_links(tmp_path):
    spec = sinks.OutputSpec.for_run(str(tmp_path / "out"), "x", "parquet")
    written = stage(spec, "new")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = {"precious.txt": b"keep me", "part-00000-of-00001.parquet": b"someone else's", "_SUCCESS": b""}
    for name, data in target.items():
        (elsewhere / name).write_bytes(data)
    scores = Path(spec.partition("scores"))
    scores.parent.mkdir(parents=True)
    scores.symlink_to(elsewhere, target_is_directory=True)
    assert run_commit.linked_partitions(spec.output, "x") == [str(scores)]  # what validation refuses (exit 2)
    with pytest.raises(run_commit.CommitError, match="symlink"):
        publish_launch(spec, written)
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == target
    assert run_commit.committed_summary(spec.output, "x") is None
    # a real partition with links inside: after a commit they are removed as links, their targets kept
    scores.unlink()
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.txt").write_bytes(b"keep me too")
    errors = Path(spec.partition("errors"))
    errors.mkdir(parents=True)
    (errors / "part-linked_dir").symlink_to(other, target_is_directory=True)
    (errors / "part-linked.parquet").symlink_to(other / "data.txt")
    publish_launch(spec, written)
    assert {p.name: p.read_bytes() for p in other.iterdir()} == {"data.txt": b"keep me too"}
    assert visible(spec, "scores") == [b"new scores"] and visible(spec, "errors") == [b"new errors"]
    assert not (errors / "part-linked.parquet").is_symlink()  # docscore's name, not the run's file: removed
    assert (errors / "part-linked_dir").is_symlink()  # not a name docscore writes: left alone


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
    publish_launch(spec, written)
    assert not os.path.lexists(spec.staging)
    assert {p.name for p in real.iterdir()} == set(sinks.TABLES)
    assert visible(spec, "scores") == [b"scores"]
