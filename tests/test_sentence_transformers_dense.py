"""Sentence-transformers Dense modules after the pooling, and EmbeddingGemma: small random models assembled and
saved by sentence-transformers itself (its own directory layout), converted with `docscore convert`, whose
embeddings through `docscore run` must equal SentenceTransformer.encode's. EmbeddingGemma is Gemma 3 attending
both ways (local layers within half their window each way), mean pooling, two Dense modules and prompts; LaBSE is
BERT with CLS pooling and a tanh Dense."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import models
from models.model_dir import METADATA
from tests.conftest import SENTENCES, read_summary, read_table, run_docscore, write_jsonl
from tests.test_convert import convert, sentence_transformers_dir

pytestmark = pytest.mark.integration  # README.md, "Development"

DOCUMENT, QUERY = "title: none | text: ", "task: search result | query: "  # EmbeddingGemma's prompts


def embedding_gemma(out: Path) -> Path:
    """An EmbeddingGemma-shaped sentence-transformers model: a random bidirectional Gemma 3 (local layers 0 and 2
    with an 8-token window, so half of it, 5, each way), mean pooling, Dense 64 -> 128 -> 64 without biases, Normalize,
    EmbeddingGemma's document and query prompts."""
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer, models as st_modules

    from tests.test_models_llama import build_tokenizer

    hf = out / "hf"
    hf.mkdir(parents=True)
    vocab = build_tokenizer(hf)
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=112, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=256, sliding_window=8, query_pre_attn_scalar=24,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], use_bidirectional_attention=True,
        initializer_range=0.2, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = transformers.Gemma3TextModel(config).eval()
    with torch.no_grad():  # Gemma's norms start at zeros: values of their own catch a norm read in the wrong place
        for name, weight in model.named_parameters():
            if "norm" in name:
                weight.add_(0.3 * torch.randn_like(weight))
    model.save_pretrained(hf)
    transformers.PreTrainedTokenizerFast(tokenizer_file=str(hf / "tokenizer.json"), bos_token="<s>", eos_token="</s>",
                                         pad_token="<unk>").save_pretrained(hf)
    modules = [st_modules.Transformer(str(hf), max_seq_length=64), st_modules.Pooling(64, "mean"),
               st_modules.Dense(64, 128, bias=False, activation_function=torch.nn.Identity()),
               st_modules.Dense(128, 64, bias=False, activation_function=torch.nn.Identity()), st_modules.Normalize()]
    SentenceTransformer(modules=modules, prompts={"query": QUERY, "document": DOCUMENT}, device="cpu").save(str(out / "st"))
    shutil.rmtree(hf)
    return out / "st"


