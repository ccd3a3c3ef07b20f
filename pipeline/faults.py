"""Test-only fault switch: make one inference batch fail once, to prove exactly-once rows under retries.

DOCSCORE_FAULT_FAIL_BUNDLE_ONCE=DIR (an existing directory shared by every worker process): every batch
attempt appends its doc ids to DIR/batches_seen; the one that comes after DOCSCORE_FAULT_AFTER_BATCHES
(default 0) earlier attempts creates DIR/failed (once across processes and retries: O_EXCL), writes its doc
ids there and raises TransientFault; the runner then retries the bundle. Must do nothing at all when the
variable is unset.
"""
from __future__ import annotations

import json
import os

ENV = "DOCSCORE_FAULT_FAIL_BUNDLE_ONCE"
AFTER_ENV = "DOCSCORE_FAULT_AFTER_BATCHES"
FAILED = "failed"
SEEN = "batches_seen"


class TransientFault(RuntimeError):
    """An injected failure that a retry cures (not a problem of the data)."""


def maybe_fail_once(doc_ids: list[str]) -> None:
    directory = os.environ.get(ENV)
    if not directory:
        return
    with open(os.path.join(directory, SEEN), "a", encoding="utf-8") as f:  # one line per batch attempt, all processes
        f.write(json.dumps(doc_ids) + "\n")
    failed = os.path.join(directory, FAILED)
    if os.path.exists(failed):
        return
    with open(os.path.join(directory, SEEN), encoding="utf-8") as f:
        seen = sum(1 for _ in f)
    if seen <= int(os.environ.get(AFTER_ENV, "0")):
        return
    try:
        handle = os.open(failed, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:  # another process failed its batch first
        return
    with os.fdopen(handle, "w", encoding="utf-8") as f:
        json.dump(doc_ids, f)
    raise TransientFault(f"{ENV}: injected failure of an inference batch of {len(doc_ids)} documents (once)")
