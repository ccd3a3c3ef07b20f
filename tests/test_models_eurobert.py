"""EuroBERT (model_type eurobert): Llama's blocks as an encoder attending both ways. A tiny random EuroBertModel and
EuroBertForMaskedLM, built in transformers (no download) and saved with save_pretrained, convert as embedders with
mean pooling (the masked-LM head not read, and convert says so); their final hidden states and mean-pooled
embeddings equal transformers' in padded and packed rows with both CPU kernels, a sentence-transformers directory
around one embeds as SentenceTransformer.encode, and the token-scoring tasks refuse it before any data is read."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import models
from models.config import EUROBERT, config_from_hf
from models.model_dir import METADATA
from pipeline.convert import main as convert_main
from tests.conftest import SENTENCES, byte_level_bpe, common_flags, perturb_parameters, run_docscore, write_jsonl
from tests.test_models_roberta import ST_MODULES, embed_run

pytestmark = pytest.mark.integration  # README.md, "Development"

MAX_SEQ_LEN = 48
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|mask|>"]  # EuroBERT's bos, eos/pad and mask, ids 0, 1, 2


def build_eurobert(out: Path, model_class: str, **settings) -> Path:
    """A random `model_class` (EuroBertModel, EuroBertForMaskedLM) saved with save_pretrained, with a byte-level BPE
    tokenizer that wraps each text in <|begin_of_text|> ... <|end_of_text|> as EuroBERT's does."""
    import torch
    import transformers
    from tokenizers import processors

    tokenizer = byte_level_bpe(SPECIALS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A <|end_of_text|>", special_tokens=[("<|begin_of_text|>", 0), ("<|end_of_text|>", 1)])
    out.mkdir(parents=True)
    torch.manual_seed(0)
    config = transformers.EuroBertConfig(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=64, intermediate_size=112, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4 * MAX_SEQ_LEN, initializer_range=0.2,
        bos_token_id=0, eos_token_id=1, pad_token_id=1, mask_token_id=2,
        rope_parameters={"rope_type": "default", "rope_theta": 250_000.0}, **settings)
    model = getattr(transformers, model_class)(config).eval()
    perturb_parameters(model, lambda name: "norm" in name.lower() or name.endswith("bias"))
    model.save_pretrained(out)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|begin_of_text|>",
                                         eos_token="<|end_of_text|>", pad_token="<|end_of_text|>",
                                         mask_token="<|mask|>").save_pretrained(out)
    return out


def convert(src: Path, out: Path, capsys) -> tuple[int, str]:
    code = convert_main(["--hf", str(src), "--out", str(out)])
    captured = capsys.readouterr()
    return code, captured.err + captured.out


def reference_hidden(src: Path, docs: list[np.ndarray]) -> list[np.ndarray]:
    """transformers' EuroBertModel final hidden states of `docs` in one right-padded batch, each cut to its length."""
    import torch
    import transformers

    model = transformers.EuroBertModel.from_pretrained(str(src)).eval()
    length = max(map(len, docs))
    ids = torch.tensor(np.stack([np.pad(d, (0, length - len(d)), constant_values=1) for d in docs]), dtype=torch.long)
    mask = torch.tensor(np.stack([np.arange(length) < len(d) for d in docs]), dtype=torch.long)
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
    return [hidden[row, :len(d)] for row, d in enumerate(docs)]


def mean_pooled(hidden: np.ndarray) -> np.ndarray:
    pooled = hidden.astype(np.float64).mean(axis=0)
    return pooled / np.linalg.norm(pooled)


@pytest.mark.parametrize("model_class, settings", [("EuroBertModel", {}),
                                                   ("EuroBertForMaskedLM", {"mlp_bias": True, "attention_bias": True})])
