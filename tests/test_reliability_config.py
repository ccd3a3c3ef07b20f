"""Configuration errors `docscore run` must refuse before reading any data - exit 2, naming the flag
and the fix - beyond those tests/test_options.py covers (unknown field, kernel unsupported on the
backend, unwritable output, input matching nothing, missing model): a model directory without its
checkpoint, with corrupt or pickled parameters, with a tokenizer that does not match the model, and
bad --max_error_fraction / --max_record_bytes. Then safety: no pickle where checkpoints are read, and
no run_id that leaves the output directory."""
from __future__ import annotations

import ast
import json
import os
import pickle
import posixpath
import shutil
from pathlib import Path

import pytest

from pipeline import validate
from pipeline.io import sinks
from pipeline.options import ConfigError
from tests.conftest import run_docscore

ROOT = Path(__file__).resolve().parent.parent


class PickleBomb:
    """Unpickling it creates a file: proof that something unpickled the parameters."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def copy_model(minilm, dst: Path, *, params: bool = True) -> Path:
    shutil.copytree(minilm.path, dst, ignore=None if params else shutil.ignore_patterns("params"))
    return dst


def missing_checkpoint(minilm, tmp: Path) -> Path:
    return copy_model(minilm, tmp / "no_params", params=False)


def corrupt_parameters(minilm, tmp: Path) -> Path:
    model = copy_model(minilm, tmp / "corrupt")
    data = [p for p in (model / "params").rglob("*") if p.is_file() and p.parent.name == "d"]
    assert data, "the Orbax checkpoint layout changed: no data files under params/d"
    for path in data:
        path.write_bytes(b"\0" * path.stat().st_size)
    return model


def pickled_parameters(minilm, tmp: Path) -> Path:
    model = copy_model(minilm, tmp / "pickled", params=False)
    (model / "params").mkdir()
    for name in ("checkpoint.pkl", "_METADATA", "pytorch_model.bin"):
        (model / "params" / name).write_bytes(pickle.dumps(PickleBomb(str(tmp / "unpickled"))))
    return model


def foreign_tokenizer(minilm, tmp: Path) -> Path:
    """The MiniLM directory with the tokenizer of another model: a 40,000-word vocabulary, where
    MiniLM has 30,522 embeddings."""
    from tokenizers import Tokenizer, models as tok_models, pre_tokenizers

    model = copy_model(minilm, tmp / "foreign_tokenizer")
    vocab = {"[UNK]": 0, **{f"word{i}": i for i in range(1, 40_000)}}
    tokenizer = Tokenizer(tok_models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(model / "tokenizer.json"))
    return model


MODEL_CASES = {
    # name: (model directory maker, what the message must say besides the flag)
    "missing_checkpoint": (missing_checkpoint, "params: missing"),
    "corrupt_parameters": (corrupt_parameters, "corrupt or incomplete Orbax checkpoint"),
    "pickled_parameters": (pickled_parameters, "Orbax checkpoint"),
    "tokenizer_not_matching_the_model": (foreign_tokenizer, "tokenizer does not match the model vocabulary"),
}


def exits_2_before_reading(args: list, tmp_path: Path, capsys, peeks: list) -> str:
    assert run_docscore(*args, "--output", tmp_path / "out", "--run_id", "r1", "--attention", "native") == 2
    assert peeks == [] and not (tmp_path / "out" / "scores").exists()
    return capsys.readouterr().err


@pytest.mark.parametrize("case", sorted(MODEL_CASES))
def test_a_damaged_model_directory_exits_2_naming_the_model_and_the_fix(case, minilm, corpus, tmp_path, capsys, no_data_read):
    make, says = MODEL_CASES[case]
    model = make(minilm, tmp_path)
    err = exits_2_before_reading(["--input", corpus, "--model", model], tmp_path, capsys, no_data_read)
    assert f"--model {model}" in err and says in err, err
    assert "docscore convert" in err or "tokenizer.json the model was trained with" in err, err
    assert not (tmp_path / "unpickled").exists(), "the parameters were unpickled"


@pytest.mark.parametrize("flag, value", [("--max_error_fraction", "1.5"), ("--max_error_fraction", "-0.1"),
                                         ("--max_record_bytes", "10")])
def test_bad_bounds_exit_2_naming_the_flag(flag, value, corpus, tmp_path, capsys, no_data_read):
    err = exits_2_before_reading(["--input", corpus, flag, value], tmp_path, capsys, no_data_read)
    assert f"{flag}={value}" in err, err


# ---- safety ----------------------------------------------------------------------------------------

UNPICKLERS = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}


def unpickling_calls(path: Path) -> list[str]:
    """Imports of pickle-like modules and calls that unpickle (torch.load, np.load(allow_pickle=True),
    pandas.read_pickle) in one source file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.split(".")[0] in UNPICKLERS]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNPICKLERS:
            found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = ast.unparse(node.func.value)
            name = node.func.attr
            if (owner, name) == ("torch", "load") or name == "read_pickle":
                found.append(f"{owner}.{name}(...)")
            elif name == "load" and owner in ("np", "numpy") and any(
                    k.arg == "allow_pickle" and ast.unparse(k.value) != "False" for k in node.keywords):
                found.append(f"{owner}.load(allow_pickle=...)")
    return [f"{path.relative_to(ROOT)}: {f}" for f in found]


