"""Progress of a running pipeline: records discovered and done, rate and ETA, while it runs.

Holds CountProgress (a Beam transform that counts elements into a Beam counter and a small
per-worker counter file), the readers of those counts (metric_values: a job's Beam metrics by namespace,
which the launcher also adds to the summary), and ProgressReporter (a thread that polls
the counts, draws a bar on a terminal or prints log lines otherwise, and keeps the time series the
report charts). Must not touch the elements it counts nor decide anything about the run.

Why counter files: Beam's DirectRunner (FnApiRunner) runs a batch pipeline synchronously inside
`Pipeline.run()`, so its metrics cannot be polled until the run is over. Workers of a local run
(in_memory, multi_threading or multi_processing) share the launcher's disk, so each DoFn instance
rewrites one small JSON file there and the reporter sums them. On a remote runner (Dataflow), where
`run()` returns at once, poll `counts_from_metrics(result)` instead.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import multiprocessing
import os
import posixpath
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Callable, Iterable, TextIO

import apache_beam as beam
import fsspec
import psutil
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from pipeline.io import run_commit

METRICS_NAMESPACE = "docscore.progress"
KINDS = ("discovered", "done")
SAMPLES_FILE = "progress.json"


@dataclasses.dataclass(frozen=True)
class ProgressCounts:
    discovered: int = 0  # input records read so far (documents + unreadable records)
    done: int = 0  # records finished: documents through the model (per model call) + error rows before it


@dataclasses.dataclass(frozen=True)
class ProgressSample:
    t_s: float  # seconds since the reporter started
    discovered: int
    done: int


# ---- counting inside the pipeline -------------------------------------------------------------


_UNWRITABLE_DIRS: set[str] = set()  # counter directories a CounterFile of this process could not write to


class CounterFile:
    """The counts of one DoFn instance, rewritten to DIR/<unique>.json every `flush_s` while they change.

    Create it in DoFn.setup() (each instance gets its own file name on its first flush), so copies
    of a pickled DoFn never share a file. Writes are atomic (temporary file + os.replace). A daemon
    thread, started by the first add(), writes the counts: a bundle that reads its records in a burst
    and then spends seconds on a model batch would otherwise show only the count at its first record
    until the bundle ends. close() stops the thread and writes the final counts.
    """

    def __init__(self, directory: str, flush_s: float = 0.5):
        if flush_s <= 0:
            raise ValueError(f"flush_s must be > 0, got {flush_s}")
        self.directory = directory
        self.flush_s = flush_s
        self.counts = {kind: 0 for kind in KINDS}
        self._name: str | None = None
        self._lock = threading.Lock()
        self._written: dict[str, int] | None = None
        self._flusher: threading.Thread | None = None
        self._closed = threading.Event()
        self._failed = False

    def add(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self.counts[kind] += n
        if self._flusher is None:
            self.flush()  # the first count shows at once
            self._flusher = threading.Thread(target=self._flush_every, name="docscore-progress-counts", daemon=True)
            self._flusher.start()

    def flush(self) -> None:
        """Write the counts if they changed since the last write. A write that fails (a full temporary directory)
        stops this file's writes with one warning: the counts only feed the progress display, and the job's own
        results do not depend on them."""
        with self._lock:
            counts = dict(self.counts)
            if counts == self._written or self._failed:
                return
            if self._name is None:
                self._name = f"{os.getpid()}-{uuid.uuid4().hex}.json"
            path = os.path.join(self.directory, self._name)
            tmp = path + ".tmp"
            try:
                with open(tmp, "w") as f:
                    json.dump(counts, f)
                os.replace(tmp, path)
            except OSError as e:
                self._failed = True
                with contextlib.suppress(OSError):
                    os.remove(tmp)
                # once per process (every counting DoFn has a file); none when the reporter removed the directory
                if os.path.isdir(self.directory) and self.directory not in _UNWRITABLE_DIRS:
                    _UNWRITABLE_DIRS.add(self.directory)
                    logging.getLogger(__name__).warning(
                        "progress: the counts cannot be written to %s (%s: %s); the progress shown undercounts from here,"
                        " the run goes on", self.directory, type(e).__name__, e)
                return
            self._written = counts

    def close(self) -> None:
        self._closed.set()
        self.flush()

    def _flush_every(self) -> None:
        while not self._closed.wait(self.flush_s) and not self._failed:
            self.flush()


def read_counter_files(directory: str) -> ProgressCounts:
    """Sum of every counter file in `directory` (files being replaced right now are skipped)."""
    totals = {kind: 0 for kind in KINDS}
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return ProgressCounts()
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                counts = json.load(f)
        except (FileNotFoundError, json.JSONDecodeError):
            continue
        for kind in KINDS:
            totals[kind] += int(counts.get(kind, 0))
    return ProgressCounts(**totals)


class RecordCounter:
    """Counts records of one kind into a Beam counter and, for a local run, this worker's counter file. Made
    where it counts (a DoFn's setup, a model handler's load) so that copies never share a file; CountProgress
    counts elements with it, the model handler the documents each model call finishes."""

    def __init__(self, directory: str | None, kind: str):
        if kind not in KINDS:
            raise ValueError(f"progress kind must be one of {KINDS}, got {kind!r}")
        self.kind = kind
        self.metric = Metrics.counter(METRICS_NAMESPACE, kind)
        self.file = CounterFile(directory) if directory else None

    def add(self, n: int) -> None:
        if n:
            self.metric.inc(n)
            if self.file is not None:
                self.file.add(self.kind, n)

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


class _CountDoFn(beam.DoFn):
    def __init__(self, directory: str | None, kind: str):
        if kind not in KINDS:
            raise ValueError(f"CountProgress kind must be one of {KINDS}, got {kind!r}")
        self.directory = directory
        self.kind = kind
        self.counter: RecordCounter | None = None

    def setup(self):
        self.counter = RecordCounter(self.directory, self.kind)

    def process(self, element):
        self.counter.add(len(element) if isinstance(element, list) else 1)
        return []

    def finish_bundle(self):
        self.counter.flush()

    def teardown(self):
        self.counter.close()


class CountProgress(beam.PTransform):
    """`pcoll | CountProgress(directory, "discovered" | "done")` counts records: an element that is a
    list counts as its length, any other element as one. It outputs nothing.

    Apply it as a side branch (the counted PCollection flows on unchanged). `directory` is a local
    directory for counter files (local runners), or None to count into Beam metrics only.
    """

    def __init__(self, directory: str | None, kind: str):
        super().__init__()
        self.directory = directory
        self.kind = kind

    def expand(self, pcoll):
        return pcoll | beam.ParDo(_CountDoFn(self.directory, self.kind))


def metric_values(result, namespace_prefix: str) -> dict[str, Any]:
    """Counters (value) and distributions (sum/count/min/max) of namespaces starting with the prefix."""
    found: dict[str, Any] = {}
    try:
        query = result.metrics().query(MetricsFilter())
    except Exception:  # a runner without metrics support
        return found
    for kind in ("counters", "distributions", "gauges"):
        for item in query.get(kind, []):
            if not item.key.metric.namespace.startswith(namespace_prefix):
                continue
            value = item.committed if item.committed is not None else item.attempted
            name = f"{item.key.metric.namespace}/{item.key.metric.name}"
            if kind == "counters":
                found[name] = found.get(name, 0) + value
            elif kind == "gauges":  # the latest value (pipeline/telemetry/memory.py: rss_mb_end)
                found[name] = value.value
            else:
                found[name] = {"sum": value.sum, "count": value.count, "min": value.min, "max": value.max}
    return found


def counts_from_metrics(result: Any) -> ProgressCounts:
    """Counts from a PipelineResult's Beam metrics (attempted: they move while a remote job runs)."""
    values = metric_values(result, METRICS_NAMESPACE)
    return ProgressCounts(**{kind: int(values.get(f"{METRICS_NAMESPACE}/{kind}") or 0) for kind in KINDS})


