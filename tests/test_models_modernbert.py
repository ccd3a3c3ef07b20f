"""ModernBERT encoders: small random ModernBertModels built in transformers (no download), with global and local
layers (the local window shorter than the documents), converted with `docscore convert`, their final hidden states
against transformers' (eager and sdpa attention; padded rows, packed rows, both CPU kernels, a document past the
blockwise kernel's blocks), their embeddings through `docscore run --task embed` against SentenceTransformer.encode
(mean and CLS pooling); task-head checkpoints; every config value docscore does not compute refused by key and value."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
from kernels import KernelUnsupportedError
from models.config import config_from_hf
from models.loader import model_kernel
from pipeline.convert import main as convert_main
from pipeline.telemetry import memory
from tests.conftest import SENTENCES, byte_level_bpe, padded, perturb_parameters, read_summary
from tests.test_convert import CLS_POOLING
from tests.test_models_roberta import embed_run, write_sentence_transformers_modules

pytestmark = pytest.mark.integration  # README.md, "Development"

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
MAX_SEQ_LEN = 48
COMMON = dict(hidden_size=32, intermediate_size=40, num_attention_heads=4, max_position_embeddings=640,
              initializer_range=0.2, pad_token_id=0, bos_token_id=2, cls_token_id=2, eos_token_id=3, sep_token_id=3)
KINDS = {
    # 4 layers: 0 and 3 global, 1 and 2 local, seeing |i - j| <= 4 (a window of 5 each way); bias-free norms
    "base": dict(num_hidden_layers=4, global_attn_every_n_layers=3, local_attention=8, global_rope_theta=160_000.0,
                 local_rope_theta=10_000.0),
    # every bias, layer_types given, an odd local_attention (|i - j| <= 3), tanh GELU, own thetas
    "biased": dict(num_hidden_layers=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                   local_attention=7, norm_bias=True, attention_bias=True, mlp_bias=True,
                   hidden_activation="gelu_pytorch_tanh", norm_eps=1e-6,
                   rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5_000.0},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 500.0}}),
}
# document lengths ([CLS] and [SEP] included): one token, shorter than the window, longer, and one past the blockwise
# kernel's 256-query block
LENGTHS = [1, 4, 23, 61, 300]


def build_tokenizer():
    """A byte-level BPE with [CLS] text [SEP], as ModernBERT's."""
    from tokenizers import processors

    tokenizer = byte_level_bpe(SPECIALS)
    tokenizer.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                             special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tokenizer


def build_hf(out: Path, kind: str = "base", model_class: str = "ModernBertModel", **overrides) -> Path:
    """A random ModernBERT sentence-transformers model (mean pooling, normalised) saved as safetensors."""
    import torch
    import transformers

    tokenizer = build_tokenizer()
    out.mkdir(parents=True)
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(vocab_size=tokenizer.get_vocab_size(),
                                           **{**COMMON, **KINDS[kind], **overrides})
    model = getattr(transformers, model_class)(config).eval()
    return save_encoder(model, tokenizer, out, MAX_SEQ_LEN)


def save_encoder(model, tokenizer, out: Path, max_seq_len: int) -> Path:
    """A random encoder (norms and biases perturbed) saved as safetensors with its BERT-style special tokens and the
    sentence-transformers modules around it (mean pooling, normalised); `out`."""
    import transformers

    perturb_parameters(model, lambda name: "norm" in name.lower() or name.endswith("bias"))
    model.save_pretrained(out)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, cls_token="[CLS]", sep_token="[SEP]",
                                         pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]").save_pretrained(out)
    write_sentence_transformers_modules(out, dim=32, max_seq_len=max_seq_len)
    return out


def convert_built(build, kind: str, tmp_path_factory) -> tuple[str, Path, Path]:
    """(kind, the Hugging Face dir `build(dir, kind)` wrote, its docscore model dir converted for rows of 320 tokens)."""
    root = tmp_path_factory.mktemp(kind)
    src = build(root / "hf", kind)
    assert convert_main(["--hf", str(src), "--out", str(root / "docscore"), "--max_seq_len", "320"]) == 0
    return kind, src, root / "docscore"


@pytest.fixture(scope="module", params=list(KINDS))
def converted(request, tmp_path_factory) -> tuple[str, Path, Path]:
    return convert_built(build_hf, request.param, tmp_path_factory)


