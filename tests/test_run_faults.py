"""An operator's bad day, with real processes and real files: a run killed (SIGKILL) at each file step of
its publish, a disk that fills during a rerun, a second launch of a run_id while the first holds it, a
symlinked partition, and a lease on gs:// (the GCS emulator). After every fault readers see either the
previous complete run or the new complete run, never a mix and never neither, and the records
reconcile (scored + errors = records, no record twice)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import secrets
from pathlib import Path

import fsspec
import pyarrow.parquet as pq
import pytest

from pipeline.io import run_commit, run_lease
from tests.conftest import SENTENCES, common_flags, read_summary, run_docscore, write_jsonl
from tests.gcs_support import gcs_emulator, gcs_target  # noqa: F401 - the session fixture

REPO = Path(__file__).resolve().parents[1]
RUN_ID = "f1"
FLAGS = ["--attention", "native", "--no_progress"]


def corpus(path: Path, tag: str, n: int) -> Path:
    records = [{"id": f"{tag}{i}", "text": SENTENCES[i % len(SENTENCES)]} for i in range(n)]
    return write_jsonl(path, [*records, "{not json"])


def visible(out: Path, run_id: str = RUN_ID) -> tuple[str | None, set[str]]:
    """(launch, doc ids) of what readers see of the run; asserts that it is complete and reconciles."""
    summary = run_commit.committed_summary(str(out), run_id)
    if summary is None:
        return None, set()
    tables = {t: pq.read_table(run_commit.committed_files(str(out), run_id, t), partitioning=None).to_pylist()
              for t in ("scores", "errors")}
    counts = summary["counts"]
    assert (len(tables["scores"]), len(tables["errors"])) == (counts["scored"], counts["errors"])
    assert counts["scored"] + counts["errors"] == counts["records"]
    keys = [(r["source"], r["record_index"]) for t in tables.values() for r in t]
    assert len(keys) == len(set(keys)), "a record is in the run twice"
    (history,) = run_commit.committed_files(str(out), run_id, "history")
    assert pq.read_table(history).to_pylist()[0]["scored"] == counts["scored"]
    return summary["launch_id"], {r["doc_id"] for r in tables["scores"]}


def docscore_killed_at(n: int, out: Path, shard: Path, log: Path) -> subprocess.CompletedProcess:
    args = ["--input", str(shard), *common_flags(RUN_ID, out), *FLAGS]
    return subprocess.run([sys.executable, str(REPO / "tests" / "run_killed_at.py"), str(n), str(out), str(log), "--", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.mark.integration
def test_a_run_killed_at_each_file_step_of_its_publish_leaves_the_old_or_the_new_run(tmp_path):
    out, log = tmp_path / "out", tmp_path / "steps.log"
    shards = {tag: corpus(tmp_path / tag / "docs.jsonl", tag, n) for tag, n in (("a", 3), ("b", 5))}
    ids = {tag: {f"{tag}{i}" for i in range(n)} for tag, n in (("a", 3), ("b", 5))}
    first = docscore_killed_at(0, out, shards["a"], log)
    assert first.returncode == 0, first.stderr[-2000:]
    steps = log.read_text().splitlines()
    commit_step = next(i for i, line in enumerate(steps, 1) if line.endswith("/summary.json"))
    assert commit_step >= 4 and len(steps) > commit_step  # tables and history placed before it; rewrites after
    now, notes = ids["a"], []
    for n in range(1, len(steps) + 1):
        tag = "b" if n % 2 else "a"
        log.unlink()
        killed = docscore_killed_at(n, out, shards[tag], log)
        assert killed.returncode == -9, (n, killed.returncode, killed.stderr[-2000:])
        launch, seen = visible(out)
        assert seen in (now, ids[tag]), f"killed before step {n}: readers see neither run"
        assert (seen == ids[tag]) == (n > commit_step) or now == ids[tag], f"step {n}: commit_step {commit_step}"
        now = seen
        notes.append(killed.stderr)
    # each launch took the dead launch's lease and removed what it left (staging, unnamed files) ...
    assert sum("left by a launch that did not finish" in err for err in notes) >= commit_step - 1
    assert run_docscore("--input", shards["a"], *common_flags(RUN_ID, out), *FLAGS) == 0  # a clean run, in this process
    launch, seen = visible(out)
    assert seen == ids["a"]
    summary = run_commit.committed_summary(str(out), RUN_ID)
    named = {f for files in summary["files"].values() for f in files}
    retired = {f for r in summary["retired"] for f in r["files"]}  # the replaced runs', kept for their readers
    on_disk = {str(p.relative_to(out)) for t in ("scores", "errors", "runs") for p in (out / t).rglob("*") if p.is_file()}
    assert on_disk - named - retired == {f"runs/run_id={RUN_ID}/{n}" for n in ("summary.json", "report.html", "progress.json")}
    assert not (out / "_staging").exists()  # ... so after a clean run only the run's own files (and its predecessors') remain


@pytest.mark.integration
def test_the_next_launch_removes_a_dead_launchs_placed_files_even_if_it_does_not_commit_itself(tmp_path):
    """A launch killed after placing a table file, then a launch of the same run_id stopped (SIGTERM) before its
    commit: the dead launch's file is gone all the same (the next launch cleans under its lease before its job;
    it used to wait for a commit, so the file stayed while no launch committed)."""
    out, log = tmp_path / "out", tmp_path / "steps.log"
    shard = corpus(tmp_path / "a" / "docs.jsonl", "a", 3)
    assert docscore_killed_at(0, out, shard, log).returncode == 0
    assert docscore_killed_at(2, out, shard, log).returncode == -9  # killed after placing its first file
    named = lambda: {f for files in run_commit.committed_summary(str(out), RUN_ID)["files"].values() for f in files}  # noqa: E731
    parts = lambda: {str(p.relative_to(out)) for t in ("scores", "errors") for p in (out / t).rglob("part-*")}  # noqa: E731
    assert parts() - named(), "the killed launch placed no file: the test kills at the wrong step"
    long = write_jsonl(tmp_path / "long" / "docs.jsonl", [{"id": f"q{i}", "text": " ".join(SENTENCES) * 3} for i in range(2000)])
    run = subprocess.Popen([sys.executable, "-m", "pipeline", "run", "--input", str(long), *common_flags(RUN_ID, out), *FLAGS],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while (parts() - named() or run_lease.holder(str(out), RUN_ID).get("pid") != run.pid) and run.poll() is None \
            and time.time() < deadline:
        time.sleep(0.2)  # until it holds the lease and has cleaned up after the dead launch
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=300)
    assert run.returncode == 143 and "left by a launch that did not finish" in err, err[-2000:]
    summary = run_commit.committed_summary(str(out), RUN_ID)
    assert summary["retired"] == []  # the first launch replaced none, so nothing but its files is kept
    assert parts() == {f for f in named() if "/part-" in f}  # only the committed run's files


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs: a real file system that fills up."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"mounting a tmpfs needs root: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.integration
def test_a_rerun_that_fills_the_disk_exits_1_and_the_previous_run_stays_whole(tmp_path, small_disk):
    out = small_disk / "out"
    small = corpus(tmp_path / "small" / "docs.jsonl", "s", 3)
    assert run_docscore("--input", small, *common_flags(RUN_ID, out), *FLAGS) == 0
    before = visible(out)
    free_before = shutil.disk_usage(small_disk).free
    # long ids make rows too big for the disk: ~8 MiB of doc_ids
    big = write_jsonl(tmp_path / "big" / "docs.jsonl",
                      [{"id": secrets.token_urlsafe(3000), "text": "short text"} for _ in range(2000)])
    # on worker threads, as an accelerator host runs: their error reaches the launcher as a traceback's text; the
    # other bundles go on in their threads, here one inside its model calls when the launcher ends (the interpreter's
    # shutdown stops it there and aborts the process, exit -6, unless the launcher ends without it)
    threads = ["--direct_running_mode", "multi_threading", "--direct_num_workers", "2"]
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    rerun = subprocess.run([sys.executable, str(REPO / "tests" / "run_beside_a_model_call.py"), "run", "--input", str(big),
                            *common_flags(RUN_ID, out), *FLAGS, *threads],
                           cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "TMPDIR": str(tmpdir)})
    assert rerun.returncode == 1, rerun.stderr[-2000:]
    assert not list(tmpdir.iterdir()), "the failed run left temporary files"
    last = rerun.stderr.strip().splitlines()[-1]
    assert last.startswith(f"docscore run {RUN_ID}: the pipeline failed (RuntimeError: OSError: [Errno 28] No space left on device")
    assert "nothing was published" in last
    # ENOSPC names no file: the message says where the job writes, with the room left, and the fix
    assert f"a disk it writes to is full: --output {out} (" in last and "free space there" in last, last
    assert "Original traceback is" not in rerun.stderr  # Beam's second copy of the traceback it printed
    assert visible(out) == before
    assert shutil.disk_usage(small_disk).free >= free_before - 64 * 1024, "the failed rerun left its files behind"
    assert not (out / "_staging").exists()


def fill(disk: Path, leave: int) -> None:
    """Fill the file system of `disk` but `leave` bytes."""
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * max(0, shutil.disk_usage(disk).free - leave))


@pytest.mark.integration
def test_an_output_on_a_full_disk_is_exit_2_saying_so_and_leaves_nothing_there(tmp_path, small_disk, capsys):
    """A disk with no room left takes no probe file: the run was refused as 'not writable' (choose a directory you can
    write to) and left its empty probe file in the output beside the published run."""
    out = small_disk / "out"
    assert run_docscore("--input", corpus(tmp_path / "a" / "docs.jsonl", "a", 3), *common_flags(RUN_ID, out), *FLAGS) == 0
    before, files = visible(out), sorted(p for p in out.rglob("*"))
    fill(small_disk, leave=0)
    capsys.readouterr()
    assert run_docscore("--input", corpus(tmp_path / "b" / "docs.jsonl", "b", 3), *common_flags(RUN_ID, out), *FLAGS) == 2
    err = capsys.readouterr().err
    assert f"--output {out}: its disk is full (No space left on device); free space there" in err, err
    assert visible(out) == before and sorted(p for p in out.rglob("*")) == files


@pytest.mark.integration
def test_a_cache_dir_too_full_for_the_built_in_model_is_one_line_naming_the_flag(tmp_path, small_disk):
    """Converting minilm-l6 into a --cache_dir whose disk is full: Orbax logged each writer thread's traceback
    (~200 lines) above a message that named --model and advised checking permissions too, and its writes went on
    after the removal of the partial copy, leaving a hidden one (2 runs in 5)."""
    run = subprocess.run([sys.executable, "-m", "pipeline", "run", "--input", str(corpus(tmp_path / "docs.jsonl", "c", 3)),
                          *common_flags(RUN_ID, tmp_path / "out"), *FLAGS, "--cache_dir", str(small_disk)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 2, run.stderr[-2000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr[-3000:]
    assert lines[0].startswith(f"docscore run: --cache_dir {small_disk}: models cannot be cached there: "), lines[0]
    assert lines[0].endswith("its disk is full: free space there, or choose another directory (or pass another "
                             "--cache_dir)"), lines[0]
    # no half-written copy (Orbax's writer threads outlive the failed save, into the room its removal frees)
    assert [p.name for p in (small_disk / "models").iterdir()] == []


def test_a_failure_for_want_of_space_says_where_the_job_writes_and_how_much_room_is_left(tmp_path):
    from pipeline.launch import no_space_hint

    hint = no_space_hint(str(tmp_path / "out" / "not yet"), "the pipeline failed (OSError: [Errno 28] No space left on device)")
    assert hint.startswith(f"; a disk it writes to is full: --output {tmp_path / 'out' / 'not yet'} ("), hint
    assert "free now)" in hint and "free space there, or choose another --output (or TMPDIR)" in hint
    assert no_space_hint(str(tmp_path), "the pipeline failed (OSError: [Errno 13] Permission denied)") == ""
    assert no_space_hint("gs://bucket/out", "OSError: [Errno 122] Disk quota exceeded").startswith(
        "; a disk it writes to is full: the temporary directory ")  # a bucket has no disk of this machine


@pytest.mark.integration
def test_a_nearly_full_temporary_directory_costs_the_progress_display_not_the_run(tmp_path, small_disk):
    """TMPDIR with a page or two left: Python's tempfile takes it (its probe fits), the progress counter files of
    the job's counting steps fill it, and their ENOSPC failed the job ('CountRead', exit 1) though the counts only
    feed the progress display. The run completes, with one warning."""
    fill(small_disk, leave=8 * 1024)
    out = tmp_path / "out"
    shard = corpus(tmp_path / "in" / "docs.jsonl", "t", 5)
    run = subprocess.run([sys.executable, "-m", "pipeline", "run", "--input", str(shard), *common_flags(RUN_ID, out),
                          *FLAGS], cwd=REPO, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "TMPDIR": str(small_disk)})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stderr.count(f"progress: the counts cannot be written to {small_disk}/") == 1, run.stderr[-2000:]
    assert visible(out)[1] == {f"t{i}" for i in range(5)}


@pytest.mark.integration
def test_a_second_launch_of_a_running_run_id_is_refused_until_the_holder_dies(tmp_path, capsys, no_data_read):
    out = tmp_path / "out"
    shard = corpus(tmp_path / "in" / "docs.jsonl", "c", 2)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pipeline.io import run_lease\n"
         "run_lease.acquire(sys.argv[1], sys.argv[2], 'holder000000')\nprint('held', flush=True)\ntime.sleep(600)",
         str(out), RUN_ID], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert run_docscore("--input", shard, *common_flags(RUN_ID, out), *FLAGS) == 2
        err = capsys.readouterr().err
        assert f"--run_id {RUN_ID} is being written" in err and f"pid {holder.pid}" in err and "another --run_id" in err
        assert run_commit.committed_summary(str(out), RUN_ID) is None  # no_data_read: no shard was read
        # another run_id is not blocked
        assert run_lease.is_held(str(out), RUN_ID) and not run_lease.is_held(str(out), "other")
    finally:
        holder.kill()
        holder.wait()
    assert not run_lease.is_held(str(out), RUN_ID)  # the kernel dropped the dead holder's lock


@pytest.mark.integration
def test_a_symlinked_partition_is_a_configuration_error_and_its_target_is_untouched(tmp_path, capsys, no_data_read):
    out = tmp_path / "out"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "part-0.parquet").write_bytes(b"not docscore's")
    (out / "scores").mkdir(parents=True)
    (out / "scores" / f"run_id={RUN_ID}").symlink_to(elsewhere, target_is_directory=True)
    shard = corpus(tmp_path / "in" / "docs.jsonl", "l", 2)
    assert run_docscore("--input", shard, *common_flags(RUN_ID, out), *FLAGS) == 2
    assert "is a symlink" in capsys.readouterr().err
    assert [p.name for p in elsewhere.iterdir()] == ["part-0.parquet"]


def test_a_readers_probe_of_a_local_lease_does_not_refuse_a_launch(tmp_path):
    """report/compare and other launches' clean-up ask whether a run_id is held (a shared lock for a moment): a
    launch taking the lease just then must not be refused naming a launch that has ended."""
    out = str(tmp_path / "out")
    run_lease.acquire(out, "r1", "first").release()
    probe = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom pipeline.io import run_lease\n"
                              "print('probing', flush=True)\nend = time.time() + 4\n"
                              "while time.time() < end: run_lease.is_held(sys.argv[1], 'r1')",
                              out], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert probe.stdout.readline().strip() == "probing"  # the launches below race a running probe
        for n in range(200):
            run_lease.acquire(out, "r1", f"launch{n}").release()  # LeaseHeld would fail the test
    finally:
        probe.wait(timeout=60)
    held = run_lease.acquire(out, "r1", "holder")
    try:
        with pytest.raises(run_lease.LeaseHeld, match="launch holder"):
            run_lease.acquire(out, "r1", "second")
    finally:
        held.release()



def test_an_object_store_lease_is_renewed_well_before_it_expires_and_not_once_taken_over():
    """A gs:// lease holds an expiry its holder pushes forward while it runs: a renewal that came only once the
    expiry had passed would let a second launch take over a run that is still writing. memory:// is an object
    store as gs:// is (no flock); the renewal loop is run here in the test's thread, one round at a time."""
    import threading

    out = "memory://docscore-renew-test/out"
    fs, path = fsspec.core.url_to_fs(run_lease.lease_path(out, "r1"))

    class Rounds(threading.Event):
        """An Event whose wait() says how long the loop would sleep and lets it run `n` rounds."""

        def __init__(self, n):
            super().__init__()
            self.n, self.timeouts = n, []

        def wait(self, timeout=None):
            self.timeouts.append(timeout)
            self.n -= 1
            return self.n < 0

    try:
        lease = run_lease.acquire(out, "r1", "one", ttl_s=90.0)
        lease._stop.set()  # the background renewer stops; its rounds are run below instead
        me = {k: v for k, v in run_lease.holder(out, "r1").items() if k != "expires"}
        before = run_lease.holder(out, "r1")["expires"]
        rounds = Rounds(1)
        run_lease._renew(fs, path, me, 90.0, rounds)
        assert run_lease.holder(out, "r1")["expires"] > before and run_lease.holder(out, "r1")["launch"] == "one"
        assert all(0 < timeout <= 90.0 / 3 for timeout in rounds.timeouts)  # two renewals may fail before it expires
        taken = {"launch": "two", "expires": time.time() + 90.0}
        fs.pipe_file(path, json.dumps(taken).encode())  # another launch took it over (the holder was cut off)
        run_lease._renew(fs, path, me, 90.0, Rounds(3))
        assert run_lease.holder(out, "r1") == taken
    finally:
        fsspec.filesystem("memory").rm("/docscore-renew-test", recursive=True)



