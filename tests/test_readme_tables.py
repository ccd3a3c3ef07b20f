"""README's lists of the scores and errors columns are the tables' schemas (pipeline/records.py), in order:
a column added to a table and not to the README fails here."""
from __future__ import annotations

import re
from pathlib import Path

from pipeline.records import ERRORS_SCHEMA, SCORES_SCHEMA

README = Path(__file__).resolve().parents[1] / "README.md"


def listed_columns(label: str) -> list[str]:
    """The backquoted, comma-separated list that follows `label` in README.md."""
    text = README.read_text()
    match = re.search(re.escape(label) + r"[^`]*`([^`]+)`", text)
    assert match, f"README.md has no {label!r} list"
    return [name.strip() for name in match.group(1).replace("\n", " ").split(",")]


def test_readme_lists_every_scores_column_in_order():
    assert listed_columns("Scores columns (schema: `pipeline/records.py`):") == SCORES_SCHEMA.names


def test_readme_lists_every_errors_column_in_order():
    assert listed_columns("Errors columns") == ERRORS_SCHEMA.names
