"""Sample data for `make run`: JSONL shards of real English text shipped with Python (the
`pydoc_data.topics` help pages) and a classify config with label descriptions.

Gold labels are assigned by a fixed rule on each help page's own section title (e.g. 'The "if"
statement' -> statement), never by a model; pages the rule does not cover carry no label.
Must not run the pipeline. Usage: python -m pipeline.sample_data --out data/sample
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

import yaml

LABELS = {
    "statement": "a Python statement such as if, for, while, return, import or raise, and how it executes",
    "expression": "Python operators and expressions: arithmetic, comparisons, boolean operations, calls, subscriptions",
    "literal": "how literal values are written in Python source code: numbers, strings and bytes",
    "data model": "special methods and attributes of the Python data model that classes define to customize behaviour",
}
# (label, pattern on the section title); the first match wins.
TITLE_RULES = (
    ("statement", re.compile(r'^The ".+" statement$|statements$')),
    ("literal", re.compile(r"literals?$", re.IGNORECASE)),
    ("data model", re.compile(r"^(Emulating|Customizing|Basic customization|Special method names|Special Attributes)")),
    ("expression", re.compile(r"operations?$|operators?$|expressions?$|^(Comparisons|Calls|Slicings|Subscriptions|Lambdas|Operator precedence)$|displays$")),
)
MAX_CHARS = 1200  # a document: consecutive paragraphs up to about this many characters
MAX_DOCS_PER_TOPIC = 4
SHARDS = 4


def gold_label(title: str) -> str | None:
    for label, pattern in TITLE_RULES:
        if pattern.search(title):
            return label
    return None


def split_paragraphs(text: str, max_chars: int) -> list[str]:
    """Group the page's paragraphs into documents of at most about max_chars characters."""
    docs, current = [], ""
    for paragraph in (p.strip() for p in re.split(r"\n\s*\n", text)):
        if not paragraph or set(paragraph) <= set("*=-"):
            continue
        if current and len(current) + len(paragraph) > max_chars:
            docs.append(current)
            current = ""
        current = f"{current}\n\n{paragraph}" if current else paragraph
    if current:
        docs.append(current)
    return docs


def sample_records() -> list[dict]:
    from pydoc_data.topics import topics

    records = []
    for topic in sorted(topics):
        text = topics[topic].strip()
        title = text.splitlines()[0].strip()
        label = gold_label(title)
        for i, doc in enumerate(split_paragraphs(text, MAX_CHARS)[:MAX_DOCS_PER_TOPIC]):
            record = {"id": f"{topic}#{i}", "topic": topic, "title": title, "text": doc}
            if label is not None:
                record["label"] = label
            records.append(record)
    return records


def write_sample(out: str) -> dict[str, object]:
    shards_dir = os.path.join(out, "shards")
    os.makedirs(shards_dir, exist_ok=True)
    records = sample_records()
    for shard in range(SHARDS):
        with open(os.path.join(shards_dir, f"topics-{shard:05d}-of-{SHARDS:05d}.jsonl"), "w", encoding="utf-8") as f:
            for record in records[shard::SHARDS]:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
    config = {
        "input": os.path.join(shards_dir, "*.jsonl"),
        "task": "classify",
        "model": "minilm-l6",
        "attention": "auto",
        "run_id": "sample",
        "labels": LABELS,
    }
    with open(os.path.join(out, "classify.yaml"), "w", encoding="utf-8") as f:
        f.write("# docscore run --config this file --output DIR, from the folder the input path is relative to (the\n"
                "# repository root for make sample's); keys are the flags without dashes.\n")
        f.write("# Gold `label` fields come from each help page's section title (pipeline/sample_data.py).\n")
        yaml.safe_dump(config, f, sort_keys=False, allow_unicode=True)
    labelled = sum("label" in r for r in records)
    return {"documents": len(records), "labelled": labelled, "shards": SHARDS, "config": os.path.join(out, "classify.yaml")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.sample_data", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data/sample", help="directory to write shards/ and classify.yaml into")
    args = parser.parse_args(argv)
    info = write_sample(args.out)
    print(f"sample data: {info['documents']} documents ({info['labelled']} with a gold label) in "
          f"{info['shards']} shards; config {info['config']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
