"""A local job whose worker process died. Beam's multi-process runner reports it in one of its threads
("Worker subprocess exited with return code N") and fails the job when the lost worker's work is still to
come, but when the worker held the job's last bundles (its Publish step) it waits for them forever. The
watch ends a job still running GRACE_S after a worker died as a failed job (exit 1), through the interrupt
handler: one line saying what was left, the launch's files removed unless it committed, its lease released.
Meanwhile the runner's threads whose connection to the dead worker broke say so in one line each, not in the
tracebacks of gRPC's internals they would print (about 60 lines for one lost worker).
"""
from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
from collections.abc import Iterator

from pipeline import interrupt

LOST_WORKER = re.compile(r"Worker subprocess exited with return code (-?\d+)")
GRACE_S = 10.0  # Beam's own failure, when it comes, comes within a second or two
EXIT_FAILED = 1
DATA_PLANE_LOGGER = "apache_beam.runners.worker.data_plane"  # logs a broken worker connection with its traceback


def broken_connection(error: BaseException | None) -> bool:
    """A gRPC error: how Beam's runner threads learn that a worker process's connection broke."""
    return error is not None and type(error).__module__.split(".")[0] == "grpc"


class OneLineForBrokenConnections(logging.Filter):
    """Keeps a broken worker connection's log record to its message (its traceback is gRPC's internals)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and broken_connection(record.exc_info[1]):
            record.exc_info, record.exc_text = None, None
        return True


@contextlib.contextmanager
def ending_a_job_that_lost_a_worker(run_id: str, grace_s: float = GRACE_S) -> Iterator[None]:
    """Within the block, a worker process that dies while the job runs ends the command after `grace_s` unless
    the job ended first (then the block has been left)."""
    finished = threading.Event()
    previous = threading.excepthook

    def end_if_still_running(code: str) -> None:
        if finished.wait(grace_s):
            return
        print(f"docscore run {run_id}: a worker process died (exit status {code}) and Beam's runner did not end the "
              f"job within {grace_s:g} s: ending it as a failed job", file=sys.stderr)
        interrupt.end_command(EXIT_FAILED, "ended as a failed job")

    def hook(args: threading.ExceptHookArgs) -> None:
        lost = LOST_WORKER.search(str(args.exc_value or ""))
        thread = args.thread.name if args.thread is not None else "a thread"
        if lost:
            print(f"docscore run {run_id}: a worker process died (exit status {lost[1]}; Beam's {thread})",
                  file=sys.stderr)
        elif broken_connection(args.exc_value):
            print(f"docscore run {run_id}: Beam's {thread} lost its connection to a worker process "
                  f"({type(args.exc_value).__name__})", file=sys.stderr)
        else:
            previous(args)
        if lost and not finished.is_set():
            threading.Thread(target=end_if_still_running, args=(lost[1],), name="docscore-lost-worker",
                             daemon=True).start()

    one_line = OneLineForBrokenConnections()
    threading.excepthook = hook
    logging.getLogger(DATA_PLANE_LOGGER).addFilter(one_line)
    try:
        yield
    finally:
        finished.set()
        threading.excepthook = previous
        logging.getLogger(DATA_PLANE_LOGGER).removeFilter(one_line)
