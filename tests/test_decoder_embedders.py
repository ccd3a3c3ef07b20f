"""Decoder embedders (Qwen3-Embedding, e5-mistral, gte-Qwen2): a sentence-transformers directory around a decoder,
small and random, built in transformers (no download), converts with its pooling, and `docscore run --task embed`
(documents packed several per row, both CPU kernels) gives SentenceTransformer.encode's embeddings. A decoder
converted as a language model is refused by the embedding tasks before any data is read."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import models
from models.model_dir import METADATA, read_metadata
from pipeline.convert import main as convert_main
from tests.conftest import SENTENCES, byte_level_bpe, common_flags, read_summary, run_docscore, write_jsonl
from tests.test_models_roberta import ST_MODULES, embed_run

pytestmark = pytest.mark.integration  # README.md, "Development"

MAX_SEQ_LEN = 64
SPECIALS = ["<|endoftext|>", "<s>", "</s>"]
# name: (transformers classes, the tokenizer's template, the Pooling config.json, the pooling it means, config)
KINDS = {
    # Qwen3-Embedding-0.6B: its tokenizer appends <|endoftext|>, whose hidden state is the embedding; tied embeddings
    "qwen3-lasttoken": ("Qwen3Config", "Qwen3Model", "$A <|endoftext|>", {"pooling_mode": "lasttoken"}, "lasttoken",
                        {"tie_word_embeddings": True}),
    # e5-mistral: <s> text </s>, the pooling spelt as sentence-transformers 2-5 wrote it, and an untied head the
    # embedder's checkpoint leaves out (Qwen3-Embedding-8B and gte-Qwen2-7B too)
    "mistral-lasttoken-headless": ("MistralConfig", "MistralModel", "<s> $A </s>",
                                   {"pooling_mode_lasttoken": True, "pooling_mode_mean_tokens": False}, "lasttoken",
                                   {"tie_word_embeddings": False}),
    "qwen2-mean": ("Qwen2Config", "Qwen2Model", "$A <|endoftext|>", {"pooling_mode_mean_tokens": True}, "mean",
                   {"tie_word_embeddings": True}),
}


def build_st_decoder(out: Path, kind: str) -> Path:
    """A random decoder saved as its base model, as the embedders are (no LM head of its own), with a
    byte-level BPE tokenizer and the sentence-transformers modules: `kind`'s pooling, normalisation, the max length."""
    import torch
    import transformers
    from tokenizers import processors

    config_class, model_class, template, pooling, _, settings = KINDS[kind]
    tokenizer = byte_level_bpe(SPECIALS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(t, i) for i, t in enumerate(SPECIALS) if t in template])
    out.mkdir(parents=True)
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=64, intermediate_size=112, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4 * MAX_SEQ_LEN, initializer_range=0.2,
        bos_token_id=1, eos_token_id=0, pad_token_id=0, **settings)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():  # norms start at ones; scales of their own catch a norm read into the wrong place
        for name, weight in model.named_parameters():
            if "norm" in name:
                weight.mul_(1 + 0.2 * torch.randn_like(weight))
    model.save_pretrained(out)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>",
                                         pad_token="<|endoftext|>").save_pretrained(out)
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64, **pooling}))
    (out / "2_Normalize").mkdir()
    (out / "modules.json").write_text(json.dumps(ST_MODULES))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_SEQ_LEN}))
    return out


