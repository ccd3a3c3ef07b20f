"""Model parameters on disk (Orbax) and the content fingerprint of a model.

Holds save/restore of the nested parameter dict and the hash over params + config + tokenizer.
Never pickles; must not know model families or file layout beyond the params/ directory it is given.
"""
from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from models.architecture import flat_params


# Orbax saves running at once in one process (threads) trip over each other; processes are
# kept apart by each writing its own directory (model_dir.write_model_dir).
_SAVE_LOCK = threading.Lock()


def save_params(path: str, params: dict[str, Any]) -> None:
    """Write the nested dict of arrays as an Orbax checkpoint at `path` (must not exist yet)."""
    with _SAVE_LOCK, ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(os.path.abspath(path), params)


def restore_params(path: str, shapes: dict[str, Any]) -> dict[str, Any]:
    """Read the Orbax checkpoint at `path` into the layout of `shapes` (ShapeDtypeStructs) as numpy."""
    target = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), shapes)
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(os.path.abspath(path), target)
    return jax.tree_util.tree_map(np.asarray, restored)


def fingerprint(params: dict[str, Any], config_bytes: bytes, tokenizer_bytes: bytes) -> str:
    """sha256 over every parameter (name, dtype, shape, bytes), config.json and tokenizer.json."""
    digest = hashlib.sha256()
    for name, array in sorted(flat_params(params).items()):
        array = np.ascontiguousarray(np.asarray(array))
        digest.update(f"{name}|{array.dtype.str}|{array.shape}\n".encode())
        digest.update(array.reshape(-1).view(np.uint8))
    for part in (config_bytes, tokenizer_bytes):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()
