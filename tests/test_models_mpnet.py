"""MPNet encoders (all-mpnet-base-v2, multi-qa-mpnet-base-dot-v1: the BERT family with RoBERTa's positions, no token
types and a relative position bias shared by every layer): a small random sentence-transformers model built in
transformers with its own MPNetTokenizer (no download), converted with `docscore convert`; its final hidden states
against MPNetModel's (both CPU kernels, padded rows and packed ones, documents long enough that offsets past the bias's
max_distance count), its embeddings through `docscore run --task embed` against SentenceTransformer.encode; the hub
config's sizes, the kernels refused before any data, and config values transformers could not run."""
from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
from kernels import KernelUnsupportedError
from models.config import MPNET_BUCKETS, MPNET_MAX_DISTANCE, config_from_hf
from models.layers import relative_position_buckets
from models.loader import model_kernel
from pipeline.convert import main as convert_main
from pipeline.telemetry import memory
from tests.conftest import SENTENCES, padded, transformers_hidden
from tests.test_models_roberta import embed_run, write_sentence_transformers_modules

pytestmark = pytest.mark.integration  # README.md, "Development"

MAX_SEQ_LEN = 384  # all-mpnet-base-v2's sentence_bert_config.json max_seq_length
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "[UNK]"]  # MPNet's vocabulary starts so: <s> 0, <pad> 1, </s> 2
# document lengths (<s> and </s> included): one token, short, and two past the bias's max_distance of 128 (300 spans
# two of blockwise's 256-query blocks); packed into one row they span two of its 512-key blocks
LENGTHS = [1, 5, 40, 200, 300]


def build_tokenizer():
    """transformers' own MPNetTokenizer (BertNormalizer lowercasing, BertPreTokenizer, WordPiece, <s> text </s>) over a
    WordPiece vocabulary trained on SENTENCES, MPNet's specials first and <mask> last."""
    import transformers
    from tokenizers import Tokenizer, models as tok_models, normalizers, pre_tokenizers, trainers

    trained = Tokenizer(tok_models.WordPiece(unk_token="[UNK]"))
    trained.normalizer = normalizers.BertNormalizer(lowercase=True)
    trained.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trained.train_from_iterator(SENTENCES * 4, trainers.WordPieceTrainer(vocab_size=300, special_tokens=SPECIALS))
    vocab = trained.get_vocab()
    vocab["<mask>"] = len(vocab)
    return transformers.MPNetTokenizer(vocab=vocab)


def build_st(out: Path) -> Path:
    """A random MPNet sentence-transformers model (mean pooling, normalised, max_seq_length 384, its pooler saved as
    all-mpnet-base-v2's is) saved as safetensors with its tokenizer."""
    import torch
    import transformers

    tokenizer = build_tokenizer()
    out.mkdir(parents=True)
    torch.manual_seed(0)
    config = transformers.MPNetConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=64, max_position_embeddings=514,
                                      initializer_range=0.2)
    model = transformers.MPNetModel(config).eval()
    with torch.no_grad():  # a bias and positions that differ a lot by row: an offset or bucket off by one shows
        model.encoder.relative_attention_bias.weight.normal_(0, 2.0)
        model.embeddings.position_embeddings.weight.normal_(0, 1.0)
        for name, weight in model.named_parameters():
            if "LayerNorm" in name:
                weight.add_(0.2 * torch.randn_like(weight))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_sentence_transformers_modules(out, dim=32, max_seq_len=MAX_SEQ_LEN)
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, Path]:
    """(the sentence-transformers dir, the docscore model dir converted from it)."""
    root = tmp_path_factory.mktemp("mpnet")
    src = build_st(root / "st")
    assert convert_main(["--hf", str(src), "--out", str(root / "docscore")]) == 0
    return src, root / "docscore"


def test_buckets_are_transformers_own():
    """Every key-query offset falls in the bucket MPNetEncoder.relative_position_bucket puts it in, those on a
    bucket's edge (8, 16, 32, 64, 128 positions away, either way) and far past max_distance included."""
    import torch
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    offsets = np.arange(-5000, 5001)
    expected = MPNetEncoder.relative_position_bucket(torch.as_tensor(offsets)).numpy()
    np.testing.assert_array_equal(relative_position_buckets(offsets, MPNET_BUCKETS, MPNET_MAX_DISTANCE), expected)
    assert len(set(expected.tolist())) == 31  # both halves used (bucket 16, offset 0 looked at from after, never is)