def test_a_launch_whose_object_store_lease_is_gone_or_taken_over_neither_commits_nor_removes_the_new_lease():
    """A launch cut off past its lease's expiry (another took it over, or the object is gone mid take-over) must be
    refused at its commit, and its release must leave the new holder's lease in place (removing it would let a
    third launch take the run_id the second is writing)."""
    out = "memory://docscore-takeover-test/out"
    fs, path = fsspec.core.url_to_fs(run_lease.lease_path(out, "r1"))
    try:
        lease = run_lease.acquire(out, "r1", "one", ttl_s=90.0)
        lease._stop.set()  # cut off: it renews no more
        run_lease.check_holder(out, "r1", "one")
        fs.rm_file(path)
        with pytest.raises(run_lease.LeaseHeld, match=r"this launch \(one\) no longer holds the lease"):
            run_lease.check_holder(out, "r1", "one")
        taken = {"launch": "two", "expires": time.time() + 90.0}
        fs.pipe_file(path, json.dumps(taken).encode())
        with pytest.raises(run_lease.LeaseHeld, match="no longer holds"):
            run_lease.check_holder(out, "r1", "one")
        lease.release()
        assert run_lease.holder(out, "r1") == taken and run_lease.is_held(out, "r1")
        run_lease.release_if_held_by(out, "r1", "two")
        assert run_lease.holder(out, "r1") == {}
    finally:
        fsspec.filesystem("memory").rm("/docscore-takeover-test", recursive=True)

