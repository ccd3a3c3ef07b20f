"""T5 encoders (sentence-t5, GTR-T5: T5EncoderModel under a sentence-transformers mean Pooling, a bias-free identity
Dense and Normalize; mT5): small random models built in transformers with a real T5Tokenizer (a Unigram vocabulary
trained here, no download), converted with `docscore convert`; their final hidden states against T5EncoderModel's (both
CPU kernels, padded rows and packed ones, both feed-forward kinds, documents long enough that the far buckets count),
their embeddings through `docscore run --task embed` against SentenceTransformer.encode; transformers' own buckets; hub
configs' sizes, the kernels refused before any data, the decoder of a whole T5 left out with a note, and config values
docscore does not compute refused by key."""
from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

import models
from kernels import KernelUnsupportedError
from models.architecture import every_param_shape
from models.config import config_from_hf
from models.hf_import import convert_hf_dir
from models.layers import relative_position_buckets
from models.loader import model_kernel
from models.sharding import partition_spec
from pipeline.convert import main as convert_main
from pipeline.telemetry import memory
from tests.conftest import SENTENCES, padded, transformers_hidden
from tests.test_models_roberta import embed_run

pytestmark = pytest.mark.integration  # README.md, "Development"

MAX_SEQ_LEN = 384
SPECIALS = ["<pad>", "</s>", "<unk>"]  # T5's vocabulary starts so: <pad> 0, </s> 1, <unk> 2
# kind: (config class, encoder class, config keywords). relu: T5 v1.0's MLP (sentence-t5, GTR) with T5's 32 buckets up
# to 128; gated: mT5's gated-GELU MLP, heads of d_kv 8 whose 4 x 8 is not d_model 48, and 16 buckets up to 40
KINDS = {
    "relu": ("T5Config", "T5EncoderModel", dict(d_model=32, d_kv=8, num_heads=4, d_ff=64)),
    "gated": ("MT5Config", "MT5EncoderModel", dict(d_model=48, d_kv=8, num_heads=4, d_ff=64,
                                                   relative_attention_num_buckets=16,
                                                   relative_attention_max_distance=40)),
}
# document lengths (</s> included): one token, short, and two past the relu kind's max_distance of 128 (300 spans two
# of blockwise's 256-query blocks)
LENGTHS = [1, 5, 40, 200, 300]


def build_tokenizer():
    """transformers' own T5Tokenizer (Metaspace, Unigram, text </s>) over a Unigram vocabulary trained on SENTENCES,
    T5's specials first and two sentinels (<extra_id_N>) after it."""
    import transformers
    from tokenizers import Tokenizer, models as tok_models, pre_tokenizers, trainers

    trained = Tokenizer(tok_models.Unigram())
    trained.pre_tokenizer = pre_tokenizers.Metaspace()
    trained.train_from_iterator(SENTENCES * 4, trainers.UnigramTrainer(vocab_size=300, special_tokens=SPECIALS,
                                                                      unk_token="<unk>", show_progress=False))
    vocab = [tuple(piece) for piece in json.loads(trained.to_str())["model"]["vocab"]]
    assert [piece for piece, _ in vocab[:3]] == SPECIALS
    return transformers.T5Tokenizer(vocab=vocab, extra_ids=2)


def write_st_modules(out: Path, dim: int) -> None:
    """What sentence-transformers saves around sentence-t5 and GTR: mean Pooling, a Dense without bias and with the
    identity activation (random weights here), Normalize, max_seq_length."""
    import torch
    from safetensors.torch import save_file

    modules = [("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Dense", "Dense"), ("3_Normalize", "Normalize")]
    (out / "modules.json").write_text(json.dumps([{"idx": i, "name": str(i), "path": path,
                                                   "type": f"sentence_transformers.models.{kind}"}
                                                  for i, (path, kind) in enumerate(modules)]))
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": dim,
                                                               "pooling_mode_mean_tokens": True}))
    (out / "2_Dense").mkdir()
    (out / "2_Dense" / "config.json").write_text(json.dumps({
        "in_features": dim, "out_features": dim, "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity"}))
    save_file({"linear.weight": torch.randn(dim, dim, generator=torch.Generator().manual_seed(1)) / dim ** 0.5},
              str(out / "2_Dense" / "model.safetensors"))
    (out / "3_Normalize").mkdir()
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_SEQ_LEN}))


