"""Small checks of config.json values that models/config.py and models/rope.py share: a value shown as the file
writes it, a positive finite number or a refusal naming its key, and the attention layer types docscore computes."""
from __future__ import annotations

import json
import math
from typing import Any

from models.errors import ModelLoadError

# The attention types of config.json's layer_types docscore computes (Qwen2's, Qwen3's and ModernBERT's read alike)
LAYER_TYPES = ("full_attention", "sliding_attention")


def shown(value: Any) -> str:
    """The value as config.json writes it, cut to 40 characters (a list or object by its type)."""
    if not isinstance(value, (int, float, str, bool, type(None))):
        return f"a JSON {type(value).__name__}"
    try:
        text = json.dumps(value)
    except ValueError:  # an integer too long to print (sys.set_int_max_str_digits)
        return "a number too long to print"
    return text if len(text) <= 40 else text[:40] + "..."


def positive_number(key: str, value: Any, or_else: str = "") -> float:
    """value as a positive, finite number, or a refusal naming `key` (a JSON true, a string that is no number, 0, a
    negative, infinite or NaN value); `or_else` says what else the key may hold."""
    number = None if isinstance(value, bool) else _as_float(value)
    if number is None or not 0 < number < math.inf:
        raise ModelLoadError(f"{key} is {shown(value)}; it must be a positive, finite number{or_else}")
    return number


def _as_float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
