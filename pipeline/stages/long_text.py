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
# Where a cut may fall: ASCII whitespace, which every tokenizer splits words at. Python's isspace also takes
# \x1c-\x1f, which BERT's normaliser deletes (a cut there split what it reads as one word), and Unicode spaces
# a Metaspace tokenizer (Llama's) keeps inside its pieces.
CUT_SPACES = " \n\t\r"


def space_before(text: str, end: int, start: int = 0) -> int | None:
    """The position of the last whitespace (CUT_SPACES) in text[start + 1:end], or None: however far back it is,
    so a word of thousands of characters across a cut is not split (str.rfind: a 64K-character piece of a hex
    dump is searched in microseconds)."""
    found = max(text.rfind(space, start + 1, end) for space in CUT_SPACES)
    return found if found >= 0 else None


def space_after(text: str, start: int) -> int | None:
    """The position of the first whitespace (CUT_SPACES) at or after `start`, or None."""
    found = [i for i in (text.find(space, start) for space in CUT_SPACES) if i >= 0]
    return min(found) if found else None
