"""TFDS input without TensorFlow: a dataset built here by a small tfds GeneratorBasedBuilder in
array_record format, read by the pipeline (`--input tfds:NAME --tfds_data_dir DIR --split test`)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import SENTENCES, common_flags, direct_embeddings, read_summary, read_table, run_docscore

N_TEST = 5


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    import tensorflow_datasets as tfds

    class DocscoreTinyDocs(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "id": tfds.features.Text(), "text": tfds.features.Text(),
                "label": tfds.features.ClassLabel(names=["statement", "other"]),
                "weight": tfds.features.Scalar(dtype=np.float32)}))

        def _split_generators(self, dl_manager):
            return {"test": self._generate_examples(SENTENCES[:N_TEST]), "train": self._generate_examples(SENTENCES[N_TEST:])}

        def _generate_examples(self, texts):
            for i, text in enumerate(texts):
                yield i, {"id": f"t{i}", "text": text, "label": 0 if "statement" in text else 1, "weight": i / 2}

    data_dir = tmp_path_factory.mktemp("tfds")
    DocscoreTinyDocs(data_dir=str(data_dir), file_format="array_record").download_and_prepare()
    return data_dir


def test_tfds_reader_decodes_records_without_tensorflow(tfds_dir):
    import sys

    from pipeline.io import tfds_reader

    dataset = tfds_reader.locate_dataset("tfds:docscore_tiny_docs", str(tfds_dir))
    assert dataset.version == "1.0.0" and dataset.class_names["label"] == ["statement", "other"]
    shards = dataset.shard_paths("test")
    records = [tfds_reader.decode_example(r, dataset) for s in shards for r in tfds_reader.iter_array_record(s)]
    assert sorted(r["id"] for r in records) == [f"t{i}" for i in range(N_TEST)]
    by_id = {r["id"]: r for r in records}
    assert by_id["t0"]["text"] == SENTENCES[0] and by_id["t0"]["label"] == "statement"
    assert by_id["t2"]["weight"] == pytest.approx(1.0)
    assert "tensorflow" not in sys.modules


@pytest.mark.integration
def test_pipeline_reads_a_tfds_split(tfds_dir, tmp_path, minilm):
    out = tmp_path / "out"
    assert run_docscore("--input", "tfds:docscore_tiny_docs:1.0.0", "--tfds_data_dir", tfds_dir, "--split", "test",
                        *common_flags("tfds", out), "--attention", "native") == 0
    scores, _ = read_table(out, "scores", "tfds")
    assert sorted(scores.doc_id) == [f"t{i}" for i in range(N_TEST)]
    assert all(".array_record-" in s for s in scores.source)
    assert sorted(scores.record_index) == list(range(N_TEST))
    assert dict(zip(scores.doc_id, scores.gold_label))["t0"] == "statement"
    scores = scores.sort_values("doc_id")
    direct = direct_embeddings(minilm, [SENTENCES[int(i[1:])] for i in scores.doc_id])
    assert np.max(np.abs(np.stack(scores.embedding.map(np.asarray)) - direct)) <= 1e-5
    assert read_summary(out, "tfds")["counts"]["records"] == N_TEST
