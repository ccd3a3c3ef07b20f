"""TFDS input without TensorFlow: a dataset built here by a small tfds GeneratorBasedBuilder in
array_record format, read by the pipeline (`--input tfds:NAME --tfds_data_dir DIR --split test`)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import SENTENCES, common_flags, direct_embeddings, read_summary, read_table, run_docscore, shards_of

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
                yield i, {"id": f"t{i}", "text": text, "label": 0 if "statement" in text else 1, "weight": i / 10}

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
    assert by_id["t1"]["weight"] == 0.1 and by_id["t2"]["weight"] == 0.2  # float32 features: the decimals written
    assert "tensorflow" not in sys.modules


def test_a_relative_tfds_data_dir_gives_the_same_absolute_shard_paths(tfds_dir, monkeypatch):
    """Shard paths become the rows' `source` and fallback ids: a relative --tfds_data_dir made them depend on
    the directory the run started in."""
    expected = shards_of("tfds:docscore_tiny_docs", tfds_data_dir=str(tfds_dir))
    monkeypatch.chdir(tfds_dir.parent)
    assert shards_of("tfds:docscore_tiny_docs", tfds_data_dir=tfds_dir.name) == expected
    assert all(shard.startswith("/") for shard in expected)


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


def write_odd_dataset(data_dir, examples: list[dict]) -> str:
    """A prepared dataset `odd_docs` written by hand (features.json, dataset_info.json and one array_record
    shard of tf.train.Examples, as TFDS writes them): a Text `text`, a scalar string Tensor `body`, an int64 `id`."""
    import json

    from array_record.python.array_record_module import ArrayRecordWriter

    from pipeline.io import tfds_reader

    directory = data_dir / "odd_docs" / "1.0.0"
    directory.mkdir(parents=True)
    features = {"featuresDict": {"features": {
        "text": {"pythonClassName": "tensorflow_datasets.core.features.text_feature.Text", "text": {}},
        "body": {"pythonClassName": "tensorflow_datasets.core.features.tensor_feature.Tensor",
                 "tensor": {"dtype": "string", "encoding": "none", "shape": {}}},
        "id": {"pythonClassName": "tensorflow_datasets.core.features.scalar.Scalar",
               "tensor": {"dtype": "int64", "encoding": "none", "shape": {}}}}}}
    (directory / "features.json").write_text(json.dumps(features))
    (directory / "dataset_info.json").write_text(json.dumps({
        "fileFormat": "array_record", "splits": [{"name": "test", "shardLengths": [str(len(examples))]}]}))
    example_class = tfds_reader._example_class()
    writer = ArrayRecordWriter(str(directory / "odd_docs-test.array_record-00000-of-00001"), "group_size:1")
    for values in examples:
        example = example_class()
        for name, value in values.items():
            feature = example.features.feature[name]
            if isinstance(value, int):
                feature.int64_list.value.append(value)
            else:
                feature.bytes_list.value.append(value)
        writer.write(example.SerializeToString())
    writer.close()
    return str(directory)


def test_string_tensor_features_are_text_and_invalid_utf8_is_an_invalid_utf8_row(tmp_path):
    """Before: a scalar string Tensor was never decoded (`--text_field body`: parse/bad_field_type "is a bytes"),
    and invalid UTF-8 in a Text feature was parse/invalid_example, a type README does not list."""
    from pipeline.io import tfds_reader
    from pipeline.io.sources import ReadSpec, read_shard
    from pipeline.records import Document, ErrorRow

    write_odd_dataset(tmp_path, [{"id": 0, "text": b"normal text", "body": b"body zero"},
                                 {"id": 1, "text": b"bad \xff utf8", "body": b"body one"},
                                 {"id": 2, "text": b"fine", "body": b"bad \xfe body"}])
    dataset = tfds_reader.locate_dataset("tfds:odd_docs", str(tmp_path))
    assert dataset.feature_kinds == {"text": "text", "body": "text", "id": "scalar"}
    [shard] = shards_of("tfds:odd_docs", tfds_data_dir=str(tmp_path))

    def outcomes(text_field):
        items = list(read_shard(shard, ReadSpec(text_field=text_field, id_field="id", tfds=dataset)))
        return ([(d.doc_id, d.text) for d in items if isinstance(d, Document)],
                [(e.record_index, e.stage, e.error_type, e.doc_id) for e in items if isinstance(e, ErrorRow)])

    # each field's bad bytes cost only the records that use that field
    assert outcomes("body") == ([("0", "body zero"), ("1", "body one")], [(2, "parse", "invalid_utf8", "2")])
    assert outcomes("text") == ([("0", "normal text"), ("2", "fine")], [(1, "parse", "invalid_utf8", "1")])


def test_a_truncated_array_record_shard_is_one_corrupt_file_row_that_says_so(tfds_dir, tmp_path):
    """array_record raises a RuntimeError with no text for a cut file: the row said "(RuntimeError: )" and
    called the shard unreadable rather than corrupt."""
    import shutil

    from pipeline.io import tfds_reader
    from pipeline.io.sources import ReadSpec, read_shard

    dataset = tfds_reader.locate_dataset("tfds:docscore_tiny_docs", str(tfds_dir))
    cut = tmp_path / "cut.array_record-00000-of-00001"
    shutil.copy(dataset.shard_paths("test")[0], cut)
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    [row] = read_shard(str(cut), ReadSpec(tfds=dataset))
    assert (row.record_index, row.error_type) == (None, "corrupt_file")
    assert "not a whole array_record file: it is truncated, or not array_record" in row.message, row.message
