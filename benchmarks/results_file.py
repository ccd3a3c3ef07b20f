"""benchmarks/RESULTS.md holds one top-level section ("# title") per benchmark that writes there; a benchmark
replaces its own section and leaves the others as they are."""
from __future__ import annotations

import os


def replace_section(path: str, text: str) -> None:
    """Put `text` (starting with its "# title" line) in place of the section of the same title in the file at
    `path`, or append it when the file has no such section yet."""
    title = text.splitlines()[0].strip()
    if not title.startswith("# "):
        raise ValueError(f"a RESULTS.md section starts with '# title', not {title!r}")
    lines = open(path).read().splitlines() if os.path.exists(path) else []
    starts = [i for i, line in enumerate(lines) if line.startswith("# ")]
    mine = next((i for i in starts if lines[i].strip() == title), None)
    if mine is None:
        kept_before, kept_after = lines, []
    else:
        end = next((i for i in starts if i > mine), len(lines))
        kept_before, kept_after = lines[:mine], lines[end:]
    while kept_before and not kept_before[-1].strip():
        kept_before.pop()
    new = kept_before + ([""] if kept_before else []) + text.rstrip("\n").splitlines() + ([""] if kept_after else []) + kept_after
    with open(path, "w") as f:
        f.write("\n".join(new) + "\n")
