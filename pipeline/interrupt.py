"""Ctrl-C (SIGINT) ends a docscore command with exit 130, and SIGTERM (a scheduler or container stopping
it) with exit 143, each with one line saying what it left, wherever the main thread is. Python's own KeyboardInterrupt can land in a weakref callback or a finaliser (jax's and
Beam's run often), where it is printed as "Exception ignored" and dropped, and the command goes on. A reader
of stdout that goes away (`docscore --help | head`) ends a command quietly too (`reader_gone`). A second
signal while the first is being handled is ignored (the first says the one line); one after the command has
finished keeps its exit code (`exit_with_on_signal`). A command started with a standard stream closed gets
/dev/null there (`hold_standard_streams`).
Imports nothing heavy: the `docscore` command installs it before it imports a subcommand.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a command ended by Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM
EXIT_CODES = {signal.SIGINT: EXIT_INTERRUPTED, signal.SIGTERM: EXIT_TERMINATED}
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer killed by the signal
ENDING = threading.Event()  # set by the first SIGINT/SIGTERM the handler takes: the process is ending
_ENDED_BY: list[tuple[int, str]] = []  # end_command's (exit code, word), which the handler then ends with


def end_command(code: int, word: str) -> None:
    """End the command from any thread as an interrupt does (the same one line saying what it left, the same
    clean-up), but with exit status `code` and `word` in place of "interrupted": for a job that cannot finish
    (pipeline/worker_watch.py). Nothing when a signal is already ending the command: its own code stands."""
    if ENDING.is_set():
        return
    _ENDED_BY.append((code, word))
    os.kill(os.getpid(), signal.SIGTERM)


def how_ended() -> str:
    """What the line of a command ended by the handler calls its ending: "interrupted", or end_command's word."""
    return _ENDED_BY[0][1] if _ENDED_BY else "interrupted"


_FINISHED: list[int] = []  # the exit code of a command that has finished (exit_with_on_signal)
_THREADS_LEFT_BUSY = threading.Event()  # end_without_shutdown was called


def end_without_shutdown() -> None:
    """Have the command's process end with os._exit once it has said its outcome, past the interpreter's shutdown:
    for a job that failed in this process, whose other Beam bundles may still be inside a model call on their
    (daemon) threads. The shutdown stops such a thread as it comes back from XLA, and the C++ frames it unwinds
    through abort the process (SIGABRT, "FATAL: exception not rethrown"): exit 134 in place of the command's own.
    os._exit stops every thread at once, as an interrupt's ending does."""
    _THREADS_LEFT_BUSY.set()


def ends_without_shutdown() -> bool:
    return _THREADS_LEFT_BUSY.is_set()


def exit_with_on_signal(code: int) -> None:
    """For the moments after a command has finished (its outcome printed, the interpreter shutting down): a
    SIGINT or SIGTERM then ends the process at once with the command's own exit code, not 130/143 without a word,
    also while the shutdown waits on a thread or a stuck flush. After the last atexit callback the interpreter puts
    Python handlers back to the default (killed: 130/143), so from there on both are ignored (_ignore_late_signals)."""
    _FINISHED.append(code)
    for signum in EXIT_CODES:
        signal.signal(signum, lambda _signum, _frame: os._exit(code))
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone, a stream closed: nothing left to say
            stream.flush()


def _ignore_late_signals() -> None:
    """The last atexit callback (registered when this module is imported, before the heavy ones): a finished
    command's last moments ignore SIGINT and SIGTERM, which the interpreter would otherwise let kill it."""
    if _FINISHED and threading.current_thread() is threading.main_thread():
        for signum in EXIT_CODES:
            signal.signal(signum, signal.SIG_IGN)


atexit.register(_ignore_late_signals)


def reader_gone() -> int:
    """For `except BrokenPipeError` around a command's printing: stop quietly, as `cat` does, and return the
    exit status. stdout now goes to /dev/null, so Python's flush at exit does not fail (and print) again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_BROKEN_PIPE


@contextlib.contextmanager
def exit_on_interrupt(say: Callable[[], str], lock: Any = None) -> Iterator[None]:
    """Within the block, SIGINT or SIGTERM prints `say()` (run under `lock` when given, e.g. so that it sees a
    commit whole) and ends the process with os._exit, which stops every thread at once; the previous handlers
    are restored after the block. Only the main thread can install a handler; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum, _frame) -> None:
        if ENDING.is_set():  # a second Ctrl-C while the first stops the workers: the first says the one line
            return
        ENDING.set()
        code = _ENDED_BY[0][0] if _ENDED_BY else EXIT_CODES[signum]  # fixed now: a later end_command changes nothing
        # the process is ending: what its other threads and child processes say about the ending (Beam's
        # workers and their connections breaking) is noise, so stderr is closed to them and the one line
        # goes to a copy of it
        sys.stderr.flush()
        stderr = os.dup(2)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        stop_child_processes()
        with lock if lock is not None else contextlib.nullcontext():
            message = said_within(say, SAY_WITHIN_S)
        os.write(stderr, f"\n{message}\n".encode())
        os._exit(code)

    previous = {signum: signal.signal(signum, on_signal) for signum in EXIT_CODES}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# How long an interrupt waits for `say()` (which may ask a store what was published): an unreachable gs:// store
# retries for minutes, and Ctrl-C must end the command now.
SAY_WITHIN_S = 15.0


def said_within(say: Callable[[], str], seconds: float) -> str:
    """say() if it answers within `seconds` without raising, else a line saying what could not be checked."""
    said: dict[str, str] = {}

    def run() -> None:
        try:
            said["message"] = say()
        except Exception as e:  # a store that cannot be reached, among others
            said["error"] = f"{type(e).__name__}: {str(e)[:200]}"

    worker = threading.Thread(target=run, name="docscore-interrupted", daemon=True)
    worker.start()
    worker.join(seconds)
    if "message" in said:
        return said["message"]
    why = said.get("error") or f"no answer within {seconds:g} s"
    return (f"docscore: interrupted; what it left could not be checked ({why}): readers see the previous run of the "
            "run_id or this one, whole, never a mix; a gs:// lease this launch held expires by itself")


def stop_child_processes() -> None:
    """Kill this process's children (Beam's multi_processing workers) before it exits: left running, each
    prints the traceback of its broken connection to the launcher, a page of noise after the one line."""
    import psutil  # here: the handler's first use, not the command's start-up

    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(children, timeout=5)


def hold_standard_streams() -> None:
    """Give a process started with stdin, stdout or stderr closed (`docscore run >&-`, a scheduler that closes
    them) /dev/null there. Python leaves such a sys.stdout None, so the first message would raise (exit 1 after a
    published run), and the next file the process opens would take the free descriptor: a worker process's or a
    library's output to it would land inside that file."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: this one, unless a lower one is free too
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False, encoding="utf-8"))
