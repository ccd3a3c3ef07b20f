"""Rotary scalings with an attention factor, yarn and longrope, in the Llama family: each family's cos and sin
(attention scaling included) equal transformers' rotary embedding's for every segment of a packed row as for that
document alone, longrope's short factors within the original context and its long ones past it; small random
Qwen2, OLMo 3 (yarn, in transformers 5's and 4.x's config layouts) and Phi-3 (longrope) models built in transformers
(no download), converted with `docscore convert`, score and embed as transformers does, a short and a long document
packed in one row as each alone, Phi-3 with a partial_rotary_factor too (only a head's first dimensions turn); the
settings that do not fit are refused naming their key, a partial_rotary_factor outside phi3 among them."""
from __future__ import annotations

import dataclasses
import json
import operator
import re
from pathlib import Path

import numpy as np
import pytest

import models
from models.config import config_from_hf
from models.layers import segment_lengths
from models.rope import rotary_tables
from pipeline.convert import main as convert_main
from tests.conftest import padded, transformers_logprobs
from tests.test_models_llama import build_hf, documents, reference_logprobs

YARN = {"rope_type": "yarn", "rope_theta": 10_000.0, "factor": 8.0, "original_max_position_embeddings": 64}
FACTORS = {"short_factor": [1.0 + i / 8 for i in range(8)], "long_factor": [1.0 + i for i in range(8)]}  # head_dim 16


def factors(pairs: int) -> dict[str, list[float]]:
    """longrope's short and long factor lists for `pairs` rotated pairs (phi3's partial rotary: fewer than 8)."""
    return {"short_factor": FACTORS["short_factor"][:pairs], "long_factor": FACTORS["long_factor"][:pairs]}


LONGROPE = {"rope_type": "longrope", "rope_theta": 10_000.0, "original_max_position_embeddings": 64, **FACTORS}
ROTARY_BASE = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512}
ROTARY_CASES = {
    # name: (config.json keys, transformers' rotary embedding class for them)
    "llama-yarn": ({"model_type": "llama", "rope_parameters": YARN}, "llama.modeling_llama.LlamaRotaryEmbedding"),
    "qwen2-yarn-4.x": ({"model_type": "qwen2", "rope_theta": 1e6, "original_max_position_embeddings": 32,
                        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}},
                       "qwen2.modeling_qwen2.Qwen2RotaryEmbedding"),
    "qwen3-longrope": ({"model_type": "qwen3", "rope_parameters": LONGROPE}, "qwen3.modeling_qwen3.Qwen3RotaryEmbedding"),
    "mistral-longrope-4.x": ({"model_type": "mistral", "rope_scaling": {"type": "longrope", "attention_factor": 1.25,
                                                                        "original_max_position_embeddings": 64, **FACTORS}},
                             "mistral.modeling_mistral.MistralRotaryEmbedding"),
    # Phi-3.5-mini's layout: longrope under rope_scaling, the original context beside it
    "phi3-longrope": ({"model_type": "phi3", "original_max_position_embeddings": 64,
                       "rope_scaling": {"type": "longrope", **FACTORS}}, "phi3.modeling_phi3.Phi3RotaryEmbedding"),
    # phi3's partial rotary: a head's first 8 dimensions (factor in the rope settings), Phi-4-mini's layout (top level,
    # 12 of 16); transformers' cos and sin are only as wide as the dimensions they turn
    "phi3-longrope-partial": ({"model_type": "phi3", "original_max_position_embeddings": 64,
                               "rope_parameters": {**LONGROPE, **factors(4), "partial_rotary_factor": 0.5}},
                              "phi3.modeling_phi3.Phi3RotaryEmbedding"),
    "phi3-longrope-partial-4.x": ({"model_type": "phi3", "original_max_position_embeddings": 64,
                                   "partial_rotary_factor": 0.75, "rope_scaling": {"type": "longrope", **factors(6)}},
                                  "phi3.modeling_phi3.Phi3RotaryEmbedding"),
    "granite-yarn": ({"model_type": "granite", "rope_parameters": {**YARN, "mscale": 1.0, "mscale_all_dim": 0.5}},
                     "granite.modeling_granite.GraniteRotaryEmbedding"),
    "gemma2-longrope": ({"model_type": "gemma2", "rope_parameters": LONGROPE},
                        "gemma2.modeling_gemma2.Gemma2RotaryEmbedding"),
    # Olmo-3's released layout: yarn laid over the global layers by rope_scaling, its truncate ignored by transformers
    "olmo3-yarn-4.x": ({"model_type": "olmo3", "rope_scaling": {**YARN, "truncate": False}},
                       "olmo3.modeling_olmo3.Olmo3RotaryEmbedding"),
    "olmo3-per-type": ({"model_type": "olmo3", "rope_parameters": {"full_attention": LONGROPE,
                                                                   "sliding_attention": {**YARN, "factor": 2.0}}},
                       "olmo3.modeling_olmo3.Olmo3RotaryEmbedding"),
    "gemma3-per-type": ({"model_type": "gemma3_text", "layer_types": ["sliding_attention", "full_attention"] * 2,
                         "rope_parameters": {"full_attention": YARN, "sliding_attention": LONGROPE}},
                        "gemma3.modeling_gemma3.Gemma3RotaryEmbedding"),
}
# one packed row: within the 64-token original context, at it, one past it, far past it
SEGMENT_LENGTHS = (40, 64, 65, 100)