# ---- showing it -------------------------------------------------------------------------------


def rate_and_eta(samples: list[ProgressSample], window_s: float = 10.0) -> tuple[float | None, float | None]:
    """(records/s over the last `window_s`, seconds left for the records discovered so far)."""
    if len(samples) < 2:
        return None, None
    last = samples[-1]
    first = samples[-2]
    for sample in reversed(samples[:-2]):
        if last.t_s - sample.t_s > window_s:
            break
        first = sample
    elapsed = last.t_s - first.t_s
    if elapsed <= 0:
        return None, None
    rate = (last.done - first.done) / elapsed
    remaining = max(last.discovered - last.done, 0)
    if remaining == 0:
        return rate, 0.0
    return rate, (remaining / rate if rate > 0 else None)


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def format_status(sample: ProgressSample, rate: float | None, eta_s: float | None) -> str:
    """'120/500 records (24%) | 12.3 records/s | ETA 0:00:31 | 0:00:10 elapsed': records, as done counts a
    record once it is scored or becomes an error row."""
    total = max(sample.discovered, sample.done)
    if not total:  # the readers have not counted a record yet: a total of 0 and no rate would say nothing true
        return f"no record read yet | {format_duration(sample.t_s)} elapsed"
    percent = f" ({100 * sample.done / total:.0f}%)"
    rate_text = "? records/s" if rate is None else f"{rate:.1f} records/s"
    return (
        f"{sample.done}/{total} records{percent} | {rate_text} | ETA {format_duration(eta_s)}"
        f" | {format_duration(sample.t_s)} elapsed"
    )


