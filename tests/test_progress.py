"""Progress reporting: counts from a real Beam pipeline and from several processes, bar and log lines."""
from __future__ import annotations

import io
import json
import os
import select
import signal
import socket
import tempfile
import time
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.telemetry import progress
from pipeline.telemetry.progress import ProgressCounts, ProgressReporter, ProgressSample


def test_rate_eta_and_status_line():
    samples = [ProgressSample(0.0, 400, 0), ProgressSample(5.0, 400, 50), ProgressSample(10.0, 400, 100)]
    rate, eta = progress.rate_and_eta(samples, window_s=10.0)
    assert rate == pytest.approx(10.0)  # 100 docs in 10 s
    assert eta == pytest.approx(30.0)  # 300 left at 10 records/s
    assert progress.format_status(samples[-1], rate, eta) == "100/400 records (25%) | 10.0 records/s | ETA 0:00:30 | 0:00:10 elapsed"
    assert progress.format_status(progress.ProgressSample(0.4, 0, 0), None, None) == "no record read yet | 0:00:00 elapsed"
    bar = progress.format_bar(samples[-1], rate, eta, width=20)
    assert bar.startswith("[#####---------------] 100/400")
    # the window only looks back window_s: the rate follows the recent pace, not the whole run
    samples.append(ProgressSample(20.0, 400, 300))
    assert progress.rate_and_eta(samples, window_s=10.0)[0] == pytest.approx(20.0)
    # nothing left -> ETA 0; too few samples -> unknown
    assert progress.rate_and_eta([ProgressSample(0, 5, 0), ProgressSample(1, 5, 5)])[1] == 0.0
    assert progress.rate_and_eta(samples[:1]) == (None, None)