def build_st(out: Path, kind: str) -> Path:
    """A random T5 (or mT5) encoder as sentence-transformers saves sentence-t5: T5EncoderModel's safetensors
    (shared.weight and encoder.*), its tokenizer, the modules around it. Layer norms and the bias table far from their
    init, so a norm, offset or bucket off shows."""
    import torch
    import transformers

    config_class, model_class, sizes = KINDS[kind]
    tokenizer = build_tokenizer()
    out.mkdir(parents=True)
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(vocab_size=len(tokenizer) + 6, num_layers=2, **sizes)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():
        model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.normal_(0, 2.0)
        for name, weight in model.named_parameters():
            if "layer_norm" in name:
                weight.add_(0.3 * torch.randn_like(weight))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_st_modules(out, config.d_model)
    return out


@pytest.fixture(scope="module", params=sorted(KINDS))
def converted(request, tmp_path_factory) -> tuple[str, Path, Path]:
    """(kind, the sentence-transformers dir, the docscore model dir converted from it)."""
    root = tmp_path_factory.mktemp(f"t5-{request.param}")
    src = build_st(root / "st", request.param)
    assert convert_main(["--hf", str(src), "--out", str(root / "docscore")]) == 0
    return request.param, src, root / "docscore"


@pytest.mark.parametrize("buckets,max_distance", [(32, 128), (16, 40), (8, 20), (64, 256)])
def test_buckets_are_transformers_own(buckets, max_distance):
    """Every key-query offset falls in the bucket T5Attention._relative_position_bucket (bidirectional, the encoder's)
    puts it in, for T5's 32 buckets up to 128 and others, those on a bucket's edge and far past max_distance
    included."""
    import torch
    from transformers.models.t5.modeling_t5 import T5Attention

    offsets = np.arange(-5000, 5001)
    expected = T5Attention._relative_position_bucket(torch.as_tensor(offsets), bidirectional=True,
                                                     num_buckets=buckets, max_distance=max_distance).numpy()
    np.testing.assert_array_equal(relative_position_buckets(offsets, buckets, max_distance), expected)
    assert len(set(expected.tolist())) == buckets - 1  # both halves used (offset 0 seen from after, never is)