# Not rich.progress: it would replace only this one "\r" line, not the counting, and add its own refresh thread
# and rate/ETA beside the ones the log lines and the report's samples use.
def format_bar(sample: ProgressSample, rate: float | None, eta_s: float | None, width: int = 30) -> str:
    total = max(sample.discovered, sample.done)
    filled = int(width * sample.done / total) if total else 0
    return f"[{'#' * filled}{'-' * (width - filled)}] " + format_status(sample, rate, eta_s)


class ProgressReporter:
    """Polls `counts()` every `interval_s` in a thread; a bar on a terminal, a line every `log_every_s` otherwise.

    with ProgressReporter(lambda: read_counter_files(d), display=not no_progress) as reporter:
        pipeline.run().wait_until_finish()
    reporter.write_samples(samples_path(output_dir, run_id))

    With display=False nothing is printed but the samples are still kept for the report.
    """

    def __init__(
        self,
        counts: Callable[[], ProgressCounts],
        *,
        display: bool = True,
        stream: TextIO | None = None,
        interval_s: float = 1.0,
        log_every_s: float = 10.0,
    ):
        self.counts = counts
        self.display = display
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = interval_s
        self.log_every_s = log_every_s
        self.samples: list[ProgressSample] = []
        self.started_at: datetime.datetime | None = None
        self._start = 0.0
        self._last_log = float("-inf")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False
        self._is_terminal = bool(getattr(self.stream, "isatty", lambda: False)())

    def start(self) -> "ProgressReporter":
        self._start = time.monotonic()
        self.started_at = datetime.datetime.now(datetime.timezone.utc)
        self.poll()
        self._thread = threading.Thread(target=self._loop, name="docscore-progress", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.poll(final=True)

    def __enter__(self) -> "ProgressReporter":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def poll(self, final: bool = False) -> ProgressSample:
        """Take one sample now and show it; the thread calls this every interval_s.

        A failing count source (e.g. a metrics query while a remote job starts) repeats the last
        counts: progress must never break a run.
        """
        try:
            counts = self.counts()
        except Exception as e:  # noqa: BLE001 - progress is best effort by design
            if not self._warned:
                logging.getLogger(__name__).warning("progress: reading the counts failed (%s); showing the last known", e)
                self._warned = True
            last = self.samples[-1] if self.samples else ProgressSample(0.0, 0, 0)
            counts = ProgressCounts(last.discovered, last.done)
        with self._lock:
            sample = ProgressSample(time.monotonic() - self._start, counts.discovered, counts.done)
            self.samples.append(sample)
            if self.display:
                self._show(sample, final)
        return sample

    def _show(self, sample: ProgressSample, final: bool) -> None:
        rate, eta_s = rate_and_eta(self.samples)
        if final:
            rate = sample.done / sample.t_s if sample.t_s > 0 else None  # whole-run average
        if self._is_terminal:
            self.stream.write("\r" + format_bar(sample, rate, eta_s) + ("\n" if final else ""))
            self.stream.flush()
        elif final or sample.t_s - self._last_log >= self.log_every_s:
            stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            self.stream.write(f"{stamp} docscore progress: {format_status(sample, rate, eta_s)}\n")
            self.stream.flush()
            self._last_log = sample.t_s

    def write_samples(self, path: str, launch_id: str | None = None) -> str:
        """Write the time series (for the report's throughput chart) as JSON to `path`."""
        write_samples(path, self.samples, self.started_at, self.interval_s, launch_id)
        return path


# ---- wiring it to a pipeline run ----------------------------------------------------------------

LOCAL_RUNNERS = (None, "DirectRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner", "PrismRunner", "FnApiRunner",
                 "TestDirectRunner")
_LOCAL_RUNNER_NAMES = {runner.lower(): runner for runner in LOCAL_RUNNERS if runner}


def runner_name(runner: Any) -> str:
    """--runner as Beam's class name, whichever of Beam's spellings was given (direct, Direct, a class path, a
    runner object): "DirectRunner" for all of those and for no --runner, "DataflowRunner" for dataflow."""
    if runner is None:
        return "DirectRunner"
    name = (runner if isinstance(runner, str) else type(runner).__name__).rpartition(".")[2]
    name = name if name.lower().endswith("runner") else f"{name[:1].upper()}{name[1:]}Runner"
    return _LOCAL_RUNNER_NAMES.get(name.lower(), name)


def runs_locally(options: PipelineOptions) -> bool:
    """The job runs in or beside this process (DirectRunner and friends), so the launcher waits for it.
    Lives here, beside LOCAL_RUNNERS, so that launch.py, graph.py, validate.py and dataflow_checks.py import it downwards."""
    return runner_name(options.view_as(StandardOptions).runner) in LOCAL_RUNNERS


def direct_workers(direct_num_workers: int | None) -> int:
    """How many workers the DirectRunner runs for --direct_num_workers: unset 1, 0 one per CPU core (as
    Beam's FnApiRunner counts them)."""
    if direct_num_workers is None:
        return 1
    return int(direct_num_workers) or multiprocessing.cpu_count()


COUNTER_DIR_PREFIX = "docscore-progress-"  # then the owner's pid, "-" and mkdtemp's random part
OWNER_FILE = "owner"  # {"pid", "create_time", "host"} of the launcher that made the folder (not *.json: not counted)


def local_counter_dir(options: PipelineOptions) -> str | None:
    """A fresh temporary directory for counter files when the runner runs on this machine, else None (and None with a
    warning when the temporary directory cannot take one). The folders of earlier runs whose launcher is gone (killed
    runs never remove theirs) are removed first."""
    if not runs_locally(options):
        return None
    remove_dead_counter_dirs()
    me = psutil.Process()
    owner = {"pid": me.pid, "create_time": me.create_time(), "host": socket.gethostname()}
    directory = None
    try:
        directory = tempfile.mkdtemp(prefix=f"{COUNTER_DIR_PREFIX}{me.pid}-")
        with open(os.path.join(directory, OWNER_FILE), "w") as f:
            json.dump(owner, f)
    except OSError as e:  # a full temporary directory: the progress is counted from Beam's metrics instead
        if directory:
            shutil.rmtree(directory, ignore_errors=True)
        logging.getLogger(__name__).warning("progress: no counts can be kept in the temporary directory %s (%s: %s); "
                                            "the run goes on, its progress shown only at its end",
                                            tempfile.gettempdir(), type(e).__name__, e)
        return None
    return directory


def remove_dead_counter_dirs(root: str | None = None) -> list[str]:
    """Remove the counter folders in `root` (the temporary directory) whose owner file names a launcher of this
    host that is no longer running (its pid is gone, or went to a process started after it: _is_running);
    returns their paths. Symlinks, other users' folders and folders without a readable owner file are left."""
    root = root or tempfile.gettempdir()
    try:
        entries = [e for e in os.scandir(root) if e.name.startswith(COUNTER_DIR_PREFIX)]
    except OSError:
        return []
    removed = []
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            owner = _read_owner(entry.path)
        except OSError:  # gone meanwhile (another run's start removed it)
            continue
        if owner is None or owner.get("host") != socket.gethostname() or _is_running(owner):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)  # rmtree never follows symlinks inside the folder
        removed.append(entry.path)
    return removed