def test_an_object_store_launchs_staging_is_kept_while_any_of_its_files_is_recent(monkeypatch):
    """On gs:// a launch nobody waits for holds no lease: its staging counts as dead only once its most recent
    write is STALE_REMOTE_S old. A launch that staged its first files long ago and is still writing keeps them."""
    out = "memory://docscore-stale-test/out"
    fs = fsspec.filesystem("memory")
    ages = {"done/scores/part-0.parquet": 3 * run_lease.STALE_REMOTE_S, "done/scores/part-1.parquet": 2 * run_lease.STALE_REMOTE_S,
            "writing/scores/part-0.parquet": 3 * run_lease.STALE_REMOTE_S, "writing/scores/part-1.parquet": 60.0}
    try:
        for tail in ages:
            fs.pipe_file(f"/docscore-stale-test/out/_staging/run_id=r1/{tail}", b"staged")
        monkeypatch.setattr(run_commit, "file_age_s", lambda _, p: next(a for tail, a in ages.items() if p.endswith(tail)))
        removed = run_lease.remove_stale(out, own_launch="next")
        assert [p.rsplit("/", 1)[1] for p in removed] == ["done"]
        assert sorted(p.rsplit("/", 1)[1] for p in fs.find("/docscore-stale-test/out/_staging")) == [
            "part-0.parquet", "part-1.parquet"]  # the launch still writing: both its files
    finally:
        fs.rm("/docscore-stale-test", recursive=True)