@pytest.mark.parametrize("attention", ["native", "flash"])
def test_hidden_states_match_transformers_padded_and_packed(converted, attention):
    import torch
    import transformers

    kind, src, model_dir = converted
    config_class, model_class, sizes = KINDS[kind]
    loaded = models.load(str(model_dir), attention=attention)
    assert loaded.attention == {"native": "xla", "flash": "blockwise"}[attention]
    config = loaded.config
    buckets = sizes.get("relative_attention_num_buckets", 32)
    max_distance = sizes.get("relative_attention_max_distance", 128)
    assert (config.family, config.model_type, config.gated_feed_forward, config.head_dim,
            config.relative_attention_buckets, config.relative_attention_max_distance, config.max_positions,
            loaded.tokenizer.max_seq_len) == (
        "t5", {"relu": "t5", "gated": "mt5"}[kind], kind == "gated", 8, buckets, max_distance, 512, MAX_SEQ_LEN)
    held = sum(int(leaf.size) for leaf in jax.tree.leaves(nnx.state(loaded.model, nnx.Param)))
    assert memory.parameter_count(config) == held  # the one bias table, the Dense

    rng = np.random.default_rng(7)
    docs = [np.concatenate([rng.integers(3, config.vocab_size, n - 1), [1]]).astype(np.int32) for n in LENGTHS]
    ids, segments = padded(docs)
    real = segments > 0
    hf = getattr(transformers, model_class).from_pretrained(src).eval()
    expected = transformers_hidden(hf, ids, segments)
    # the test can fail: the bias moves transformers' outputs, its far buckets too, and so would a 1/sqrt(d) scale
    attentions = [block.layer[0].SelfAttention for block in hf.encoder.block]
    first_far = int(np.argmax(relative_position_buckets(np.arange(600), buckets, max_distance) == buckets - 1))
    with torch.no_grad():
        table = attentions[0].relative_attention_bias.weight
        kept = table.clone()
        table[[buckets // 2 - 1, buckets - 1]] = 0.0  # the buckets of offsets from first_far on, both ways
        far = transformers_hidden(hf, ids, segments)
        table.zero_()
        unbiased = transformers_hidden(hf, ids, segments)
        table.copy_(kept)
    for module in attentions:
        module.scaling = config.head_dim ** -0.5
    scaled = transformers_hidden(hf, ids, segments)
    for module in attentions:
        module.scaling = 1.0
    long_rows = real & (np.arange(ids.shape[1]) >= first_far)
    print(f"t5 {kind}: transformers moves by {np.abs(far[long_rows] - expected[long_rows]).max():.3f} without the far "
          f"buckets, {np.abs(unbiased[real] - expected[real]).max():.3f} without the bias, "
          f"{np.abs(scaled[real] - expected[real]).max():.3f} at a 1/sqrt(d) scale")
    assert first_far < max(LENGTHS) and np.abs(far[long_rows] - expected[long_rows]).max() > 0.05
    assert np.abs(unbiased[real] - expected[real]).max() > 0.5
    assert np.abs(scaled[real] - expected[real]).max() > 0.5

    ours = np.asarray(loaded.model(jnp.asarray(ids), jnp.asarray(segments)))
    error = np.abs(ours[real] - expected[real]).max()
    print(f"t5 {kind} {attention}: max abs diff {error:.2e} over {int(real.sum())} tokens")
    assert error <= 1e-4, error

    # all documents packed into one row (padding id 0 after them) equal transformers' of each alone
    packed_ids = np.pad(np.concatenate(docs), (0, 5))[None]
    packed_segments = np.concatenate([np.full(len(d), s + 1, np.int32) for s, d in enumerate(docs)])
    packed_segments = np.pad(packed_segments, (0, 5))[None]
    packed = np.asarray(loaded.model(jnp.asarray(packed_ids), jnp.asarray(packed_segments)))[0]
    alone = np.concatenate([expected[row, :len(d)] for row, d in enumerate(docs)])
    error = np.abs(packed[:len(alone)] - alone).max()
    print(f"t5 {kind} {attention} packed: max abs diff {error:.2e}")
    assert error <= 1e-4, error


def test_embeddings_through_docscore_run_equal_sentence_transformers(converted, tmp_path):
    """sentence-t5's layout (mean Pooling, a bias-free identity Dense, Normalize) through `docscore run --task embed`,
    documents packed two rows a call, texts up to ~300 tokens so the far buckets count; the relu kind with native
    attention, the gated (mT5) kind with flash."""
    from sentence_transformers import SentenceTransformer

    kind, src, model_dir = converted
    loaded = models.load(str(model_dir), attention="native")
    assert [spec.bias for spec in loaded.config.dense] == [False] and loaded.pooling == "mean"
    long_texts = [" ".join(SENTENCES[:10]), " ".join(SENTENCES[::-1][:9])]  # 318 and 328 tokens
    texts = SENTENCES[:4] + long_texts + ["Use the <pad> token to pad sequences."]
    windows = loaded.tokenizer.encode_ids(texts)
    assert 250 < max(map(len, windows)) < MAX_SEQ_LEN and 0 in windows[-1]  # <pad> written in a text is id 0
    expected = SentenceTransformer(str(src), device="cpu").encode(texts, normalize_embeddings=True)
    attention = {"relu": "native", "gated": "flash"}[kind]
    ours = embed_run(tmp_path, model_dir, texts, attention)
    cosines = np.sum(ours * expected, axis=1)
    print(f"t5 {kind} docscore run --attention {attention}: min cosine {cosines.min():.8f}")
    assert cosines.min() >= 0.99999, (kind, attention, cosines.min())


def sentence_t5_base(**changes) -> dict:
    """sentence-t5-base's sizes as config.json keys (an older save: no relative_attention_max_distance, so 128; GTR-T5
    base has the same), with `changes` (None removes a key)."""
    base = {"architectures": ["T5EncoderModel"], "d_ff": 3072, "d_kv": 64, "d_model": 768, "dropout_rate": 0.1,
            "eos_token_id": 1, "feed_forward_proj": "relu", "initializer_factor": 1.0, "is_encoder_decoder": True,
            "layer_norm_epsilon": 1e-06, "model_type": "t5", "n_positions": 512, "num_decoder_layers": 12,
            "num_heads": 12, "num_layers": 12, "pad_token_id": 0, "relative_attention_num_buckets": 32,
            "vocab_size": 32128}
    return {key: value for key, value in {**base, **changes}.items() if value is not None}


def transformers_parameters(model_class: str, hf: dict) -> int:
    import torch
    import transformers

    config_class = {"T5EncoderModel": "T5Config", "MT5EncoderModel": "MT5Config"}[model_class]
    keys = {k: v for k, v in hf.items() if k not in ("model_type", "architectures")}
    with torch.device("meta"):
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**keys))
    return sum(p.numel() for p in model.parameters())


