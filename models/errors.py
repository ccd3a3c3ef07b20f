"""The one error models/ raises when a model cannot be loaded or converted.

Holds only `ModelLoadError`; every message names the path and the problem and says what to do.
"""
from __future__ import annotations


class ModelLoadError(ValueError):
    """A model directory, name or Hugging Face source cannot be used as asked; the message names
    the path, the problem and the fix."""
