"""docs/summary.md documents every key of summary.json: a real `docscore run` (classify, with a shadow kernel,
so the optional sections appear, run twice so `retired` has an entry) writes a summary; every key path in it
must be a backticked key of the doc's tables, and every key of the doc's tables must be in that summary or in
SOMETIMES below (keys this run cannot have). A field added to the summary without a row in the doc fails here."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import SENTENCES, common_flags, read_summary, run_docscore, write_jsonl

pytestmark = pytest.mark.integration  # README.md, "Development"

DOC = Path(__file__).resolve().parents[1] / "docs" / "summary.md"

# Maps whose keys depend on the run (flags, packages, Beam metrics, error types, tables): the doc describes
# their shape; the walk stops at them.
FREE_FORM = {"config", "versions", "metrics", "files", "counts.errors_by_stage", "counts.errors_by_type"}

# Keys of the doc that this run cannot have: other tasks' task_metrics, an accelerator's memory.
SOMETIMES = {
    "task_metrics.n_docs",  # choice, loglik
    "task_metrics.accuracy_per_token", "task_metrics.accuracy_per_byte",  # choice
    "task_metrics.loglik_tokens", "task_metrics.total_loglik", "task_metrics.corpus_perplexity",  # loglik
    "task_metrics.spearman", "task_metrics.pearson",  # similarity
    "memory.device.peak_in_use_mb", "memory.device.end_in_use_mb", "memory.device.allocator_peak_mb",  # GPU, TPU
    "model.prompts.document", "model.prompts.query",  # a model with prompts (tests/test_prompts.py checks them)
}

ROW_KEY = re.compile(r"^\|\s*`([^`]+)`\s*\|")  # a table row's first cell, one backticked key path


def doc_rows() -> dict[str, str]:
    """{key path: its whole table row} of every table row of the doc that starts with a backticked key."""
    rows = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        match = ROW_KEY.match(line)
        if match:
            assert match.group(1) not in rows, f"docs/summary.md documents {match.group(1)} twice"
            rows[match.group(1)] = line
    return rows


def key_paths(value, prefix: str = ""):
    """(leaf key paths, every key path) of a summary: dotted, `[]` for the elements of a list of objects; a
    free-form map, a plain value, a list of plain values and an empty object or list are leaves."""
    leaves, every = set(), {prefix} if prefix else set()
    if prefix in FREE_FORM or not isinstance(value, (dict, list)) or not value:
        return {prefix}, every
    if isinstance(value, list):
        if not all(isinstance(item, dict) for item in value):
            return {prefix}, every
        children = [(f"{prefix}[]", item) for item in value]
    else:
        children = [(f"{prefix}.{key}" if prefix else key, item) for key, item in value.items()]
    for path, item in children:
        child_leaves, child_every = key_paths(item, path)
        leaves |= child_leaves
        every |= child_every
    return leaves, every


def pattern(doc_key: str) -> re.Pattern:
    """A doc key as a pattern over key paths: `<name>` stands for any one key (timing.stages.<stage>.p50)."""
    return re.compile("".join("[^.]+" if part.startswith("<") else re.escape(part)
                              for part in re.split(r"(<[^>]+>)", doc_key)) + r"\Z")


@pytest.fixture(scope="module")
def summary(tmp_path_factory, minilm):
    root = tmp_path_factory.mktemp("summary_doc")
    records = [{"id": f"d{i}", "text": text, "label": "statement" if i % 2 else "expression"}
               for i, text in enumerate(SENTENCES[:6])]
    shard = write_jsonl(root / "in" / "docs.jsonl", [*records, {"id": "empty", "text": "   "}])
    out = root / "out"
    flags = ["--input", shard, *common_flags("doc", out), "--attention", "native", "--task", "classify",
             "--labels", "statement=a Python statement;expression=a Python expression",
             "--shadow_attention", "flash", "--shadow_fraction", "1", "--no_progress"]
    for _ in range(2):  # the second launch replaces the first: its summary lists it under `retired`
        assert run_docscore(*flags) == 0
    return read_summary(out, "doc")


def test_the_run_has_the_optional_sections(summary):
    assert summary["shadow"]["documents"] == 6 and summary["shadow"]["passed"] is True
    assert set(summary["gates"]) == {"shadow", "error_fraction"} and summary["task_metrics"]["n_gold"] == 6
    assert len(summary["retired"]) == 1 and summary["counts"]["errors_by_type"]


def test_every_key_of_the_summary_is_documented(summary):
    rows = doc_rows()
    patterns = [pattern(key) for key in rows]
    leaves, _ = key_paths(summary)
    undocumented = sorted(path for path in leaves if not any(p.match(path) for p in patterns))
    assert not undocumented, f"summary.json keys missing from docs/summary.md: {undocumented}"
    for path in FREE_FORM:
        assert path in rows and "free-form" in rows[path], f"docs/summary.md must describe {path} as a free-form map"


def test_every_documented_key_is_in_the_summary_or_only_in_some_runs(summary):
    rows = doc_rows()
    _, every = key_paths(summary)
    stale = sorted(key for key in rows if key not in SOMETIMES and not any(pattern(key).match(path) for path in every))
    assert not stale, f"docs/summary.md documents keys this run's summary.json does not have: {stale}"
    for key in SOMETIMES:
        assert key in rows, f"docs/summary.md lost the row of {key}"
        assert "only" in rows[key].lower(), f"docs/summary.md must say in which runs {key} appears"


def test_the_model_family_row_names_every_family():
    """model.family is config.family: the doc's row names each value a run can record."""
    from models.config import FAMILIES

    row = doc_rows()["model.family"]
    missing = sorted(family for family in set(FAMILIES.values()) if not re.search(rf"\b{family}\b", row))
    assert not missing, f"docs/summary.md's model.family row does not name {missing}"
