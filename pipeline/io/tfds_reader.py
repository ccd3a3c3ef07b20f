"""Reads TFDS datasets prepared in array_record format without TensorFlow.

Holds: locating a prepared dataset (`tfds:NAME[:VERSION]` + data_dir + split) from its
dataset_info.json / features.json, and decoding its records (serialized tf.train.Example protos,
parsed with protobuf's public descriptor API). Must not import tensorflow or tensorflow_datasets.
"""
from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import tempfile
from collections.abc import Iterator
from typing import Any

import fsspec
import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

TFDS_PREFIX = "tfds:"


@dataclasses.dataclass(frozen=True)
class TfdsDataset:
    """A prepared dataset version directory and what its features are."""

    name: str
    version: str
    directory: str
    feature_kinds: dict[str, str]  # feature name -> text | class_label | scalar | other
    class_names: dict[str, list[str]]  # class_label feature -> its names (index order)

    def shard_paths(self, split: str) -> list[str]:
        with fsspec.open(posixpath.join(self.directory, "dataset_info.json"), "r") as f:
            info = json.load(f)
        if info.get("fileFormat", "tfrecord") != "array_record":
            raise ValueError(
                f"{self.directory}: prepared as {info.get('fileFormat', 'tfrecord')}, not array_record; "
                "prepare it with file_format='array_record'"
            )
        splits = {s["name"]: s for s in info.get("splits", [])}
        if split not in splits:
            raise KeyError(f"--split {split}: dataset {self.name} has splits {sorted(splits)}; pass one of them")
        entry = splits[split]
        n = len(entry.get("shardLengths", [])) or 1
        template = entry.get("filepathTemplate", "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}")
        paths = []
        for i in range(n):
            name = (
                template.replace("{DATASET}", self.name)
                .replace("{SPLIT}", split)
                .replace("{FILEFORMAT}", "array_record")
                .replace("{SHARD_X_OF_Y}", f"{i:05d}-of-{n:05d}")
            )
            paths.append(posixpath.join(self.directory, name))
        return paths


def parse_tfds_input(spec: str) -> tuple[str, str | None]:
    """'tfds:NAME[:VERSION]' -> (NAME, VERSION or None)."""
    body = spec[len(TFDS_PREFIX):]
    name, _, version = body.partition(":")
    return name, (version or None)


def locate_dataset(spec: str, data_dir: str) -> TfdsDataset:
    """Find the prepared dataset directory; raises FileNotFoundError naming what is missing."""
    name, version = parse_tfds_input(spec)
    if not name.strip():  # tfds: alone would look for versions in the data dir itself
        raise FileNotFoundError(f"--input {spec}: name the dataset, tfds:NAME or tfds:NAME:VERSION (e.g. tfds:imdb_reviews)")
    if "://" not in data_dir:  # shard paths are rows' `source` and fallback ids: the same from any directory
        data_dir = os.path.abspath(data_dir)
    fs, root = fsspec.core.url_to_fs(posixpath.join(data_dir, name))
    if not fs.isdir(root):
        raise FileNotFoundError(f"--input {spec}: no prepared dataset {name!r} under --tfds_data_dir {data_dir}")
    if version is None:
        versions = [posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False)]
        versions = [v for v in versions if _is_version(v)]
        if not versions:
            raise FileNotFoundError(f"--input {spec}: {data_dir}/{name} holds no prepared version directory")
        version = max(versions, key=lambda v: tuple(int(x) for x in v.split(".")))
    directory = posixpath.join(data_dir, name, version)
    features_path = posixpath.join(directory, "features.json")
    try:
        with fsspec.open(features_path, "r") as f:
            features = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"--input {spec}: {features_path} is missing; is the dataset fully prepared?") from None
    kinds: dict[str, str] = {}
    class_names: dict[str, list[str]] = {}
    for feature, spec_ in features.get("featuresDict", {}).get("features", {}).items():
        if "text" in spec_:
            kinds[feature] = "text"
        elif "classLabel" in spec_:
            kinds[feature] = "class_label"
            labels_path = posixpath.join(directory, f"{feature}.labels.txt")
            try:
                with fsspec.open(labels_path, "r") as f:
                    class_names[feature] = [line.rstrip("\n") for line in f if line.strip()]
            except FileNotFoundError:
                class_names[feature] = []
        elif "tensor" in spec_ and not spec_["tensor"].get("shape", {}).get("dimensions"):
            # a scalar string Tensor (tfds.features.Tensor(shape=(), dtype=np.str_)) holds text as Text does
            kinds[feature] = "text" if spec_["tensor"].get("dtype") == "string" else "scalar"
        else:
            kinds[feature] = "other"
    return TfdsDataset(name, version, directory, kinds, class_names)