def test_embedding_gemma_through_docscore_run_equals_sentence_transformers(tmp_path, capsys):
    """embed (native and flash: the blockwise kernel's two-way local window) and similarity with the prompts; the
    Dense modules are recorded and change the embedding; token scoring is refused, the model attending both ways."""
    from sentence_transformers import SentenceTransformer

    src = embedding_gemma(tmp_path)
    code, message = convert(src, tmp_path / "model", capsys)
    assert code == 0, message
    metadata = json.loads((tmp_path / "model" / METADATA).read_text())
    assert metadata["dense"] == [dict(in_features=64, out_features=128, bias=False, activation="identity"),
                                 dict(in_features=128, out_features=64, bias=False, activation="identity")]
    loaded = models.load(str(tmp_path / "model"), attention="native")
    assert (loaded.config.bidirectional, loaded.config.causal, loaded.config.sliding_window) == (True, False, 5)

    st = SentenceTransformer(str(src), device="cpu")
    # short enough for one 64-token window with the prompt (this tokenizer spends a token or more a word)
    texts, queries = [" ".join(s.split()[:6]) for s in SENTENCES[:6]], [" ".join(s.split()[:3]) for s in SENTENCES[6:12]]
    documents = st.encode(texts, prompt=DOCUMENT, normalize_embeddings=True).astype(np.float64)
    shard = write_jsonl(tmp_path / "in" / "d.jsonl",
                        [{"id": f"d{i}", "text": t, "query": q} for i, (t, q) in enumerate(zip(texts, queries))])

    def run(run_id: str, task: str, attention: str):
        assert run_docscore("--input", shard, "--output", tmp_path / "out", "--run_id", run_id, "--task", task,
                            "--model", tmp_path / "model", "--attention", attention, "--batch_size", "2",
                            "--stride", "8") == 0
        scores, _ = read_table(tmp_path / "out", "scores", run_id)
        return scores.sort_values("record_index")

    for attention in ("native", "flash"):
        scores = run(attention, "embed", attention)
        assert (scores.n_chunks == 1).all()
        ours = np.stack(scores.embedding.map(np.asarray)).astype(np.float64)
        assert np.sum(ours * documents, axis=1).min() >= 0.99999, attention
    assert read_summary(tmp_path / "out", "flash")["kernel"]["resolved"] == "blockwise"
    expected = np.sum(st.encode(queries, prompt=QUERY, normalize_embeddings=True) * documents, axis=1)
    np.testing.assert_allclose(run("similarity", "similarity", "native").score.to_numpy(), expected, atol=2e-5)

    without = models.load(str(tmp_path / "model"), attention="native").model  # the same model without its Dense modules
    without.dense = None
    undense = dataclasses.replace(loaded, model=without)
    window = loaded.tokenizer.encode_windows([texts[0]], role="document")[0].windows[0][None]
    plain = undense.embed_packed(window, np.ones_like(window), 1)[0, 0]
    assert float(plain @ documents[0]) < 0.99

    code = run_docscore("--input", shard, "--output", tmp_path / "out", "--run_id", "ll", "--task", "loglik",
                        "--model", tmp_path / "model")
    err = capsys.readouterr().err
    assert code == 2 and "attends both ways (use_bidirectional_attention: an embedder)" in err, err

    # its Transformer module alone, as a plain Hugging Face directory: nothing to embed with, no tokens to score
    bare = tmp_path / "bare"
    shutil.copytree(src, bare, ignore=shutil.ignore_patterns("modules.json", "sentence_bert_config.json",
                                                            "config_sentence_transformers.json", "[0-9]_*"))
    code, message = convert(bare, tmp_path / "bare-model", capsys)
    assert code == 2 and "use_bidirectional_attention true makes this gemma3_text attend both ways" in message, message


def test_a_cls_pooled_bert_with_a_tanh_dense_equals_sentence_transformers_and_absent_segments_stay_zeros(tmp_path, capsys):
    """LaBSE's layout: CLS pooling, a Dense with a bias and tanh, Normalize."""
    import torch
    from sentence_transformers import SentenceTransformer, models as st_modules

    bert = sentence_transformers_dir(tmp_path / "bert", pooling={"pooling_mode_cls_token": True,
                                                                 "pooling_mode_mean_tokens": False})
    modules = [st_modules.Transformer(str(bert), max_seq_length=128), st_modules.Pooling(64, "cls"),
               st_modules.Dense(64, 48, bias=True, activation_function=torch.nn.Tanh()), st_modules.Normalize()]
    src = tmp_path / "st"
    SentenceTransformer(modules=modules, device="cpu").save(str(src))
    code, message = convert(src, tmp_path / "model", capsys)
    assert code == 0 and "cls pooling" in message, message
    loaded = models.load(str(tmp_path / "model"), attention="native")
    texts = SENTENCES[:6]
    expected = SentenceTransformer(str(src), device="cpu").encode(texts, normalize_embeddings=True).astype(np.float64)
    windows = [loaded.tokenizer.encode_windows([t])[0].windows[0] for t in texts]
    row = np.concatenate(windows)[None]
    segments = np.concatenate([np.full(len(w), i + 1) for i, w in enumerate(windows)])[None]
    packed = loaded.embed_packed(row, segments, len(texts) + 2)[0].astype(np.float64)  # two slots without a segment
    assert packed.shape == (len(texts) + 2, 48)
    assert np.sum(packed[:len(texts)] * expected, axis=1).min() >= 0.99999
    assert not packed[len(texts):].any()  # not the Dense bias's direction