def test_hub_configs_read_as_transformers_reads_them_and_kernels_without_a_bias_are_refused():
    """sentence-t5-base (T5 v1.0: ReLU MLP) and mt5-small (gated-GELU, 6 heads of 64 over d_model 512, its MLP and
    vocabulary MT5Config's defaults when left out): as many parameters as transformers' encoder models; on a GPU or TPU
    flash is refused before any data is read, naming the bias, and auto runs xla; on CPU flash is blockwise. The
    memory estimate counts mt5's gated MLP as three intermediate tensors."""
    config = config_from_hf(sentence_t5_base())
    assert (config.family, config.hidden_size, config.num_heads, config.head_dim, config.intermediate_size,
            config.relative_attention_buckets, config.relative_attention_max_distance, config.activation,
            config.gated_feed_forward, config.max_positions, config.is_encoder, config.causal) == (
        "t5", 768, 12, 64, 3072, 32, 128, "relu", False, 512, True, False)
    assert memory.parameter_count(config) == transformers_parameters("T5EncoderModel", sentence_t5_base())
    assert config_from_hf(sentence_t5_base(n_positions=None)) == config  # 512, T5's trained length
    # over a model axis, every matrix splits by models/sharding.py's names (norms and the small bias table copied)
    shapes = every_param_shape(config)
    split = {name for name, spec in shapes.items() if partition_spec(name, spec.shape, 2) != PartitionSpec()}
    assert split == {name for name in shapes if name.endswith("kernel") or name == "token_embedding/embedding"}
    assert len(split) == 12 * 6 + 1

    mt5_small = {"model_type": "mt5", "d_model": 512, "num_layers": 8, "tie_word_embeddings": False}
    mt5 = config_from_hf(mt5_small)
    assert (mt5.vocab_size, mt5.intermediate_size, mt5.num_heads, mt5.head_dim, mt5.activation, mt5.gated_mlp) == (
        250112, 1024, 6, 64, "gelu_tanh", True)
    assert memory.parameter_count(mt5) == transformers_parameters("MT5EncoderModel", mt5_small)
    estimate = lambda c: memory.call_estimate(c, batch_size=4, seq_len=128, dtype="float32", attention="xla")
    ungated = config_from_hf({**mt5_small, "feed_forward_proj": "relu"})
    assert estimate(mt5).activations - estimate(ungated).activations == 2 * 4 * 128 * 1024 * memory.ACTIVATION_BYTES

    for backend in ("gpu", "tpu"):
        with pytest.raises(KernelUnsupportedError, match=f"--attention=flash .* cannot run on {backend}: .*it has no "
                                                         "relative position bias.*T5's relative_attention_bias"):
            model_kernel("flash", config, MAX_SEQ_LEN, "bfloat16", backend=backend)
        assert model_kernel("auto", config, MAX_SEQ_LEN, "bfloat16", backend=backend) == "xla"
    assert model_kernel("flash", config, MAX_SEQ_LEN, "float32", backend="cpu") == "blockwise"


def test_config_json_activation_keys_win_over_feed_forward_proj_as_in_transformers():
    """transformers 5 saves is_gated_act and dense_act_fn beside feed_forward_proj and, reading them back, lets them
    win; docscore reads the MLP the same way."""
    import transformers

    for changes in ({"feed_forward_proj": "gated-gelu", "is_gated_act": False, "dense_act_fn": "relu"},
                    {"feed_forward_proj": "relu", "is_gated_act": True, "dense_act_fn": "gelu_new"},
                    {"feed_forward_proj": "gelu"}, {"feed_forward_proj": "gated-gelu"}):
        theirs = transformers.T5Config.from_dict(sentence_t5_base(**changes))
        ours = config_from_hf(sentence_t5_base(**changes))
        named = {"relu": "relu", "gelu_new": "gelu_tanh", "gelu": "gelu"}[theirs.dense_act_fn]
        assert (ours.gated_feed_forward, ours.activation) == (theirs.is_gated_act, named), changes


