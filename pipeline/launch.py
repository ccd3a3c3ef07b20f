"""`docscore run`: parse -> validate (exit 2) -> build the Beam graph (pipeline/graph.py), whose last step
publishes the tables and summary.json (pipeline/runs/publish.py) -> run -> wait (not for a job only written down:
--template_location, --dry_run) -> add the job's Beam metrics -> the gates -> print where the tables are.
Must not hold reading, scoring or writing logic (their modules do), nor build graph steps (pipeline/graph.py).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import gc
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import fsspec
import psutil
from apache_beam.options.pipeline_options import DirectOptions, StandardOptions

from models.memory_room import format_bytes
from pipeline.graph import build_pipeline
from pipeline.interrupt import end_without_shutdown, exit_on_interrupt, how_ended
from pipeline.io import run_commit, run_lease, sinks, sources
from pipeline.options import ConfigError, EvalOptions, given_option_names, parse_options
from pipeline.runs import publish
from pipeline.runs.summary import with_launcher_compiles
from pipeline.telemetry import progress
from pipeline.telemetry.progress import direct_workers, metric_values, runner_name, runs_locally
from pipeline.telemetry.stats import SHARD_SOURCES_KEPT, error_fraction
from pipeline.process_setup import (CpuTuning, apply_cpu_tuning, check_compilation_cache, compilation_cache_dir,
                                    compilation_cache_setting, read_only_cache_notice)
from pipeline.telemetry.timing import STAGES
from pipeline.validate import validate
from pipeline.worker_watch import ending_a_job_that_lost_a_worker

DIRECT_FLAGS = {"direct_running_mode", "direct_num_workers"}


def use_local_threads(options: beam.options.pipeline_options.PipelineOptions, threads: int, given: set[str]) -> int:
    """A local DirectRunner run whose flags set neither --direct_running_mode nor --direct_num_workers runs
    `threads` parallel bundles in this process (threads sharing its one model: while one thread's batch is
    on the device, others read, tokenize and score). Returns the parallel bundles the run has (the flags'
    threads or processes: --direct_num_workers in every mode, in-memory too, where Beam runs that many bundles on
    threads); `threads` for a remote runner, whose workers choose."""
    if runner_name(options.view_as(StandardOptions).runner) != "DirectRunner":
        return threads
    direct = options.view_as(DirectOptions)
    if threads > 1 and not given & DIRECT_FLAGS:
        direct.direct_running_mode, direct.direct_num_workers = "multi_threading", threads
    return direct_workers(direct.direct_num_workers)


PREALLOCATE_ENV = "XLA_PYTHON_CLIENT_PREALLOCATE"


def share_device_memory(options: beam.options.pipeline_options.PipelineOptions) -> bool:
    """A local multi_processing run starts a JAX client in every worker process, beside the launcher's own
    (validation loads the model): on a GPU each would take 75% of its memory up front (JAX's default), so
    the second process could not start. They allocate as they go instead, unless PREALLOCATE_ENV is set.
    Call before JAX starts in this process; the workers inherit the environment. True when it was set."""
    if options.view_as(DirectOptions).direct_running_mode != "multi_processing" or PREALLOCATE_ENV in os.environ:
        return False
    os.environ[PREALLOCATE_ENV] = "false"
    return True


@contextlib.contextmanager
def launcher_objects_frozen() -> Iterator[None]:
    """While the job runs, Python's cyclic garbage collector skips the objects that exist when it starts
    (modules, the model, the Beam graph: about 500k, nearly all alive until the launcher exits) and scans
    only what the job creates. Otherwise each full collection during the job rescans them all
    (benchmarks/pipeline_overhead.py --model real measures it: job_gc_s). Unfrozen when the job ends, so a process
    that launches several runs (tests, notebooks) can collect what they left behind."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def temporary_files_in(directory: str) -> Iterator[None]:
    """Python's temporary files and folders are made in `directory` meanwhile (tempfile.tempdir)."""
    before = tempfile.tempdir
    tempfile.tempdir = directory
    try:
        yield
    finally:
        tempfile.tempdir = before


def shadow_gate_failure(summary: dict[str, Any]) -> str | None:
    """The message of a failed shadow gate, or None (no shadow kernel, within tolerance, or nothing shadowed)."""
    gate = summary.get("shadow")
    if gate is None or gate.get("passed") is not False:
        return None
    nan = gate.get("documents_nan") or 0
    nan_text = f"; {nan} of them NaN from the shadow kernel alone" if nan else ""
    return (
        f"shadow gate FAILED: {gate['documents_over_tolerance']} of {gate['documents']} shadowed documents differ by "
        f"more than the tolerance {gate['tolerance']:g} (max |output difference| {gate['output_max_abs_diff']:.3g} over "
        f"the others, {gate['worst_ratio_to_tolerance']:.3g}x the tolerance{nan_text}) between "
        f"{summary['kernel']['resolved']} and the shadow "
        f"{gate['impl']}; the outputs are published for inspection (scores columns shadow_*); fix the kernel, or pass "
        f"--shadow_tolerance only if this difference is expected"
    )


def shadow_gate_not_run(summary: dict[str, Any]) -> str | None:
    """Why a run with a shadow kernel compared no document (its gate neither passed nor failed), or None."""
    gate = summary.get("shadow")
    if gate is None or gate.get("documents"):
        return None
    if not summary["counts"]["scored"]:
        why = "no document was scored, so none was run through it"
    else:
        why = (f"--shadow_fraction={gate['fraction']:g} chose none of this run's batches (a hash of each batch's "
               f"documents picks about that share of them; {summary['counts']['scored']} documents were scored)")
    return (f"shadow gate NOT RUN: the shadow kernel {gate['impl']} compared 0 documents: {why}; raise "
            f"--shadow_fraction (1 shadows every batch) to check {summary['kernel']['resolved']} against it")


GATE_EXIT_CODES = {"shadow": 3, "error_fraction": 4}  # the first failed gate, in this order, is the exit code


def run_gates(summary: dict[str, Any], max_error_fraction: float) -> dict[str, dict[str, Any]]:
    """The summary's "gates" section, from fields the summary already has: each gate's limit, its value, whether
    it passed (True, False, or None when it did not run) and, unless it passed, the message saying what to do."""
    counts = summary["counts"]
    value = error_fraction(counts["records"], counts["errors"])
    failure = error_fraction_failure(summary, max_error_fraction)
    if value is None:
        failure = ("no record was read (the input's files hold none), so --max_error_fraction had nothing to check and "
                   "the tables are empty: check that --input names the data you meant")
    gates = {"error_fraction": {
        "limit": max_error_fraction, "value": value, "errors": counts["errors"], "records": counts["records"],
        "passed": None if value is None else failure is None, "message": failure,
    }}
    shadow = summary.get("shadow")
    if shadow is not None:
        gates = {"shadow": {
            # the worst document's |difference| over max(1, |output|), the measure the tolerance bounds
            "limit": shadow["tolerance"],
            "value": shadow["worst_ratio_to_tolerance"] * shadow["tolerance"] if shadow["documents"] else None,
            "documents": shadow["documents"], "documents_over_tolerance": shadow["documents_over_tolerance"],
            "passed": shadow["passed"], "message": shadow_gate_failure(summary) or shadow_gate_not_run(summary),
        }, **gates}
    return gates


def with_gates(summary: dict[str, Any], max_error_fraction: float) -> dict[str, Any]:
    """The summary with its "gates" section, and a gate that did not run among its notices."""
    gates = run_gates(summary, max_error_fraction)
    not_run = [gate["message"] for gate in gates.values() if gate["passed"] is None and gate["message"]]
    notices = list(summary.get("notices") or [])
    return {**summary, "gates": gates, "notices": notices + [m for m in not_run if m not in notices]}


def failed_gates(summary: dict[str, Any]) -> list[tuple[int, str]]:
    """(exit code, message) of each failed gate of a summary with gates (with_gates), in exit code order."""
    gates = summary["gates"]
    return [(code, gates[name]["message"]) for name, code in GATE_EXIT_CODES.items()
            if name in gates and gates[name]["passed"] is False]


class DefaultsShownParser(argparse.ArgumentParser):
    """Adds "(default: X)" to a flag's help unless it has no default or its help already says it (through
    add_argument, public API: argparse's formatter methods are not)."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        text = kwargs.get("help") or ""
        default = kwargs.get("default", False if kwargs.get("action") == "store_true" else None)  # a switch's: False
        if default not in (None, argparse.SUPPRESS) and "default" not in text.lower():
            kwargs["help"] = f"{text} (default: %(default)s)"
        return super().add_argument(*args, **kwargs)


def print_help() -> None:
    parser = DefaultsShownParser(
        prog="docscore run",
        description="Score document shards with a Flax model on Beam. Any Beam option (--runner, "
        "--direct_num_workers, --direct_running_mode, --project, ...) is accepted as well.",
    )
    EvalOptions._add_argparse_args(parser)
    parser.add_argument("--labels", help='classify labels "name=description;name=description" (in --config: a mapping; '
                        "--task classify only)")
    parser.print_help()


def process_start_time() -> float:
    """When this process started, on time.monotonic()'s clock (which a step of the system clock does not move: a
    command's time is its own), to the 10 ms of a clock tick: its age from Linux's /proc/self/stat (start in ticks
    since boot) and the clock since boot. Elsewhere from psutil's create_time, on the system clock to a second."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()  # the fields after the command name, from field 3
        started = int(fields[22 - 3]) / os.sysconf("SC_CLK_TCK")
        return time.monotonic() - (time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic() - (time.time() - psutil.Process().create_time())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print_help()
        return 0
    phase_starts = {"start": process_start_time(), "validate": time.monotonic()}  # summary.COMMAND_PHASES
    with exit_on_interrupt(lambda: "docscore run: interrupted before the job started; nothing was published"):
        return launch(argv, phase_starts)


def launch(argv: list[str], phase_starts: dict[str, float]) -> int:
    """Validate, take the run's lease, then run_and_report under an interrupt handler that knows the run
    (phase_starts: when the command's phases began, for the summary; this adds the later ones)."""
    try:
        options, eo = parse_options(argv)
        share_device_memory(options)
        cache = compilation_cache_dir(eo.cache_dir)
        try:
            unwritable = check_compilation_cache(cache)  # before anything is exported or configured for it
        except OSError as e:
            raise ConfigError(f"{compilation_cache_setting(eo.cache_dir)}: cannot hold the compilation cache {cache} "
                              f"({type(e).__name__}: {e}); choose a directory you can write to") from None
        apply_cpu_tuning(CpuTuning(dtype=eo.dtype, cache_dir=eo.cache_dir))  # before validate starts jax
        plan = validate(eo)
        if unwritable:
            plan = dataclasses.replace(plan, notices=(*plan.notices, read_only_cache_notice(eo.cache_dir, cache,
                                                                                             unwritable)))
    except ConfigError as e:
        print(f"docscore run: {e}", file=sys.stderr)
        return 2
    phase_starts["prepare"] = time.monotonic()
    bundles = use_local_threads(options, plan.batch.local_threads, given_option_names(argv))
    plan = dataclasses.replace(plan, batch=dataclasses.replace(plan.batch, local_threads=bundles))  # what runs
    for notice in plan.notices:
        print(f"docscore run: note: {notice}", file=sys.stderr)
    staging_root = eo.get_all_options().get("temp_location") if eo.output.startswith(sinks.BQ_PREFIX) else None
    out = sinks.OutputSpec.for_run(eo.output, eo.run_id, eo.output_format, staging_root)
    why_not_wait = publish.submit_only(options)
    lease = None
    # from the lease on, an interrupt releases it (the handler reads `lease` and `out` when it runs); the release
    # after the run is inside too, so an interrupt while a gs:// lease is deleted says whether the run was published
    with exit_on_interrupt(lambda: interrupted(options, eo, out, lease), lock=run_commit.COMMIT_LOCK):
        try:
            if not why_not_wait and not eo.output.startswith(sinks.BQ_PREFIX):
                try:
                    lease = run_lease.acquire(eo.output, eo.run_id, out.launch)
                except run_lease.LeaseHeld as e:
                    print(f"docscore run: {e}", file=sys.stderr)
                    return 2
                except OSError as e:  # a lock file another user made, a read-only _leases/: nothing was read
                    print(f"docscore run: --output {eo.output}: cannot take run {eo.run_id}'s lease "
                          f"{run_lease.lease_path(eo.output, eo.run_id)} ({type(e).__name__}: {e}); make it writable "
                          "for this user, or choose another --output", file=sys.stderr)
                    return 2
                out = dataclasses.replace(out, leased=True)
                for left in run_lease.remove_stale(eo.output, own_launch=out.launch):
                    print(f"docscore run: note: removed {left}, left by a launch that did not finish", file=sys.stderr)
                run_lease.remove_replaced(eo.output, eo.run_id, own_launch=out.launch)
                damaged = damaged_summary(eo.output, eo.run_id)
                if damaged:
                    print(f"docscore run: note: {damaged}; this launch replaces it", file=sys.stderr)
            return run_and_report(options, eo, plan, out, why_not_wait, phase_starts)
        finally:
            if lease is not None:
                lease.release()


# Beam's local temporary directories of this process's pipelines (Pipeline.local_tempdir), which interrupted() removes.
PIPELINE_TEMPDIRS: list[str] = []


def interrupted(options, eo: EvalOptions, out: sinks.OutputSpec, lease: run_lease.Lease | None = None) -> str:
    """What an interrupt leaves: a local launch that had not committed removes its files and releases its
    lease (the process ends with os._exit, past launch()'s own release: a gs:// lease would hold the run_id
    until it expired); a remote job is not cancelled (it publishes its own tables)."""
    ended = how_ended()  # "interrupted", unless worker_watch ended a job that could not finish
    for tempdir in PIPELINE_TEMPDIRS:
        shutil.rmtree(tempdir, ignore_errors=True)
    if eo.output.startswith(sinks.BQ_PREFIX):
        return f"docscore run {eo.run_id}: {ended}; BigQuery publishes in one transaction: check {eo.output}"
    committed = (run_commit.summary_to_replace(eo.output, eo.run_id) or {}).get(run_commit.LAUNCH_KEY) == out.launch
    if runs_locally(options) and not committed:
        run_commit.discard_launch(eo.output, eo.run_id, out.launch, out.staging)
    if lease is not None:
        lease.release()
    else:  # the interrupt may have come inside run_lease.acquire, after its write
        run_lease.release_if_held_by(eo.output, eo.run_id, out.launch)
    what = (("the run was published before the interrupt" if ended == "interrupted" else "the run was published before it ended")
            if committed else
            "nothing was published: the previous run of this run_id, if any, is what readers see")
    if committed and not report_written(eo.output, eo.run_id):  # the interrupt came between the commit and the report
        what += (f", without its report and the launcher's additions to its summary (Beam metrics, gates): write the "
                 f"report with `docscore report {eo.output} --run_id {eo.run_id}`")
    if not runs_locally(options):
        what += "; the job itself was not cancelled and publishes when it finishes"
    return f"docscore run {eo.run_id}: {ended}; {what}"


def damaged_summary(output: str, run_id: str) -> str | None:
    """Why the run's committed summary.json is damaged (run_commit.DamagedSummary), or None."""
    try:
        run_commit.committed_summary(output, run_id)
    except run_commit.DamagedSummary as e:
        return str(e)
    return None


def report_written(output: str, run_id: str) -> bool:
    """Whether the run's report.html exists (a launch sets the old one aside before its commit)."""
    try:
        fs, path = fsspec.core.url_to_fs(run_commit.report_path(output, run_id))
        return fs.exists(path)
    except Exception:  # an unreachable store: say nothing more than before
        return True


def job_error_text(error: Exception) -> str:
    """'Type: message' of a failed job's error in one line. A worker thread's or process's error reaches the
    launcher as a RuntimeError whose message is the worker's whole traceback (Beam has already printed it):
    its last line names the error."""
    text = str(error)
    if "Traceback (most recent call last)" in text:
        lines = [line for line in text.strip().splitlines() if line.strip()]
        return lines[-1].strip() if lines else type(error).__name__
    return f"{type(error).__name__}: {text}"


def run_and_report(options, eo: EvalOptions, plan, out: sinks.OutputSpec, why_not_wait: str | None,
                   phase_starts: dict[str, float]) -> int:
    """Build and run the job, wait for it, enrich what it committed, print where the tables are; the exit code."""
    started = time.time()
    p = beam.Pipeline(options=options)
    PIPELINE_TEMPDIRS.append(p.local_tempdir)  # Beam removes it when run() returns; an interrupt's os._exit skips that
    counter_dir = progress.local_counter_dir(options)
    build_pipeline(p, eo, plan, out, counter_dir, started)
    if why_not_wait:  # nothing to wait for here; the job publishes its own tables when it runs
        try:
            # Beam's Dataflow runner stages the job's dependencies from a folder it makes and never removes; made in
            # the pipeline's own temporary folder, it goes when Beam removes that as run() returns
            with temporary_files_in(p.local_tempdir):
                p.run()
        except Exception as e:  # Beam builds, stages and submits the job here: its refusals are one line too
            print(f"docscore run {eo.run_id}: the job was not built or submitted ({job_error_text(e)}); nothing was "
                  "published", file=sys.stderr)
            return 1
        print(publish.submitted_message(eo.run_id, out, why_not_wait, publish.plan_line(eo, plan)))
        return 0
    failed = None
    try:
        phase_starts["job"] = time.monotonic()
        with launcher_objects_frozen(), ending_a_job_that_lost_a_worker(eo.run_id):
            result, reporter = progress.run_with_progress(p, counter_dir, display=not eo.no_progress)
        phase_starts["launcher"] = time.monotonic()
        if result.state not in (None, "DONE"):
            failed = f"the pipeline ended in state {result.state}"
    except Exception as e:
        failed = f"the pipeline failed ({job_error_text(e)})"
    if failed:  # Beam leaves the job's other bundles running on its threads, maybe inside a model call
        end_without_shutdown()
    committed = launch_committed(eo, out) if failed and not eo.output.startswith(sinks.BQ_PREFIX) else False
    if failed and committed is not False:  # it failed after its commit (the store lost while cleaning up), or may have
        print(f"docscore run {eo.run_id}: {failed}, "
              + ("after the run was published" if committed else
                 "and whether the run was published cannot be checked (its summary cannot be read)")
              + f"; the launcher's additions to its summary (Beam metrics, command time, gates) and the report were not "
              f"written (`docscore report {eo.output}/runs/run_id={eo.run_id}` writes the report)", file=sys.stderr)
        return unwritten_gates_exit(eo) if committed else 1
    if failed:  # the job did not commit: the previous run stays what readers see
        left = ""
        if not eo.output.startswith(sinks.BQ_PREFIX) and runs_locally(options):
            try:
                run_commit.discard_launch(eo.output, eo.run_id, out.launch, out.staging)
            except Exception as e:  # the store the job lost: what it placed goes at the run_id's next launch
                left = (f"; its files could not be removed ({type(e).__name__}: {str(e)[:200]}): the next launch of "
                        "this run_id removes them")
        print(f"docscore run {eo.run_id}: {failed}; nothing was published (the previous run of this run_id, "
              f"if any, is what readers see){left}{no_space_hint(eo.output, failed)}", file=sys.stderr)
        return 1
    # the job committed the run; add what only the launcher knows, the gates' outcomes included, before
    # the report is derived from it
    published = sinks.published_paths(out)
    judged: list[dict[str, Any]] = []  # the summary with its gates, once judged: its exit code stands if writing it fails

    def finish(committed_summary: dict[str, Any]) -> dict[str, Any]:
        judged.append(with_gates(committed_summary, eo.max_error_fraction))
        return judged[-1]

    try:
        metrics = with_launcher_compiles(metric_values(result, "docscore"), plan.kernel, plan.compiles)
        summary = publish.enrich_published_summary(out, metrics, phase_starts, finish=finish)
    except publish.HistoryRowNotRewritten as e:  # the summary has everything: the report can still be written
        print(f"docscore run {eo.run_id}: note: the run and its summary are published, but its history row was not "
              f"rewritten ({e}): the history table shows the run without the launcher's Beam metrics, command time "
              "and gates, which summary.json holds", file=sys.stderr)
        summary = e.summary
    except Exception as e:  # the run is committed; only the launcher's additions are missing
        print(f"docscore run {eo.run_id}: the run is published, but the launcher's additions to its summary "
              f"(Beam metrics, command time, gates) and the report were not written ({type(e).__name__}: "
              f"{str(e)[:300]}); `docscore report {eo.output}/runs/run_id={eo.run_id}` writes the report",
              file=sys.stderr)
        return unwritten_gates_exit(eo, judged[-1] if judged else None)
    if summary is None:  # BigQuery: the run's summary is its PREFIX_runs row
        print(f"docscore run {eo.run_id}: published " + ", ".join(published.values()))
        return 0
    try:
        reporter.write_samples(progress.samples_path(eo.output, eo.run_id), out.launch)
    except Exception as e:  # the run is committed: its exit code must not say the job failed
        if not (isinstance(e, OSError) or sources.is_transient(e)):
            raise
        print(f"docscore run {eo.run_id}: note: the run is published, but its progress samples (the report's "
              f"throughput chart) were not written to {progress.samples_path(eo.output, eo.run_id)} "
              f"({type(e).__name__}: {str(e)[:300]})", file=sys.stderr)
    derived = publish.write_derived(out, summary)  # the report
    if "report" in derived:
        published["report"] = derived["report"]
    print_report(summary, published)
    for gate in summary["gates"].values():
        if gate["passed"] is None and gate["message"]:
            print(f"docscore run {eo.run_id}: note: {gate['message']}", file=sys.stderr)
    failures = failed_gates(summary)
    for _, message in failures:
        print(f"docscore run {eo.run_id}: {message}", file=sys.stderr)
    return failures[0][0] if failures else 0


NO_SPACE = tuple(f"[Errno {code}] {os.strerror(code)}" for code in (errno.ENOSPC, errno.EDQUOT))


def no_space_hint(output: str, failure: str) -> str:
    """For a job that failed for want of disk space (ENOSPC or a quota, which name no file): where it writes on this
    machine, --output's tables and the temporary directory's files, with the room each has now (this launch's files
    removed), and the fix; "" for any other failure."""
    if not any(text in failure for text in NO_SPACE):
        return ""
    places, seen = [], set()
    protocol, output_path = fsspec.core.split_protocol(output)
    candidates = ([(f"--output {output}", output_path)] if protocol in (None, "file") else []) + [
        (f"the temporary directory {tempfile.gettempdir()} (TMPDIR)", tempfile.gettempdir())]
    for name, path in candidates:
        path = os.path.abspath(path)
        while not os.path.exists(path) and path != os.path.dirname(path):
            path = os.path.dirname(path)
        try:
            device, free = os.stat(path).st_dev, shutil.disk_usage(path).free
        except OSError:
            continue
        if device not in seen:
            seen.add(device)
            places.append(f"{name} ({format_bytes(free)} free now)")
    where = " and ".join(places) or "its output"
    return f"; a disk it writes to is full: {where}; free space there, or choose another --output (or TMPDIR), and run again"


def launch_committed(eo: EvalOptions, out: sinks.OutputSpec) -> bool | None:
    """Whether this launch's run is the committed one (a job can fail after its commit); None when the committed
    summary cannot be read (the store the job lost)."""
    try:
        summary = run_commit.committed_summary(eo.output, eo.run_id)
    except Exception:  # the store the job lost, or a damaged summary: not known, and the caller says so
        return None
    return summary is not None and summary.get(run_commit.LAUNCH_KEY) == out.launch


def unwritten_gates_exit(eo: EvalOptions, judged: dict[str, Any] | None = None) -> int:
    """The gates of a committed run whose summary could not be given them: judged on `judged` (the summary with its
    gates, as the launcher worked them out before writing it failed) or else on the summary as committed, so a
    scheduler still sees a failed gate's exit code (0 when even that summary cannot be read)."""
    summary = judged
    if summary is None:
        try:
            summary = run_commit.committed_summary(eo.output, eo.run_id)
        except Exception:  # the store is gone too: nothing more to judge
            return 0
    if summary is None:
        return 0
    failures = failed_gates(with_gates(summary, eo.max_error_fraction))
    for _, message in failures:
        print(f"docscore run {eo.run_id}: {message}", file=sys.stderr)
    return failures[0][0] if failures else 0


def error_fraction_failure(summary: dict[str, Any], max_fraction: float) -> str | None:
    """The message of a run whose error rows are more than max_fraction of its records, or that has a shard not
    read to its end while max_fraction is under 1 (both, when both hold); None when the gate passes."""
    counts = summary["counts"]
    if not counts["records"]:
        return None
    shards = _shards_not_read(counts) if max_fraction < 1 else ""
    lost = (f"{shards} (the errors table's rows without a record_index say why: a corrupt or truncated file, one "
            "that cannot be opened, an ambiguous column); records it did not give are in neither table, so the error "
            "fraction undercounts them") if shards else ""
    published = "the tables and summary are published"
    fraction = error_fraction(counts["records"], counts["errors"])
    if fraction > max_fraction:
        common = sorted(counts["errors_by_type"].items(), key=lambda kv: -kv[1])[:3]
        too_many = (f"{counts['errors']} of {counts['records']} records ({fraction:.1%}) "
                    f"are error rows, more than --max_error_fraction={max_fraction:g} (most: "
                    f"{', '.join(f'{k} {n}' for k, n in common)})")
        if lost:  # a raised fraction under 1 would still fail on the shard: say so
            return (f"{too_many}; and {lost}; {published}: read the errors table and fix the input (the shard as its "
                    "row says), or pass --max_error_fraction 1 to accept both")
        model_side = {"infer/nan_output", "infer/zero_output"}
        if common and common[0][0] in model_side:  # overflow inside the model: its weights or --dtype, not the input
            return (f"{too_many}; {published}: values overflowed inside the model for most of them: check the model's "
                    "weights and --dtype (float32 has the widest range), or raise --max_error_fraction")
        return f"{too_many}; {published}: read the errors table, fix the input, or raise --max_error_fraction"
    if lost:  # a damaged file is one error row however many of its records were lost
        return f"{lost}; {published}: fix or remove the file as its row says, or pass --max_error_fraction 1 to accept the loss"
    return None


def _shards_not_read(counts: dict[str, Any]) -> str:
    """"N shards could not be read to the end: a, b, c and K more", or "" when none. counts.shard_errors counts rows,
    and one shard may give two (a .gz cut while the run read it: shard_changed and corrupt_file), so where the summary
    names every such shard (fewer than SHARD_SOURCES_KEPT) the names are counted; where it names the first
    SHARD_SOURCES_KEPT the count is a lower bound; a summary older than the names has only the rows."""
    rows, named = counts.get("shard_errors") or 0, counts.get("shard_error_sources") or []
    if not rows:
        return ""
    if named and len(named) >= SHARD_SOURCES_KEPT:
        shards, more = f"{len(named)} or more shards ({rows} whole-shard error rows)", " and more"
    else:
        count = len(named) or rows
        shards = f"{count} shard{'s' if count > 1 else ''}"
        more = f" and {count - 3} more" if len(named) > 3 else ""
    listed = f": {', '.join(named[:3])}{more}" if named else ""
    return f"{shards} could not be read to the end{listed}"


def _shown(value: float | None, spec: str) -> str:
    """A summary number as printed; "-" where the summary has none (no documents: no percentiles, no rate)."""
    return "-" if value is None else format(value, spec)


def print_report(summary: dict[str, Any], published: dict[str, str]) -> None:
    counts = summary["counts"]
    print(f"docscore run {summary['run_id']}: {counts['scored']} scored, {counts['errors']} errors "
          f"({counts['records']} records) in {summary.get('command_wall_s', summary['wall_s']):.1f}s "
          f"({summary['wall_s']:.1f}s pipeline) "
          f"[{summary['model']['name']}, attention={summary['kernel']['resolved']}, task={summary['task']}]")
    for name, path in published.items():
        print(f"  {name:<8} {path}")
    replaced = summary.get(run_commit.RETIRED_KEY) or []
    if replaced:
        print(f"  note: the folders above still hold the files of {len(replaced)} replaced launch"
              f"{'es' if len(replaced) > 1 else ''} of this run_id (kept {run_commit.REPLACED_GRACE_S / 60:.0f} minutes "
              "for readers of the old summary, removed by a later launch): read this run through its summary "
              "(docscore report/compare, the views in docs/queries.md), not by listing a folder")
    stages = summary["timing"]["stages"]
    print("  stage ms  " + "  ".join(
        f"{s}: p50 {_shown(stages[s].get('p50'), '.1f')} p95 {_shown(stages[s].get('p95'), '.1f')}"
        for s in STAGES if s in stages))
    print(f"  throughput {summary['throughput']['docs_per_s']:.1f} docs/s, {summary['throughput']['tokens_per_s']:.0f} tokens/s; "
          f"padding efficiency {_shown(summary['tokens']['padding_efficiency'], '.2f')}; compiles {summary['compile']['count']}")
    device, batching = summary.get("device") or {}, summary.get("batching") or {}
    if device.get("busy_s") is not None:
        busy = (f"({device['busy_fraction']:.0%} of the pipeline), host {_shown(device['host_us_per_doc'], '.0f')} us/doc"
                if device.get("busy_fraction") is not None else
                f"summed over {device.get('busy_processes') or 'the'} worker processes")
        print(f"  device busy {device['busy_s']:.1f}s {busy}; batch_size {batching.get('batch_size')}, "
              f"{batching.get('calls_per_beam_batch')} calls per Beam batch; compiles {summary['compile']['cold_count']} "
              f"cold ({summary['compile']['cold_ms'] / 1000:.1f}s), {summary['compile']['cached_count']} cached")
    memory = summary.get("memory") or {}
    if memory.get("peak_rss_mb") is not None:
        print(f"  memory rss MB start {memory.get('start_rss_mb')} peak {memory['peak_rss_mb']} end {memory.get('end_rss_mb')}"
              f"; duplicate doc_ids {counts.get('duplicate_doc_ids', 0)}")
    gate = summary.get("shadow")
    if gate:
        print(f"  shadow {gate['impl']} on {gate['documents']} documents ({gate['batches']} batches): max |output diff| "
              f"{_shown(gate['output_max_abs_diff'], '.3g')}, max |score diff| {_shown(gate['score_max_abs_diff'], '.3g')}, tolerance "
              f"{gate['tolerance']:g} -> {({True: 'passed', False: 'FAILED'}).get(gate['passed'], 'NOT RUN')}")
    metrics = {k: v for k, v in summary["task_metrics"].items() if v is not None}
    if metrics:
        print("  task metrics " + ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()))