def documents(vocab_size: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [np.concatenate([[2], rng.integers(5, vocab_size, max(n - 2, 0)), [3]])[:n].astype(np.int32) for n in LENGTHS]


def transformers_hidden(src: Path, ids: np.ndarray, segments: np.ndarray, implementation: str) -> np.ndarray:
    """ModernBertModel's last_hidden_state over right-padded rows (attention_mask 1 on tokens), float32."""
    import torch
    import transformers

    model = transformers.ModernBertModel.from_pretrained(src, attn_implementation=implementation).eval()
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(ids, dtype=torch.long),
                    attention_mask=torch.as_tensor(segments > 0, dtype=torch.long)).last_hidden_state
    return out.numpy()


@pytest.mark.parametrize("attention", ["native", "flash"])
def test_hidden_states_match_transformers_padded_and_packed(converted, attention):
    kind, src, model_dir = converted
    loaded = models.load(str(model_dir), attention=attention)
    assert loaded.attention == {"native": "xla", "flash": "blockwise"}[attention]
    config = loaded.config
    assert (config.family, config.is_encoder, config.sliding_window) == ("modernbert", True,
                                                                        {"base": 5, "biased": 4}[kind])
    assert config.sliding_layers == {"base": (1, 2), "biased": (0, 2)}[kind]
    held = sum(int(leaf.size) for leaf in jax.tree.leaves(nnx.state(loaded.model, nnx.Param)))
    assert memory.parameter_count(config) == held  # layer 0 has no attention norm

    docs = documents(config.vocab_size)
    ids, segments = padded(docs)
    ours = np.asarray(loaded.model(jnp.asarray(ids), jnp.asarray(segments)))
    real = segments > 0
    for implementation in ("eager", "sdpa"):
        expected = transformers_hidden(src, ids, segments, implementation)
        assert np.abs(expected[real]).max() > 1.0
        error = np.abs(ours[real] - expected[real]).max()
        cosine = np.min(np.sum(ours[real] * expected[real], -1)
                        / np.linalg.norm(ours[real], axis=-1) / np.linalg.norm(expected[real], axis=-1))
        print(f"{kind} {attention} vs {implementation}: max abs diff {error:.2e}, min cosine {cosine:.8f}")
        assert error <= 1e-4, (kind, implementation, error)

    # all documents packed into one row (padding after them) equal each alone
    packed_ids = np.pad(np.concatenate(docs), (0, 5))[None]
    packed_segments = np.pad(np.concatenate([np.full(len(d), s + 1, np.int32) for s, d in enumerate(docs)]), (0, 5))[None]
    packed = np.asarray(loaded.model(jnp.asarray(packed_ids), jnp.asarray(packed_segments)))[0]
    alone = np.concatenate([ours[row, :len(d)] for row, d in enumerate(docs)])
    np.testing.assert_allclose(packed[:len(alone)], alone, atol=2e-5, rtol=0)