@pytest.mark.integration
def test_a_gs_lease_is_exclusive_until_released_or_expired(gcs_emulator, tmp_path):  # noqa: F811
    with gcs_target(gcs_emulator, tmp_path, fault_rate=0) as target:
        out = target.url("out")
        first = run_lease.acquire(out, "g1", "launch-one", ttl_s=60.0)  # far from expiring on a loaded machine
        with pytest.raises(run_lease.LeaseHeld, match=r"launch launch-one .*wait for it to finish \(its lease, renewed "
                                                      r"while it runs, expires at \d\d:\d\d:\d\d if it stopped\)"):
            run_lease.acquire(out, "g1", "launch-two")
        run_lease.check_holder(out, "g1", "launch-one")
        first.release()
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        killed = run_lease.acquire(out, "g1", "launch-killed", ttl_s=60.0)  # as if its process had been killed:
        killed._stop.set()
        with fsspec.open(run_lease.lease_path(out, "g1"), "rb") as f:
            held = json.loads(f.read())
        with fsspec.open(run_lease.lease_path(out, "g1"), "wb") as f:
            f.write(json.dumps({**held, "pid": int(gone.stdout)}).encode())  # its pid on this host is no more
        with pytest.raises(run_lease.LeaseHeld, match="a process of this machine that is gone; its lease expires at"):
            run_lease.acquire(out, "g1", "launch-two")
        fsspec.filesystem("gs").rm(run_lease.lease_path(out, "g1"))
        second = run_lease.acquire(out, "g1", "launch-two", ttl_s=2.0)
        second._stop.set()  # the holder stops renewing (cut off): after the expiry the lease is taken over
        time.sleep(2.5)
        third = run_lease.acquire(out, "g1", "launch-three")
        with pytest.raises(run_lease.LeaseHeld, match="no longer holds"):
            run_lease.check_holder(out, "g1", "launch-two")
        third.release()
        assert run_lease.holder(out, "g1") == {}  # released: the object is gone


def test_two_launches_taking_over_an_expired_gs_lease_at_once_are_one_holder(gcs_emulator, tmp_path):  # noqa: F811
    """Both read the expired lease; the first deletes it and creates its own; the second deleted that new lease
    (a delete without a precondition) and created its own too: two holders running one run_id."""
    import threading

    with gcs_target(gcs_emulator, tmp_path, fault_rate=0) as target:
        out = target.url("out")
        fs, path = fsspec.core.url_to_fs(run_lease.lease_path(out, "race"))
        for trial in range(6):
            fs.pipe_file(path, json.dumps({"launch": "dead", "expires": time.time() - 1}).encode())
            barrier, outcomes = threading.Barrier(2), {}

            def take(launch):
                barrier.wait()
                try:
                    outcomes[launch] = run_lease.acquire(out, "race", launch)
                except run_lease.LeaseHeld as e:
                    outcomes[launch] = e

            threads = [threading.Thread(target=take, args=(name,)) for name in ("a", "b")]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            held = [name for name, got in outcomes.items() if isinstance(got, run_lease.Lease)]
            assert len(held) == 1 and run_lease.holder(out, "race")["launch"] == held[0], (trial, outcomes)
            outcomes[held[0]].release()
        # a delete that names a generation the object no longer has leaves it: the precondition GCS checks
        fs.pipe_file(path, b"{}")
        stale = run_lease._generation(fs, path)
        fs.pipe_file(path, b'{"launch": "new"}')
        assert not run_lease._delete_generation(fs, path, stale) and run_lease.holder(out, "race") == {"launch": "new"}


