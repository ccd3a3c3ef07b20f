"""DistilBERT encoders (BERT's post-norm blocks under other tensor names, no token types): a small random
sentence-transformers model built in transformers (no download), converted with `docscore convert` and run through
`docscore run --task embed`, whose embeddings (documents packed in rows) must equal SentenceTransformer.encode's; its
task-head checkpoints convert with a note, and a model with sinusoidal positions (saved as its position table) too."""
from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

import models
from models.config import config_from_hf
from pipeline.convert import main as convert_main
from pipeline.telemetry import memory
from tests.conftest import SENTENCES
from tests.test_models_roberta import embed_run, write_sentence_transformers_modules

pytestmark = pytest.mark.integration  # README.md, "Development"

MAX_SEQ_LEN = 40


def build_tokenizer():
    """A WordPiece tokenizer with [CLS] text [SEP], as DistilBERT's."""
    from tokenizers import Tokenizer, models as tok_models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(tok_models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(SENTENCES * 4, trainers.WordPieceTrainer(
        vocab_size=300, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"]))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tokenizer


def build_st(out: Path, model_class: str = "DistilBertModel", **config_keys) -> Path:
    """A random DistilBERT sentence-transformers model (mean pooling, normalised) saved as safetensors."""
    import torch
    import transformers

    tokenizer = build_tokenizer()
    out.mkdir(parents=True)
    torch.manual_seed(0)
    config = transformers.DistilBertConfig(vocab_size=tokenizer.get_vocab_size(), dim=32, n_layers=2, n_heads=4,
                                           hidden_dim=64, max_position_embeddings=64, initializer_range=0.2,
                                           **config_keys)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():  # norms start at ones; scales of their own catch a norm read into the wrong place
        for name, weight in model.named_parameters():
            if "layer_norm" in name or "LayerNorm" in name:
                weight.mul_(1 + 0.2 * torch.randn_like(weight))
    model.save_pretrained(out)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, cls_token="[CLS]", sep_token="[SEP]",
                                         pad_token="[PAD]", unk_token="[UNK]").save_pretrained(out)
    write_sentence_transformers_modules(out, dim=32, max_seq_len=MAX_SEQ_LEN)
    return out


def test_embeddings_through_docscore_run_equal_sentence_transformers(tmp_path):
    from sentence_transformers import SentenceTransformer

    src = build_st(tmp_path / "st")
    assert convert_main(["--hf", str(src), "--out", str(tmp_path / "model")]) == 0
    loaded = models.load(str(tmp_path / "model"), attention="native")
    assert (loaded.config.family, loaded.config.model_type, loaded.config.type_vocab_size) == ("bert", "distilbert", 0)
    held = sum(int(leaf.size) for leaf in jax.tree.leaves(nnx.state(loaded.model, nnx.Param)))
    assert memory.parameter_count(loaded.config) == held

    texts = SENTENCES[:8]  # each one window; --batch_size 2 packs several documents into each row
    expected = SentenceTransformer(str(src), device="cpu").encode(texts, normalize_embeddings=True)
    for attention in ("native", "flash"):
        ours = embed_run(tmp_path, tmp_path / "model", texts, attention)
        assert np.abs(ours - expected).max() < 1e-5, (attention, np.abs(ours - expected).max())


def test_a_task_head_checkpoint_converts_with_a_note(tmp_path, capsys):
    """DistilBertForSequenceClassification saves the model under "distilbert." with pre_classifier/classifier
    beside it: the base model converts, the head is left out and the user told."""
    src = build_st(tmp_path / "st", "DistilBertForSequenceClassification")
    assert convert_main(["--hf", str(src), "--out", str(tmp_path / "model")]) == 0
    assert "DistilBertForSequenceClassification's task head was not converted" in capsys.readouterr().err


def test_sinusoidal_positions_are_the_saved_table_and_embed_as_sentence_transformers(tmp_path):
    """With sinusoidal_pos_embds, transformers fills the position table with sinusoids and saves it: reading the
    checkpoint's table is exact (docscore refused such models)."""
    from sentence_transformers import SentenceTransformer

    src = build_st(tmp_path / "st", sinusoidal_pos_embds=True)
    assert convert_main(["--hf", str(src), "--out", str(tmp_path / "model")]) == 0
    texts = SENTENCES[:4]
    expected = SentenceTransformer(str(src), device="cpu").encode(texts, normalize_embeddings=True)
    ours = embed_run(tmp_path, tmp_path / "model", texts, "native")
    assert np.abs(ours - expected).max() < 1e-5


def test_dimension_keys_are_distilberts():
    base = {"model_type": "distilbert", "vocab_size": 100, "dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64,
            "max_position_embeddings": 64}
    config = config_from_hf(base)
    assert (config.hidden_size, config.num_layers, config.intermediate_size, config.layer_norm_eps) == (32, 2, 64, 1e-12)
    with pytest.raises(models.ModelLoadError, match="n_layers is 0; it must be a whole number"):
        config_from_hf({**base, "n_layers": 0})
    assert config_from_hf({**base, "sinusoidal_pos_embds": True}) == config  # the table is in the checkpoint