def _count_in_child(directory: str, n: int) -> int:
    """Fork a process that counts n discovered and n // 2 done into its own counter file; returns its pid.

    A bare os.fork whose child only touches files and leaves by os._exit: nothing it runs takes a
    lock another thread of this (JAX/Beam) process might hold, so the fork is safe.
    """
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            counter = progress.CounterFile(directory)
            for _ in range(n):
                counter.add("discovered")
            for _ in range(n // 2):
                counter.add("done")
            counter.close()
            code = 0
        finally:
            os._exit(code)
    return pid


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # JAX warns on any fork; see _count_in_child
def test_counter_files_sum_across_processes(tmp_path):
    pids = [_count_in_child(str(tmp_path), n) for n in (7, 10, 31)]
    assert all(os.waitpid(pid, 0)[1] == 0 for pid in pids)
    assert len(list(tmp_path.glob("*.json"))) == 3
    assert progress.read_counter_files(str(tmp_path)) == ProgressCounts(discovered=48, done=3 + 5 + 15)
    assert progress.read_counter_files(str(tmp_path / "missing")) == ProgressCounts()


def _pipeline(n: int, counter_dir: str | None, sleep_s: float) -> beam.Pipeline:
    """Records are read, reshuffled, then processed slowly: the shape of the docscore job."""
    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory"]))
    records = pipeline | beam.Create(list(range(n)))
    _ = records | "Discovered" >> progress.CountProgress(counter_dir, "discovered")
    done = records | beam.Reshuffle() | beam.Map(lambda x: (time.sleep(sleep_s), x)[1])  # by value: workers can't import tests
    _ = done | "Done" >> progress.CountProgress(counter_dir, "done")
    return pipeline


def test_progress_follows_a_running_beam_pipeline():
    # in_memory only: multi_processing costs ~20 s of worker start-up here; crossing processes is
    # covered by test_counter_files_sum_across_processes (and the pipeline's own multi_processing test)
    n = 24
    counter_dir = progress.local_counter_dir(PipelineOptions([]))  # DirectRunner is local
    assert counter_dir is not None and os.path.isdir(counter_dir)
    log = io.StringIO()
    result, reporter = progress.run_with_progress(
        _pipeline(n, counter_dir, 0.05), counter_dir, stream=log, interval_s=0.05, log_every_s=0.2
    )
    samples = reporter.samples
    assert samples[-1].discovered == n and samples[-1].done == n
    assert [s.done for s in samples] == sorted(s.done for s in samples)
    assert any(0 < s.done < n for s in samples), f"no sample saw the run in progress: {samples}"
    lines = log.getvalue().splitlines()
    assert len(lines) >= 2 and all(" docscore progress: " in line for line in lines)
    assert f"{n}/{n} records (100%)" in lines[-1]
    assert not os.path.exists(counter_dir)  # cleaned up
    # the same counts also reach Beam metrics, which is what a remote runner is polled through
    assert progress.counts_from_metrics(result) == ProgressCounts(discovered=n, done=n)


def test_counts_read_in_a_burst_show_while_the_bundle_works_on():
    # docscore's shape: a bundle reads its records in a burst, then spends seconds on one model batch
    # before its first result; the discovered count must show the whole burst in the meantime
    n, work_s = 20, 1.5
    counter_dir = progress.local_counter_dir(PipelineOptions([]))
    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory"]))
    records = pipeline | beam.Create(list(range(n)), reshuffle=False)
    _ = records | "Discovered" >> progress.CountProgress(counter_dir, "discovered")
    done = (records | beam.BatchElements(min_batch_size=n, max_batch_size=n)
            | beam.FlatMap(lambda batch: (time.sleep(work_s), batch)[1]))
    _ = done | "Done" >> progress.CountProgress(counter_dir, "done")
    _, reporter = progress.run_with_progress(pipeline, counter_dir, display=False, interval_s=0.05)
    samples = reporter.samples
    assert samples[-1] == ProgressSample(samples[-1].t_s, n, n)
    waiting = [s for s in samples if s.done == 0 and s.discovered > 0]
    assert waiting and waiting[-1].discovered == n, f"the burst never showed while the batch ran: {samples}"


def test_counter_file_writes_only_changed_counts_and_stops_on_close(tmp_path):
    counter = progress.CounterFile(str(tmp_path), flush_s=0.05)
    counter.add("discovered", 3)  # the first count is written at once
    assert progress.read_counter_files(str(tmp_path)) == ProgressCounts(discovered=3)
    counter.add("done", 2)
    deadline = time.monotonic() + 10  # the flusher thread writes it, no further add() needed
    while progress.read_counter_files(str(tmp_path)).done != 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert progress.read_counter_files(str(tmp_path)) == ProgressCounts(discovered=3, done=2)
    (path,) = tmp_path.glob("*.json")
    path.unlink()
    counter.flush()  # what the flusher thread calls: unchanged counts are not rewritten
    assert not path.exists()
    counter.add("done")
    counter.close()  # writes the final counts at once
    assert progress.read_counter_files(str(tmp_path)) == ProgressCounts(discovered=3, done=3)
    with pytest.raises(ValueError, match="flush_s"):
        progress.CounterFile(str(tmp_path), flush_s=0.0)


def test_without_counter_files_progress_comes_from_beam_metrics():
    assert progress.local_counter_dir(PipelineOptions(["--runner=DataflowRunner"])) is None
    log = io.StringIO()
    _, reporter = progress.run_with_progress(_pipeline(5, None, 0.0), None, stream=log, interval_s=3600)
    assert reporter.samples[-1] == ProgressSample(reporter.samples[-1].t_s, 5, 5)
    assert "5/5 records (100%)" in log.getvalue()


def test_bar_on_a_terminal_and_silence_with_display_off(tmp_path):
    feed = iter([ProgressCounts(10, 0), ProgressCounts(10, 4), ProgressCounts(10, 10), ProgressCounts(10, 10)])
    master, slave = os.openpty()
    with os.fdopen(slave, "w") as terminal:
        reporter = ProgressReporter(lambda: next(feed), stream=terminal, interval_s=3600)
        reporter.start()
        reporter.poll()
        reporter.poll()
        reporter.stop()
    output = b""
    while select.select([master], [], [], 0.2)[0]:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    os.close(master)
    text = output.decode()
    assert text.count("\r[") == 4
    assert "[############------------------] 4/10 records (40%)" in text
    assert "[##############################] 10/10 records (100%)" in text
    assert text.endswith("\n")

    quiet = io.StringIO()
    counts = iter([ProgressCounts(3, 0), ProgressCounts(3, 3)])
    silent = ProgressReporter(lambda: next(counts), display=False, stream=quiet, interval_s=3600)
    silent.start()
    silent.stop()
    assert quiet.getvalue() == ""
    assert [s.done for s in silent.samples] == [0, 3]
    path = silent.write_samples(progress.samples_path(str(tmp_path), "r1"))
    assert path == f"{tmp_path}/runs/run_id=r1/progress.json"
    assert progress.read_samples(path) == silent.samples
    assert progress.read_samples(str(tmp_path / "none.json")) == []
    # the samples name their launch: a reader of another launch's summary (a rerun that died after its commit,
    # before writing its own samples) gets none rather than the previous launch's curve
    silent.write_samples(path, launch_id="launch-1")
    assert progress.read_samples(path, "launch-1") == silent.samples and progress.read_samples(path, "launch-2") == []
    Path(path).write_text('{"samples": [{"t_s"')  # cut short: no chart, no crash
    assert progress.read_samples(path, "launch-1") == []


def test_a_failing_count_source_never_breaks_the_run():
    calls = iter([ProgressCounts(4, 1), RuntimeError("metrics service not ready"), ProgressCounts(4, 4)])

    def counts():
        value = next(calls)
        if isinstance(value, Exception):
            raise value
        return value

    reporter = ProgressReporter(counts, display=False, interval_s=3600)
    reporter.start()
    reporter.poll()
    reporter.stop()
    assert [(s.discovered, s.done) for s in reporter.samples] == [(4, 1), (4, 1), (4, 4)]


def _launcher(temp: Path) -> tuple[int, Path]:
    """Fork a process that makes its counter folder in `temp` the way `docscore run` does, then runs on until
    killed; returns its pid and folder. Safe to fork for the reason _count_in_child gives."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            tempfile.tempdir = str(temp)
            os.write(write_end, progress.local_counter_dir(PipelineOptions([])).encode() + b"\n")
            while True:  # a run in progress
                time.sleep(60)
        finally:
            os._exit(1)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as made:
        return pid, Path(made.readline().decode().strip())


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)  # what an interrupted job's machine does: no clean-up runs
        os.waitpid(pid, 0)  # reaped: until then its pid still exists (a zombie)
    except (ProcessLookupError, ChildProcessError):  # killed and reaped already
        pass


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # JAX warns on any fork; see _count_in_child
def test_a_killed_runs_counter_folder_is_removed_at_the_next_start_and_nothing_else(tmp_path, monkeypatch):
    temp = tmp_path / "tmp"
    temp.mkdir()
    killed, killed_dir = _launcher(temp)
    running, running_dir = _launcher(temp)
    try:
        assert killed_dir.parent == temp and killed_dir.name.startswith(f"docscore-progress-{killed}-")
        _kill(killed)
        (killed_dir / "123-abc.json").write_text('{"discovered": 4, "done": 1}')  # its counts: gone with it

        def folder(name: str, owner: dict | None) -> Path:
            path = temp / name
            path.mkdir()
            if owner is not None:
                (path / progress.OWNER_FILE).write_text(json.dumps(owner))
            return path

        dead_owner = {"pid": killed, "create_time": time.time() - 5, "host": socket.gethostname()}
        me = {"pid": os.getpid(), "create_time": time.time() - 2 * 3600, "host": socket.gethostname()}
        reused = folder(f"docscore-progress-{os.getpid()}-reused", me)  # its pid now runs a later process
        elsewhere = folder("docscore-progress-1-elsewhere", dict(dead_owner, host="another-host"))
        unowned = folder("docscore-progress-legacy", None)  # no owner file: whose it is cannot be known
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / progress.OWNER_FILE).write_text(json.dumps(dead_owner))
        link = temp / f"docscore-progress-{killed}-link"
        link.symlink_to(outside, target_is_directory=True)

        monkeypatch.setattr(tempfile, "tempdir", str(temp))
        mine = Path(progress.local_counter_dir(PipelineOptions([])))  # the next run's start
        assert not killed_dir.exists() and not reused.exists()
        assert running_dir.is_dir() and (running_dir / progress.OWNER_FILE).exists()  # another live run's
        assert elsewhere.is_dir() and unowned.is_dir()
        assert link.is_symlink() and (outside / progress.OWNER_FILE).exists()  # not followed
        assert json.loads((mine / progress.OWNER_FILE).read_text())["pid"] == os.getpid()
        assert progress.read_counter_files(str(mine)) == ProgressCounts()  # the owner file is not a counter file
        assert progress.remove_dead_counter_dirs(str(temp)) == []  # nothing more: this run's folder is live
    finally:
        _kill(killed)
        _kill(running)