@pytest.mark.integration
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_ends_the_run_with_a_message_and_no_traceback_and_the_previous_run_stays(tmp_path, signum, code):
    """Ctrl-C, or SIGTERM (a scheduler or container stopping the command): 130 / 143, one line, the launch's files
    removed, the previous run of the run_id still what readers see."""
    out = tmp_path / "out"
    first = corpus(tmp_path / "first" / "docs.jsonl", "p", 2)
    assert run_docscore("--input", first, *common_flags(RUN_ID, out), *FLAGS) == 0  # the previous run, in this process
    before = visible(out)
    # minutes of work, so the run is still going when it is interrupted however fast the machine
    long = write_jsonl(tmp_path / "long" / "docs.jsonl",
                       [{"id": f"q{i}", "text": " ".join(SENTENCES) * 3} for i in range(2000)])
    temp = tmp_path / "tmp"  # the interrupted process's temporary files (Beam's pipeline directory among them)
    temp.mkdir()
    run = subprocess.Popen([sys.executable, "-m", "pipeline", "run", "--input", str(long), *common_flags(RUN_ID, out), *FLAGS],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "TMPDIR": str(temp)})
    staging = out / "_staging" / f"run_id={RUN_ID}"
    deadline = time.time() + 300
    while run_lease.holder(str(out), RUN_ID).get("pid") != run.pid and run.poll() is None and time.time() < deadline:
        time.sleep(0.2)  # until it has validated and taken the lease
    time.sleep(3)  # the job is being built or running
    run.send_signal(signum)
    _, err = run.communicate(timeout=300)
    assert run.returncode == code, err[-2000:]
    assert "interrupted; nothing was published" in err and "Traceback" not in err
    assert visible(out) == before
    assert not staging.exists()
    assert not list(temp.glob("beam-pipeline-temp*"))  # os._exit skips Beam's own removal of it


@pytest.mark.integration
def test_ctrl_c_on_worker_processes_stops_them_and_prints_only_the_one_line(tmp_path):
    """A multi_processing run: the interrupt kills Beam's worker processes before the launcher exits, and what
    the launcher's threads and the workers say about their connections breaking never reaches the terminal."""
    import psutil

    long = write_jsonl(tmp_path / "long" / "docs.jsonl",
                       [{"id": f"q{i}", "text": " ".join(SENTENCES) * 3} for i in range(2000)])
    run = subprocess.Popen([sys.executable, "-m", "pipeline", "run", "--input", str(long),
                            *common_flags(RUN_ID, tmp_path / "out"), *FLAGS,
                            "--direct_running_mode", "multi_processing", "--direct_num_workers", "2"],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    launcher, deadline = psutil.Process(run.pid), time.time() + 300
    workers: list = []
    while len(workers) < 2 and run.poll() is None and time.time() < deadline:
        time.sleep(0.5)  # until both workers run (each is `sh -c python -m ...sdk_worker_main`)
        workers = [p for p in launcher.children(recursive=True) if "sdk_worker_main" in " ".join(p.cmdline())]
    run.send_signal(signal.SIGINT)
    time.sleep(0.2)  # an impatient second Ctrl-C while the first stops the workers: the one line still comes
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=300)
    assert run.returncode == 130, err[-2000:]
    assert "interrupted; nothing was published" in err and "Traceback" not in err, err[-3000:]
    assert workers and not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in workers)


@pytest.mark.integration
@pytest.mark.parametrize("runner", [[], ["--runner", "DataflowRunner", "--project", "p", "--region", "r"]])
def test_an_interrupt_inside_lease_acquisition_still_releases_the_gs_lease(gcs_emulator, tmp_path, runner):  # noqa: F811
    """The interrupt can come after acquire() wrote the lease and before it returned the Lease (the full suite
    caught one): the handler then releases the lease its launch holds, and only that one, for a local run as for
    a remote job the launcher waits for (it is submitted only after acquire returns)."""
    from pipeline import launch
    from pipeline.io import sinks
    from pipeline.options import parse_options

    with gcs_target(gcs_emulator, tmp_path, fault_rate=0) as target:
        out = target.url("out")
        options, eo = parse_options(["--input", str(tmp_path), *common_flags(RUN_ID, out), *runner])
        spec = sinks.OutputSpec.for_run(eo.output, eo.run_id, eo.output_format, None)
        other = run_lease.acquire(out, "other-run", "another-launch")  # someone else's lease stays
        run_lease.acquire(out, RUN_ID, spec.launch)  # written; the Lease never reached launch()
        assert "interrupted" in launch.interrupted(options, eo, spec, lease=None)
        assert run_lease.holder(out, RUN_ID) == {}
        assert run_lease.holder(out, "other-run")["launch"] == "another-launch"
        other.release()


@pytest.mark.integration
def test_ctrl_c_releases_a_gs_lease_so_the_run_id_can_be_launched_again_at_once(gcs_emulator, tmp_path):  # noqa: F811
    """The interrupt ends the process with os._exit, past launch()'s own release; on gs:// (no kernel lock to
    drop) the lease used to hold the run_id for its whole TTL, refusing an immediate relaunch."""
    long = write_jsonl(tmp_path / "long" / "docs.jsonl",
                       [{"id": f"q{i}", "text": " ".join(SENTENCES) * 3} for i in range(2000)])
    with gcs_target(gcs_emulator, tmp_path, fault_rate=0) as target:
        out = target.url("out")
        run = subprocess.Popen([sys.executable, "-m", "pipeline", "run", "--input", str(long), *common_flags(RUN_ID, out),
                                *FLAGS], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 300
        while run_lease.holder(out, RUN_ID).get("pid") != run.pid and run.poll() is None and time.time() < deadline:
            time.sleep(0.2)  # until it holds the lease
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=300)
        assert run.returncode == 130, err[-2000:]
        assert run_lease.holder(out, RUN_ID) == {}  # released: the next launch is not refused


