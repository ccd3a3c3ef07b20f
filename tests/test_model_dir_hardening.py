"""Model directories checked before the model is built: every config.json size within bounds and fitting
the parameter shapes the checkpoint stores, every file readable JSON of the right shape; each refusal a
ModelLoadError naming the file, the key and the fix, and `docscore run` exiting 2 with it (no traceback).
Then what the fingerprint is: a checksum against accidental damage, not a guard against deliberate edits.
"""
from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import models
from models.config import HF_KEYS, MAX_SIZES, config_from_hf
from models.errors import MachineShortOf, ModelLoadError
from tests.conftest import run_docscore

ROOT = Path(__file__).resolve().parent.parent


def copy_model(minilm, dst: Path) -> Path:
    return Path(shutil.copytree(minilm.path, dst))


def edit_json(file: Path, **changes) -> None:
    data = json.loads(file.read_text())
    data.update(changes)
    file.write_text(json.dumps(data, indent=2))


def refingerprint(minilm, model: Path) -> None:
    """Recompute metadata.json's fingerprint over the directory's files as they are now: what anyone who
    edits a model directory on purpose can do (the fingerprint needs no secret)."""
    from models.architecture import param_shapes
    from models.checkpoint import fingerprint, restore_params

    params = restore_params(str(model / "params"), param_shapes(minilm.config))
    value = fingerprint(params, (model / "config.json").read_bytes(), (model / "tokenizer.json").read_bytes())
    edit_json(model / "metadata.json", fingerprint=value)


def docscore_run_subprocess(tmp_path: Path, model: Path, timeout: float) -> subprocess.CompletedProcess:
    corpus = tmp_path / "in" / "docs.jsonl"
    corpus.parent.mkdir(exist_ok=True)
    corpus.write_text('{"id": "a", "text": "a short document"}\n')
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "run", "--input", str(corpus), "--output", str(tmp_path / "out"),
         "--model", str(model), "--attention", "native", "--run_id", "r1"],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout)


# ---- bounds ----------------------------------------------------------------------------------------

