"""A local job whose worker process died. Beam's multi-process runner reports it in one of its threads
("Worker subprocess exited with return code N") and fails the job when the lost worker's work is still to
come, but when the worker held the job's last bundles (its Publish step) it waits for them forever. The
watch ends a job still running GRACE_S after a worker died as a failed job (exit 1), through the interrupt
handler: one line saying what was left, the launch's files removed unless it committed, its lease released.
"""
from __future__ import annotations

import contextlib
import re
import sys
import threading
from collections.abc import Iterator

from pipeline import interrupt

LOST_WORKER = re.compile(r"Worker subprocess exited with return code (-?\d+)")
GRACE_S = 10.0  # Beam's own failure, when it comes, comes within a second or two
EXIT_FAILED = 1


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
        previous(args)
        lost = LOST_WORKER.search(str(args.exc_value or ""))
        if lost and not finished.is_set():
            threading.Thread(target=end_if_still_running, args=(lost[1],), name="docscore-lost-worker",
                             daemon=True).start()

    threading.excepthook = hook
    try:
        yield
    finally:
        finished.set()
        threading.excepthook = previous