@pytest.mark.integration
def test_ctrl_c_while_starting_up_is_exit_130_without_a_traceback(tmp_path):
    shard = corpus(tmp_path / "in" / "docs.jsonl", "u", 2)
    run = subprocess.Popen([sys.executable, "-m", "pipeline", "run", "--input", str(shard),
                            *common_flags(RUN_ID, tmp_path / "out"), *FLAGS],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2)  # importing jax and Beam, or validating
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=300)
    assert run.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err


def test_a_signal_while_the_lease_is_released_says_the_run_was_published(tmp_path):
    """The lease is released after the run is published (on gs://, a read and a delete): a SIGTERM then said
    "interrupted before the job started; nothing was published" though readers saw the new run."""
    shard = corpus(tmp_path / "in" / "docs.jsonl", "r", 2)
    script = ("import os, signal, sys\n"
              "from pipeline.io import run_lease\n"
              "from pipeline.cli import entry\n"
              "release = run_lease.Lease.release\n"
              "def slow_release(lease):\n"
              "    os.kill(os.getpid(), signal.SIGTERM)  # as if a gs:// delete were on its way\n"
              "    release(lease)\n"
              "run_lease.Lease.release = slow_release\n"
              "sys.argv = ['docscore'] + sys.argv[1:]\n"
              "sys.exit(entry())\n")
    done = subprocess.run([sys.executable, "-c", script, "run", "--input", str(shard),
                           *common_flags(RUN_ID, tmp_path / "out"), *FLAGS],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 143, done.stderr[-2000:]
    assert f"docscore run {RUN_ID}: interrupted; the run was published before the interrupt" in done.stderr, done.stderr
    assert "nothing was published" not in done.stderr
    assert (tmp_path / "out" / "runs" / f"run_id={RUN_ID}" / "summary.json").is_file()


LATE_SIGNALS = {  # what the finished command meets, after its exit_with_on_signal(4)
    "sigterm": "os.kill(os.getpid(), signal.SIGTERM)\nsys.exit(4)\n",
    # the interpreter's shutdown puts Python handlers back to the default (killed: 143), after atexit
    "sigterm-in-shutdown": ("class Late:\n    def __del__(self):\n        os.kill(os.getpid(), signal.SIGTERM)\n"
                            "late = Late()\nsys.exit(4)\n"),
    "sigint-in-a-slow-shutdown": "os.kill(os.getpid(), signal.SIGINT)\nsignal.pause()\n",
    "sigint-in-shutdown": ("class Late:\n    def __del__(self):\n        os.kill(os.getpid(), signal.SIGINT)\n"
                           "late = Late()\nsys.exit(4)\n"),
    # a shutdown that waits on a thread (a worker pool not yet stopped) still ends at the signal, not with the thread
    "sigterm-while-a-thread-is-awaited": ("import threading, time\n"
                                          "def stuck():\n    time.sleep(0.5)\n    os.kill(os.getpid(), signal.SIGTERM)\n"
                                          "    time.sleep(120)\n"
                                          "threading.Thread(target=stuck).start()\nsys.exit(4)\n"),
}


@pytest.mark.parametrize("late", sorted(LATE_SIGNALS))
def test_a_signal_after_the_command_finished_keeps_its_exit_code(late):
    """SIGTERM or SIGINT in the last moments of a finished command (its outcome printed, the interpreter shutting
    down) exits with the command's own code, not 130/143 without a word."""
    script = ("import os, signal, sys\n"
              "from pipeline.interrupt import exit_with_on_signal\n"
              "print('done', flush=True)\n"
              "exit_with_on_signal(4)\n" + LATE_SIGNALS[late])
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (4, "done\n", "")


def test_a_lease_file_that_cannot_be_opened_is_exit_2_naming_it(tmp_path, capsys, no_data_read):
    """Another user's lock file, a read-only _leases/ (here: a directory where the lock file goes): one line
    naming the lease, exit 2, nothing read (it was a traceback and exit 1)."""
    shard = corpus(tmp_path / "in" / "docs.jsonl", "l", 2)
    lock = Path(run_lease.lease_path(str(tmp_path / "out"), RUN_ID))
    lock.mkdir(parents=True)
    code = run_docscore("--input", shard, *common_flags(RUN_ID, tmp_path / "out"), *FLAGS)
    err = capsys.readouterr().err
    assert code == 2 and f"cannot take run {RUN_ID}'s lease {lock} (IsADirectoryError" in err, err
    assert "Traceback" not in err


def test_workers_of_a_killed_launcher_cannot_commit_its_run(tmp_path):
    """A local lease is the launcher's flock. Beam's multi_processing workers outlive a launcher killed with
    SIGKILL and publish from a worker: the check before the commit refuses once the flock is gone, though the
    lease file still names the dead launch."""
    out = str(tmp_path / "out")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from pipeline.io import run_lease\n"
                               f"run_lease.acquire({out!r}, 'k1', 'launch-dead')\n"
                               "print('held', flush=True)\n"
                               "time.sleep(300)\n"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        run_lease.check_holder(out, "k1", "launch-dead")  # its holder is alive: a worker of it may commit
    finally:
        holder.kill()
        holder.wait(timeout=60)
    assert run_lease.holder(out, "k1")["launch"] == "launch-dead"
    with pytest.raises(run_lease.LeaseHeld, match="the launch launch-dead that held the lease of .* has ended"):
        run_lease.check_holder(out, "k1", "launch-dead")


@pytest.mark.integration
def test_an_interrupt_between_the_commit_and_the_report_says_how_to_write_the_report(tmp_path):
    """The run is published (its summary committed) but the launcher was stopped before it wrote report.html: the
    interrupt's message says so and names the command that writes it, which then works."""
    import dataclasses

    from pipeline import launch
    from pipeline.io import sinks
    from pipeline.options import parse_options
    from pipeline.runs import report

    shard = write_jsonl(tmp_path / "in" / "docs.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(SENTENCES[:3])])
    out = tmp_path / "out"
    assert run_docscore("--input", shard, *common_flags("cut", out), "--attention", "native", "--no_progress") == 0
    page = out / "runs" / "run_id=cut" / "report.html"
    page.unlink()  # where the interrupt left it: the launch moves the old report aside before its commit
    options, eo = parse_options(["--input", str(shard), *common_flags("cut", out)])
    spec = sinks.OutputSpec.for_run(eo.output, eo.run_id, eo.output_format)
    committed = dataclasses.replace(spec, staging=spec.staging.rsplit("/", 1)[0] + "/" + read_summary(out, "cut")["launch_id"])
    message = launch.interrupted(options, eo, committed)
    assert "the run was published before the interrupt, without its report" in message, message
    assert f"`docscore report {out} --run_id cut`" in message, message
    assert report.main([str(out), "--run_id", "cut"]) == 0 and page.exists()
    assert "without its report" not in launch.interrupted(options, eo, committed)


def test_an_interrupts_line_comes_at_once_even_when_what_it_asks_cannot_answer():
    """The interrupt's line asks the store what was published; a gs:// store that is gone retries for minutes or
    raises: Ctrl-C still ends the command now, with a line saying what could not be checked."""
    from pipeline.interrupt import said_within

    assert said_within(lambda: "docscore run r: interrupted; nothing was published", 5) == \
        "docscore run r: interrupted; nothing was published"

    def unreachable() -> str:
        raise OSError("Server disconnected")

    assert "could not be checked (OSError: Server disconnected)" in said_within(unreachable, 5)
    started = time.monotonic()
    late = said_within(lambda: time.sleep(3) or "too late", 0.5)  # a store that answers too late
    assert time.monotonic() - started < 5
    assert "could not be checked (no answer within 0.5 s)" in late and "whole, never a mix" in late


def test_a_failed_job_whose_store_is_gone_still_ends_in_its_one_line(tmp_path, capsys, monkeypatch):
    """The job failed and removing what it placed fails too (the store went away): the command still says that
    nothing was published, and that the next launch removes its files, instead of a traceback."""
    from pipeline import launch

    shard = write_jsonl(tmp_path / "in" / "docs.jsonl", [{"id": "a", "text": SENTENCES[0]}])

    def job_fails(*_args, **_kwargs):
        raise RuntimeError("worker lost")

    def store_gone(*_args, **_kwargs):
        raise OSError("Server disconnected")

    monkeypatch.setattr(launch.progress, "run_with_progress", job_fails)
    monkeypatch.setattr(launch.run_commit, "discard_launch", store_gone)
    assert run_docscore("--input", shard, *common_flags("gone", tmp_path / "out"), "--attention", "native") == 1
    err = capsys.readouterr().err
    assert "the pipeline failed (RuntimeError: worker lost); nothing was published" in err, err
    assert "could not be removed (OSError: Server disconnected): the next launch of this run_id removes them" in err, err


def test_a_run_whose_summary_is_damaged_is_published_again_as_its_message_advises(tmp_path, capsys):
    """report and compare refuse a damaged summary.json and advise publishing the run again: that launch works (it
    said so before it started), replaces the damaged commit record, and the damaged run's files go after its commit."""
    shard = write_jsonl(tmp_path / "in" / "docs.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(SENTENCES[:3])])
    out = tmp_path / "out"
    assert run_docscore("--input", shard, *common_flags("r", out), "--attention", "native", "--no_progress") == 0
    old_files = sorted((out / "scores" / "run_id=r").iterdir())
    summary = out / "runs" / "run_id=r" / "summary.json"
    summary.write_bytes(summary.read_bytes()[:100])
    capsys.readouterr()
    assert run_docscore("--input", shard, *common_flags("r", out), "--attention", "native", "--no_progress") == 0
    err = capsys.readouterr().err
    assert f"note: {summary} is damaged" in err and "this launch replaces it" in err, err
    assert read_summary(out, "r")["counts"]["scored"] == 3
    assert not set(old_files) & set((out / "scores" / "run_id=r").iterdir())


def test_a_commit_that_fails_leaves_the_published_run_its_report(tmp_path, capsys, monkeypatch):
    """The replaced run's report is moved aside just before the commit: when the commit fails (a full disk while
    summary.json is written), the previous run is still the published one, and its report comes back."""
    from pipeline.runs import publish

    shard = write_jsonl(tmp_path / "in" / "docs.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(SENTENCES[:3])])
    out = tmp_path / "out"
    assert run_docscore("--input", shard, *common_flags("r", out), "--attention", "native", "--no_progress") == 0
    page = out / "runs" / "run_id=r" / "report.html"
    before = page.read_text()

    def disk_full(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(publish.run_commit, "commit", disk_full)
    assert run_docscore("--input", shard, *common_flags("r", out), "--attention", "native", "--no_progress") == 1
    assert "nothing was published" in capsys.readouterr().err
    assert page.read_text() == before
    assert not [p for p in page.parent.iterdir() if p.name.endswith(".docscore-tmp")]


@pytest.mark.integration
def test_a_worker_process_killed_in_the_publish_step_ends_the_command_as_a_failed_job(tmp_path):
    """Beam's multi-process runner waits forever for the bundles of a worker killed while it publishes the run
    (it reports the lost worker only in a thread): the command ends anyway, exit 1, saying why and that nothing
    was published, and the previous run stays what readers see; the lost connection takes a few lines, not ~60."""
    shard = write_jsonl(tmp_path / "in" / "docs.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(SENTENCES)])
    out = tmp_path / "out"
    flags = [*common_flags(RUN_ID, out), *FLAGS, "--direct_running_mode", "multi_processing", "--direct_num_workers", "2"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent / "worker_faults"),
           "DOCSCORE_TEST_KILL_WORKER_AT": "place_staged"}
    run = subprocess.run([sys.executable, "-m", "pipeline", "run", "--input", str(shard), *flags], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 1, run.stderr[-3000:]
    assert "a worker process died (exit status" in run.stderr and "ending it as a failed job" in run.stderr, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"docscore run {RUN_ID}: ended as a failed job; nothing was published"), run.stderr[-3000:]
    assert "interrupted" not in run.stderr, run.stderr[-3000:]
    # the runner's threads say their worker connection broke in a line each, not in gRPC tracebacks
    assert "Traceback" not in run.stderr and len(run.stderr.splitlines()) < 15, run.stderr[-3000:]
    assert not (out / "runs" / f"run_id={RUN_ID}" / "summary.json").exists()
    assert not (out / "_staging").exists() or not any((out / "_staging").rglob("part-*"))


def test_a_job_ended_for_a_lost_worker_during_an_interrupt_keeps_the_interrupts_exit_code():
    """Ctrl-C of a multi-process run kills its workers, which Beam reports as lost workers: the watch that ends a
    stuck job must not turn the interrupt's 130 into its own exit 1 while the interrupt's line is being said."""
    script = textwrap.dedent("""
        import os, signal, threading, time
        from pipeline import interrupt

        def slow_line():
            threading.Thread(target=lambda: interrupt.end_command(1, "ended as a failed job")).start()
            time.sleep(1)
            return f"docscore run r: {interrupt.how_ended()}; nothing was published"

        with interrupt.exit_on_interrupt(slow_line):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "docscore run r: interrupted; nothing was published", done.stderr


def as_an_ordinary_user() -> list[str]:
    """A command prefix under which file modes bind a process as they bind an ordinary user: none for one; for root
    (which ignores modes through CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH) setpriv without those two capabilities."""
    if os.geteuid() != 0:
        return []
    prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
    try:
        works = subprocess.run([*prefix, "true"], capture_output=True, timeout=60).returncode == 0
    except FileNotFoundError:
        works = False
    if not works:
        pytest.skip("running as root without setpriv (util-linux) to drop CAP_DAC_OVERRIDE: no file root cannot read")
    return prefix


@pytest.mark.integration
def test_an_input_this_user_may_read_none_of_is_exit_2_and_the_published_run_stays(tmp_path):
    """Shards whose permissions this user lacks: each became a read/unreadable_shard row, so a launch that read
    nothing published a run of error rows over the run_id's complete run (exit 4; exit 0 with --max_error_fraction 1,
    as here). Now refused before the job (exit 2), naming a shard and the fix; one readable shard among them keeps
    the others as error rows (README)."""
    out = tmp_path / "out"
    assert run_docscore("--input", corpus(tmp_path / "good" / "docs.jsonl", "g", 3), *common_flags(RUN_ID, out), *FLAGS) == 0
    before = visible(out)
    for i in range(2):
        corpus(tmp_path / "locked" / f"part-{i}.jsonl", "l", 2).chmod(0)
    run = subprocess.run([*as_an_ordinary_user(), sys.executable, "-m", "pipeline", "run", "--input", str(tmp_path / "locked"),
                          *common_flags(RUN_ID, out), *FLAGS], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 2, run.stderr[-2000:]
    assert f"{tmp_path / 'locked' / 'part-0.jsonl'} cannot be read by this user" in run.stderr, run.stderr[-2000:]
    assert "Permission denied" in run.stderr and "nor does the other shard looked at" in run.stderr, run.stderr[-2000:]
    assert visible(out) == before


@pytest.mark.integration
def test_a_read_only_compilation_cache_still_serves_its_programs(tmp_path):
    """A --cache_dir filled by an earlier run and then read-only (baked into an image, a read-only mount): refused
    with exit 2 before, as if it were missing. Now its programs load, a note says compiles are not saved, and a
    cache that is not there and cannot be made is still refused."""
    from models.builtin import builtin_dir
    from models.model_dir import default_cache_dir

    model = builtin_dir("minilm-l6", default_cache_dir())  # converted outside the cache under test
    shard, cache = corpus(tmp_path / "in" / "docs.jsonl", "r", 4), tmp_path / "cache"
    flags = ["--input", str(shard), "--model", model, "--cache_dir", str(cache), *FLAGS]
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}  # it would win over --cache_dir
    command = [sys.executable, "-m", "pipeline", "run"]
    # a fresh process fills the cache (in this one, programs an earlier test compiled come from memory, unwritten)
    warm = subprocess.run([*command, *flags, *common_flags("warm", tmp_path / "out")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert warm.returncode == 0, warm.stderr[-2000:]
    for folder, _, files in os.walk(cache):
        for name in files:
            os.chmod(os.path.join(folder, name), 0o444)
        os.chmod(folder, 0o555)
    command = [*as_an_ordinary_user(), *command]
    run = subprocess.run([*command, *flags, *common_flags("ro", tmp_path / "out")], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"compilation cache {cache}/jax-compilation-cache cannot be written here (PermissionError: " in run.stderr, \
        run.stderr[-2000:]
    compiled = read_summary(tmp_path / "out", "ro")["compile"]
    assert compiled["cached_count"] >= 1 and compiled["cold_count"] == 0, compiled  # the same shapes: all loaded
    missing = cache / "sub"  # not there, and its parent cannot take it
    refused = subprocess.run([*command, *flags[:4], "--cache_dir", str(missing), *FLAGS,
                              *common_flags("no", tmp_path / "out")], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=600)
    assert refused.returncode == 2 and f"cannot hold the compilation cache {missing}" in refused.stderr, refused.stderr


@pytest.mark.integration
def test_progress_samples_that_cannot_be_written_after_the_commit_do_not_make_a_published_run_exit_1(tmp_path, capsys):
    """progress.json is written after the commit; a failure there (a full disk by then, a folder in its place, as
    here) ended the command in a traceback and exit 1, which says the job failed and nothing was published, and the
    report went unwritten. The run stays what it is: published, exit 0, with its report and a note."""
    out = tmp_path / "out"
    (out / "runs" / f"run_id={RUN_ID}" / "progress.json").mkdir(parents=True)
    assert run_docscore("--input", corpus(tmp_path / "a" / "docs.jsonl", "a", 3), *common_flags(RUN_ID, out), *FLAGS) == 0
    err = capsys.readouterr().err
    assert "the run is published, but its progress samples (the report's throughput chart) were not written" in err, err
    assert visible(out)[1] == {"a0", "a1", "a2"}
    assert (out / "runs" / f"run_id={RUN_ID}" / "report.html").is_file()
