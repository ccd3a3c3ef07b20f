"""The one error models/ raises when a model cannot be loaded or converted.

Holds `ModelLoadError`, its `DamagedModelDir`, `ModelDirNotWritten` and `MachineShortOf`, and `shortage` (which tells them apart); every
message names the path and the problem and says what to do.
"""
from __future__ import annotations

import errno
import re


class ModelLoadError(ValueError):
    """A model directory, name or Hugging Face source cannot be used as asked; the message names
    the path, the problem and the fix."""


class DamagedModelDir(ModelLoadError):
    """A model directory whose files cannot be what `docscore convert` wrote (damaged, cut short, edited, or
    written by another docscore version): making it again mends it, which docscore does itself for the copies
    of built-in models in its cache."""


class ModelDirNotWritten(ModelLoadError):
    """A model directory could not be written where it was to go (a full disk, no permission): the place is at
    fault, not the model, so a run names the setting that chose the place (--cache_dir for a built-in model)."""


class MachineShortOf(ModelLoadError):
    """A model directory this process could not read for want of open files or memory (`shortage`): nothing is
    wrong with its files, so no copy of it is discarded or made again."""


# errnos of a process out of a resource, which say nothing of the file being read
SHORTAGES = {errno.EMFILE: "open files", errno.ENFILE: "open files", errno.ENOMEM: "memory", errno.ENOBUFS: "memory"}
FIXES = {"open files": "raise the limit on open files (`ulimit -n`)", "memory": "free memory, or use a larger machine"}


def disk_full(err: BaseException) -> bool:
    """Whether `err` says the disk (or the user's quota) is full: an OSError's errno, or the errno tensorstore puts in
    the text of Orbax's errors (`[os_error_code='28']`)."""
    codes = (errno.ENOSPC, errno.EDQUOT)
    if isinstance(err, OSError) and err.errno in codes:
        return True
    code = re.search(r"os_error_code='(\d+)'", str(err))
    return bool(code) and int(code.group(1)) in codes


def shortage(err: BaseException) -> str | None:
    """What this process ran out of when `err` was raised reading a model ("open files", "memory"), or None. Orbax
    reads through tensorstore, whose errors carry the errno in their text (`[os_error_code='24']`)."""
    if isinstance(err, MemoryError):
        return "memory"
    if isinstance(err, OSError) and err.errno in SHORTAGES:
        return SHORTAGES[err.errno]
    code = re.search(r"os_error_code='(\d+)'", str(err))
    return SHORTAGES.get(int(code.group(1))) if code else None


def short_of(path: str, err: BaseException, what: str) -> MachineShortOf:
    """The MachineShortOf of reading `path` failing with `err` for want of `what` (shortage's answer)."""
    return MachineShortOf(f"{path}: cannot be read: this process ran out of {what} ({type(err).__name__}: "
                          f"{' '.join(str(err).split())[:300]}); the files are not damaged: {FIXES[what]}, and run again")