@pytest.mark.parametrize("case", sorted(ROTARY_CASES))
def test_rotary_tables_are_transformers_cos_and_sin_for_each_segment_alone(case, tmp_path):
    """Each layer type's (cos, sin) docscore computes for a row packed with documents of SEGMENT_LENGTHS equal, for
    each document, what transformers' rotary embedding of that model gives the document encoded alone, its
    attention scaling included: longrope's long factors exactly where the document is longer than the original
    context (transformers' seq_len > original_max_position_embeddings), whatever it is packed with."""
    import torch
    import transformers

    keys, rotary_class = ROTARY_CASES[case]
    (tmp_path / "config.json").write_text(json.dumps({**ROTARY_BASE, **keys}))
    reference = transformers.AutoConfig.from_pretrained(str(tmp_path))
    rotary = operator.attrgetter(rotary_class)(transformers.models)(reference)
    config = config_from_hf({**ROTARY_BASE, **keys})
    segments = np.concatenate([np.full(n, s + 1, np.int32) for s, n in enumerate(SEGMENT_LENGTHS)])[None]
    np.testing.assert_array_equal(segment_lengths(segments)[0], np.repeat(SEGMENT_LENGTHS, SEGMENT_LENGTHS))
    per_type = isinstance(rotary.rope_type, dict)  # Gemma 3's and OLMo 3's rotary embedding: one per layer type
    for layer_type in sorted(rotary.rope_type) if per_type else [None]:
        rope = config.local_rope if layer_type == "sliding_attention" else config.rope
        cos, sin = (np.asarray(table)[0, :, 0] for table in rotary_tables(segments, rope, config.head_dim))
        start = 0
        for length in SEGMENT_LENGTHS:
            with torch.no_grad():
                theirs = rotary(torch.zeros(1), torch.arange(length)[None], *([layer_type] if per_type else []))
            np.testing.assert_allclose(cos[start:start + length], theirs[0][0].numpy(), atol=1e-6, rtol=0)
            np.testing.assert_allclose(sin[start:start + length], theirs[1][0].numpy(), atol=1e-6, rtol=0)
            start += length
    kinds = {config.rope.kind, getattr(config.local_rope, "kind", None)}
    assert kinds & {"yarn", "longrope"}, kinds