def test_the_local_window_changes_the_outputs(tmp_path):
    """The same weights with every layer global differ from transformers' with local layers (so the parity above
    is about the window), and equal transformers' all-global model."""
    src = build_hf(tmp_path / "hf")
    config = json.loads((src / "config.json").read_text())
    glob = tmp_path / "global"
    glob.mkdir()
    for path in src.iterdir():
        if path.is_file():
            (glob / path.name).write_bytes(path.read_bytes())
    (glob / "config.json").write_text(json.dumps({**config, "layer_types": ["full_attention"] * 4}))
    assert convert_main(["--hf", str(glob), "--out", str(tmp_path / "docscore"), "--max_seq_len", "64"]) == 0
    loaded = models.load(str(tmp_path / "docscore"), attention="native")
    assert loaded.config.sliding_layers == ()
    docs = documents(loaded.config.vocab_size)[:4]
    ids, segments = padded(docs)
    ours = np.asarray(loaded.model(jnp.asarray(ids), jnp.asarray(segments)))
    real = segments > 0
    assert np.abs(ours[real] - transformers_hidden(glob, ids, segments, "eager")[real]).max() <= 1e-4
    assert np.abs(ours[real] - transformers_hidden(src, ids, segments, "eager")[real]).max() > 1e-2


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_embeddings_through_docscore_run_equal_sentence_transformers(tmp_path, pooling):
    """A CLS-pooling ModernBERT directory (as some ModernBERT embedders are) gives SentenceTransformer.encode's
    embeddings through `docscore run` (documents packed in rows), as a mean one does."""
    from sentence_transformers import SentenceTransformer

    src = build_hf(tmp_path / "st")
    if pooling == "cls":
        (src / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **CLS_POOLING}))
    assert convert_main(["--hf", str(src), "--out", str(tmp_path / "model")]) == 0
    loaded = models.load(str(tmp_path / "model"), attention="native")
    assert (loaded.tokenizer.max_seq_len, loaded.pooling) == (MAX_SEQ_LEN, pooling)
    texts = SENTENCES[:8]  # each one window, most longer than the local window; --batch_size 2 packs them in rows
    assert max(len(t) for t in loaded.tokenizer.encode_ids(texts)) > 5
    expected = SentenceTransformer(str(src), device="cpu").encode(texts, normalize_embeddings=True)
    # pooling is applied to the final hidden states, whichever kernel made them (their parity under both is
    # checked above): the CLS case runs one kernel, to keep this test short
    for attention in ("native", "flash") if pooling == "mean" else ("native",):
        ours = embed_run(tmp_path, tmp_path / "model", texts, attention)
        error = np.abs(ours - expected).max()
        cosine = np.min(np.sum(ours * expected, -1))
        print(f"sentence-transformers {pooling} {attention}: max abs diff {error:.2e}, min cosine {cosine:.8f}")
        assert error < 1e-5 and cosine >= 0.99999, (pooling, attention, error, cosine)
        assert read_summary(tmp_path / "out", attention)["model"]["pooling"] == pooling


@pytest.mark.parametrize("model_class", ["ModernBertForMaskedLM", "ModernBertForSequenceClassification"])
def test_task_head_checkpoints_convert_to_the_base_model(tmp_path, capsys, model_class):
    """ModernBertForX saves the model under "model." and its head (head., decoder., classifier.) at the root: the
    base model converts with the same weights, and a classifier's head is left out with a note."""
    import torch
    import transformers

    src = build_hf(tmp_path / "hf", model_class=model_class)
    assert convert_main(["--hf", str(src), "--out", str(tmp_path / "model"), "--max_seq_len", "64"]) == 0
    note = capsys.readouterr().err
    assert (f"{model_class}'s task head was not converted" in note) == (model_class != "ModernBertForMaskedLM")
    loaded = models.load(str(tmp_path / "model"), attention="native")
    ids, segments = padded(documents(loaded.config.vocab_size)[:4])
    ours = np.asarray(loaded.model(jnp.asarray(ids), jnp.asarray(segments)))
    base = getattr(transformers, model_class).from_pretrained(src, attn_implementation="eager").model.eval()
    with torch.no_grad():
        expected = base(input_ids=torch.as_tensor(ids, dtype=torch.long),
                        attention_mask=torch.as_tensor(segments, dtype=torch.long)).last_hidden_state.numpy()
    assert np.abs(ours[segments > 0] - expected[segments > 0]).max() <= 1e-4


def test_kernels_without_a_local_window_are_refused_before_any_data():
    """The model's local window (each way) is part of the shape info validation resolves the kernel with: on a GPU,
    flash (cudnn, pallas_gpu) is refused naming it, auto runs xla; rows no longer than the window run anything."""
    config = config_from_hf(hub_config())
    assert config.sliding_window == 65 and config.max_positions == 8192 and config.default_seq_len == 8192
    with pytest.raises(KernelUnsupportedError, match="local .sliding-window. attention, which this model's window of "
                                                     "64 positions each way needs in rows of 1024 tokens .rows of at most 65 "
                                                     "tokens would not need it."):
        model_kernel("flash", config, 1024, "bfloat16", backend="gpu")
    assert model_kernel("auto", config, 1024, "bfloat16", backend="gpu") == "xla"
    without = dataclasses.replace(config, sliding_window=0, sliding_layers=())
    assert model_kernel("flash", config, 64, "bfloat16", backend="gpu") == model_kernel("flash", without, 64, "bfloat16",
                                                                                        backend="gpu")