def test_no_package_unpickles_anything():
    """Checkpoints are read through Orbax and safetensors only (Beam pickles its own DoFns; we never)."""
    sources_ = [p for package in ("models", "pipeline", "kernels", "runners") for p in (ROOT / package).rglob("*.py")]
    assert len(sources_) > 30
    assert [hit for path in sources_ for hit in unpickling_calls(path)] == []
    # the scan does find what it looks for
    probe = ROOT / "tests" / "make_bad_corpus.py"
    assert unpickling_calls(Path(__file__)) and not unpickling_calls(probe)


UNSAFE_RUN_IDS = ["..", ".", "../x", "x/../../y", "a/b", "/abs", "a\\b", "abc\n", "\nabc", "", " ", "-x", ".hidden",
                  "a" * 129, "%2e%2e", "\uff0e\uff0e", "r\u2024\u2024", "run id", "a\0b", "a*", "a?"]


@pytest.mark.parametrize("run_id", UNSAFE_RUN_IDS, ids=[json.dumps(r)[1:-1][:20] or "empty" for r in UNSAFE_RUN_IDS])
def test_a_run_id_that_is_not_one_plain_path_segment_is_refused(run_id):
    """Path separators, dot segments, control characters, look-alike dots, glob characters (fsspec would
    expand them), over-long names."""
    with pytest.raises(ConfigError, match="--run_id"):
        validate.check_run_id(run_id)


@pytest.mark.parametrize("given", ["", "  "])
def test_an_empty_run_id_is_refused_not_replaced_by_a_timestamp(given):
    """`--run_id "$RUN"` with RUN unset gave a new timestamp run each time instead of the run the script names."""
    from pipeline.options import parse_options

    with pytest.raises(ConfigError, match="--run_id=.* is empty; give the run a name, or leave --run_id out"):
        parse_options(["--input", "in.jsonl", "--output", "out", "--run_id", given])
    assert parse_options(["--input", "in.jsonl", "--output", "out"])[1].run_id  # left out: a timestamp


@pytest.mark.parametrize("run_id", ["20260102T030405Z", "nightly-2026.01.02", "a", "A_b-c.d", "9" * 128])
def test_an_accepted_run_id_stays_one_directory_under_the_output(run_id, tmp_path):
    validate.check_run_id(run_id)
    spec = sinks.OutputSpec.for_run(str(tmp_path / "out"), run_id, "parquet")
    for path in (spec.partition("scores"), spec.partition("errors"), spec.summary_path(), spec.staging):
        normal = posixpath.normpath(path)
        assert normal.startswith(str(tmp_path / "out") + os.sep) and f"run_id={run_id}" in normal.split(os.sep)