@pytest.mark.parametrize("hf, says", [
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}},
     "rope_parameters.rope_type \"dynamic\" is not supported; docscore computes rotary positions of "
     "rope_type 'default', 'linear', 'llama3', 'yarn', 'longrope' only"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, 'rope_scaling.type "dynamic" is not supported'),
    ({"rope_parameters": {**LONGROPE, "short_factor": [1.0] * 4}},
     "rope_parameters.short_factor has 4 entries; rope_type 'longrope' needs head_dim / 2 = 8"),
    ({"rope_scaling": {**LONGROPE, "long_factor": 4.0}}, "rope_scaling.long_factor is 4.0; expected a list"),
    ({"rope_parameters": {**LONGROPE, "long_factor": [1.0] * 7 + [0]}},
     "rope_parameters.long_factor[7] is 0; it must be a positive, finite number"),
    ({"rope_parameters": {k: v for k, v in LONGROPE.items() if k != "long_factor"}},
     "rope_parameters of rope_type 'longrope' lacks 'long_factor'"),
    ({"rope_parameters": {**LONGROPE, "original_max_position_embeddings": 1}, "max_position_embeddings": 64},
     "original_max_position_embeddings is 1; rope_type 'longrope' needs at least 2"),
    ({"rope_parameters": {k: v for k, v in YARN.items() if k != "factor"}},
     "rope_parameters of rope_type 'yarn' lacks 'factor'"),
    ({"rope_parameters": {**YARN, "attention_factor": -1}},
     "rope_parameters.attention_factor of rope_type 'yarn' is -1; it must be a positive, finite number"),
    ({"rope_scaling": {**YARN, "beta_fast": "fast"}}, 'rope_scaling.beta_fast of rope_type \'yarn\' is "fast"'),
    ({"rope_scaling": {**YARN, "truncate": "no"}}, 'rope_scaling.truncate is "no"; it must be true or false'),
    ({"model_type": "olmo3", "rope_parameters": {"full_attention": {**LONGROPE, "long_factor": [2.0] * 9}}},
     "full_attention layers: rope_parameters.long_factor has 9 entries; rope_type 'longrope' needs head_dim / 2 = 8"),
    # the families whose transformers attention rotates whole heads (it fails on a narrower cos, or ignores the factor)
    ({"model_type": "qwen2", "partial_rotary_factor": 0.5},
     "partial_rotary_factor 0.5 is not supported; docscore rotates every dimension of a head (1.0)"),
    ({"model_type": "mistral", "rope_scaling": {**YARN, "partial_rotary_factor": 0.5}},
     "rope_scaling.partial_rotary_factor 0.5 is not supported"),
    ({"model_type": "olmo3", "rope_parameters": {"full_attention": {**YARN, "partial_rotary_factor": 0.5}}},
     "full_attention layers: rope_parameters.partial_rotary_factor 0.5 is not supported"),
    # phi3's partial rotary: an even number of at least 2 of a head's dimensions, factor lists one per rotated pair
    ({"model_type": "phi3", "partial_rotary_factor": 0.3125},
     "partial_rotary_factor 0.3125 rotates int(head_dim 16 * 0.3125) = 5 dimensions of each head; rotary positions "
     "turn pairs of dimensions, so it must give an even number of at least 2"),
    ({"model_type": "phi3", "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.1}},
     "rope_parameters.partial_rotary_factor 0.1 rotates int(head_dim 16 * 0.1) = 1 dimensions"),
    ({"model_type": "phi3", "partial_rotary_factor": 1.5},
     "partial_rotary_factor is 1.5; it must be a number in (0, 1]"),
    ({"model_type": "phi3", "partial_rotary_factor": 0}, "partial_rotary_factor is 0; it must be a number in (0, 1]"),
    ({"model_type": "phi3", "partial_rotary_factor": "0.5"}, 'partial_rotary_factor is "0.5"; it must be a number'),
    # Phi3Config reads the rope settings' own factor, even null (on which transformers fails), over the top-level one
    ({"model_type": "phi3", "partial_rotary_factor": 0.5,
      "rope_parameters": {"rope_type": "default", "partial_rotary_factor": None}},
     "rope_parameters.partial_rotary_factor is null; it must be a number in (0, 1]"),
    ({"model_type": "phi3", "partial_rotary_factor": 0.5, "rope_scaling": LONGROPE},
     "rope_scaling.short_factor has 8 entries; rope_type 'longrope' needs int(head_dim 16 * partial_rotary_factor) / 2 "
     "= 4, one per rotated pair of a head's dimensions"),
], ids=["dynamic", "dynamic-4.x", "short-factor-length", "long-factor-not-a-list", "long-factor-zero",
        "no-long-factor", "longrope-original-1", "yarn-no-factor", "yarn-negative-attention-factor",
        "yarn-beta-not-a-number", "yarn-truncate-not-a-bool", "olmo3-long-factor-length", "qwen2-partial",
        "mistral-yarn-partial", "olmo3-partial", "phi3-odd-rotary-dim", "phi3-one-rotary-dim", "phi3-partial-above-1",
        "phi3-partial-0", "phi3-partial-a-string", "phi3-partial-null-in-settings", "phi3-partial-factor-length"])
