"""Ctrl-C (SIGINT) ends a docscore command with exit 130, and SIGTERM (a scheduler or container stopping
it) with exit 143, each with one line saying what it left, wherever the main thread is. Python's own KeyboardInterrupt can land in a weakref callback or a finaliser (jax's and
Beam's run often), where it is printed as "Exception ignored" and dropped, and the command goes on.
Imports nothing heavy: the `docscore` command installs it before it imports a subcommand.
"""
from __future__ import annotations

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


@contextlib.contextmanager
def exit_on_interrupt(say: Callable[[], str], lock: Any = None) -> Iterator[None]:
    """Within the block, SIGINT or SIGTERM prints `say()` (run under `lock` when given, e.g. so that it sees a
    commit whole) and ends the process with os._exit, which stops every thread at once; the previous handlers
    are restored after the block. Only the main thread can install a handler; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum, _frame) -> None:
        with lock if lock is not None else contextlib.nullcontext():
            message = say()
        print(f"\n{message}", file=sys.stderr, flush=True)
        os._exit(EXIT_CODES[signum])

    previous = {signum: signal.signal(signum, on_signal) for signum in EXIT_CODES}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