@pytest.mark.parametrize("attention", ["native", "flash"])
def test_hidden_states_match_transformers_padded_and_packed(converted, attention):
    import torch
    import transformers

    src, model_dir = converted
    loaded = models.load(str(model_dir), attention=attention)
    assert loaded.attention == {"native": "xla", "flash": "blockwise"}[attention]
    config = loaded.config
    assert (config.family, config.position_offset, config.type_vocab_size, config.relative_attention_buckets,
            config.max_positions, loaded.tokenizer.max_seq_len) == ("bert", 2, 0, 32, 512, MAX_SEQ_LEN)
    held = sum(int(leaf.size) for leaf in jax.tree.leaves(nnx.state(loaded.model, nnx.Param)))
    assert memory.parameter_count(config) == held  # the shared bias table counted once, no pooler

    rng = np.random.default_rng(7)
    docs = [np.concatenate([[0], rng.integers(5, config.vocab_size - 1, max(n - 2, 0)), [2]])[:n].astype(np.int32)
            for n in LENGTHS]
    docs[3][10] = 1  # the padding id inside a text: its position is 1 and later ones do not count it, as transformers
    ids, segments = padded(docs)
    real = segments > 0
    hf = transformers.MPNetModel.from_pretrained(src).eval()
    expected = transformers_hidden(hf, ids, segments)
    with torch.no_grad():  # the test can fail: the bias moves transformers' outputs, its buckets past 128 positions too
        table = hf.encoder.relative_attention_bias.weight
        kept = table.clone()
        table[[15, 31]] = 0.0  # the buckets of offsets from 91 on, both ways (past max_distance, 128, all in them)
        far = transformers_hidden(hf, ids, segments)
        table.zero_()
        unbiased = transformers_hidden(hf, ids, segments)
        table.copy_(kept)
    long_rows = real & (np.arange(ids.shape[1]) >= 91)
    assert np.abs(far[long_rows] - expected[long_rows]).max() > 0.05
    assert np.abs(unbiased[real] - expected[real]).max() > 0.5

    ours = np.asarray(loaded.model(jnp.asarray(ids), jnp.asarray(segments)))
    error = np.abs(ours[real] - expected[real]).max()
    print(f"mpnet {attention}: max abs diff {error:.2e} over {int(real.sum())} tokens")
    assert error <= 1e-4, error

    # all documents packed into one row (padding after them) equal transformers' of each alone
    packed_ids = np.pad(np.concatenate(docs), (0, 5))[None]
    packed_segments = np.pad(np.concatenate([np.full(len(d), s + 1, np.int32) for s, d in enumerate(docs)]), (0, 5))[None]
    packed = np.asarray(loaded.model(jnp.asarray(packed_ids), jnp.asarray(packed_segments)))[0]
    alone = np.concatenate([expected[row, :len(d)] for row, d in enumerate(docs)])
    error = np.abs(packed[:len(alone)] - alone).max()
    print(f"mpnet {attention} packed: max abs diff {error:.2e}")
    assert error <= 1e-4, error


def test_embeddings_through_docscore_run_equal_sentence_transformers(converted, tmp_path):
    """all-mpnet-base-v2's layout (mean pooling, Normalize, max_seq_length 384) through `docscore run --task embed`,
    documents packed two rows a call, texts up to ~300 tokens so offsets past max_distance count; the padding token
    written in a text is the padding id, which MPNet's positions skip."""
    from sentence_transformers import SentenceTransformer

    src, model_dir = converted
    loaded = models.load(str(model_dir), attention="native")
    long_texts = [" ".join(SENTENCES), " ".join(SENTENCES[::-1] + SENTENCES[:7])]
    texts = SENTENCES[:4] + long_texts + ["Use the <pad> token to pad sequences."]
    lengths = [len(ids) for ids in loaded.tokenizer.encode_ids(texts)]
    assert max(lengths) > 250 and max(lengths) <= MAX_SEQ_LEN, lengths
    assert 1 in loaded.tokenizer.encode_ids(texts[-1:])[0]
    expected = SentenceTransformer(str(src), device="cpu").encode(texts, normalize_embeddings=True)
    for attention in ("native", "flash"):
        ours = embed_run(tmp_path, model_dir, texts, attention)
        cosines = np.sum(ours * expected, axis=1)
        print(f"mpnet docscore run --attention {attention}: min cosine {cosines.min():.8f}")
        assert cosines.min() >= 0.99999, (attention, cosines.min())


