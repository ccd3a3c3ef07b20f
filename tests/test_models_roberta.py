"""RoBERTa, XLM-RoBERTa and CamemBERT encoders (the BERT family with positions numbered from pad_token_id + 1): small random
sentence-transformers models built in transformers (no download), converted with `docscore convert`, and run
through `docscore run --task embed`, whose embeddings (documents packed together in rows) must equal
SentenceTransformer.encode's; configs whose positions cannot hold a text are refused."""
from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

import models
from models.config import config_from_hf
from pipeline.convert import main as convert_main
from pipeline.telemetry import memory
from tests.conftest import SENTENCES, byte_level_bpe, read_table, run_docscore, write_jsonl

pytestmark = pytest.mark.integration  # README.md, "Development"

ST_MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
              {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
              {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
MAX_SEQ_LEN = 48
# name: (transformers classes, pad token id, the tokenizer's special tokens in id order)
KINDS = {
    "roberta": ("RobertaConfig", "RobertaModel", 1, ["<s>", "<pad>", "</s>", "<unk>"]),
    "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaModel", 1, ["<s>", "<pad>", "</s>", "<unk>"]),
    "roberta-pad-0": ("RobertaConfig", "RobertaModel", 0, ["<pad>", "<s>", "</s>", "<unk>"]),  # positions from 1
    "camembert": ("CamembertConfig", "CamembertModel", 1, ["<s>", "<pad>", "</s>", "<unk>"]),
}


def build_tokenizer(kind: str, specials: list[str]):
    """RoBERTa's byte-level BPE with its <s> text </s> processor, or XLM-RoBERTa's unigram with Metaspace."""
    from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers, processors, trainers

    ids = {token: i for i, token in enumerate(specials)}
    if kind in ("xlm-roberta", "camembert"):
        tokenizer = Tokenizer(tok_models.Unigram())
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=300, special_tokens=specials, unk_token="<unk>", show_progress=False)
        tokenizer.train_from_iterator(SENTENCES * 4, trainer)
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", special_tokens=[("<s>", ids["<s>"]), ("</s>", ids["</s>"])])
    else:
        tokenizer = byte_level_bpe(specials)
        tokenizer.post_processor = processors.RobertaProcessing(("</s>", ids["</s>"]), ("<s>", ids["<s>"]))
    return tokenizer


def build_st(out: Path, kind: str) -> Path:
    """A random RoBERTa/XLM-RoBERTa sentence-transformers model (mean pooling, normalised) saved as safetensors."""
    import torch
    import transformers

    config_class, model_class, pad, specials = KINDS[kind]
    tokenizer = build_tokenizer(kind, specials)
    out.mkdir(parents=True)
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=MAX_SEQ_LEN + pad + 1, initializer_range=0.2,
        pad_token_id=pad, bos_token_id=specials.index("<s>"), eos_token_id=specials.index("</s>"))
    model = getattr(transformers, model_class)(config, add_pooling_layer=False).eval()
    with torch.no_grad():  # a position table whose rows differ a lot: a position off by one changes every output
        model.embeddings.position_embeddings.weight.normal_(0, 1.0)
    model.save_pretrained(out)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", cls_token="<s>", sep_token="</s>",
        pad_token="<pad>", unk_token="<unk>").save_pretrained(out)
    write_sentence_transformers_modules(out, dim=32, max_seq_len=MAX_SEQ_LEN)
    return out


def write_sentence_transformers_modules(out: Path, *, dim: int, max_seq_len: int) -> None:
    """What sentence-transformers saves beside a Transformer: mean pooling, normalisation, the max length."""
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": dim,
                                                               "pooling_mode_mean_tokens": True}))
    (out / "2_Normalize").mkdir()
    (out / "modules.json").write_text(json.dumps(ST_MODULES))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_len}))


