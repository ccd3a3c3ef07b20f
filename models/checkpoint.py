"""Model parameters on disk (Orbax) and the content fingerprint of a model.

Holds save/restore of the nested parameter dict, the stored shapes (read from Orbax's metadata, no array
read) and the hash over params + config + tokenizer. Never pickles; must not know model families or file
layout beyond the params/ directory it is given.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from models.architecture import flat_params
from models.errors import DamagedModelDir, short_of, shortage


# Orbax saves running at once in one process (threads) trip over each other; processes are
# kept apart by each writing its own directory (model_dir.write_model_dir).
_SAVE_LOCK = threading.Lock()


def save_params(path: str, params: dict[str, Any]) -> None:
    """Write the nested dict of arrays as an Orbax checkpoint at `path` (must not exist yet)."""
    quiet_reads_after_a_failed_restore()  # a failed save leaves tensorstore's callbacks the same closed loop
    with _SAVE_LOCK, orbax_errors_raised_not_logged(), ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(os.path.abspath(path), params)


class _OrbaxErrorRecords(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and f"{os.sep}orbax{os.sep}" in record.pathname)


@contextlib.contextmanager
def orbax_errors_raised_not_logged() -> Iterator[None]:
    """Within the block, Orbax's own error log records are dropped: a save that fails (a full disk) logs each of its
    writer threads' tracebacks (~200 lines) before raising the same error, which the caller reports in one line."""
    logger, dropped = logging.getLogger("absl"), _OrbaxErrorRecords()
    logger.addFilter(dropped)
    try:
        yield
    finally:
        logger.removeFilter(dropped)


def restore_params(path: str, shapes: dict[str, Any]) -> dict[str, Any]:
    """Read the Orbax checkpoint at `path` into the layout of `shapes` (ShapeDtypeStructs) as numpy."""
    target = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), shapes)
    quiet_reads_after_a_failed_restore()
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(os.path.abspath(path), target)
    return jax.tree_util.tree_map(np.asarray, restored)


def quiet_reads_after_a_failed_restore() -> None:
    """A damaged checkpoint fails its restore while tensorstore still finishes the other reads, whose callbacks
    then find Orbax's event loop closed, some of them after the one error that says what is wrong (a
    ModelLoadError) is out; Python would print each ("RuntimeError: Event loop is closed") as a traceback. Those
    are left out, from the first restore on (installed once; any other unraisable error is printed as before)."""
    previous = sys.unraisablehook
    if getattr(previous, "docscore_quiet", False):
        return

    def hook(unraisable) -> None:
        error = unraisable.exc_value
        if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"):
            previous(unraisable)

    hook.docscore_quiet = True
    sys.unraisablehook = hook


def stored_shapes(path: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """{'layers/0/attention/query/kernel': (shape, dtype), ...} of the Orbax checkpoint at `path`, read from
    its metadata only (no array is read, nothing is allocated). ModelLoadError naming `path` when it holds no
    readable Orbax checkpoint (a named pipe or other special file in it too: reading one could wait forever)."""
    special = [os.path.join(root, name) for root, _, names in os.walk(path) for name in names
               if not os.path.isfile(os.path.join(root, name))]
    if special:
        raise DamagedModelDir(f"{special[0]}: not a regular file, so {path} is not an Orbax checkpoint `docscore convert` "
                              "wrote; re-create the directory with `docscore convert`")
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            tree = checkpointer.metadata(os.path.abspath(path)).item_metadata
        stored = {name: (tuple(int(n) for n in leaf.shape), np.dtype(leaf.dtype))
                  for name, leaf in flat_params(tree).items()} if tree is not None else {}
    except Exception as err:  # Orbax/tensorstore raise many types for a damaged checkpoint
        if what := shortage(err):  # this process's limit, not the checkpoint's damage
            raise short_of(path, err, what) from None
        raise DamagedModelDir(f"{path}: corrupt or incomplete Orbax checkpoint ({type(err).__name__}: {str(err)[:300]}); "
                              "re-create the directory with `docscore convert`") from None
    if not stored:
        raise DamagedModelDir(f"{path}: corrupt or incomplete Orbax checkpoint (no parameter metadata in it); "
                              "re-create the directory with `docscore convert`")
    return stored


def fingerprint(params: dict[str, Any], config_bytes: bytes, tokenizer_bytes: bytes) -> str:
    """sha256 over every parameter (name, dtype, shape, bytes), config.json and tokenizer.json.

    A checksum against accidental corruption (a truncated copy or upload, a damaged disk, a file swapped
    by mistake), not against tampering: it is not a signature and needs no secret, so whoever can edit
    the files can recompute it and write it into metadata.json, and the directory then loads."""
    digest = hashlib.sha256()
    for name, array in sorted(flat_params(params).items()):
        array = np.ascontiguousarray(np.asarray(array))
        digest.update(f"{name}|{array.dtype.str}|{array.shape}\n".encode())
        digest.update(array.reshape(-1).view(np.uint8))
    for part in (config_bytes, tokenizer_bytes):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()