@pytest.mark.parametrize("changes,message", [
    (dict(is_decoder=True), "is_decoder true: this config describes a t5 decoder stack"),
    (dict(feed_forward_proj="gated-silu"), "feed_forward_proj \"gated-silu\" is not supported; docscore computes"),
    (dict(dense_act_fn="silu"), "dense_act_fn \"silu\" is not supported"),
    (dict(feed_forward_proj="relu-gated"), "feed_forward_proj \"relu-gated\" is not supported; transformers reads"),
    (dict(is_gated_act="yes"), "is_gated_act is \"yes\"; it must be true or false"),
    (dict(relative_attention_num_buckets=2), "relative_attention_num_buckets 2 is not supported"),
    (dict(relative_attention_max_distance=8), "relative_attention_max_distance 8 is not supported: it must exceed"),
    (dict(num_heads=0), "num_heads is 0; it must be a whole number from 1"),
    (dict(n_positions="512"), "n_positions is \"512\"; it must be a whole number"),
    (dict(layer_norm_epsilon=0), "layer_norm_epsilon is 0; it must be a number between 0 and 1"),
    (dict(model_type="umt5"), "model_type 'umt5' is not supported; .*T5's encoder \\(model_type 't5' or 'mt5'"),
])
def test_config_values_docscore_does_not_compute_are_refused_by_key_and_value(changes, message):
    with pytest.raises(models.ModelLoadError, match=message):
        config_from_hf(sentence_t5_base(**changes))


def test_a_whole_t5_converts_as_its_encoder_with_a_note(tmp_path, capsys):
    """T5ForConditionalGeneration (t5-base's layout: shared, encoder, decoder): the decoder is never read and convert
    says so; the model's hidden states are its encoder's. A sentence-transformers T5 (T5EncoderModel) gets no note."""
    import torch
    import transformers

    tokenizer = build_tokenizer()
    torch.manual_seed(3)
    config = transformers.T5Config(vocab_size=len(tokenizer), num_layers=2, **KINDS["relu"][2])
    model = transformers.T5ForConditionalGeneration(config).eval()
    model.save_pretrained(tmp_path / "t5")
    tokenizer.save_pretrained(tmp_path / "t5")
    assert convert_main(["--hf", str(tmp_path / "t5"), "--out", str(tmp_path / "model")]) == 0
    assert ("T5ForConditionalGeneration is an encoder-decoder model: its encoder was converted"
            in capsys.readouterr().err)
    loaded = models.load(str(tmp_path / "model"), attention="native")
    ids = np.asarray(tokenizer(" ".join(SENTENCES[:3]))["input_ids"], np.int32)[None]
    with torch.no_grad():
        expected = model.encoder(input_ids=torch.as_tensor(ids, dtype=torch.long)).last_hidden_state.numpy()
    ours = np.asarray(loaded.model(jnp.asarray(ids), jnp.ones_like(jnp.asarray(ids))))
    assert np.abs(ours - expected).max() <= 1e-4

    src = build_st(tmp_path / "st", "relu")
    assert convert_main(["--hf", str(src), "--out", str(tmp_path / "st-model")]) == 0
    assert "note" not in capsys.readouterr().err


def test_an_encoder_table_of_its_own_is_read_as_transformers_unties_it(tmp_path):
    """A checkpoint holding encoder.embed_tokens.weight beside a different shared.weight (saved untied): transformers
    then unties them and the encoder reads its own table, and so does docscore."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    src = build_st(tmp_path / "st", "relu")
    tensors = load_file(str(src / "model.safetensors"))
    tensors["encoder.embed_tokens.weight"] = torch.randn_like(tensors["shared.weight"])
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    assert convert_main(["--hf", str(src), "--out", str(tmp_path / "model")]) == 0
    loaded = models.load(str(tmp_path / "model"), attention="native")
    ids = np.asarray(build_tokenizer()(" ".join(SENTENCES[:3]))["input_ids"], np.int32)[None]
    hf = transformers.T5EncoderModel.from_pretrained(src).eval()
    assert not torch.equal(hf.encoder.embed_tokens.weight, hf.shared.weight)
    expected = transformers_hidden(hf, ids, np.ones_like(ids))
    ours = np.asarray(loaded.model(jnp.asarray(ids), jnp.ones_like(jnp.asarray(ids))))
    assert np.abs(ours - expected).max() <= 1e-4


def test_instructor_is_refused_by_its_module(tmp_path):
    """INSTRUCTOR (hkunlp/instructor-*: GTR-T5 under its own INSTRUCTOR_Transformer module, which leaves the
    instruction's tokens out of the mean) is refused before any weight is read: docscore would pool them."""
    (tmp_path / "config.json").write_text(json.dumps(sentence_t5_base()))
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "InstructorEmbedding.INSTRUCTOR_Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    with pytest.raises(models.ModelLoadError, match="INSTRUCTOR_Transformer.* is not supported; docscore computes"):
        convert_hf_dir(str(tmp_path), str(tmp_path / "out"))
