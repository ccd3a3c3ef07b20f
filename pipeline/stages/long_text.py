"""How much of a very long text is tokenized: a text over FULL_TOKENIZE_CHARS is cut (at whitespace where it
can be) to the part its windows can reach, so a 20 MB document costs milliseconds instead of a minute and
gigabytes. Used by preprocess (a document's head: its first --max_chunks windows) and by --task choice (a
context's tail: the window before each candidate). Holds only the sizes and the cut; must not tokenize.
"""
from __future__ import annotations

FULL_TOKENIZE_CHARS = 64 * 1024  # texts up to this are tokenized whole
PREFIX_CHARS_PER_TOKEN = 16  # characters read per needed token (English averages ~5); choice grows it x4 while short
NO_SPACE_SPARE_TOKENS = 256  # tokens kept past what is needed when a cut must fall inside a word
MAX_PREFIX_CHARS_PER_TOKEN = 256  # choice's context tail stops growing here (then the context is tokenized whole)
LOOK_FOR_SPACE_CHARS = 1024  # how far from the cut whitespace is looked for


def space_before(text: str, end: int, look_back: int = LOOK_FOR_SPACE_CHARS) -> int | None:
    """The position of the last whitespace before `end`, looking back at most look_back characters."""
    for i in range(end - 1, max(end - look_back, 0), -1):
        if text[i].isspace():
            return i
    return None


def space_after(text: str, start: int, look_ahead: int = LOOK_FOR_SPACE_CHARS) -> int | None:
    """The position of the first whitespace at or after `start`, looking ahead at most look_ahead characters."""
    for i in range(start, min(start + look_ahead, len(text))):
        if text[i].isspace():
            return i
    return None