def convert(src: Path, out: Path, capsys) -> tuple[int, str]:
    code = convert_main(["--hf", str(src), "--out", str(out)])
    captured = capsys.readouterr()
    return code, captured.err + captured.out


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_embeddings_of_a_decoder_embedder_through_docscore_run_equal_sentence_transformers(kind, tmp_path, capsys):
    from sentence_transformers import SentenceTransformer

    pooling = KINDS[kind][4]
    src = build_st_decoder(tmp_path / "st", kind)
    code, message = convert(src, tmp_path / "model", capsys)
    assert code == 0 and f"max_seq_len {MAX_SEQ_LEN}, {pooling} pooling, fingerprint" in message, message
    assert ("converted as an embedder only" in message) == ("headless" in kind), message  # convert says so
    assert json.loads((tmp_path / "model" / METADATA).read_text())["pooling"] == pooling  # a decoder's is always written
    loaded = models.load(str(tmp_path / "model"), attention="native")
    assert (loaded.config.is_encoder, loaded.pooling) == (False, pooling)
    assert loaded.tokenizer.encode_windows(["a b"])[0].windows[0][-1] == (0 if "qwen" in kind else 2)  # the appended EOS
    assert loaded.config.lm_head == ("headless" not in kind)

    texts = SENTENCES[:8]
    expected = SentenceTransformer(str(src), device="cpu").encode(texts, normalize_embeddings=True).astype(np.float64)
    for attention in ("native", "flash"):  # flash on CPU: the causal blockwise kernel over packed segments
        ours = embed_run(tmp_path, tmp_path / "model", texts, attention)
        cosines = np.sum(ours * expected, axis=1)
        assert cosines.min() >= 0.99999, (kind, attention, cosines)
        model = read_summary(tmp_path / "out", attention)["model"]
        assert (model["family"], model["pooling"]) == ("llama", pooling), model

    # all eight documents in one row: each pooled from its own segment, and the other pooling is far from it
    windows = [loaded.tokenizer.encode_windows([t])[0].windows[0] for t in texts]
    row = np.concatenate(windows)[None]
    segments = np.concatenate([np.full(len(w), i + 1) for i, w in enumerate(windows)])[None]
    packed = loaded.embed_packed(row, segments, len(texts))[0].astype(np.float64)
    assert np.sum(packed * expected, axis=1).min() >= 0.99999
    other = dataclasses.replace(loaded, pooling="mean" if pooling == "lasttoken" else "lasttoken")
    assert np.sum(other.embed_packed(row, segments, len(texts))[0] * expected, axis=1).max() < 0.99


def test_a_decoder_converted_as_a_language_model_embeds_nothing(tiny_gpt2_dir, tmp_path, capsys, no_data_read):
    """A plain Hugging Face decoder converts without a pooling: --task embed, similarity and classify refuse it before
    any data is read, naming what would embed; embed_packed refuses it too; its log-likelihoods still run."""
    assert read_metadata(tiny_gpt2_dir).pooling is None
    assert "pooling" not in json.loads((Path(tiny_gpt2_dir) / METADATA).read_text())
    shard = write_jsonl(tmp_path / "in" / "d.jsonl", [{"id": "a", "text": "hello world", "query": "q", "label": "x"}])
    for task, extra in (("embed", ()), ("similarity", ()), ("classify", ("--labels", "x=about x;y=about y"))):
        code = run_docscore("--input", shard, *common_flags(task, tmp_path / "out"), "--task", task,
                            "--model", tiny_gpt2_dir, *extra)
        err = capsys.readouterr().err
        assert code == 2 and f"--task={task} needs a model that embeds" in err, err
        assert "gpt2 language model, converted without a pooling; use --task=loglik" in err, err
    loaded = models.load(tiny_gpt2_dir, attention="native")
    ids = loaded.tokenizer.encode_windows(["hello world"])[0].windows[0][None]
    with pytest.raises(ValueError, match="embed_packed\\(\\) needs a model that embeds"):
        loaded.embed_packed(ids, np.ones_like(ids), 1)
    assert np.isfinite(loaded.token_logprobs(ids, np.ones_like(ids))).all()


def test_a_decoder_embedder_without_its_head_embeds_and_refuses_token_scoring(tmp_path, capsys, no_data_read):
    """An untied decoder whose checkpoint has no lm_head.weight converts as an embedder only: the log-likelihood tasks
    refuse it before any data is read, naming the tasks it runs; a language model missing its head is still refused
    at convert (tests/test_models_llama.py)."""
    src = build_st_decoder(tmp_path / "st", "mistral-lasttoken-headless")
    assert convert(src, tmp_path / "model", capsys)[0] == 0
    shard = write_jsonl(tmp_path / "in" / "d.jsonl", [{"id": "a", "text": "hello world", "choices": ["a", "b"]}])
    for task in ("loglik", "choice"):
        code = run_docscore("--input", shard, *common_flags(task, tmp_path / "out"), "--task", task,
                            "--model", tmp_path / "model")
        err = capsys.readouterr().err
        assert code == 2 and f"--task={task} scores tokens with the model's language-model head" in err, err
        assert "use it with --task embed, similarity or classify" in err, err
    loaded = models.load(str(tmp_path / "model"), attention="native")
    ids = loaded.tokenizer.encode_windows(["hello world"])[0].windows[0][None]
    with pytest.raises(ValueError, match="needs a language-model head"):
        loaded.token_logprobs(ids, np.ones_like(ids))
    assert np.isfinite(loaded.embed_packed(ids, np.ones_like(ids), 1)).all()