def _read_owner(directory: str) -> dict | None:
    try:
        handle = os.open(os.path.join(directory, OWNER_FILE), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        with os.fdopen(handle) as f:
            owner = json.load(f)
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) and isinstance(owner.get("pid"), int) else None


def _is_running(owner: dict) -> bool:
    """Whether the owner's process still runs: its pid exists and did not go to a process started well after the
    owner (the margin: create_time follows the system clock, which may be stepped)."""
    try:
        started = psutil.Process(owner["pid"]).create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # exists but cannot be inspected: assume it is the owner
        return True
    recorded = owner.get("create_time")
    return not isinstance(recorded, (int, float)) or started < recorded + 60.0


def run_with_progress(
    pipeline: beam.Pipeline,
    counter_dir: str | None,
    *,
    display: bool = True,
    stream: TextIO | None = None,
    interval_s: float = 1.0,
    log_every_s: float = 10.0,
) -> tuple[Any, ProgressReporter]:
    """Run `pipeline` to completion while reporting progress; returns (PipelineResult, reporter).

    Counts come from the counter files in `counter_dir` (local runners, where run() blocks), or
    else from the job's Beam metrics once run() has returned (remote runners). The counter
    directory is removed at the end.
    """
    started: dict[str, Any] = {}

    def counts() -> ProgressCounts:
        if counter_dir:
            return read_counter_files(counter_dir)
        if "result" in started:
            return counts_from_metrics(started["result"])
        return ProgressCounts()

    try:
        with ProgressReporter(counts, display=display, stream=stream, interval_s=interval_s, log_every_s=log_every_s) as reporter:
            started["result"] = result = pipeline.run()
            result.wait_until_finish()
    finally:
        if counter_dir:
            shutil.rmtree(counter_dir, ignore_errors=True)
    return result, reporter


