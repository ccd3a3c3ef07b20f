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


class RecordingParser:
    """What EvalOptions._add_argparse_args declares: each flag's names and keywords (default, action, ...)."""

    def __init__(self):
        self.flags: dict[str, dict] = {}

    def add_argument(self, *names, **keywords):
        for name in names:
            self.flags[name] = keywords


def options_table() -> dict[str, str]:
    """{--flag: its default cell} of README's Options table (a row naming several flags gives each its part)."""
    text = README.read_text()
    section = text[text.index("## Options"):text.index("## Performance")]
    table = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`--"):
            continue
        flags = [flag.strip().strip("`") for flag in cells[0].split(",")]
        defaults = cells[1].split(", ") if len(flags) > 1 else [cells[1]]
        assert len(defaults) == len(flags), f"README Options row {cells[0]}: one default per flag"
        table.update(zip(flags, defaults))
    return table


def test_readme_options_table_lists_every_docscore_flag_and_its_default():
    """Every flag `docscore run` declares is a row of README's Options table and every row is a flag; a flag
    with a literal default shows that default in backticks (None, switches and per-backend defaults show words)."""
    from pipeline.options import EvalOptions

    parser = RecordingParser()
    EvalOptions._add_argparse_args(parser)
    table = options_table()
    # --labels is declared as --classify_labels (Beam's own --labels is Dataflow's job labels); users write --labels
    declared = set(parser.flags) - {"--classify_labels"} | {"--labels"}
    assert set(table) == declared, sorted(set(table) ^ declared)
    for flag, keywords in parser.flags.items():
        default = keywords.get("default")
        if default is None or isinstance(default, bool) or flag not in table:
            continue
        assert f"`{default}`" in table[flag], f"README Options: {flag} defaults to {default!r}, the table says {table[flag]!r}"