def _is_version(text: str) -> bool:
    parts = text.split(".")
    return len(parts) == 3 and all(p.isdigit() for p in parts)


def _example_class():
    """tf.train.Example built from its .proto definition with protobuf's public descriptor API."""
    file = descriptor_pb2.FileDescriptorProto(name="docscore_tf_example.proto", package="docscore_tf", syntax="proto3")
    lab, rep = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    T = descriptor_pb2.FieldDescriptorProto

    def add(name, fields, nested=None, options=None):
        message = file.message_type.add(name=name) if nested is None else nested.nested_type.add(name=name)
        if options is not None:
            message.options.CopyFrom(options)
        for fname, number, ftype, label, type_name, oneof in fields:
            field = message.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = type_name
            if oneof is not None:
                field.oneof_index = oneof
        return message

    add("BytesList", [("value", 1, T.TYPE_BYTES, rep, None, None)])
    add("FloatList", [("value", 1, T.TYPE_FLOAT, rep, None, None)])
    add("Int64List", [("value", 1, T.TYPE_INT64, rep, None, None)])
    feature = add(
        "Feature",
        [
            ("bytes_list", 1, T.TYPE_MESSAGE, lab, ".docscore_tf.BytesList", 0),
            ("float_list", 2, T.TYPE_MESSAGE, lab, ".docscore_tf.FloatList", 0),
            ("int64_list", 3, T.TYPE_MESSAGE, lab, ".docscore_tf.Int64List", 0),
        ],
    )
    feature.oneof_decl.add(name="kind")
    features = add("Features", [("feature", 1, T.TYPE_MESSAGE, rep, ".docscore_tf.Features.FeatureEntry", None)])
    add(
        "FeatureEntry",
        [("key", 1, T.TYPE_STRING, lab, None, None), ("value", 2, T.TYPE_MESSAGE, lab, ".docscore_tf.Feature", None)],
        nested=features,
        options=descriptor_pb2.MessageOptions(map_entry=True),
    )
    add("Example", [("features", 1, T.TYPE_MESSAGE, lab, ".docscore_tf.Features", None)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("docscore_tf.Example"))


_EXAMPLE = None


def decode_example(data: bytes, dataset: TfdsDataset) -> dict[str, Any]:
    """One serialized tf.train.Example -> {feature: python value} (text decoded, class labels named)."""
    global _EXAMPLE
    if _EXAMPLE is None:
        _EXAMPLE = _example_class()
    example = _EXAMPLE.FromString(data)
    record: dict[str, Any] = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        values = list(getattr(feature, kind).value) if kind else []
        if kind == "bytes_list" and dataset.feature_kinds.get(name) == "text":
            values = [_text(v) for v in values]
        if kind == "float_list":  # float32s: the decimal written (0.1), not the float32's expansion 0.10000000149...
            values = [float(str(np.float32(v))) for v in values]
        if dataset.feature_kinds.get(name) == "class_label" and values:
            names = dataset.class_names.get(name) or []
            values = [names[v] if 0 <= v < len(names) else v for v in values]
        record[name] = values[0] if len(values) == 1 and dataset.feature_kinds.get(name) != "other" else values
    return record


def _text(value: bytes) -> str | bytes:
    """A text feature's bytes as str; bytes that are not UTF-8 stay bytes, so that only a record whose text or id
    they are becomes an error row (parse/invalid_utf8, as in the other readers), not one that never uses them."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value


def iter_array_record(path: str, chunk: int = 256) -> Iterator[bytes]:
    """Stream the records of one array_record file in order (remote files are copied locally first)."""
    from array_record.python.array_record_module import ArrayRecordReader

    local, cleanup = path, None
    protocol = fsspec.core.split_protocol(path)[0]
    if protocol not in (None, "file"):
        handle, local = tempfile.mkstemp(suffix=".array_record")
        os.close(handle)
        cleanup = local
        fsspec.core.url_to_fs(path)[0].get(path, local)
    try:
        reader = ArrayRecordReader(local, "readahead_buffer_size:0")
        try:
            n = reader.num_records()
            for start in range(0, n, chunk):
                yield from reader.read(list(range(start, min(n, start + chunk))))
        finally:
            reader.close()
    except RuntimeError as e:  # array_record's C++ errors, some without a word (a truncated file)
        raise ValueError(f"not a whole array_record file: {str(e) or 'it is truncated, or not array_record'}") from None
    finally:
        if cleanup:
            os.remove(cleanup)