def test_a_plain_eurobert_directory_converts_as_a_mean_pooled_encoder_equal_to_transformers(model_class, settings,
                                                                                            tmp_path, capsys):
    import jax.numpy as jnp

    src = build_eurobert(tmp_path / "hf", model_class, **settings)
    code, message = convert(src, tmp_path / "model", capsys)
    assert code == 0 and f"wrote {tmp_path / 'model'}: llama, max_seq_len {4 * MAX_SEQ_LEN}, mean pooling" in message, message
    masked_lm = model_class == "EuroBertForMaskedLM"
    assert ("masked-LM head (lm_head) was not converted" in message) == masked_lm, message
    assert "converted as an embedder only" not in message, message  # not a decoder embedder missing its head
    assert json.loads((tmp_path / "model" / METADATA).read_text())["pooling"] == "mean"

    for attention in ("native", "flash"):  # flash on CPU: the blockwise kernel, both ways over packed segments
        loaded = models.load(str(tmp_path / "model"), attention=attention)
        config = loaded.config
        assert (config.family, config.model_type, config.causal, config.bidirectional, config.lm_head) == (
            "llama", "eurobert", False, True, False)
        assert (config.mlp_bias, config.qkv_bias, config.output_bias) == (masked_lm,) * 3
        docs = [loaded.tokenizer.encode_windows([t])[0].windows[0] for t in SENTENCES[:6]]
        assert all(d[0] == 0 and d[-1] == 1 for d in docs)
        expected = reference_hidden(src, docs)
        assert max(np.abs(e).max() for e in expected) > 1.0  # not a near-zero model

        # padded: one document a row, padding (segment 0) after it
        length = max(map(len, docs))
        ids = np.stack([np.pad(d, (0, length - len(d))) for d in docs]).astype(np.int32)
        segments = np.stack([np.arange(length) < len(d) for d in docs]).astype(np.int32)
        hidden = np.asarray(loaded.model.final_hidden(jnp.asarray(ids), jnp.asarray(segments)))
        for row, e in enumerate(expected):
            np.testing.assert_allclose(hidden[row, :len(e)], e, atol=2e-4, rtol=0)
        padded = loaded.embed_packed(ids, segments, 1)[:, 0].astype(np.float64)
        want = np.stack([mean_pooled(e) for e in expected])
        assert np.sum(padded * want, axis=1).min() >= 0.99999, attention

        # packed: every document in one row, each attending to its own segment only
        row = np.pad(np.concatenate(docs), (0, 5))[None].astype(np.int32)
        packed_segments = np.pad(np.concatenate([np.full(len(d), s + 1) for s, d in enumerate(docs)]), (0, 5))[None]
        packed_hidden = np.asarray(loaded.model.final_hidden(jnp.asarray(row), jnp.asarray(packed_segments.astype(np.int32))))[0]
        np.testing.assert_allclose(packed_hidden[:sum(map(len, docs))], np.concatenate(expected), atol=2e-4, rtol=0)
        packed = loaded.embed_packed(row, packed_segments.astype(np.int32), len(docs))[0].astype(np.float64)
        assert np.sum(packed * want, axis=1).min() >= 0.99999, attention
        with pytest.raises(ValueError, match=r"needs a decoder model, but .* \(eurobert\) is an encoder"):
            loaded.token_logprobs(ids, segments)


def build_st_eurobert(out: Path) -> Path:
    """A sentence-transformers directory around a random EuroBertModel: mean pooling, normalisation, a max length."""
    src = build_eurobert(out, "EuroBertModel")
    (src / "1_Pooling").mkdir()
    (src / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64,
                                                               "pooling_mode_mean_tokens": True}))
    (src / "2_Normalize").mkdir()
    (src / "modules.json").write_text(json.dumps(ST_MODULES))
    (src / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_SEQ_LEN}))
    return src


def test_a_sentence_transformers_eurobert_embeds_as_sentence_transformers_encode(tmp_path, capsys):
    """`docscore run --task embed` (two documents packed a row, both CPU kernels) gives SentenceTransformer.encode's
    embeddings."""
    from sentence_transformers import SentenceTransformer

    src = build_st_eurobert(tmp_path / "st")
    code, message = convert(src, tmp_path / "model", capsys)
    assert code == 0 and f"max_seq_len {MAX_SEQ_LEN}, mean pooling" in message, message
    texts = SENTENCES[:8]
    expected = SentenceTransformer(str(src), device="cpu").encode(texts, normalize_embeddings=True).astype(np.float64)
    for attention in ("native", "flash"):
        ours = embed_run(tmp_path, tmp_path / "model", texts, attention)
        assert np.sum(ours * expected, axis=1).min() >= 0.99999, attention


def test_the_token_scoring_tasks_refuse_eurobert_before_reading_data(tmp_path, capsys, no_data_read):
    src = build_st_eurobert(tmp_path / "st")
    assert convert(src, tmp_path / "model", capsys)[0] == 0
    shard = write_jsonl(tmp_path / "in" / "l.jsonl", [{"id": "l0", "text": "hello world", "choices": ["a", "b"]}])
    for task in ("loglik", "choice"):
        code = run_docscore("--input", shard, *common_flags(task, tmp_path / "out"), "--task", task,
                            "--model", tmp_path / "model")
        err = capsys.readouterr().err
        assert code == 2 and "attends both ways (model_type eurobert: an encoder)" in err, err
        assert "use it with --task embed, similarity or classify" in err, err


def test_eurobert_keys_left_out_are_eurobertconfigs_defaults():
    """A config.json holding only model_type reads as EuroBertConfig() builds the model; is_causal, which
    EuroBertModel never reads, changes nothing (null or true included)."""
    import transformers

    theirs = transformers.EuroBertConfig()
    ours = config_from_hf({"model_type": "eurobert"})
    assert (ours.vocab_size, ours.hidden_size, ours.intermediate_size, ours.num_layers, ours.num_heads, ours.kv_heads,
            ours.head_dim, ours.max_positions, ours.layer_norm_eps, ours.rope.theta) == (
        theirs.vocab_size, theirs.hidden_size, theirs.intermediate_size, theirs.num_hidden_layers,
        theirs.num_attention_heads, theirs.num_key_value_heads, theirs.head_dim, theirs.max_position_embeddings,
        theirs.rms_norm_eps, theirs.rope_parameters["rope_theta"])
    assert not theirs.tie_word_embeddings and EUROBERT["tie_word_embeddings"] is False
    assert (ours.bidirectional, ours.lm_head, ours.is_encoder, ours.causal) == (True, False, True, False)
    for is_causal in (True, None, False):
        assert config_from_hf({"model_type": "eurobert", "is_causal": is_causal}) == ours
