"""--profile_dir: a JAX profiler trace (jax.profiler.trace) of the first Beam batches each worker process
runs, written where TensorBoard's profile plugin and Perfetto read it. The attention kernel shows in it
under its named scope "attention/<impl>" (kernels/dispatch.py). Must not change what is computed.

Layout: PROFILE_DIR/<host>-<pid>-batch<k>/plugins/profile/<timestamp>/{<host>.xplane.pb,
<host>.trace.json.gz, perfetto_trace.json.gz}.
"""
from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator

PROFILED_BATCHES = 2  # Beam batches traced per process: the first compiles, the second runs warm

_lock = threading.Lock()  # one trace at a time per process (the profiler is process-wide)
_traced: dict[str, int] = {}


@contextlib.contextmanager
def profile_batch(profile_dir: str | None, batches: int = PROFILED_BATCHES) -> Iterator[str | None]:
    """Trace the body into its own directory under profile_dir while this process has traced fewer
    than `batches` Beam batches there; otherwise (or with no profile_dir) run it untraced.
    Yields the trace directory or None."""
    if not profile_dir or not _lock.acquire(blocking=False):
        yield None
        return
    try:
        k = _traced.get(profile_dir, 0)
        if k >= batches:
            yield None
            return
        _traced[profile_dir] = k + 1
        import jax

        log_dir = os.path.join(profile_dir, f"{socket.gethostname()}-{os.getpid()}-batch{k + 1}")
        with jax.profiler.trace(log_dir, create_perfetto_trace=True):
            yield log_dir
    finally:
        _lock.release()