def test_cls_pooling_without_normalize_equals_sentence_transformers(converted, tmp_path):
    """multi-qa-mpnet-base-dot-v1's layout: CLS pooling and no Normalize module (a dot-product model); docscore's
    embedding is the same direction, L2-normalised as every docscore embedding is."""
    import shutil

    from sentence_transformers import SentenceTransformer

    src = Path(shutil.copytree(converted[0], tmp_path / "dot"))
    (src / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32,
                                                                "pooling_mode_cls_token": True}))
    modules = json.loads((src / "modules.json").read_text())
    (src / "modules.json").write_text(json.dumps([m for m in modules if not m["type"].endswith("Normalize")]))
    assert convert_main(["--hf", str(src), "--out", str(tmp_path / "model")]) == 0
    loaded = models.load(str(tmp_path / "model"), attention="native")
    assert loaded.pooling == "cls"
    text = " ".join(SENTENCES)  # one window whose first token sees keys past max_distance
    expected = SentenceTransformer(str(src), device="cpu").encode([text], normalize_embeddings=True)[0]
    window = loaded.tokenizer.encode_windows([text])[0].windows[0]
    assert len(window) > 129
    got = loaded.embed_packed(window[None], np.ones_like(window)[None], 1)[0, 0]
    assert float(got @ expected) >= 0.99999


def hub_config(**changes) -> dict:
    """sentence-transformers/all-mpnet-base-v2's config.json keys (multi-qa-mpnet-base-dot-v1's are the same), with
    `changes` (None removes a key)."""
    base = {"architectures": ["MPNetForMaskedLM"], "attention_probs_dropout_prob": 0.1, "bos_token_id": 0,
            "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
            "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-05,
            "max_position_embeddings": 514, "model_type": "mpnet", "num_attention_heads": 12, "num_hidden_layers": 12,
            "pad_token_id": 1, "relative_attention_num_buckets": 32, "vocab_size": 30527}
    return {key: value for key, value in {**base, **changes}.items() if value is not None}


def test_a_hub_config_reads_as_transformers_reads_it_and_kernels_without_a_bias_are_refused():
    """all-mpnet-base-v2: 512 positions after padding id 1 (whatever pad_token_id says), no token types, a 32-bucket
    table, as many parameters as transformers' MPNetModel without its pooler; on a GPU or TPU flash is refused before
    any data is read, naming the bias (no flash kernel there adds one), and auto runs xla; on CPU flash is blockwise."""
    import torch
    import transformers

    config = config_from_hf(hub_config())
    assert (config.family, config.max_positions, config.position_offset, config.type_vocab_size,
            config.relative_attention_buckets, config.activation, config.layer_norm_eps) == (
        "bert", 512, 2, 0, 32, "gelu", 1e-05)
    assert config_from_hf(hub_config(pad_token_id=0)) == config  # MPNetEmbeddings.padding_idx is always 1
    assert config_from_hf(hub_config(relative_attention_num_buckets=None)) == config  # MPNetConfig's default, 32
    keys = {k: v for k, v in hub_config().items() if k not in ("model_type", "architectures")}
    with torch.device("meta"):
        hf = transformers.MPNetModel(transformers.MPNetConfig(**keys), add_pooling_layer=False)
    assert memory.parameter_count(config) == sum(p.numel() for p in hf.parameters())

    for backend in ("gpu", "tpu"):
        with pytest.raises(KernelUnsupportedError, match=f"--attention=flash .* cannot run on {backend}: .*it has no "
                                                         "relative position bias"):
            model_kernel("flash", config, MAX_SEQ_LEN, "bfloat16", backend=backend)
        assert model_kernel("auto", config, MAX_SEQ_LEN, "bfloat16", backend=backend) == "xla"
    assert model_kernel("flash", config, MAX_SEQ_LEN, "float32", backend="cpu") == "blockwise"
    assert model_kernel("flash", config_from_hf(hub_config(model_type="roberta")), MAX_SEQ_LEN, "bfloat16",
                        backend="gpu") == "pallas_gpu"  # the same sizes without the bias


@pytest.mark.parametrize("changes,message", [
    (dict(relative_attention_num_buckets=16), "relative_attention_num_buckets 16 is not supported: transformers' MPNet "
                                              "looks offsets up in 32 buckets"),
    (dict(relative_attention_num_buckets="32"), "relative_attention_num_buckets is \"32\"; it must be a whole number"),
    (dict(max_position_embeddings=2), "max_position_embeddings 2 leaves no position past"),
    (dict(hidden_act="swish"), "hidden_act \"swish\" is not supported"),
])
def test_config_values_docscore_does_not_compute_are_refused_by_key_and_value(changes, message):
    with pytest.raises(models.ModelLoadError, match=message):
        config_from_hf(hub_config(**changes))