def test_rope_settings_that_do_not_fit_are_refused_naming_the_key(hf, says):
    with pytest.raises(models.ModelLoadError, match=re.escape(says)):
        config_from_hf({**ROTARY_BASE, "model_type": "llama", **hf}, "/models/x/config.json")


def convert(hf_dir: Path, out: Path) -> models.LoadedModel:
    """`docscore convert` of hf_dir, loaded with the native kernel."""
    assert convert_main(["--hf", str(hf_dir), "--out", str(out)]) == 0
    return models.load(str(out), attention="native")


def to_4x_layout(hf_dir: Path, **keys) -> None:
    """Rewrite hf_dir's config.json as transformers 4.x saved it: rope_theta and rope_scaling (`keys`), no
    rope_parameters."""
    config = json.loads((hf_dir / "config.json").read_text())
    config.pop("rope_parameters")
    (hf_dir / "config.json").write_text(json.dumps({**config, **keys}))


def assert_padded_and_packed_rows_score_as_transformers(loaded, hf_dir: Path, docs: list[np.ndarray]) -> np.ndarray:
    """Token log-probabilities of docs in padded rows within 1e-4 of transformers', and all of them packed in one
    row equal to each in its own row; transformers' (rows, L) log-probabilities."""
    ids, segments = padded(docs)
    ours = loaded.token_logprobs(ids, segments)
    expected = transformers_logprobs(hf_dir, ids, segments)
    assert np.abs(expected).max() > 1.0 and np.abs(ours - expected).max() <= 1e-4, np.abs(ours - expected).max()
    packed_ids = np.concatenate(docs)[None]
    packed_segments = np.concatenate([np.full(len(d), s + 1, np.int32) for s, d in enumerate(docs)])[None]
    packed = loaded.token_logprobs(packed_ids, packed_segments)[0]
    np.testing.assert_allclose(packed, np.concatenate([ours[row, :len(d)] for row, d in enumerate(docs)]), atol=2e-5)
    return expected


