"""The one error models/ raises when a model cannot be loaded or converted.

Holds `ModelLoadError` and its `DamagedModelDir`; every message names the path and the problem and says what to do.
"""
from __future__ import annotations


class ModelLoadError(ValueError):
    """A model directory, name or Hugging Face source cannot be used as asked; the message names
    the path, the problem and the fix."""


class DamagedModelDir(ModelLoadError):
    """A model directory whose files cannot be what `docscore convert` wrote (damaged, cut short, edited, or
    written by another docscore version): making it again mends it, which docscore does itself for the copies
    of built-in models in its cache."""