BERT = {"model_type": "bert", "vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 64, "max_position_embeddings": 64, "type_vocab_size": 2}
GPT2 = {"model_type": "gpt2", "vocab_size": 100, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_inner": 64, "n_positions": 64}
OUT_OF_BOUNDS = [
    (config, key, value)
    for config, family in ((BERT, "bert"), (GPT2, "gpt2"))
    for field, key in HF_KEYS[family].items()
    for value in (MAX_SIZES[field] + 1, 10**7, 0, -1, 2.5, "64", True, None)
    if not (key == "n_inner" and value is None)  # n_inner null means 4 x n_embd
]


@pytest.mark.parametrize("config, key, value", OUT_OF_BOUNDS,
                         ids=[f"{c['model_type']}-{k}-{v!r}" for c, k, v in OUT_OF_BOUNDS])
def test_every_size_out_of_bounds_is_refused_naming_the_file_and_key(config, key, value):
    with pytest.raises(ModelLoadError) as caught:
        config_from_hf({**config, key: value}, "/models/x/config.json")
    message = str(caught.value)
    assert message.startswith("/models/x/config.json: ") and f"{key} is " in message, message
    assert "docscore convert" in message, message


LLAMA = {"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 96, "max_position_embeddings": 64, "hidden_act": "silu"}


def test_a_config_transformers_computes_otherwise_is_refused_naming_the_key_and_value():
    """Refusals say which key to change: an odd head_dim (rotary embeddings turn pairs of dimensions; it converted,
    then every document was an infer/TypeError row), an unsupported activation by its own key, a partial rotary
    factor with its value; a null partial_rotary_factor is unset, as transformers reads it."""
    def refusal(config: dict) -> str:
        with pytest.raises(ModelLoadError) as caught:
            config_from_hf(config, "/models/x/config.json")
        return str(caught.value)

    assert "head_dim 15" in refusal({**LLAMA, "hidden_size": 60}) and "even" in refusal({**LLAMA, "hidden_size": 60})
    assert "head_dim 9" in refusal({**LLAMA, "head_dim": 9})
    for config, key in ((BERT, "hidden_act"), (GPT2, "activation_function"),
                        ({"model_type": "distilbert", "vocab_size": 100, "dim": 32, "n_layers": 2, "n_heads": 4,
                          "hidden_dim": 64, "max_position_embeddings": 64}, "activation")):
        assert f'{key} "quick_gelu" is not supported' in refusal({**config, key: "quick_gelu"})
    assert 'partial_rotary_factor 0.5 is not supported' in refusal({**LLAMA, "partial_rotary_factor": 0.5})
    assert 'rope_parameters.partial_rotary_factor 0.5' in refusal(
        {**LLAMA, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}})
    assert config_from_hf({**LLAMA, "partial_rotary_factor": None}) == config_from_hf(LLAMA)
    mistral = {**LLAMA, "model_type": "mistral", "sliding_window": 16, "layer_types": ["full_attention"] * 2}
    assert "layer_types marks layers [0, 1] full_attention" in refusal(mistral)

def test_sizes_at_their_bounds_and_real_models_are_accepted(minilm):
    assert config_from_hf({**BERT, "num_hidden_layers": MAX_SIZES["num_layers"]}).num_layers == MAX_SIZES["num_layers"]
    gpt2_xl = {**GPT2, "vocab_size": 50257, "n_embd": 1600, "n_layer": 48, "n_head": 25, "n_inner": None, "n_positions": 1024}
    assert config_from_hf(gpt2_xl).intermediate_size == 6400
    assert minilm.config.num_layers == 6


@pytest.mark.integration
def test_a_config_asking_for_ten_million_layers_exits_2_within_seconds(minilm, tmp_path):
    """Before: the model's shape was built with 10**7 layers, 300+ s before any check."""
    model = copy_model(minilm, tmp_path / "huge")
    edit_json(model / "config.json", num_hidden_layers=10**7)
    done = docscore_run_subprocess(tmp_path, model, timeout=120)  # it took 300+ s: refused before the shape is built
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"{model / 'config.json'}: num_hidden_layers is 10000000" in done.stderr, done.stderr
    assert "docscore convert" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "out" / "scores").exists()


# ---- the config against the checkpoint's stored shapes --------------------------------------------

MISMATCHES = {
    # config.json change: the key the message must name
    "layers": ({"num_hidden_layers": 12}, "num_hidden_layers is 12 but the checkpoint"),
    "fewer_layers": ({"num_hidden_layers": 2}, "num_hidden_layers is 2 but the checkpoint"),
    "intermediate": ({"intermediate_size": 1024}, "intermediate_size does not fit the checkpoint"),
    "vocabulary": ({"vocab_size": 40_000}, "vocab_size does not fit the checkpoint"),
    "positions": ({"max_position_embeddings": 1024}, "max_position_embeddings does not fit the checkpoint"),
    "hidden": ({"hidden_size": 768}, "hidden_size does not fit the checkpoint"),
    "token_types": ({"type_vocab_size": 4}, "type_vocab_size does not fit the checkpoint"),
}


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_a_config_that_does_not_fit_the_checkpoint_names_the_key_even_with_a_recomputed_fingerprint(case, minilm, tmp_path):
    """The fingerprint alone would not catch these: it is recomputed, as someone editing the directory would."""
    changes, says = MISMATCHES[case]
    model = copy_model(minilm, tmp_path / case)
    edit_json(model / "config.json", **changes)
    refingerprint(minilm, model)
    with pytest.raises(ModelLoadError) as caught:
        models.load(str(model), attention="native")
    message = str(caught.value)
    assert f"{model / 'config.json'}: " in message and says in message, message
    assert str(model / "params") in message and "docscore convert" in message, message


def test_docscore_run_exits_2_on_a_config_that_does_not_fit(minilm, corpus, tmp_path, capsys, no_data_read):
    model = copy_model(minilm, tmp_path / "m")
    edit_json(model / "config.json", intermediate_size=1024)
    refingerprint(minilm, model)
    rc = run_docscore("--input", corpus, "--output", tmp_path / "out", "--model", model, "--attention", "native")
    err = capsys.readouterr().err
    assert rc == 2 and f"--model {model}" in err and "intermediate_size does not fit the checkpoint" in err, err
    assert no_data_read == []


# ---- files that are not what they should be --------------------------------------------------------

def write(name: str, content: bytes):
    def make(model: Path) -> None:
        (model / name).write_bytes(content)
    return make


def directory_instead_of(name: str):
    def make(model: Path) -> None:
        (model / name).unlink()
        (model / name).mkdir()
    return make


BINARY = b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00 not text"
METADATA_OK = {"family": "bert", "fingerprint": "0" * 64, "max_seq_len": 256, "source": "x", "format": "docscore-model/1"}

BAD_FILES = {
    # name: (damage, file the message names, what it says; the fix is `docscore convert` unless it says another)
    "metadata_not_json": (write("metadata.json", b"{'family': bert"), "metadata.json", "not valid JSON"),
    "metadata_binary": (write("metadata.json", BINARY), "metadata.json", "not UTF-8"),
    "metadata_a_list": (write("metadata.json", b"[1, 2]"), "metadata.json", "a JSON list"),
    "metadata_number_too_long": (write("metadata.json", b"1" * 5000), "metadata.json", "not valid JSON"),
    "metadata_bad_fingerprint": (write("metadata.json", json.dumps({**METADATA_OK, "fingerprint": "../../x"}).encode()),
                                 "metadata.json", "fingerprint is not 64 lowercase hex digits"),
    "metadata_bad_max_seq_len": (write("metadata.json", json.dumps({**METADATA_OK, "max_seq_len": "256"}).encode()),
                                 "metadata.json", "max_seq_len must be a whole number"),
    "metadata_a_directory": (directory_instead_of("metadata.json"), "metadata.json", "not a regular file (a directory)"),
    "metadata_of_another_version": (write("metadata.json", json.dumps({**METADATA_OK, "dtype": "bfloat16"}).encode()),
                                    "metadata.json", "not the metadata this docscore version writes (unknown field "
                                                     "dtype): written by another version"),
    "metadata_without_a_field": (write("metadata.json", json.dumps({k: v for k, v in METADATA_OK.items()
                                                                    if k != "max_seq_len"}).encode()),
                                 "metadata.json", "(missing max_seq_len)"),
    "config_binary": (write("config.json", BINARY), "config.json", "not UTF-8"),
    "config_not_json": (write("config.json", b"model_type: bert\n"), "config.json", "not valid JSON"),
    "config_nested_too_deep": (write("config.json", b"[" * 100_000 + b"]" * 100_000), "config.json", "not valid JSON"),
    "config_a_string": (write("config.json", b'"bert"'), "config.json", "expected a JSON object"),
    "config_model_type_a_list": (write("config.json", b'{"model_type": ["bert"]}'), "config.json",
                                 "is not supported; docscore models are the BERT family"),
    "tokenizer_binary": (write("tokenizer.json", BINARY), "tokenizer.json", "not UTF-8"),
    "tokenizer_not_json": (write("tokenizer.json", b"{ vocab"), "tokenizer.json",
                           "not a Hugging Face tokenizers file (key must be a string at line 1 column 3); save a fast"),
    "tokenizer_a_directory": (directory_instead_of("tokenizer.json"), "tokenizer.json", "not a regular file (a directory)"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_an_unreadable_or_non_json_file_exits_2_naming_its_path(case, minilm, corpus, tmp_path, capsys, no_data_read):
    damage, name, says = BAD_FILES[case]
    model = copy_model(minilm, tmp_path / "m")
    damage(model)
    rc = run_docscore("--input", corpus, "--output", tmp_path / "out", "--model", model, "--attention", "native")
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"--model {model}: {model / name}: " in err and says in err, err
    assert "docscore convert" in err or case in ("config_model_type_a_list", "tokenizer_not_json"), err
    assert no_data_read == [] and not (tmp_path / "out" / "scores").exists()


@pytest.mark.integration
@pytest.mark.parametrize("name", ["config.json", "params/_METADATA"])  # read_text reads every JSON file
def test_a_named_pipe_in_the_model_directory_exits_2_instead_of_waiting(name, minilm, tmp_path):
    """Opening a FIFO waits for a writer forever: a real `docscore run` process must refuse it."""
    model = copy_model(minilm, tmp_path / "m")
    (model / name).unlink()
    os.mkfifo(model / name)
    done = docscore_run_subprocess(tmp_path, model, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert str(model / name) in done.stderr and "not a regular file" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_a_remote_fingerprint_cannot_name_a_directory_outside_the_cache(tmp_path):
    """fetch_remote copies a remote model into CACHE/remote/<fingerprint>-<max_seq_len>: the fingerprint must be hex."""
    import fsspec

    from models.model_dir import fetch_remote

    fs = fsspec.filesystem("memory")
    fs.pipe("/docscore-test-remote/m/metadata.json", json.dumps({**METADATA_OK, "fingerprint": "../../escaped"}).encode())
    fs.pipe("/docscore-test-remote/m/config.json", b"{}")
    try:
        with pytest.raises(ModelLoadError, match="memory://docscore-test-remote/m/metadata.json: .*fingerprint is not"):
            fetch_remote("memory://docscore-test-remote/m", str(tmp_path / "cache"))
    finally:
        fs.rm("/docscore-test-remote", recursive=True)
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "cache").exists()


def test_the_same_weights_converted_at_two_lengths_are_two_remote_copies(tmp_path):
    """Two uploads of one model converted at different --max_seq_len share the fingerprint (weights, config,
    tokenizer): each is fetched into its own copy, so the second is not read with the first's length."""
    import fsspec

    from models.model_dir import fetch_remote, read_metadata

    fs = fsspec.filesystem("memory")
    for length in (32, 64):
        fs.pipe(f"/docscore-test-remote/m{length}/metadata.json", json.dumps({**METADATA_OK, "max_seq_len": length}).encode())
        fs.pipe(f"/docscore-test-remote/m{length}/config.json", b"{}")
    try:
        copies = {n: fetch_remote(f"memory://docscore-test-remote/m{n}", str(tmp_path / "cache")) for n in (32, 64, 32)}
    finally:
        fs.rm("/docscore-test-remote", recursive=True)
    assert copies[32] != copies[64]
    assert {n: read_metadata(path).max_seq_len for n, path in copies.items()} == {32: 32, 64: 64}


def test_the_same_weights_converted_with_other_poolings_prompts_or_dense_activations_are_other_remote_copies(tmp_path):
    """Conversions of one model that differ in what metadata.json alone holds (pooling, prompts, a Dense's activation)
    share the fingerprint: each is fetched into its own copy, so a CLS model is not read from a mean one's copy and
    pooled as mean, nor a prompted one's prompts taken from another's."""
    import fsspec

    from models.model_dir import fetch_remote, read_metadata

    dense = {"in_features": 8, "out_features": 8, "bias": True}
    variants = {"mean": {}, "cls": {"pooling": "cls"}, "prompted": {"prompts": {"document": "passage: "}},
                "other-prompt": {"prompts": {"document": "text: "}},
                "tanh": {"dense": [{**dense, "activation": "tanh"}]}, "identity": {"dense": [{**dense, "activation": "identity"}]}}
    fs = fsspec.filesystem("memory")
    for name, fields in variants.items():
        fs.pipe(f"/docscore-test-remote/{name}/metadata.json", json.dumps({**METADATA_OK, **fields}).encode())
        fs.pipe(f"/docscore-test-remote/{name}/config.json", b"{}")
    try:
        copies = {n: fetch_remote(f"memory://docscore-test-remote/{n}", str(tmp_path / "cache")) for n in variants}
    finally:
        fs.rm("/docscore-test-remote", recursive=True)
    assert copies["mean"].endswith(f"{'0' * 64}-256")  # the name earlier versions gave a mean model's copy
    assert len(set(copies.values())) == len(variants)
    assert {n: read_metadata(path).pooling for n, path in copies.items() if n in ("mean", "cls")} == {"mean": "mean", "cls": "cls"}
    assert read_metadata(copies["tanh"]).dense[0]["activation"] == "tanh"


# ---- what the fingerprint is -----------------------------------------------------------------------

def test_a_changed_file_is_caught_and_the_message_says_what_the_fingerprint_can_and_cannot_do(minilm, tmp_path):
    model = copy_model(minilm, tmp_path / "m")
    with open(model / "tokenizer.json", "a") as f:
        f.write("\n")  # still the same tokenizer; a different file
    with pytest.raises(ModelLoadError) as caught:
        models.load(str(model), attention="native")
    message = str(caught.value)
    assert "does not match metadata.json" in message and "accidental" in message, message
    assert "not a signature" in message and "docscore convert" in message, message


def test_a_deliberate_edit_with_a_recomputed_fingerprint_still_loads(minilm, tmp_path):
    """The documented limit: the fingerprint is a checksum, not a signature. A config edited within what
    the checkpoint's shapes allow, with the fingerprint recomputed, loads (and would score differently)."""
    model = copy_model(minilm, tmp_path / "m")
    edit_json(model / "config.json", layer_norm_eps=0.5)
    refingerprint(minilm, model)
    loaded = models.load(str(model), attention="native")
    assert loaded.config.layer_norm_eps == 0.5 and loaded.fingerprint != minilm.fingerprint
    from models.checkpoint import fingerprint

    assert "not against tampering" in fingerprint.__doc__


@pytest.mark.integration
@pytest.mark.parametrize("damage", ["cut_checkpoint", "another_version", "missing_tokenizer", "missing_metadata",
                                    "missing_params"])
def test_a_damaged_copy_of_the_built_in_model_in_the_cache_is_converted_again(damage, tmp_path, caplog):
    """docscore's own copy of minilm-l6 under --cache_dir, cut short (a full disk) or written by another version:
    a load converts it again instead of failing every run with advice (`docscore convert` into the cache's
    folder) that cannot work; the embeddings are those of a fresh copy."""
    import numpy as np

    fresh = models.load("minilm-l6", attention="native", cache_dir=str(tmp_path / "cache"))
    copy = Path(fresh.path)
    if damage == "cut_checkpoint":
        biggest = max((p for p in (copy / "params").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
        biggest.write_bytes(biggest.read_bytes()[: biggest.stat().st_size // 2])
    elif damage == "another_version":
        edit_json(copy / "metadata.json", format="docscore-model/0")
    elif damage == "missing_params":
        shutil.rmtree(copy / "params")
    else:
        (copy / f"{damage.split('_')[1]}.json").unlink()
    with caplog.at_level("WARNING", logger="models.loader"):
        again = models.load("minilm-l6", attention="native", cache_dir=str(tmp_path / "cache"))
    if damage != "missing_metadata":  # without its metadata.json the copy is made again before any load
        assert "docscore's copy of the built-in model minilm-l6 cannot be used" in caplog.text, caplog.text
    assert again.path == fresh.path and again.fingerprint == fresh.fingerprint
    ids = np.array([[101, 7592, 2088, 102]], np.int32)
    np.testing.assert_allclose(again.embed_packed(ids, np.ones_like(ids), 1), fresh.embed_packed(ids, np.ones_like(ids), 1))
    assert [p.name for p in copy.parent.iterdir()] == [copy.name]  # the damaged copy was removed, not kept aside


@pytest.mark.integration
def test_a_copy_another_process_made_meanwhile_is_not_discarded(tmp_path):
    """Two launches find the same bad copy: the first makes a new one; the second, whose load failed on the old
    copy, must not discard the new one (its run would fail: no such model directory)."""
    from models.builtin import discard_copy

    copy = Path(models.load("minilm-l6", attention="native", cache_dir=str(tmp_path / "cache")).path)
    old = os.stat(copy).st_ino
    shutil.copytree(copy, tmp_path / "fresh")
    shutil.rmtree(copy)
    (tmp_path / "fresh").rename(copy)  # another process's new copy, at the same path
    discard_copy(str(copy), old)
    assert (copy / "metadata.json").exists()
    discard_copy(str(copy), os.stat(copy).st_ino)
    assert not copy.exists() and not list(copy.parent.iterdir())


@pytest.mark.integration
def test_a_cut_checkpoint_is_one_line_not_event_loop_tracebacks(minilm, tmp_path):
    """A params file cut short: exit 2 with the one message naming the checkpoint, without the dozen "RuntimeError:
    Event loop is closed" tracebacks the reads still in flight raised as the restore failed."""
    model = copy_model(minilm, tmp_path / "m")
    biggest = max((p for p in (model / "params").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    biggest.write_bytes(biggest.read_bytes()[:100_000])
    done = docscore_run_subprocess(tmp_path, model, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "corrupt or incomplete Orbax checkpoint" in done.stderr
    assert "Event loop is closed" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr[-3000:]


@pytest.mark.integration
# Orbax's event loop, refused its descriptors, is left half made: collected in this test, not in a later one's
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning",
                            "ignore:coroutine .* was never awaited:RuntimeWarning")
def test_a_process_out_of_file_descriptors_keeps_the_built_in_models_copy_and_says_so(tmp_path):
    """Under `ulimit -n` too low for the run, reading docscore's copy of minilm-l6 failed with EMFILE, which was
    taken for damage: the good copy was discarded, converting it again failed the same way, and the run ended
    advising free space and permissions. The copy stays, and the message names the limit."""
    from tests.conftest import no_free_file_descriptors

    fresh = models.load("minilm-l6", attention="native", cache_dir=str(tmp_path / "cache"))
    copy = Path(fresh.path)
    inode = copy.stat().st_ino
    with no_free_file_descriptors(leave=2), pytest.raises(ModelLoadError) as caught:  # one file at a time: Orbax fails
        models.load("minilm-l6", attention="native", cache_dir=str(tmp_path / "cache"))
    assert "ran out of open files" in str(caught.value) and "ulimit -n" in str(caught.value), caught.value
    assert isinstance(caught.value, MachineShortOf)
    del caught  # its context's frames hold Orbax's loop
    gc.collect()
    assert [p.name for p in copy.parent.iterdir()] == [copy.name] and copy.stat().st_ino == inode
    assert models.load("minilm-l6", attention="native", cache_dir=str(tmp_path / "cache")).fingerprint == fresh.fingerprint