# ---- the time series on disk ------------------------------------------------------------------


def samples_path(output_dir: str, run_id: str) -> str:
    return posixpath.join(run_commit.partition(output_dir, "runs", run_id), SAMPLES_FILE)


def write_samples(
    path: str,
    samples: Iterable[ProgressSample],
    started_at: datetime.datetime | None,
    interval_s: float,
    launch_id: str | None = None,
) -> None:
    """The samples as JSON, written whole or not at all, naming the launch they belong to."""
    from pipeline.io.run_commit import write_atomic

    data = {
        "launch_id": launch_id,
        "started_at": started_at.isoformat() if started_at else None,
        "interval_s": interval_s,
        "samples": [dataclasses.asdict(s) for s in samples],
    }
    write_atomic(path, json.dumps(data).encode())


def read_samples(path: str, launch_id: str | None = None) -> list[ProgressSample]:
    """The samples a run wrote; [] when it wrote none (a run from before progress existed, a remote run), when
    they are another launch's than `launch_id` (a rerun that died after its commit, before writing its
    own), or when the file cannot be read: the report then draws no throughput chart rather than a wrong one."""
    fs, fs_path = fsspec.core.url_to_fs(path)
    try:
        with fs.open(fs_path, "r") as f:
            data = json.load(f)
        if launch_id is not None and data.get("launch_id") not in (None, launch_id):
            return []
        return [ProgressSample(**s) for s in data.get("samples", [])]
    except (OSError, ValueError, TypeError, AttributeError):
        return []