def embed_run(tmp_path: Path, model: Path, texts: list[str], attention: str) -> np.ndarray:
    """`docscore run --task embed` of single-window texts packed two rows a call: their embeddings, in order."""
    shard = write_jsonl(tmp_path / "in" / "d.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)])
    assert run_docscore("--input", shard, "--output", tmp_path / "out", "--run_id", attention, "--task", "embed",
                        "--model", model, "--attention", attention, "--batch_size", "2") == 0
    scores, _ = read_table(tmp_path / "out", "scores", attention)
    scores = scores.sort_values("record_index")
    assert (scores.n_chunks == 1).all()
    return np.stack(scores.embedding.map(np.asarray)).astype(np.float64)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_embeddings_through_docscore_run_equal_sentence_transformers(kind, tmp_path):
    from sentence_transformers import SentenceTransformer

    src = build_st(tmp_path / "st", kind)
    assert convert_main(["--hf", str(src), "--out", str(tmp_path / "model")]) == 0
    loaded = models.load(str(tmp_path / "model"), attention="native")
    pad = KINDS[kind][2]
    assert pad in loaded.tokenizer.encode_ids(["a <pad> b"])[0]
    assert (loaded.config.family, loaded.config.position_offset, loaded.config.max_positions) == ("bert", pad + 1, MAX_SEQ_LEN)
    assert loaded.tokenizer.max_seq_len == MAX_SEQ_LEN
    held = sum(int(leaf.size) for leaf in jax.tree.leaves(nnx.state(loaded.model, nnx.Param)))
    assert memory.parameter_count(loaded.config) == held  # the whole position table, its unread rows too

    # each one window; --batch_size 2 packs several documents into each row; the padding token written in a text
    # is the padding id, which RoBERTa's positions skip
    texts = SENTENCES[:8] + ["Use the <pad> token to pad sequences.", "a <pad> b <pad> c"]
    expected = SentenceTransformer(str(src), device="cpu").encode(texts, normalize_embeddings=True)
    for attention in ("native", "flash"):
        ours = embed_run(tmp_path, tmp_path / "model", texts, attention)
        cosines = np.sum(ours * expected, axis=1)
        assert cosines.min() > 0.99999, (kind, attention, cosines.min())
        # with positions taken from 0, as BERT's, the embeddings would be others
        assert np.abs(ours - expected).max() < 1e-5


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta", "camembert"])
def test_positions_start_after_the_padding_id_and_a_table_too_short_is_refused(model_type):
    base = {"model_type": model_type, "vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 64, "type_vocab_size": 1}
    config = config_from_hf({**base, "max_position_embeddings": 514, "pad_token_id": 1})
    assert (config.max_positions, config.position_offset, config.position_table) == (512, 2, 514)
    assert config_from_hf({**base, "max_position_embeddings": 514}).position_offset == 2  # transformers' default pad 1
    assert config_from_hf({**base, "model_type": "bert", "max_position_embeddings": 512}).position_offset == 0
    with pytest.raises(models.ModelLoadError, match="max_position_embeddings 2 leaves no position past pad_token_id 1"):
        config_from_hf({**base, "max_position_embeddings": 2, "pad_token_id": 1})
    with pytest.raises(models.ModelLoadError, match="pad_token_id is null"):
        config_from_hf({**base, "max_position_embeddings": 514, "pad_token_id": None})


def test_a_model_saved_by_sentence_transformers_6_converts_with_its_pooling_and_length(tmp_path):
    """sentence-transformers 6 saves pooling as `pooling_mode: "mean"` and the max length as the tokenizer's
    model_max_length (sentence_bert_config.json has none): such a directory converts at that length, and its
    embeddings equal SentenceTransformer.encode's, with `pooling_mode: "cls"` too; a mode docscore does not compute
    is refused by its value."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(build_st(tmp_path / "st", "roberta")), device="cpu")
    st.max_seq_length = 24
    saved = tmp_path / "saved"
    st.save(str(saved))
    assert json.loads((saved / "1_Pooling" / "config.json").read_text())["pooling_mode"] == "mean"
    assert "max_seq_length" not in json.loads((saved / "sentence_bert_config.json").read_text())
    assert convert_main(["--hf", str(saved), "--out", str(tmp_path / "model")]) == 0
    loaded = models.load(str(tmp_path / "model"), attention="native")
    assert loaded.tokenizer.max_seq_len == 24
    texts = [t for t in SENTENCES if len(loaded.tokenizer.encode_windows([t])[0].windows) == 1][:4]
    assert texts
    expected = SentenceTransformer(str(saved), device="cpu").encode(texts, normalize_embeddings=True)
    for text, want in zip(texts, expected):
        window = loaded.tokenizer.encode_windows([text])[0].windows[0]
        got = loaded.embed_packed(window[None], np.ones_like(window)[None], 1)[0, 0]
        assert float(got @ want) > 0.99999

    pooling = json.loads((saved / "1_Pooling" / "config.json").read_text())
    (saved / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "pooling_mode": "cls"}))
    assert convert_main(["--hf", str(saved), "--out", str(tmp_path / "cls")]) == 0
    cls = models.load(str(tmp_path / "cls"), attention="native")
    expected = SentenceTransformer(str(saved), device="cpu").encode(texts, normalize_embeddings=True)
    for text, want in zip(texts, expected):
        window = cls.tokenizer.encode_windows([text])[0].windows[0]
        assert float(cls.embed_packed(window[None], np.ones_like(window)[None], 1)[0, 0] @ want) > 0.99999
    (saved / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "pooling_mode": "max"}))
    assert convert_main(["--hf", str(saved), "--out", str(tmp_path / "max")]) == 2
