"""`python tests/run_beside_a_model_call.py DOCSCORE-ARGS`: the `docscore` command (pipeline.cli.entry) in a process
that has one more daemon thread, which starts calling a jitted JAX function, batch after batch, when the interpreter
begins its shutdown, as a failed job's other Beam bundles are still inside their model calls when the launcher ends
(which bundle is where when one fails is up to timing; here it is fixed). Used by tests/test_run_faults.py; nothing of
this is in docscore."""
from __future__ import annotations

import atexit
import sys
import threading
import time

import jax
import jax.numpy as jnp

start, entered = threading.Event(), threading.Event()


@jax.jit
def model_call(x):
    return jnp.tanh(x @ x)


def bundle() -> None:
    x = jnp.ones((32, 32)) / 32
    model_call(x).block_until_ready()  # compiled before the command runs
    start.wait()
    entered.set()
    while True:  # the bundle's batches: short calls, each inside XLA with the GIL released and back for it
        x = model_call(x + 1)
        x.block_until_ready()


def shutdown_begins() -> None:
    start.set()
    entered.wait(10)
    time.sleep(0.2)  # the GIL left to the thread, so that the shutdown finds it inside a call, not waiting for the GIL


if __name__ == "__main__":
    threading.Thread(target=bundle, daemon=True).start()
    atexit.register(shutdown_begins)  # atexit runs its callbacks last registered first: this one before jax's own
    from pipeline.cli import entry

    sys.argv = ["docscore", *sys.argv[1:]]
    sys.exit(entry())