def hub_config(**changes) -> dict:
    """answerdotai/ModernBERT-base's config.json keys (as written by transformers 4.48), with `changes`."""
    base = {"model_type": "modernbert", "architectures": ["ModernBertForMaskedLM"], "vocab_size": 50368,
            "hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22, "num_attention_heads": 12,
            "hidden_activation": "gelu", "max_position_embeddings": 8192, "norm_eps": 1e-05, "norm_bias": False,
            "global_rope_theta": 160000.0, "local_rope_theta": 10000.0, "local_attention": 128,
            "global_attn_every_n_layers": 3, "attention_bias": False, "mlp_bias": False, "pad_token_id": 50283,
            "classifier_pooling": "mean", "reference_compile": True, "deterministic_flash_attn": False}
    return {key: value for key, value in {**base, **changes}.items() if value is not None}


def test_a_hub_config_reads_as_transformers_5_reads_it():
    """The hub's config (global_attn_every_n_layers, global/local_rope_theta) and the one transformers 5 saves from
    it (layer_types, rope_parameters) give the same model: globals at 0, 3, 6, ..., thetas 160k / 10k."""
    import transformers

    keys = {k: v for k, v in hub_config().items() if k not in ("model_type", "architectures")}
    saved = transformers.ModernBertConfig(**keys).to_dict()
    config = config_from_hf(hub_config())
    assert config_from_hf(saved) == config
    assert config.sliding_layers == tuple(i for i in range(22) if i % 3)
    assert (config.rope.theta, config.local_rope.theta, config.layer_rope(0).theta, config.layer_rope(1).theta) == (
        160_000.0, 10_000.0, 160_000.0, 10_000.0)
    assert (config.activation, config.norm_bias, config.qkv_bias, config.layer_norm_eps) == ("gelu", False, False, 1e-5)


@pytest.mark.parametrize("changes,message", [
    (dict(hidden_activation="silu"), "hidden_activation \"silu\" is not supported"),
    (dict(layer_types=["full_attention", "chunked_attention"] * 11), "layer_types holds 'chunked_attention'"),
    (dict(layer_types=["full_attention"] * 3), "layer_types has 3 entries for num_hidden_layers 22"),
    (dict(global_attn_every_n_layers=0), "global_attn_every_n_layers is 0; it must be a whole number >= 1"),
    (dict(local_attention=-2), "local_attention is -2; it must be a whole number >= 0"),
    (dict(local_attention="128"), "local_attention is \"128\"; it must be a whole number >= 0"),
    (dict(global_rope_theta=0), "global_rope_theta is 0; it must be a positive, finite number"),
    (dict(rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0}}),
     "rope_parameters.full_attention.rope_type \"linear\" is not supported"),
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "rope_scaling.rope_type \"dynamic\" is not supported"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1.0}), "rope_parameters holds .* per layer type"),
    (dict(head_dim=32), "head_dim 32 is not supported"),
    (dict(hidden_size=36, num_attention_heads=4), "head_dim 9 .* is odd"),
    (dict(hidden_size=770), "hidden size 770 is not a multiple of 12 attention heads"),
    (dict(norm_eps=0), "norm_eps is 0; it must be a number between 0 and 1"),
    (dict(max_position_embeddings=None), "modernbert config lacks the field 'max_position_embeddings'"),
])
def test_config_values_docscore_does_not_compute_are_refused_by_key_and_value(changes, message):
    with pytest.raises(models.ModelLoadError, match=message):
        config_from_hf(hub_config(**changes))


def test_every_weight_matrix_is_split_over_a_model_mesh():
    """The fused Wqkv and GeGLU Wi are split into the names models/sharding.py's rules know, so ModernBERT-base's
    matrices (and its embedding) are split over a model axis of 4 devices, and only its LayerNorm scales copied."""
    from models.architecture import flat_params, param_shapes
    from models.sharding import partition_spec

    config = dataclasses.replace(config_from_hf(hub_config()), num_layers=2)  # layer 0 (no attention norm) and 1
    shapes = flat_params(param_shapes(config))
    copied = sorted(name for name, leaf in shapes.items() if partition_spec(name, leaf.shape, 4) == jax.sharding.PartitionSpec())
    assert copied and all(name.endswith("norm/scale") for name in copied), copied
    assert len([name for name in shapes if name.startswith("layers/1/")]) == 9  # q, k, v, output, gate, up, down, 2 norms