# name: (FAMILIES entry of tests/test_models_llama.py, its overrides, the transformers 4.x config.json keys, if any)
YARN_MODELS = {
    "qwen2": ("qwen2", {"rope_parameters": {**YARN, "rope_theta": 1e6, "beta_fast": 16}}, None),
    # the top-level original_max_position_embeddings wins over rope_scaling's, as transformers reads it
    "qwen2-4.x": ("qwen2", {"rope_parameters": YARN},
                  {"rope_theta": 1e6, "original_max_position_embeddings": 64,
                   "rope_scaling": {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 256}}),
    "olmo3": ("olmo3", {"rope_parameters": {"full_attention": {**YARN, "rope_theta": 500_000.0},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 1_000.0}}}, None),
    # Olmo-3-7B's layout: yarn laid over the global layers, every layer's theta 500,000
    "olmo3-4.x": ("olmo3", {},
                  {"rope_theta": 500_000.0, "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0,
                                                            "beta_slow": 1.0, "attention_factor": 1.2079441541679836,
                                                            "original_max_position_embeddings": 64}}),
}


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(YARN_MODELS))
def test_yarn_models_score_as_transformers(name, tmp_path):
    """A Qwen2 and an OLMo 3 (its global layers) with yarn, saved by transformers 5 or in transformers 4.x's layout,
    score their documents (one crossing the 64-token original context) as transformers does, padded and packed;
    transformers' own model without its attention scaling scores them more than 1e-2 apart, so the scaling of cos
    and sin is part of what the parity checks."""
    import torch
    import transformers

    family, overrides, layout_4x = YARN_MODELS[name]
    hf_dir = build_hf(tmp_path / "hf", family, **overrides)
    if layout_4x:
        to_4x_layout(hf_dir, **layout_4x)
    loaded = convert(hf_dir, tmp_path / "docscore")
    assert loaded.config.rope.kind == "yarn" and loaded.config.rope.attention_factor > 1.1
    docs = documents(loaded.config.vocab_size)
    expected = assert_padded_and_packed_rows_score_as_transformers(loaded, hf_dir, docs)
    reference = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    rotary = reference.model.rotary_emb
    for scaling in [key for key in vars(rotary) if key.endswith("attention_scaling")]:
        setattr(rotary, scaling, 1.0)
    ids, segments = padded(docs)
    real = segments[:, 1:] == 1
    assert np.abs(reference_logprobs(reference, ids, segments) - expected[:, :-1])[real].max() > 1e-2


@pytest.mark.integration
def test_longrope_picks_each_documents_factors_by_its_own_length(tmp_path):
    """A Phi-3 with longrope (a 64-token original context, Phi-3.5-mini's top-level original_max_position_embeddings)
    scores each document as transformers scores it alone: short factors for the 1-, 7- and 40-token documents, long
    ones for the 552-token one, in padded rows as in one packed row. Its embeddings (mean pooled) of a short and a
    long document packed in one row equal each alone and transformers' of each alone. transformers' own padded batch
    chooses once, by its longest row, and so scores the 40-token document with the long factors more than 1e-2 apart:
    the documents above did take both paths."""
    hf_dir = build_hf(tmp_path / "hf", "phi3", sliding_window=None, original_max_position_embeddings=64,
                      rope_parameters=LONGROPE)
    loaded = convert(hf_dir, tmp_path / "docscore")
    rope = loaded.config.rope
    assert (rope.kind, rope.original_max_positions, rope.attention_factor > 1.2) == ("longrope", 64, True)
    docs = documents(loaded.config.vocab_size)
    alone = assert_each_document_scores_and_embeds_as_transformers_alone(loaded, hf_dir, docs)
    ids, segments = padded(docs)
    batched = transformers_logprobs(hf_dir, ids, segments)
    assert np.abs(batched[2, :len(docs[2]) - 1] - alone[2]).max() > 1e-2


