"""The sample data `make run` uses: real English shards from pydoc_data.topics and a classify config
that passes every configuration check."""
from __future__ import annotations

import json

from pipeline import sample_data
from pipeline.options import parse_options
from pipeline.validate import validate


def test_sample_data_and_its_config_are_valid(tmp_path, minilm):
    info = sample_data.write_sample(str(tmp_path / "sample"))
    records = [json.loads(line) for p in sorted((tmp_path / "sample" / "shards").iterdir()) for line in open(p)]
    assert len(records) == info["documents"] > 100 and len({r["id"] for r in records}) == len(records)
    assert all(r["text"].strip() for r in records)
    labelled = [r for r in records if "label" in r]
    assert len(labelled) == info["labelled"] and {r["label"] for r in labelled} == set(sample_data.LABELS)
    assert all(sample_data.gold_label(r["title"]) == r["label"] for r in labelled)
    _, eo = parse_options(["--config", info["config"], "--output", str(tmp_path / "out"), "--attention", "native"])
    plan = validate(eo)
    assert eo.task == "classify" and plan.labels == sample_data.LABELS and len(plan.shards) == sample_data.SHARDS