def test_dense_modules_docscore_cannot_compute_are_refused_before_writing(tmp_path, capsys):
    import torch
    from safetensors.torch import save_file
    from sentence_transformers import SentenceTransformer, models as st_modules

    bert = sentence_transformers_dir(tmp_path / "bert")
    modules = [st_modules.Transformer(str(bert), max_seq_length=128), st_modules.Pooling(64, "mean"),
               st_modules.Dense(64, 32, activation_function=torch.nn.ReLU()), st_modules.Normalize()]
    src = tmp_path / "st"
    SentenceTransformer(modules=modules, device="cpu").save(str(src))
    code, message = convert(src, tmp_path / "relu", capsys)
    assert code == 2 and "activation_function 'torch.nn.modules.activation.ReLU' is not supported" in message, message

    dense = json.loads((src / "2_Dense" / "config.json").read_text())
    (src / "2_Dense" / "config.json").write_text(json.dumps({**dense, "activation_function": "torch.nn.modules.linear.Identity",
                                                             "in_features": 32}))
    code, message = convert(src, tmp_path / "width", capsys)
    assert code == 2 and "expected in_features 64 (the embedding it receives)" in message, message

    (src / "2_Dense" / "config.json").write_text(json.dumps({**dense, "activation_function": "torch.nn.modules.linear.Identity"}))
    listing = json.loads((src / "modules.json").read_text())
    (src / "modules.json").write_text(json.dumps([listing[0], listing[2], listing[1], listing[3]]))
    code, message = convert(src, tmp_path / "order", capsys)
    assert code == 2 and "Dense modules one after another between the Pooling and the Normalize" in message, message

    (src / "modules.json").write_text(json.dumps(listing))
    (src / "2_Dense" / "model.safetensors").unlink()
    torch.save({"linear.weight": torch.zeros(32, 64)}, src / "2_Dense" / "pytorch_model.bin")
    code, message = convert(src, tmp_path / "pickle", capsys)
    assert code == 2 and "2_Dense: no *.safetensors weights found (it has PyTorch pickle files" in message, message
    save_file({"linear.weight": torch.zeros(32, 64), "linear.bias": torch.zeros(32), "extra": torch.zeros(1)},
              str(src / "2_Dense" / "model.safetensors"))
    code, message = convert(src, tmp_path / "extra", capsys)
    assert code == 2 and "extra" in message, message
    assert not any((tmp_path / name).exists() for name in ("relu", "width", "order", "pickle", "extra"))


def test_a_dense_with_a_residual_or_other_features_is_refused_before_writing(tmp_path, capsys):
    """sentence-transformers 6's Dense can add its input back (use_residual: at the same width with no tensor of its
    own, so the weights alone do not give it away) or read and write another feature than the pooled embedding;
    docscore computes neither, so convert refuses them rather than writing a model whose embeddings differ. A Dense
    wider than a model directory may record is refused too, rather than written and then refused at load."""
    import torch
    from safetensors.torch import save_file
    from sentence_transformers import SentenceTransformer, models as st_modules

    bert = sentence_transformers_dir(tmp_path / "bert")
    modules = [st_modules.Transformer(str(bert), max_seq_length=128), st_modules.Pooling(64, "mean"),
               st_modules.Dense(64, 64, activation_function=torch.nn.Tanh(), use_residual=True), st_modules.Normalize()]
    src = tmp_path / "st"
    SentenceTransformer(modules=modules, device="cpu").save(str(src))
    code, message = convert(src, tmp_path / "residual", capsys)
    assert code == 2 and "use_residual true is not supported" in message, message

    dense = json.loads((src / "2_Dense" / "config.json").read_text())
    del dense["use_residual"]
    (src / "2_Dense" / "config.json").write_text(json.dumps({**dense, "module_output_name": "projected"}))
    code, message = convert(src, tmp_path / "elsewhere", capsys)
    assert code == 2 and 'module_output_name "projected" are not supported' in message, message
    (src / "2_Dense" / "config.json").write_text(json.dumps(dense))
    code, message = convert(src, tmp_path / "plain", capsys)
    assert code == 0, message

    # wider than a model directory's metadata.json may record (models.load would call it corrupt): refused here
    (src / "2_Dense" / "config.json").write_text(json.dumps({**dense, "out_features": 70_000}))
    save_file({"linear.weight": torch.zeros(70_000, 64), "linear.bias": torch.zeros(70_000)},
              str(src / "2_Dense" / "model.safetensors"))
    code, message = convert(src, tmp_path / "wide", capsys)
    assert code == 2 and "out_features from 1 to 65,536" in message, message
    assert not any((tmp_path / name).exists() for name in ("residual", "elsewhere", "wide"))