def assert_each_document_scores_and_embeds_as_transformers_alone(loaded, hf_dir: Path, docs: list[np.ndarray]
                                                                 ) -> list[np.ndarray]:
    """Token log-probabilities of docs (documents(): 1, 7, 40 and 552 tokens) in padded rows within 1e-4 of what
    transformers gives each document alone; the 40-token and 552-token documents (within and past a 64-token original
    context) packed in one row score and embed (mean pooled) as each alone, and those embeddings are within 1e-4 of
    transformers' mean-pooled hidden states of each alone. transformers' log-probabilities of each document alone."""
    import torch
    import transformers

    reference = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    alone, hidden_alone = [], []
    for doc in docs:
        with torch.no_grad():
            logits = reference(torch.tensor(doc[None], dtype=torch.long)).logits[0]
            hidden_alone.append(reference.model(torch.tensor(doc[None], dtype=torch.long)).last_hidden_state[0].numpy())
        logprobs = torch.log_softmax(logits.double(), dim=-1)[:-1].gather(-1, torch.tensor(doc[1:, None]))
        alone.append(logprobs[:, 0].numpy())
    assert max(np.abs(a).max(initial=0) for a in alone) > 1.0  # not a near-uniform model
    ids, segments = padded(docs)
    ours = loaded.token_logprobs(ids, segments)
    for row, doc in enumerate(docs):
        assert np.abs(ours[row, :len(doc) - 1] - alone[row]).max(initial=0) <= 1e-4, (len(doc), row)
    short, long = docs[2], docs[3]
    assert len(short) <= 64 < len(long)
    packed_ids = np.concatenate([short, long])[None]
    packed_segments = np.concatenate([np.full(len(short), 1, np.int32), np.full(len(long), 2, np.int32)])[None]
    packed = loaded.token_logprobs(packed_ids, packed_segments)[0]
    np.testing.assert_allclose(packed, np.concatenate([ours[2, :len(short)], ours[3, :len(long)]]), atol=2e-5)
    embedder = dataclasses.replace(loaded, pooling="mean")
    packed_embeddings = embedder.embed_packed(packed_ids, packed_segments, 2)[0]
    alone_embeddings = embedder.embed_packed(*padded([short, long]), 1)[:, 0]
    np.testing.assert_allclose(packed_embeddings, alone_embeddings, atol=2e-5)
    for ours_embedding, hidden in zip(alone_embeddings, hidden_alone[2:]):
        mean = hidden.astype(np.float64).mean(axis=0)
        np.testing.assert_allclose(ours_embedding, mean / np.linalg.norm(mean), atol=1e-4)
    return alone


# name: (partial_rotary_factor, build_hf's rope settings, the transformers 4.x config.json keys, if any)
PARTIAL_ROTARY_MODELS = {
    "0.75-default": (0.75, {"rope_type": "default", "rope_theta": 250_000.0}, None),
    "0.5-longrope": (0.5, {**LONGROPE, **factors(4)}, None),
    # Phi-4-mini's layout: the factor at the top level, longrope under rope_scaling, 3/4 of each head turned
    "0.75-longrope-4.x": (0.75, {**LONGROPE, **factors(6)},
                          {"rope_theta": 10_000.0, "rope_scaling": {"type": "longrope", **factors(6)}}),
}


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(PARTIAL_ROTARY_MODELS))
def test_partial_rotary_phi3_scores_and_embeds_as_transformers(name, tmp_path):
    """A Phi-3 whose partial_rotary_factor turns only a head's first 12 or 8 of 16 dimensions (Phi-4-mini's 0.75; the
    rest pass through as transformers' Phi3 attention passes them), with the default rope or longrope (short factors
    within its 64-token original context, long ones past it), scores each document and embeds the short and the long
    one as transformers does each alone, packed together as alone."""
    factor, rope_parameters, layout_4x = PARTIAL_ROTARY_MODELS[name]
    hf_dir = build_hf(tmp_path / "hf", "phi3", sliding_window=None, original_max_position_embeddings=64,
                      partial_rotary_factor=factor, rope_parameters=rope_parameters)
    if layout_4x:
        to_4x_layout(hf_dir, **layout_4x)
    assert json.loads((hf_dir / "config.json").read_text())["partial_rotary_factor"] == factor
    loaded = convert(hf_dir, tmp_path / "docscore")
    assert (loaded.config.rope.kind, loaded.config.rope.rotary_dim) == (rope_parameters["rope_type"], 16 * factor)
    assert_each_document_scores_and_embeds_as_transformers_alone(loaded, hf_dir, documents(loaded.config.vocab_size))