def test_a_decoder_whose_config_makes_it_bidirectional_attends_both_ways(tmp_path, capsys):
    """transformers 5 runs a decoder whose config.json has a falsy is_causal with a bidirectional mask, and
    sentence-transformers embeds with it (so its embeddings are not a causal decoder's): docscore's Llama-family
    decoder attends both ways too, and its embeddings equal sentence-transformers'; it scores no tokens. GPT-2 with
    the key, and a sliding window with it, are refused at convert."""
    from sentence_transformers import SentenceTransformer

    src = build_st_decoder(tmp_path / "st", "qwen2-mean")
    causal = SentenceTransformer(str(src), device="cpu").encode(SENTENCES[:8], normalize_embeddings=True)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "is_causal": False}))
    both_ways = SentenceTransformer(str(src), device="cpu").encode(SENTENCES[:8], normalize_embeddings=True)
    assert np.sum(causal * both_ways, axis=1).max() < 0.99  # the key changes the model's embeddings
    code, message = convert(src, tmp_path / "model", capsys)
    assert code == 0, message
    loaded = models.load(str(tmp_path / "model"), attention="native")
    assert (loaded.config.causal, loaded.config.bidirectional) == (False, True)
    ours = embed_run(tmp_path, tmp_path / "model", SENTENCES[:8], "flash")
    assert np.sum(ours * both_ways.astype(np.float64), axis=1).min() >= 0.99999
    ids = loaded.tokenizer.encode_windows(["hello world"])[0].windows[0][None]
    with pytest.raises(ValueError, match="needs a causal decoder"):
        loaded.token_logprobs(ids, np.ones_like(ids))
    shard = write_jsonl(tmp_path / "in" / "l.jsonl", [{"id": "l0", "text": "hello world"}])
    capsys.readouterr()
    assert run_docscore("--input", shard, *common_flags("ll", tmp_path / "out"), "--task", "loglik",
                        "--model", tmp_path / "model") == 2
    err = capsys.readouterr().err
    assert "attends both ways (is_causal false: an embedder)" in err, err  # the key this model's config.json holds

    # the same model as a plain Hugging Face directory: no pooling to embed with, and no token scoring attending both
    # ways, so no task could run what convert would write
    bare = tmp_path / "bare"
    shutil.copytree(src, bare, ignore=shutil.ignore_patterns("modules.json", "sentence_bert_config.json", "1_Pooling",
                                                            "2_Normalize"))
    code, message = convert(bare, tmp_path / "bare-model", capsys)
    assert code == 2 and "is_causal false makes this qwen2 attend both ways, so it scores no tokens" in message, message
    assert not (tmp_path / "bare-model").exists()

    (src / "config.json").write_text(json.dumps({**config, "is_causal": False, "use_sliding_window": True,
                                                 "sliding_window": 8, "layer_types": ["sliding_attention"] * 2}))
    code, message = convert(src, tmp_path / "windowed", capsys)
    assert code == 2 and "with a sliding window of 8 is not supported" in message, (code, message[-600:])


def test_a_decoder_whose_is_causal_is_null_is_refused_at_convert(tmp_path, capsys):
    """transformers reads is_causal null as both ways in a padded batch and causal in an unpadded one (its sdpa path
    skips the mask when nothing is padded): one text alone and the same text in a padded batch differ, so the model
    has no one answer to match, and convert refuses it naming the key."""
    from sentence_transformers import SentenceTransformer

    src = build_st_decoder(tmp_path / "st", "qwen2-mean")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "is_causal": None}))
    model = SentenceTransformer(str(src), device="cpu")
    alone = model.encode(SENTENCES[:1], normalize_embeddings=True)[0]
    padded_batch = model.encode([SENTENCES[0], SENTENCES[0] + " " + SENTENCES[1]], normalize_embeddings=True)[0]
    assert float(alone @ padded_batch) < 0.99  # transformers' own two answers
    code, message = convert(src, tmp_path / "model", capsys)
    assert code == 2 and "is_causal null: transformers attends both ways in a padded batch" in message, message
