"""Llama family end to end: small random LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
Phi3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, Olmo2ForCausalLM, Olmo3ForCausalLM, GraniteForCausalLM and
SmolLM3ForCausalLM models built
in transformers (no download) with a BPE tokenizer that adds a BOS token as Llama's does, converted with
`docscore convert`, scored against transformers (padding, packing, both CPU kernels, lengths across the
blockwise kernel's blocks and past llama3's original context); the configs refused (unsupported rotary
scalings, windows longer than a sliding window, pickle weights, leftover tensors); a loglik run through the
CLI."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import models
from kernels import KernelUnsupportedError, resolve, table
from models.config import HF_KEYS, MAX_SIZES, config_from_hf
from models.hf_import import convert_hf_dir
from models.rope import Rope, rope_frequencies
from pipeline.convert import main as convert_main
from pipeline.options import ConfigError, parse_options
from pipeline.validate import validate
from tests.conftest import (SENTENCES, common_flags, padded, read_summary, read_table, run_docscore,
                            transformers_logprobs, write_jsonl)

pytest_plugins = ["gcs_support"]

pytestmark = pytest.mark.integration  # README.md, "Development"

CORPUS = ["the quick brown fox jumps over the lazy dog", "docscore scores documents in batches",
          "rotary positions restart in every packed segment", "grouped-query attention shares keys"] * 8
# Document lengths (BOS included): one token, short ones, and one crossing the blockwise kernel's 256-query
# and 512-key blocks and llama3's 64-token original context; together 600 tokens fill one packed row.
LENGTHS = [1, 7, 40, 552]
COMMON = dict(hidden_size=64, intermediate_size=112, num_attention_heads=4, num_key_value_heads=2,
              initializer_range=0.2, bos_token_id=1, eos_token_id=2)
FAMILIES = {
    # name: (transformers classes, config keywords)
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(num_hidden_layers=3, max_position_embeddings=640, rope_theta=500_000.0)),
    "llama3": ("LlamaConfig", "LlamaForCausalLM",  # head_dim set apart from hidden/heads, rope llama3
               dict(num_hidden_layers=2, max_position_embeddings=640, head_dim=32, attention_bias=True,
                    rope_parameters={"rope_type": "llama3", "rope_theta": 10_000.0, "factor": 8.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 64})),
    "mistral": ("MistralConfig", "MistralForCausalLM",  # the 40- and 552-token documents pass its window
                dict(num_hidden_layers=2, max_position_embeddings=1024, sliding_window=32)),
    "qwen2-window": ("Qwen2Config", "Qwen2ForCausalLM",  # layer 0 attends to everything, layers 1-2 to 24 tokens
                     dict(num_hidden_layers=3, max_position_embeddings=640, use_sliding_window=True,
                          sliding_window=24, max_window_layers=1)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",  # q/k/v biases, tied head, linear rope scaling
              dict(num_hidden_layers=4, max_position_embeddings=640, tie_word_embeddings=True,
                   rope_parameters={"rope_type": "linear", "rope_theta": 1_000_000.0, "factor": 2.0})),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",  # q/k RMSNorm per head, head_dim apart from hidden/heads, all biases
              dict(num_hidden_layers=2, max_position_embeddings=640, head_dim=24, attention_bias=True,
                   rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})),
    # local layers 0 and 2 (a 16-token window, a theta of their own), a global one with linear rope scaling (as
    # gemma-3-4b's), an attention scale of its own, sandwich norms, a scaled embedding, a tied head
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(num_hidden_layers=3, max_position_embeddings=640, head_dim=32, sliding_window=16,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"], query_pre_attn_scalar=24,
                    rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100_000.0},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 1_000.0}})),
    # fused qkv_proj and gate_up_proj; a window on every layer shorter than the 40- and 552-token documents (as
    # Phi-3-mini-4k's 2047), Phi-4's theta; pad_token_id in the vocabulary (Phi3Config's 32000 is past it)
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             dict(num_hidden_layers=2, max_position_embeddings=1024, sliding_window=20, pad_token_id=2,
                  rope_parameters={"rope_type": "default", "rope_theta": 250_000.0})),
    # every other layer local from layer 0 (Gemma2Config's layer_types) within 16 tokens, one rotary setting, no q/k
    # norms, attention scores capped at 5 and logits at 3 (gemma-2's 50 and 30 would not bite in a model this small),
    # sandwich norms, a scaled embedding, a tied head
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(num_hidden_layers=4, max_position_embeddings=640, head_dim=32, sliding_window=16,
                    query_pre_attn_scalar=24, attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                    rope_parameters={"rope_type": "default", "rope_theta": 1_000.0})),
    # norms after the attention and the MLP only, q/k norms over all heads (k's 2 kv heads: 32 wide, q's 64), all biases
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM",
              dict(num_hidden_layers=2, max_position_embeddings=640, attention_bias=True,
                   rope_parameters={"rope_type": "default", "rope_theta": 500_000.0})),
    # OLMo 2's blocks, Olmo3Config's layer_types (three local layers within 16 tokens, then a global one), a rotary
    # theta per layer type
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM",
              dict(num_hidden_layers=4, max_position_embeddings=640, sliding_window=16,
                   rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 500_000.0},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1_000.0}})),
    # granite-3's multipliers but the attention's (0.0625 where head_dim 16 gives 0.25; granite-3-8b's is 1/128 for
    # head_dim 128), its theta, a tied head
    "granite": ("GraniteConfig", "GraniteForCausalLM",
                dict(num_hidden_layers=2, max_position_embeddings=640, tie_word_embeddings=True,
                     embedding_multiplier=12.0, attention_multiplier=0.0625, residual_multiplier=0.22,
                     logits_scaling=8.0, rope_theta=10_000_000.0)),
    # every second layer without rotary positions (no_rope_layer_interval 2: layers 1 and 3), which slide within 16
    # tokens (SmolLM3Config's layer_types with use_sliding_window), SmolLM3-3B's theta; pad_token_id in the vocabulary
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM",
                dict(num_hidden_layers=4, max_position_embeddings=640, no_rope_layer_interval=2,
                     use_sliding_window=True, sliding_window=16, pad_token_id=2,
                     rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0})),
}


def build_tokenizer(out: Path) -> int:
    """A byte-level BPE tokenizer.json that puts <s> before every text (Llama's template); its vocab size."""
    from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(tok_models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer.save(str(out / "tokenizer.json"))
    return tokenizer.get_vocab_size()


def build_hf(out: Path, family: str, **overrides) -> Path:
    """A random *ForCausalLM of `family` (FAMILIES) saved as safetensors, with the tokenizer."""
    import torch
    import transformers

    config_class, model_class, keywords = FAMILIES[family]
    out.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(out)
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(vocab_size=vocab, **{**COMMON, **keywords, **overrides})
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():  # norms start at ones (Gemma's at zeros); scales of their own catch a norm read into the wrong place
        for name, weight in model.named_parameters():
            if "norm" in name:
                weight.mul_(1 + 0.2 * torch.randn_like(weight)).add_(0.2 * torch.randn_like(weight))
    model.save_pretrained(out)
    assert (out / "model.safetensors").exists() and not list(out.glob("*.bin"))
    return out


def convert(src: Path, out: Path, capsys, *extra: str) -> tuple[int, str]:
    """The real `docscore convert --hf` entry point; (exit code, its output)."""
    code = convert_main(["--hf", str(src), "--out", str(out), *extra])
    captured = capsys.readouterr()
    return code, captured.err + captured.out


@pytest.fixture(scope="module", params=list(FAMILIES))
def converted(request, tmp_path_factory) -> tuple[str, Path, Path]:
    """(family, Hugging Face dir, docscore model dir) of each family."""
    family = request.param
    root = tmp_path_factory.mktemp(family)
    hf_dir = build_hf(root / "hf", family)
    assert convert_main(["--hf", str(hf_dir), "--out", str(root / "docscore")]) == 0
    return family, hf_dir, root / "docscore"


def documents(vocab_size: int) -> list[np.ndarray]:
    """Random token ids of LENGTHS, each starting with BOS (id 1), as a tokenized document does."""
    rng = np.random.default_rng(7)
    return [np.concatenate([[1], rng.integers(3, vocab_size, n - 1)]).astype(np.int32) for n in LENGTHS]


@pytest.mark.parametrize("attention", ["native", "flash"])
def test_token_logprobs_match_transformers_padded_and_packed(converted, attention):
    family, hf_dir, model_dir = converted
    loaded = models.load(str(model_dir), attention=attention)
    assert loaded.attention == {"native": "xla", "flash": "blockwise"}[attention]
    assert loaded.config.family == "llama"
    docs = documents(loaded.config.vocab_size)
    ids, segments = padded(docs)
    ours = loaded.token_logprobs(ids, segments)
    expected = transformers_logprobs(hf_dir, ids, segments)
    assert np.abs(expected).max() > 1.0  # not a near-uniform model
    assert np.abs(ours - expected).max() <= 1e-4, (family, np.abs(ours - expected).max())

    # all documents packed into one row (with padding after them) equal each scored alone
    packed_ids = np.pad(np.concatenate(docs), (0, 8))[None]
    packed_segments = np.pad(np.concatenate([np.full(len(d), s + 1, np.int32) for s, d in enumerate(docs)]), (0, 8))[None]
    packed = loaded.token_logprobs(packed_ids, packed_segments)[0]
    alone = np.concatenate([ours[row, :len(d)] for row, d in enumerate(docs)])
    np.testing.assert_allclose(packed[:len(alone)], alone, atol=2e-5, rtol=0)
    assert not packed[len(alone):].any()
    with pytest.raises(ValueError, match="needs a model that embeds"):
        loaded.embed_packed(ids, segments, 1)


def test_config_reads_each_family(converted):
    import jax

    family, hf_dir, model_dir = converted
    loaded = models.load(str(model_dir), attention="native")
    config = loaded.config
    ids = np.ones((1, 16), np.int32)
    scans = str(jax.make_jaxpr(loaded.model)(ids, ids)).count("scan[")
    # one scanned body; Qwen2's two windowed layers after its full one are one (models/layers.py block_runs), Gemma 3's
    # local, global, local repeat nothing and run one by one; Gemma 2's local, global period is scanned twice, as is
    # SmolLM3's rotary, NoPE one; OLMo 3's three local layers are one scan, its global one runs alone
    assert scans == (0 if family == "gemma3" else 1)
    want = {
        "llama": dict(kv_heads=2, head_dim=16, qkv_bias=False, tie_word_embeddings=False, sliding_window=0,
                      rope=Rope(theta=500_000.0)),
        "llama3": dict(head_dim=32, qkv_bias=True, output_bias=True,
                       rope=Rope(10_000.0, "llama3", 8.0, 1.0, 4.0, 64)),
        "mistral": dict(sliding_window=32, sliding_layers=(0, 1), max_positions=1024, qkv_bias=False),
        "qwen2-window": dict(sliding_window=24, sliding_layers=(1, 2), qkv_bias=True),
        "qwen2": dict(qkv_bias=True, output_bias=False, tie_word_embeddings=True, sliding_window=0,
                      rope=Rope(1_000_000.0, "linear", 2.0)),
        "qwen3": dict(head_dim=24, qk_norm=True, qkv_bias=True, output_bias=True, mlp_bias=False, sliding_window=0,
                      layer_norm_eps=1e-5, rope=Rope(1_000_000.0)),
        "gemma3": dict(head_dim=32, qk_norm=True, sliding_window=16, sliding_layers=(0, 2), tie_word_embeddings=True,
                       embed_scale=8.0, post_norms=True, query_pre_attn_scalar=24.0, activation="gelu_tanh",
                       rope=Rope(100_000.0, "linear", 2.0), local_rope=Rope(1_000.0)),
        "phi3": dict(kv_heads=2, head_dim=16, qkv_bias=False, output_bias=False, mlp_bias=False, sliding_window=20,
                     sliding_layers=(0, 1), layer_norm_eps=1e-5, tie_word_embeddings=False, rope=Rope(250_000.0)),
        "gemma2": dict(head_dim=32, qk_norm=False, sliding_window=16, sliding_layers=(0, 2), tie_word_embeddings=True,
                       embed_scale=8.0, post_norms=True, query_pre_attn_scalar=24.0, activation="gelu_tanh",
                       rope=Rope(1_000.0), local_rope=None, attention_logit_cap=5.0, final_logit_cap=3.0),
        "olmo2": dict(kv_heads=2, head_dim=16, qkv_bias=True, output_bias=True, mlp_bias=False, layer_norm_eps=1e-5,
                      tie_word_embeddings=False, rope=Rope(500_000.0)),
        "olmo3": dict(sliding_window=16, sliding_layers=(0, 1, 2), qkv_bias=False, rope=Rope(500_000.0),
                      local_rope=Rope(1_000.0)),
        "granite": dict(head_dim=16, tie_word_embeddings=True, embed_scale=12.0, attention_multiplier=0.0625,
                        residual_multiplier=0.22, logits_divisor=8.0, rope=Rope(10_000_000.0)),
        "smollm3": dict(nope_layers=(1, 3), sliding_window=16, sliding_layers=(1, 3), tie_word_embeddings=True,
                        rope=Rope(5_000_000.0)),
    }[family]
    gemma, olmo = family.startswith("gemma"), family.startswith("olmo")
    assert config.qk_norm == (family in ("qwen3", "gemma3") or olmo) and config.qk_norm_across_heads == olmo
    assert config.post_norms == (gemma or olmo) and config.pre_norms == (not olmo)
    assert (config.embed_scale > 0) == (gemma or family == "granite")
    assert (config.attention_logit_cap, config.final_logit_cap) == ((5.0, 3.0) if family == "gemma2" else (0.0, 0.0))
    assert (config.attention_multiplier, config.residual_multiplier, config.logits_divisor) == (
        (0.0625, 0.22, 8.0) if family == "granite" else (0.0, 0.0, 0.0))
    assert config.nope_layers == ((1, 3) if family == "smollm3" else ())
    assert {key: getattr(config, key) for key in want} == want
    metadata = json.loads((model_dir / "metadata.json").read_text())
    assert metadata["family"] == "llama"
    # the default window length: the sliding window where every layer slides (longer is allowed: --max_seq_len);
    # a model with global layers too sees the whole text through them
    assert metadata["max_seq_len"] == {"mistral": 32, "phi3": 20}.get(family, 640)


def test_transformers_4_config_layout_reads_the_same_rope():
    """rope_theta + rope_scaling ("type" or "rope_type") as transformers 4.x saved them."""
    base = {"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
            "max_position_embeddings": 256, "rope_theta": 500_000.0}
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    assert config_from_hf({**base, "rope_scaling": None}).rope == Rope(theta=500_000.0)
    assert (config_from_hf({**base, "rope_scaling": {"rope_type": "llama3", **scaling}}).rope
            == Rope(500_000.0, "llama3", 8.0, 1.0, 4.0, 64))
    assert config_from_hf({**base, "rope_scaling": {"type": "linear", "factor": 4.0}}).rope == Rope(500_000.0, "linear", 4.0)
    qwen = {**base, "model_type": "qwen2", "sliding_window": 32, "max_window_layers": 1}
    assert config_from_hf({**qwen, "use_sliding_window": False}).sliding_window == 0
    assert config_from_hf({**qwen, "use_sliding_window": True}).sliding_window == 32
    assert config_from_hf({**qwen, "use_sliding_window": True}).sliding_layers == (1,)
    layer_types = {**base, "model_type": "qwen2", "sliding_window": 8, "use_sliding_window": True,
                   "layer_types": ["sliding_attention", "full_attention"]}
    assert config_from_hf(layer_types).sliding_layers == (0,)
    assert config_from_hf({**base, "model_type": "mistral", "sliding_window": None}).sliding_window == 0


ROPE_BASE = {"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 512}
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500_000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
YARN = {"rope_type": "yarn", "rope_theta": 10_000.0, "factor": 8.0, "original_max_position_embeddings": 64}
FACTORS = {"short_factor": [1.0 + i / 8 for i in range(8)], "long_factor": [1.0 + i for i in range(8)]}  # head_dim 16
ROPE_CASES = {  # config.json rope keys as different transformers versions (and hand edits) leave them
    "4.x-theta-only": {"rope_theta": 300_000.0},
    "5.x-linear": {"rope_parameters": {"rope_type": "linear", "rope_theta": 20_000.0, "factor": 2.0}},
    "both-fields-scaling-wins": {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
                                 "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    "both-fields-top-level-theta": {"rope_theta": 300_000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
                                    "rope_scaling": {"type": "linear", "factor": 4.0}},
    "empty-scaling": {"rope_scaling": {}, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
    "llama3-in-dict": {"rope_parameters": {**LLAMA3, "original_max_position_embeddings": 64}},
    "llama3-top-level-only": {"original_max_position_embeddings": 32, "rope_parameters": LLAMA3},
    "llama3-both": {"original_max_position_embeddings": 32, "rope_parameters": {**LLAMA3, "original_max_position_embeddings": 64}},
    "yarn-5.x": {"rope_parameters": {**YARN, "beta_fast": 16, "beta_slow": 2}},
    "yarn-4.x-type": {"rope_theta": 1e6, "rope_scaling": {"type": "yarn", "factor": 4.0}},  # original: max positions
    "yarn-top-level-original": {"original_max_position_embeddings": 32, "rope_scaling": YARN},
    "yarn-untruncated-mscale": {"rope_parameters": {**YARN, "truncate": False, "mscale": 1.0, "mscale_all_dim": 0.5}},
    "yarn-nulls": {"rope_parameters": {**YARN, "truncate": None, "factor": None, "beta_fast": None, "beta_slow": 0}},
    "yarn-attention-factor": {"rope_parameters": {**YARN, "attention_factor": 1.5}},
    "longrope-5.x": {"rope_parameters": {"rope_type": "longrope", "original_max_position_embeddings": 64, **FACTORS}},
    "longrope-4.x-factor": {"original_max_position_embeddings": 128,
                            "rope_scaling": {"type": "longrope", "factor": 3.0, "original_max_position_embeddings": 64,
                                             **FACTORS}},
    "longrope-attention-factor": {"rope_parameters": {"rope_type": "longrope", "attention_factor": 0.9, **FACTORS}},
}


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_rope_frequencies_are_the_ones_transformers_builds_from_the_same_config_json(case, tmp_path):
    """transformers 5 prefers a non-empty rope_scaling over rope_parameters, and a top-level
    original_max_position_embeddings over the one in the rope settings (llama3, yarn, longrope); docscore reads them
    alike, to the same frequencies (longrope: the long ones too) and attention scaling (yarn's from its factor or
    mscales, longrope's from its factor or the ratio of the context lengths, each unless attention_factor says)."""
    import torch
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    (tmp_path / "config.json").write_text(json.dumps({**ROPE_BASE, **ROPE_CASES[case]}))
    reference = transformers.AutoConfig.from_pretrained(str(tmp_path))
    with torch.no_grad():
        rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(reference)
    config = config_from_hf(json.loads((tmp_path / "config.json").read_text()))
    np.testing.assert_allclose(rope_frequencies(config.rope, config.head_dim), rotary.inv_freq.numpy(), rtol=1e-6)
    assert config.rope.attention_factor == rotary.attention_scaling
    if config.rope.kind == "longrope":  # what transformers switches to past the original context
        long, _ = ROPE_INIT_FUNCTIONS["longrope"](reference, seq_len=config.rope.original_max_positions + 1)
        np.testing.assert_allclose(rope_frequencies(config.rope, config.head_dim, long=True), long.numpy(), rtol=1e-6)


WINDOW_BASE = {"vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 30, "num_attention_heads": 4,
               "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 8192}
WINDOW_CASES = {  # config.json keys that decide local attention, as saved (absent keys take transformers' defaults)
    "mistral-absent": {"model_type": "mistral"},
    "mistral-null": {"model_type": "mistral", "sliding_window": None},
    "mistral-64": {"model_type": "mistral", "sliding_window": 64},
    "mistral-all-sliding-types": {"model_type": "mistral", "sliding_window": 64, "layer_types": ["sliding_attention"] * 30},
    "qwen2-absent": {"model_type": "qwen2"},
    "qwen2-on-defaults": {"model_type": "qwen2", "use_sliding_window": True},
    "qwen2-on-window": {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 16},
    "qwen2-on-from-layer-3": {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 3},
    "qwen2-off-window": {"model_type": "qwen2", "use_sliding_window": False, "sliding_window": 16, "max_window_layers": 0},
    "qwen2-types": {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 16,
                    "layer_types": ["full_attention", "sliding_attention"] * 15},
    "qwen3-absent": {"model_type": "qwen3"},
    "qwen3-on-defaults": {"model_type": "qwen3", "use_sliding_window": True},
    "qwen3-on-from-layer-3": {"model_type": "qwen3", "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 3},
    "qwen3-types": {"model_type": "qwen3", "use_sliding_window": True, "sliding_window": 16,
                    "layer_types": ["sliding_attention", "full_attention"] * 15},
}


@pytest.mark.parametrize("case", sorted(WINDOW_CASES))
def test_sliding_windows_are_what_transformers_applies(case):
    """Each layer's window equals the one transformers' own config class gives the same config.json (its
    defaults for absent keys, Qwen2's use_sliding_window switch, layer_types); the modeling code windows
    every layer of Mistral when sliding_window is set, and Qwen2's sliding_attention layers."""
    import transformers

    hf = {**WINDOW_BASE, **WINDOW_CASES[case]}
    reference = transformers.AutoConfig.for_model(**hf)
    window = reference.sliding_window
    if hf["model_type"] == "mistral":
        layers = tuple(range(hf["num_hidden_layers"])) if window is not None else ()
    else:
        layers = tuple(i for i, kind in enumerate(reference.layer_types) if kind == "sliding_attention")
    config = config_from_hf(hf)
    assert (config.sliding_window, config.sliding_layers) == ((window, layers) if layers else (0, ()))


@pytest.mark.parametrize("hf, refusal", [
    ({"model_type": "qwen2", "use_sliding_window": False, "sliding_window": 16,
      "layer_types": ["full_attention", "sliding_attention"] * 15}, "transformers cannot run it"),
    ({"model_type": "mistral", "sliding_window": 16, "layer_types": ["full_attention", "sliding_attention"] * 15},
     "MistralForCausalLM ignores"),
], ids=["qwen2-sliding-layer-without-window", "mistral-mixed-layer-types"])
def test_windows_transformers_would_not_apply_as_written_are_refused(hf, refusal):
    with pytest.raises(models.ModelLoadError, match=refusal):
        config_from_hf({**WINDOW_BASE, **hf})


LLAMA = {"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "max_position_embeddings": 256}
OUT_OF_BOUNDS = [(key, value) for field, key in HF_KEYS["llama"].items()
                 for value in (MAX_SIZES[field] + 1, 10**7, 0, -1, 2.5, "64", True)]


@pytest.mark.parametrize("key, value", OUT_OF_BOUNDS, ids=[f"{k}-{v!r}" for k, v in OUT_OF_BOUNDS])
def test_every_size_out_of_bounds_is_refused_naming_the_file_and_key(key, value):
    with pytest.raises(models.ModelLoadError) as caught:
        config_from_hf({**LLAMA, key: value}, "/models/x/config.json")
    message = str(caught.value)
    assert message.startswith("/models/x/config.json: ") and f"{key} is " in message, message


def test_head_and_group_shapes_are_checked():
    # null head_dim and num_key_value_heads mean hidden_size / heads and one kv head per head, as transformers
    config = config_from_hf({**LLAMA, "head_dim": None, "num_key_value_heads": None})
    assert (config.head_dim, config.kv_heads) == (16, 4)
    assert config_from_hf({**LLAMA, "hidden_size": 62, "head_dim": 32}).head_dim == 32  # set apart: need not divide
    with pytest.raises(models.ModelLoadError, match="hidden size 62 is not a multiple of 4 attention heads"):
        config_from_hf({**LLAMA, "hidden_size": 62, "head_dim": None})
    with pytest.raises(models.ModelLoadError, match="num_attention_heads 4 is not a multiple of num_key_value_heads 3"):
        config_from_hf({**LLAMA, "num_key_value_heads": 3})
    with pytest.raises(models.ModelLoadError, match="hidden_act 'gelu' is not supported for llama"):
        config_from_hf({**LLAMA, "hidden_act": "gelu"})


ROPE_VALUES = [({"rope_theta": -5}, 'rope_theta of rope_type \'default\' is -5'),
               ({"rope_parameters": {"rope_type": "linear", "factor": 0}}, "rope_parameters.factor of rope_type 'linear' is 0"),
               ({"rope_parameters": {"rope_type": "default", "rope_theta": "abc"}}, 'rope_theta of rope_type \'default\' is "abc"'),
               ({"rope_scaling": {"rope_type": "llama3", "factor": "x", "low_freq_factor": 1, "high_freq_factor": 4}},
                'rope_scaling.factor of rope_type \'llama3\' is "x"'),
               ({"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": float("nan"), "high_freq_factor": 4}},
                "rope_scaling.low_freq_factor of rope_type 'llama3' is NaN"),
               ({"rope_theta": 1, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},  # its ramp divides by ln(theta)
                "rope_theta of rope_type 'yarn' is 1")]


@pytest.mark.parametrize("settings, named", ROPE_VALUES)
def test_rope_values_that_make_every_score_nan_are_refused_naming_the_key(settings, named):
    """rope_theta -5 or a linear factor 0 converted and ran to NaN scores with exit 0; a value that is not a
    number named the whole settings object instead of its key."""
    with pytest.raises(models.ModelLoadError) as caught:
        config_from_hf({**LLAMA, **settings}, "/models/x/config.json")
    assert named in str(caught.value) and "must be a positive, finite number" in str(caught.value), str(caught.value)


@pytest.mark.parametrize("rope_type, extra", [("dynamic", {"factor": 2.0}),  # its frequencies follow the batch's length
                                              ("su", {"short_factor": [1.0] * 8, "long_factor": [1.0] * 8})])
def test_unsupported_rope_scaling_is_refused_naming_field_and_value(rope_type, extra, tmp_path, capsys):
    src = build_hf(tmp_path / "hf", "llama", num_hidden_layers=1)
    config = json.loads((src / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": rope_type, "rope_theta": 10_000.0, **extra}
    (src / "config.json").write_text(json.dumps(config))
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 2, message
    assert f'{src}/config.json: rope_parameters.rope_type "{rope_type}" is not supported' in message
    assert "'default', 'linear', 'llama3', 'yarn', 'longrope' only" in message and not (tmp_path / "out").exists()
    # the transformers 4.x layout names its own field
    del config["rope_parameters"]
    config["rope_scaling"] = {"type": rope_type, **extra}
    (src / "config.json").write_text(json.dumps(config))
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 2 and f'rope_scaling.type "{rope_type}" is not supported' in message


def test_sliding_window_is_a_local_mask_and_kernels_without_one_are_refused(converted, tmp_path, gcs):
    """Past its window a Mistral/Qwen2/Phi-3 token sees only the last `window` tokens in each sliding layer (the
    parity test above runs documents longer than the window); the window rides the kernel contract, and a
    kernel without local attention is refused, not silently run without it."""
    family, hf_dir, model_dir = converted
    config = models.load(str(model_dir), attention="native").config
    expected = {"mistral": (32, (0, 1)), "qwen2-window": (24, (1, 2)), "gemma3": (16, (0, 2)),
                "phi3": (20, (0, 1)), "gemma2": (16, (0, 2)), "olmo3": (16, (0, 1, 2)),
                "smollm3": (16, (1, 3))}.get(family, (0, ()))
    assert (config.sliding_window, config.sliding_layers) == expected
    # Phi-3 windows every layer as Mistral does, OLMo 3 and SmolLM3 some layers as Qwen2 and Gemma do: the plans below
    # are the kernel policy's for a window, which is the same whatever model holds it
    if not config.sliding_window or family in ("phi3", "olmo3", "smollm3"):
        return
    with pytest.raises(KernelUnsupportedError, match="sliding-window"):
        resolve("flash", "gpu", heads=4, kv_heads=2, head_dim=16, dtype="bfloat16", causal=True,
                has_segments=True, q_len=4096, kv_len=4096, window=config.sliding_window)
    assert resolve("auto", "gpu", heads=4, kv_heads=2, head_dim=16, dtype="bfloat16", causal=True,
                   has_segments=True, q_len=4096, kv_len=4096, window=config.sliding_window) in ("xla", "blockwise")
    # Dataflow GPU/TPU workers: converted at its window (docscore convert's default where every layer slides), no
    # row is longer than the window, which then masks nothing, and their flash kernels run it; converted at twice
    # the window, flash is refused on GPU before the job starts, as the workers' loader would refuse it, and TPU's
    # splash_tpu runs the window. auto plans (and records) the kernel the workers will run. The workers read the
    # input and the models from GCS (its emulator).
    fs = gcs.fs()
    fs.pipe(f"{gcs.bucket}/docs.jsonl", b'{"id": "a", "text": "a short text"}\n')
    window_dir, long_dir = tmp_path / "converted-at-the-window", tmp_path / "converted-at-twice-the-window"
    assert convert_main(["--hf", str(hf_dir), "--out", str(window_dir), "--max_seq_len", str(config.sliding_window)]) == 0
    assert convert_main(["--hf", str(hf_dir), "--out", str(long_dir), "--max_seq_len", str(2 * config.sliding_window)]) == 0
    fs.put(str(window_dir), f"{gcs.bucket}/window", recursive=True)
    fs.put(str(long_dir), f"{gcs.bucket}/twice", recursive=True)
    for accelerator, backend in (("nvidia-l4;count:1;install-nvidia-driver", "gpu"), ("tpu-v5-lite-podslice;topology:1x1", "tpu")):
        def plan(attention, *extra, model=gcs.url("window")):
            _, eo = parse_options(["--input", gcs.url("docs.jsonl"), "--output", "bq:docscore-test.evals.nightly", "--run_id", "r1",
                                   "--temp_location", "gs://docscore-test-bucket/tmp", "--project", "docscore-test",
                                   "--sdk_container_image", "img:test",
                                   "--region", "r", "--task", "loglik", "--stride", "8", "--model", str(model), "--dtype", "bfloat16",
                                   "--attention", attention, "--runner", "DataflowRunner",
                                   "--dataflow_service_options", f"worker_accelerator=type:{accelerator}",
                                   "--experiments", "no_use_multiple_sdk_containers", *extra])
            return validate(eo)

        if config.attention_logit_cap and backend == "gpu":  # Gemma 2: neither GPU flash kernel caps the scores
            with pytest.raises(ConfigError, match="--attention=flash .*attention-logit soft-capping.*the Dataflow "
                                                  "workers' accelerator"):
                plan("flash")
            assert plan("auto").kernel == "xla"
        else:
            assert plan("flash").kernel in table.FLASH[backend]
        if backend == "tpu":  # TPU's flash kernel, splash_tpu, has the local window (and the soft cap) itself
            twice = gcs.url("twice")
            assert plan("flash", model=twice).kernel == plan("auto", model=twice).kernel == "splash_tpu"
            continue
        with pytest.raises(ConfigError, match="--attention=flash .*sliding-window.*the Dataflow workers' accelerator"):
            plan("flash", model=gcs.url("twice"))
        assert plan("auto", model=gcs.url("twice")).kernel == "xla"
    # a longer --max_seq_len than the model was converted at needs converting again
    with pytest.raises(ConfigError, match="exceeds the model's .*convert the model again with `docscore convert "
                                          "--max_seq_len` up to its"):
        plan("auto", "--max_seq_len", str(2 * config.sliding_window))


def test_pickle_weights_and_leftover_tensors_are_refused(tmp_path, capsys):
    src = build_hf(tmp_path / "hf", "qwen2", num_hidden_layers=1)
    tensors = load_file(src / "model.safetensors")
    save_file({**tensors, "model.layers.0.mlp.extra_proj.weight": np.zeros((4, 4), np.float32)},
              src / "model.safetensors")
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 2 and "'model.layers.0.mlp.extra_proj.weight'] have no place in the model" in message

    del tensors["model.layers.0.self_attn.q_proj.bias"]  # Qwen2 has q/k/v biases
    save_file(tensors, src / "model.safetensors")
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 2 and "tensor 'model.layers.0.self_attn.q_proj.bias' is missing" in message

    (src / "model.safetensors").rename(src / "pytorch_model.bin")
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 2 and f"{src}: no *.safetensors weights found" in message and "pickle" in message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_bias_settings_transformers_ignores_are_ignored_as_it_does(family, tmp_path, capsys):
    """Qwen2 always has q/k/v biases and Mistral none, whatever attention_bias and mlp_bias say (only Llama
    reads them): such a config was refused for a missing o_proj bias that transformers never builds."""
    src = build_hf(tmp_path / "hf", family, num_hidden_layers=1, attention_bias=True, mlp_bias=True)
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 0, message
    loaded = models.load(str(tmp_path / "out"), attention="native")
    ids, segments = padded(documents(loaded.config.vocab_size)[:3])
    np.testing.assert_allclose(loaded.token_logprobs(ids, segments), transformers_logprobs(src, ids, segments),
                               atol=1e-4, rtol=0)


def test_untied_model_without_its_head_is_refused(tmp_path, capsys):
    src = build_hf(tmp_path / "hf", "llama", num_hidden_layers=1)
    tensors = load_file(src / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, src / "model.safetensors")
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 2 and "'lm_head.weight' is missing and tie_word_embeddings is false" in message


def test_tied_model_with_a_head_of_its_own_is_refused(tmp_path, capsys):
    """transformers unties such a checkpoint and scores with its lm_head; docscore silently used the embedding
    (total log-likelihood -84 against transformers' -352). The same head as the embedding converts."""
    src = build_hf(tmp_path / "hf", "qwen2", num_hidden_layers=1)
    tensors = load_file(src / "model.safetensors")
    embedding = tensors["model.embed_tokens.weight"]
    save_file({**tensors, "lm_head.weight": embedding.copy()}, src / "model.safetensors")
    code, message = convert(src, tmp_path / "same", capsys)
    assert code == 0, message
    save_file({**tensors, "lm_head.weight": np.random.default_rng(0).normal(size=embedding.shape).astype(embedding.dtype)}, src / "model.safetensors")
    code, message = convert(src, tmp_path / "out", capsys)
    assert code == 2 and "lm_head.weight differs from embed_tokens.weight although config.json sets " \
                         "tie_word_embeddings true" in message, message


def test_loglik_run_through_the_cli_matches_transformers(tmp_path):
    """`docscore run --task loglik` on a converted Llama: each document's total log-likelihood and perplexity
    equal transformers' over the same tokens (BOS predicts the first text token), and the summary's corpus
    perplexity is theirs."""
    import torch
    import transformers
    from tokenizers import Tokenizer

    src = build_hf(tmp_path / "hf", "llama")
    assert convert_main(["--hf", str(src), "--out", str(tmp_path / "model")]) == 0
    texts = SENTENCES[:6]
    shard = write_jsonl(tmp_path / "in" / "l.jsonl", [{"id": f"l{i}", "text": t} for i, t in enumerate(texts)])
    assert run_docscore("--input", shard, *common_flags("ll", tmp_path / "out"), "--task", "loglik",
                        "--model", tmp_path / "model", "--attention", "native", "--max_seq_len", "64") == 0
    scores, _ = read_table(tmp_path / "out", "scores", "ll")
    scores = scores.sort_values("record_index")
    assert list(scores.doc_id) == [f"l{i}" for i in range(6)] and (scores.n_chunks == 1).all()
    assert set(scores.task) == {"loglik"} and set(scores.attention_impl) == {"xla"}
    tokenizer = Tokenizer.from_file(str(src / "tokenizer.json"))
    reference = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    totals, counts = [], []
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tokenizer.encode(text).ids])
            assert ids[0, 0] == 1  # <s>
            logp = torch.log_softmax(reference(ids).logits[0, :-1].double(), dim=-1)
            totals.append(float(logp.gather(1, ids[0, 1:, None]).sum()))
            counts.append(ids.shape[1] - 1)
    np.testing.assert_allclose(scores.score.to_numpy(), totals, atol=1e-3, rtol=1e-5)
    np.testing.assert_allclose(scores.perplexity.to_numpy(), [math.exp(-t / c) for t, c in zip(totals, counts)],
                               rtol=1e-4)
    summary = read_summary(tmp_path / "out", "ll")
    assert summary["task_metrics"]["loglik_tokens"] == sum(counts)
    assert summary["task_metrics"]["corpus_perplexity"] == pytest.approx(math.exp(-sum(totals) / sum(counts)), rel=1e-4)
    assert summary["model"]["family"] == "llama" and summary["model"]["max_seq_len"] == 64


def test_a_long_document_through_the_flash_kernel_matches_native_and_transformers(tmp_path):
    """One 4,600-token document (not a multiple of the blockwise kernel's blocks, past llama3's original
    context many times over): blockwise (`--attention flash` on CPU) equals native and transformers."""
    src = build_hf(tmp_path / "hf", "llama3", max_position_embeddings=8192)
    convert_hf_dir(str(src), str(tmp_path / "model"))
    flash = models.load(str(tmp_path / "model"), attention="flash")
    native = models.load(str(tmp_path / "model"), attention="native")
    assert (flash.attention, native.attention) == ("blockwise", "xla")
    rng = np.random.default_rng(3)
    ids = np.concatenate([[1], rng.integers(3, flash.config.vocab_size, 4599)]).astype(np.int32)[None]
    segments = np.ones_like(ids)
    ours = flash.token_logprobs(ids, segments)
    # float32 softmax over up to 4,600 keys summed in blocks or at once: 3e-5 apart on an AVX2-only CPU
    np.testing.assert_allclose(ours, native.token_logprobs(ids, segments), atol=5e-5, rtol=0)
    assert np.abs(ours - transformers_logprobs(src, ids, segments)).max() <= 1e-4


def test_the_kernel_is_chosen_for_the_runs_rows_not_the_models_longest(tmp_path, capsys):
    """--max_seq_len shorter than the model was converted at: the kernel is chosen for the rows the run builds.
    auto's xla limit on CPU (kv_len > 1024) judged a 2048-position model's rows at 2048 although the run's are 128,
    and a Mistral window of 24 that rows of 24 tokens never reach refused GPU flash naming rows of 640 (TPU's,
    splash_tpu, takes the window in either)."""
    from pipeline.validate import resolve_kernel

    src = build_hf(tmp_path / "hf", "llama", max_position_embeddings=2048, num_hidden_layers=1)
    assert convert_main(["--hf", str(src), "--out", str(tmp_path / "long")]) == 0
    assert models.load(str(tmp_path / "long"), attention="auto").attention == "blockwise"
    assert models.load(str(tmp_path / "long"), attention="auto", max_seq_len=128).attention == "xla"
    shard = write_jsonl(tmp_path / "in" / "d.jsonl", [{"id": "a", "text": "a short text"}])
    assert run_docscore("--input", shard, "--output", tmp_path / "out", "--run_id", "r", "--task", "loglik",
                        "--model", tmp_path / "long", "--max_seq_len", "128", "--stride", "8") == 0
    assert read_summary(tmp_path / "out", "r")["kernel"]["resolved"] == "xla"

    window = build_hf(tmp_path / "hf-window", "qwen2-window", num_hidden_layers=3)
    assert convert_main(["--hf", str(window), "--out", str(tmp_path / "w"), "--max_seq_len", "640"]) == 0
    loaded = models.load(str(tmp_path / "w"), attention="native")
    with pytest.raises(ConfigError, match="window of 24 needs in rows of 640 tokens"):
        resolve_kernel("flash", "gpu", dtype="bfloat16", loaded=loaded)
    assert resolve_kernel("flash", "tpu", dtype="bfloat16", loaded=loaded) == "splash_tpu"
    for backend in ("tpu", "gpu"):
        assert resolve_kernel("flash", backend, dtype="bfloat16", loaded=loaded, max_len=24) in table.FLASH[backend]


@pytest.mark.parametrize("hf, says", [
    ({k: v for k, v in LLAMA.items() if k != "model_type"}, "has no model_type, so its architecture is unknown"),
    ({**LLAMA, "model_type": "qwen3", "layer_types": ["full_attention", "chunked_attention"]},
     "layer_types holds 'chunked_attention', which is not supported"),
    ({**LLAMA, "rope_scaling": {"type": "dynamic", "factor": 4.0}}, 'rope_scaling.type "dynamic" is not supported'),
], ids=["no-model-type", "unknown-layer-type", "transformers-4-rope-key"])
def test_refusals_name_the_key_and_value_the_file_holds(hf, says):
    with pytest.raises(models.ModelLoadError, match=re.escape(says)):
        config_from_hf(hf)


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3", "phi3"])
def test_pretraining_tp_is_read_as_the_same_model(model_type):
    """pretraining_tp > 1 (Llama-2's and some fine-tunes' config.json say 2 or 4) only split transformers 4.x's MLP
    matmuls into slices summed back, the same linear map, and transformers 5 does not read it: the model is the one
    without it."""
    hf = {**LLAMA, "model_type": model_type}
    assert config_from_hf({**hf, "pretraining_tp": 4}) == config_from_hf(hf)


def test_an_unknown_model_type_is_refused_naming_every_model_type_docscore_reads():
    from models.config import FAMILIES as MODEL_TYPES

    with pytest.raises(models.ModelLoadError, match="model_type 'bloom' is not supported") as refused:
        config_from_hf({**LLAMA, "model_type": "bloom"})
    assert not [name for name in MODEL_TYPES if f"'{name}'" not in str(refused.value)], str(refused.value)


GEMMA3_4X = {  # gemma-3-4b's text config as transformers 4.x saved it: one rope_theta, rope_scaling for the global
    "model_type": "gemma3_text", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 12,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 4096,
    "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    "sliding_window": 1024, "sliding_window_pattern": 6, "query_pre_attn_scalar": 256}


def test_gemma3_configs_read_as_transformers_reads_them():
    """A transformers 4.x Gemma 3 config (sliding_window_pattern, rope_local_base_freq, rope_scaling) gives the
    layer types and rotary settings transformers 5 builds from it; what docscore does not compute is refused by key."""
    import transformers

    ours = config_from_hf(GEMMA3_4X)
    theirs = transformers.Gemma3TextConfig(**{k: v for k, v in GEMMA3_4X.items() if k != "model_type"})
    assert ours.sliding_layers == tuple(i for i, kind in enumerate(theirs.layer_types) if kind == "sliding_attention")
    assert ours.sliding_layers == (0, 1, 2, 3, 4, 6, 7, 8, 9, 10) and ours.sliding_window == theirs.sliding_window
    full, local = theirs.rope_parameters["full_attention"], theirs.rope_parameters["sliding_attention"]
    assert ours.rope == Rope(full["rope_theta"], full["rope_type"], full["factor"]) == Rope(1e6, "linear", 8.0)
    assert ours.local_rope == Rope(local["rope_theta"]) == Rope(10_000.0)
    assert (ours.head_dim, ours.query_pre_attn_scalar, ours.embed_scale, ours.tie_word_embeddings) == (32, 256.0, 8.0, True)
    # transformers 5 lays a non-null rope_scaling over rope_parameters' global layers, and takes a theta
    # rope_parameters leaves out from rope_theta / rope_local_base_freq
    per_type = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    for both in ({"rope_parameters": per_type, "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
                 {"rope_parameters": {"full_attention": per_type["full_attention"]}, "rope_local_base_freq": 5e3}):
        hf = {**{k: v for k, v in GEMMA3_4X.items() if not k.startswith("rope")}, **both}
        ours = config_from_hf(hf)
        theirs = transformers.Gemma3TextConfig(**{k: v for k, v in hf.items() if k != "model_type"}).rope_parameters
        full, local = theirs["full_attention"], theirs["sliding_attention"]
        assert ours.rope == Rope(full["rope_theta"], full["rope_type"], full.get("factor", 1.0)), both
        assert ours.local_rope == Rope(local["rope_theta"]), both
    assert ours.causal and not ours.bidirectional
    # EmbeddingGemma: both ways, a local layer within half its window each way (transformers keeps |i - j| < 1024 // 2 + 1)
    both = config_from_hf({**GEMMA3_4X, "use_bidirectional_attention": True})
    assert (both.causal, both.sliding_window) == (False, 1024 // 2 + 1)
    assert both.sliding_window == transformers.Gemma3TextConfig(**{k: v for k, v in GEMMA3_4X.items() if k != "model_type"},
                                                                use_bidirectional_attention=True).sliding_window
    # Gemma3ForCausalLM caps its logits at final_logit_softcapping; its attention never reads attn_logit_softcapping
    capped = config_from_hf({**GEMMA3_4X, "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0})
    assert (capped.final_logit_cap, capped.attention_logit_cap) == (30.0, 0.0)
    for change, says in (({"final_logit_softcapping": 0}, "final_logit_softcapping is 0; it must be a positive"),
                         ({"hidden_activation": "gelu"}, "hidden_activation 'gelu' is not supported for gemma3_text"),
                         ({"sliding_window_pattern": 0}, "sliding_window_pattern is 0"),
                         ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "full_attention layers: rope_scaling"),
                         ({"rope_parameters": {"rope_type": "default"}}, "Gemma 3's are per layer type")):
        with pytest.raises(models.ModelLoadError, match=re.escape(says)):
            config_from_hf({**GEMMA3_4X, **change})


GEMMA2_9B = {  # gemma-2-9b's config.json (sizes cut down): alternating layers, transformers 4.x's rope_theta
    "model_type": "gemma2", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 6,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 8192,
    "rope_theta": 10_000.0, "sliding_window": 4096, "query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh", "cache_implementation": "hybrid"}


def assert_gemma_sizes_as(ours, theirs) -> None:
    """docscore's ModelConfig has the sizes and local layers of a transformers Gemma2Config / Gemma3TextConfig."""
    assert (ours.vocab_size, ours.hidden_size, ours.intermediate_size, ours.num_layers, ours.num_heads, ours.kv_heads,
            ours.head_dim, ours.max_positions, ours.layer_norm_eps, ours.query_pre_attn_scalar) == (
        theirs.vocab_size, theirs.hidden_size, theirs.intermediate_size, theirs.num_hidden_layers,
        theirs.num_attention_heads, theirs.num_key_value_heads, theirs.head_dim, theirs.max_position_embeddings,
        theirs.rms_norm_eps, theirs.query_pre_attn_scalar)
    assert ours.sliding_layers == tuple(i for i, kind in enumerate(theirs.layer_types) if kind == "sliding_attention")


def test_gemma2_configs_read_as_transformers_reads_them():
    """A gemma2 config.json gives what Gemma2Config and Gemma2ForCausalLM build from it: its defaults for keys left
    out (every other layer local from layer 0, caps of 50 and 30, head_dim 256, a tied head), the one rotary
    setting's frequencies, caps set to null as none; what docscore does not compute is refused by key."""
    import transformers
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RotaryEmbedding

    theirs, ours = transformers.Gemma2Config(), config_from_hf({"model_type": "gemma2"})
    assert_gemma_sizes_as(ours, theirs)
    assert ours.sliding_layers == tuple(range(0, 26, 2)) and ours.sliding_window == theirs.sliding_window == 4096
    assert (ours.attention_logit_cap, ours.final_logit_cap) == (
        theirs.attn_logit_softcapping, theirs.final_logit_softcapping) == (50.0, 30.0)
    assert ours.tie_word_embeddings and ours.post_norms and not ours.qk_norm and ours.local_rope is None
    assert ours.embed_scale == theirs.hidden_size ** 0.5 and ours.default_seq_len == 8192  # global layers see it all
    for rope in ({"rope_theta": 10_000.0}, {"rope_parameters": {"rope_type": "linear", "rope_theta": 5e4, "factor": 2.0}}):
        hf = {**{k: v for k, v in GEMMA2_9B.items() if k != "rope_theta"}, **rope}
        reference = transformers.Gemma2Config(**{k: v for k, v in hf.items() if k != "model_type"})
        with torch_no_grad():
            inv_freq = Gemma2RotaryEmbedding(reference).inv_freq.numpy()
        config = config_from_hf(hf)
        np.testing.assert_allclose(rope_frequencies(config.layer_rope(0), config.head_dim), inv_freq, rtol=1e-6)
        assert config.layer_rope(0) == config.layer_rope(1)
    layer_types = ["full_attention", "sliding_attention", "sliding_attention"] * 2
    assert config_from_hf({**GEMMA2_9B, "layer_types": layer_types}).sliding_layers == (1, 2, 4, 5)
    uncapped = config_from_hf({**GEMMA2_9B, "attn_logit_softcapping": None, "final_logit_softcapping": None})
    assert (uncapped.attention_logit_cap, uncapped.final_logit_cap) == (0.0, 0.0)
    for change, says in (({"attn_logit_softcapping": 0}, "attn_logit_softcapping is 0; it must be a positive, finite"),
                         ({"final_logit_softcapping": "abc"}, 'final_logit_softcapping is "abc"; it must be a positive'),
                         ({"final_logit_softcapping": -30.0}, "final_logit_softcapping is -30.0; it must be a positive"),
                         ({"use_bidirectional_attention": True}, "use_bidirectional_attention true is not supported"),
                         ({"hidden_activation": "gelu"}, "hidden_activation 'gelu' is not supported for gemma2"),
                         ({"sliding_window": None}, "sliding_window is null; it must be a whole number >= 1"),
                         ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, 'rope_type "dynamic" is not supported'),
                         ({"num_key_value_heads": None}, "num_key_value_heads is null")):
        with pytest.raises(models.ModelLoadError, match=re.escape(says)):
            config_from_hf({**GEMMA2_9B, **change})


def torch_no_grad():
    import torch

    return torch.no_grad()


def reference_logprobs(reference, ids: np.ndarray, segments: np.ndarray) -> np.ndarray:
    """log p(ids[t+1] | ids[:t+1]) [rows, L - 1] of a transformers model as it stands (its switches set by hand)."""
    import torch

    with torch.no_grad():
        logits = reference(torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(segments)).logits
    return torch.log_softmax(logits.double(), dim=-1).gather(-1, torch.tensor(ids[:, 1:, None])).numpy()[..., 0]


@pytest.mark.parametrize("converted", ["gemma2"], indirect=True)
def test_gemma2s_caps_are_what_makes_its_scores_transformers(converted):
    """Gemma 2's parity above (test_token_logprobs_match_transformers_padded_and_packed) holds because both caps are
    computed: transformers' own Gemma 2 without its attention cap, or without its final cap, scores the same tokens
    more than 1e-2 apart, so a docscore that left either out would fail there. Flash (blockwise) caps inside its
    online softmax as native does."""
    import torch
    import transformers

    _, hf_dir, model_dir = converted
    ids, segments = padded(documents(300))
    reference = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    real = segments[:, 1:] == 1
    capped = reference_logprobs(reference, ids, segments)
    reference.config.final_logit_softcapping = None
    without_final = reference_logprobs(reference, ids, segments)
    reference.config.final_logit_softcapping = 3.0
    for layer in reference.model.layers:
        layer.self_attn.attn_logit_softcapping = None
    without_attention = reference_logprobs(reference, ids, segments)
    assert np.abs(capped - without_final)[real].max() > 1e-2
    assert np.abs(capped - without_attention)[real].max() > 1e-2
    loaded = models.load(str(model_dir), attention="flash")
    ours = loaded.token_logprobs(ids, segments)[:, :-1]
    assert np.abs(ours - capped)[real].max() <= 1e-4


def test_gemma3_with_a_final_cap_scores_as_transformers(tmp_path, capsys):
    """Gemma3ForCausalLM caps its logits at final_logit_softcapping and leaves attn_logit_softcapping unread (its
    attention never passes it on): a Gemma 3 with both set converts and scores as transformers does."""
    src = build_hf(tmp_path / "hf", "gemma3", final_logit_softcapping=3.0,
                   attn_logit_softcapping=5.0)
    code, message = convert(src, tmp_path / "model", capsys)
    assert code == 0, message
    loaded = models.load(str(tmp_path / "model"), attention="native")
    assert (loaded.config.final_logit_cap, loaded.config.attention_logit_cap) == (3.0, 0.0)
    ids, segments = padded(documents(loaded.config.vocab_size)[:3])
    np.testing.assert_allclose(loaded.token_logprobs(ids, segments), transformers_logprobs(src, ids, segments),
                               atol=1e-4, rtol=0)


def test_gemma3_sizes_left_out_are_transformers_defaults():
    """A gemma3_text config.json is read as Gemma3TextConfig fills it: a num_key_value_heads left out is 4 (not one
    per head, the Llama family's rule), and so for every size docscore reads; a null one, which transformers' strict
    config refuses, is refused."""
    import transformers

    sizes = {**{k: v for k, v in GEMMA3_4X.items() if k != "num_key_value_heads"}, "num_attention_heads": 8}
    ours = config_from_hf(sizes)
    theirs = transformers.Gemma3TextConfig(**{k: v for k, v in sizes.items() if k != "model_type"})
    assert (ours.num_heads, ours.kv_heads) == (theirs.num_attention_heads, theirs.num_key_value_heads) == (8, 4)
    theirs = transformers.Gemma3TextConfig()
    ours = config_from_hf({"model_type": "gemma3_text"})
    assert (ours.vocab_size, ours.hidden_size, ours.intermediate_size, ours.num_layers, ours.num_heads, ours.kv_heads,
            ours.head_dim, ours.max_positions, ours.layer_norm_eps) == (
        theirs.vocab_size, theirs.hidden_size, theirs.intermediate_size, theirs.num_hidden_layers,
        theirs.num_attention_heads, theirs.num_key_value_heads, theirs.head_dim, theirs.max_position_embeddings,
        theirs.rms_norm_eps)
    assert ours.sliding_layers == tuple(i for i, kind in enumerate(theirs.layer_types) if kind == "sliding_attention")
    with pytest.raises(Exception, match="num_key_value_heads"):
        transformers.Gemma3TextConfig(num_key_value_heads=None)
    with pytest.raises(models.ModelLoadError, match="num_key_value_heads is null"):
        config_from_hf({**GEMMA3_4X, "num_key_value_heads": None})


def test_gemma3s_image_soft_token_past_the_text_models_table_is_dropped_not_refused(tmp_path, capsys):
    """Every Gemma 3 tokenizer holds the added special <image_soft_token> at id 262,144, one past the text models'
    embedding table (gemma-3-1b, gemma-3-270m, EmbeddingGemma: vocab_size 262,144): convert drops it rather than
    refusing the model, so a text spelling it out is tokenised as text, never an id without a row; a token past the
    table that is not such a control token is still refused."""
    from tokenizers import AddedToken, Tokenizer

    src = build_hf(tmp_path / "hf", "gemma3")
    vocab = json.loads((src / "config.json").read_text())["vocab_size"]
    tokenizer = Tokenizer.from_file(str(src / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken("<image_soft_token>", special=True)])
    tokenizer.save(str(src / "tokenizer.json"))
    assert tokenizer.token_to_id("<image_soft_token>") == vocab
    code, message = convert(src, tmp_path / "model", capsys)
    assert code == 0, message
    assert "note: the tokenizer's special token <image_soft_token> was left out: past the model's embedding" in message
    loaded = models.load(str(tmp_path / "model"), attention="native")
    ids = loaded.tokenizer.encode_windows(["an <image_soft_token> here"])[0].windows[0]
    assert ids.max() < vocab and len(ids) > 4
    np.testing.assert_allclose(loaded.token_logprobs(*padded(documents(vocab)))[0],
                               transformers_logprobs(src, *padded(documents(vocab)))[0], atol=1e-4)

    tokenizer.add_tokens([AddedToken("<not_special>", special=False)])
    tokenizer.save(str(src / "tokenizer.json"))
    code, message = convert(src, tmp_path / "refused", capsys)
    assert code == 2 and f"it emits ids up to {vocab + 1} but" in message, message


PHI3_MINI_4K = {  # Phi-3-mini-4k-instruct's config.json (its sizes cut down): a 2047-token window on every layer
    "model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "vocab_size": 320, "hidden_size": 64,
    "intermediate_size": 112, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
    "max_position_embeddings": 4096, "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
    "rope_theta": 10_000.0, "rope_scaling": None, "sliding_window": 2047, "attention_bias": False, "hidden_act": "silu",
    "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0, "pad_token_id": 2, "bos_token_id": 1,
    "eos_token_id": 2, "tie_word_embeddings": False}
PHI4 = {**PHI3_MINI_4K, "num_key_value_heads": 2, "max_position_embeddings": 16384,  # phi-4's: no window, its own theta
        "original_max_position_embeddings": 16384, "rope_theta": 250_000.0, "sliding_window": None}
LONGROPE = {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [4.0] * 8}  # Phi-3.5-mini's, 8 pairs a head


def test_phi3_configs_read_as_transformers_reads_them():
    """Phi-3-mini-4k's and Phi-4's config.json read as transformers 5's Phi3Config and Phi3ForCausalLM read them (the
    window on every layer, kv heads, norm eps, theta; a key left out is Phi3Config's default: no window, eps 1e-5;
    attention_bias, which Phi-3 has no place for, ignored); Phi-3.5-mini's longrope (and yarn, which Phi3Config reads
    as longrope) gives Phi3RotaryEmbedding's frequencies, long ones and attention scaling, its original context the
    top-level original_max_position_embeddings (Phi3Config's 4096 when left out) whatever the rope settings say;
    Phi-4-mini's partial_rotary_factor 0.75 turns a head's first 12 of 16 dimensions, by Phi3RotaryEmbedding's
    frequencies, its factor lists one per turned pair; the rotary settings docscore does not compute are refused naming
    their key: factor lists of the wrong length (as Phi3Config refuses them), the types Phi3Config itself refuses, and
    su, which Phi3Config renames longrope but then fails to validate."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    def theirs(hf):  # a copy: Phi3Config writes its defaults into the rope settings it is given
        return transformers.Phi3Config(**{k: v for k, v in json.loads(json.dumps(hf)).items() if k != "model_type"})

    left_out = {k: v for k, v in PHI3_MINI_4K.items() if k not in ("sliding_window", "rms_norm_eps")}
    biased = {**PHI3_MINI_4K, "attention_bias": True}
    for hf, window in ((PHI3_MINI_4K, 2047), (PHI4, 0), (left_out, 0), (biased, 2047)):
        ours, reference = config_from_hf(hf), theirs(hf)
        assert (ours.sliding_window, ours.kv_heads, ours.layer_norm_eps, ours.rope.theta) == (
            reference.sliding_window or 0, reference.num_key_value_heads, reference.rms_norm_eps,
            reference.rope_parameters["rope_theta"]), hf
        assert ours.sliding_window == window and ours.sliding_layers == (tuple(range(4)) if window else ())
        assert ours.rope.kind == "default" and not (ours.qkv_bias or ours.output_bias or ours.mlp_bias)
    assert config_from_hf(PHI3_MINI_4K).default_seq_len == 2047 and config_from_hf(PHI4).default_seq_len == 16384
    phi35_mini = {**PHI3_MINI_4K, "max_position_embeddings": 131072, "sliding_window": 262144, "rope_scaling": LONGROPE}
    no_top_level = {k: v for k, v in phi35_mini.items() if k != "original_max_position_embeddings"}
    for hf in (phi35_mini, {**phi35_mini, "rope_scaling": {**LONGROPE, "type": "yarn"}},
               {**no_top_level, "rope_scaling": {**LONGROPE, "original_max_position_embeddings": 2048}}):
        ours, reference = config_from_hf(hf), theirs(hf)
        rotary = Phi3RotaryEmbedding(reference)
        long, _ = ROPE_INIT_FUNCTIONS["longrope"](reference, seq_len=4097)
        assert ours.rope.kind == "longrope" and ours.rope.original_max_positions == 4096 == \
            reference.rope_parameters["original_max_position_embeddings"]
        assert ours.rope.attention_factor == rotary.attention_scaling == math.sqrt(1 + math.log(32) / math.log(4096))
        np.testing.assert_array_equal(rope_frequencies(ours.rope, ours.head_dim), rotary.inv_freq.numpy())
        np.testing.assert_array_equal(rope_frequencies(ours.rope, ours.head_dim, long=True), long.numpy())
    phi4_mini = {**PHI4, "tie_word_embeddings": True, "partial_rotary_factor": 0.75, "max_position_embeddings": 131072,
                 "original_max_position_embeddings": 4096,
                 "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 6, "long_factor": [4.0] * 6}}
    ours, reference = config_from_hf(phi4_mini), theirs(phi4_mini)
    rotary, (long, _) = Phi3RotaryEmbedding(reference), ROPE_INIT_FUNCTIONS["longrope"](reference, seq_len=4097)
    assert (ours.rope.kind, ours.rope.rotary_dim, ours.tie_word_embeddings) == ("longrope", 12, True)
    assert ours.rope.attention_factor == rotary.attention_scaling
    np.testing.assert_array_equal(rope_frequencies(ours.rope, ours.head_dim), rotary.inv_freq.numpy())
    np.testing.assert_array_equal(rope_frequencies(ours.rope, ours.head_dim, long=True), long.numpy())
    short = {**LONGROPE, "long_factor": [4.0] * 7}
    for change, says in ((phi4_mini | {"rope_scaling": LONGROPE},
                          "rope_scaling.short_factor has 8 entries; rope_type 'longrope' needs int(head_dim 16 * "
                          "partial_rotary_factor) / 2 = 6"),
                         ({"rope_scaling": short}, "rope_scaling.long_factor has 7 entries; rope_type 'longrope' "
                                                   "needs head_dim / 2 = 8"),
                         ({"rope_scaling": {"type": "longrope", "long_factor": [4.0] * 8}},
                          "rope_scaling of rope_type 'longrope' lacks 'short_factor'"),
                         ({"rope_scaling": {**LONGROPE, "type": "su"}}, 'rope_scaling.type "su" is not supported'),
                         ({"rope_scaling": {"type": "linear", "factor": 2.0}},
                          "rope_type 'linear' is not supported for phi3; transformers' Phi3Config takes"),
                         ({"layer_types": ["sliding_attention", "full_attention"] * 2},
                          "Phi3ForCausalLM ignores layer_types")):
        with pytest.raises(models.ModelLoadError, match=re.escape(says)):
            config_from_hf({**PHI3_MINI_4K, **change})
    with pytest.raises(Exception, match="must be one of"):  # transformers refuses the rope types Phi-3 has not
        theirs({**PHI3_MINI_4K, "rope_scaling": {"type": "linear", "factor": 2.0}})
    with pytest.raises(Exception, match="long_factor field must have length 8"):  # and factor lists that do not fit
        theirs({**PHI3_MINI_4K, "rope_scaling": short})
    with pytest.raises(Exception, match="short_factor field must have length 6"):  # the turned pairs' number
        theirs(phi4_mini | {"rope_scaling": LONGROPE})
    with pytest.raises(KeyError, match="original_max_position_embeddings"):  # and su, once renamed
        theirs({**phi35_mini, "rope_scaling": {**LONGROPE, "type": "su"}})


def test_phi3_fused_tensors_that_do_not_fit_are_refused(tmp_path, capsys):
    """A qkv_proj whose rows are not config.json's q + 2 kv heads is refused naming the fused tensor (split as it
    was, its shortfall would surface as a wrong v_proj the checkpoint does not hold); a checkpoint holding a q_proj
    beside its qkv_proj is refused, not read with one of them silently dropped."""
    src = build_hf(tmp_path / "hf", "phi3", num_hidden_layers=1)
    tensors = load_file(src / "model.safetensors")
    qkv = tensors["model.layers.0.self_attn.qkv_proj.weight"]
    for name, changed, says in (
            ("short", {"model.layers.0.self_attn.qkv_proj.weight": qkv[:-16]},
             "'model.layers.0.self_attn.qkv_proj.weight' has shape [112, 64], but config.json's sizes make it "
             "128 rows"),
            ("both", {"model.layers.0.self_attn.q_proj.weight": qkv[:64]},
             "holds both 'model.layers.0.self_attn.qkv_proj.weight' and 'model.layers.0.self_attn.q_proj.weight'")):
        save_file({**tensors, **changed}, src / "model.safetensors")
        code, message = convert(src, tmp_path / name, capsys)
        assert code == 2 and says in message, message


def olmo_qk_norm_per_head(reference) -> None:
    """OLMo's q_norm and k_norm as Qwen3's: each head normalised alone (by its own slice of the same weights)."""
    import torch

    class PerHead(torch.nn.Module):
        def __init__(self, norm: torch.nn.Module, head_dim: int):
            super().__init__()
            self.norm, self.head_dim = norm, head_dim

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            heads = x.reshape(*x.shape[:-1], -1, self.head_dim)
            normed = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + self.norm.variance_epsilon)
            return normed.reshape(x.shape) * self.norm.weight

    for layer in reference.model.layers:
        attention = layer.self_attn
        attention.q_norm = PerHead(attention.q_norm, attention.head_dim)
        attention.k_norm = PerHead(attention.k_norm, attention.head_dim)


def without_window(reference) -> None:
    """Every layer attending to its whole text: a window longer than any row, the layers' flash argument unset."""
    reference.config.sliding_window = 10_000
    for layer in reference.model.layers:
        layer.self_attn.sliding_window = None


def identity(module, *names: str) -> None:
    import torch

    for name in names:
        setattr(module, name, torch.nn.Identity())


# What each family's switches are, as transformers' own model with each one undone in turn (set by hand on the loaded
# reference): a docscore without that switch would compute the undone model.
SWITCHES_UNDONE = {
    "olmo2": {
        "no norms after the attention and the MLP": lambda m: [identity(layer, "post_attention_layernorm",
                                                                        "post_feedforward_layernorm")
                                                               for layer in m.model.layers],
        "no q/k norms": lambda m: [identity(layer.self_attn, "q_norm", "k_norm") for layer in m.model.layers],
        "q/k norms per head": olmo_qk_norm_per_head,
    },
    "olmo3": {
        "no window on the sliding layers": without_window,
        "the global layers' theta on the sliding ones": lambda m: m.model.rotary_emb.sliding_attention_inv_freq.copy_(
            m.model.rotary_emb.full_attention_inv_freq),
    },
    "granite": {
        "embedding_multiplier 1": lambda m: setattr(m.model, "embedding_multiplier", 1.0),
        "attention scale head_dim ** -0.5": lambda m: [setattr(layer.self_attn, "scaling", 16 ** -0.5)
                                                       for layer in m.model.layers],
        "residual_multiplier 1": lambda m: [setattr(layer, "residual_multiplier", 1.0) for layer in m.model.layers],
        "logits_scaling 1": lambda m: setattr(m.config, "logits_scaling", 1.0),
    },
    "smollm3": {
        "rotary positions on every layer": lambda m: [setattr(layer.self_attn, "use_rope", 1) for layer in m.model.layers],
        "no window on the NoPE layers": without_window,
    },
}


@pytest.mark.parametrize("converted", sorted(SWITCHES_UNDONE), indirect=True)
def test_each_switch_is_what_makes_the_scores_transformers(converted):
    """The parity above (test_token_logprobs_match_transformers_padded_and_packed, within 1e-4) holds for OLMo 2,
    OLMo 3, Granite and SmolLM3 because each of their switches is computed: transformers' own model with any one of
    them undone scores the same tokens more than 1e-2 apart, so a docscore without it would fail there."""
    import torch
    import transformers

    family, hf_dir, model_dir = converted
    ids, segments = padded(documents(300))
    real = segments[:, 1:] == 1
    expected = transformers_logprobs(hf_dir, ids, segments)[:, :-1]
    ours = models.load(str(model_dir), attention="native").token_logprobs(ids, segments)[:, :-1]
    assert np.abs(ours - expected)[real].max() <= 1e-4
    for undone, undo in SWITCHES_UNDONE[family].items():
        reference = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
        with torch.no_grad():
            undo(reference)
        moved = np.abs(reference_logprobs(reference, ids, segments) - expected)[real].max()
        assert moved > 1e-2, (family, undone, moved)


OLMO2_7B = {  # OLMo-2-1124-7B's config.json (sizes cut down)
    "model_type": "olmo2", "architectures": ["Olmo2ForCausalLM"], "vocab_size": 320, "hidden_size": 64,
    "intermediate_size": 112, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 500_000.0, "rope_scaling": None,
    "attention_bias": False, "hidden_act": "silu", "tie_word_embeddings": False, "pad_token_id": 2}


def assert_llama_sizes_as(ours, theirs) -> None:
    """docscore's ModelConfig has the sizes, norm eps and head tying of a transformers config."""
    assert (ours.vocab_size, ours.hidden_size, ours.intermediate_size, ours.num_layers, ours.num_heads, ours.kv_heads,
            ours.head_dim, ours.max_positions, ours.layer_norm_eps, ours.tie_word_embeddings) == (
        theirs.vocab_size, theirs.hidden_size, theirs.intermediate_size, theirs.num_hidden_layers,
        theirs.num_attention_heads, theirs.num_key_value_heads, theirs.hidden_size // theirs.num_attention_heads,
        theirs.max_position_embeddings, theirs.rms_norm_eps, theirs.tie_word_embeddings)


def test_olmo2_configs_read_as_transformers_reads_them():
    """An olmo2 config.json gives what Olmo2Config builds from it (its defaults for keys left out: one kv head per
    head, eps 1e-5, theta 10,000), norms after the attention and the MLP only, q/k norms over all heads; what docscore
    does not compute is refused by key."""
    import transformers

    for hf in (OLMO2_7B, {"model_type": "olmo2"}):
        ours, theirs = config_from_hf(hf), transformers.Olmo2Config(**{k: v for k, v in hf.items() if k != "model_type"})
        assert_llama_sizes_as(ours, theirs)
        assert ours.rope == Rope(theirs.rope_parameters["rope_theta"])
        assert ours.post_norms and not ours.pre_norms and ours.qk_norm and ours.qk_norm_across_heads
        assert not (ours.qkv_bias or ours.mlp_bias or ours.sliding_window)
    assert config_from_hf({**OLMO2_7B, "attention_bias": True, "mlp_bias": True}).output_bias
    assert not config_from_hf({**OLMO2_7B, "mlp_bias": True}).mlp_bias  # Olmo2MLP has no bias whatever it says
    for change, says in (({"rope_scaling": {"rope_type": "dynamic", "factor": 8.0}}, 'rope_scaling.rope_type "dynamic" is not'),
                         ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported for olmo2")):
        with pytest.raises(models.ModelLoadError, match=re.escape(says)):
            config_from_hf({**OLMO2_7B, **change})


OLMO3_7B = {  # Olmo-3-1025-7B's config.json (sizes cut down): three local layers in four, yarn on the global ones
    **OLMO2_7B, "model_type": "olmo3", "architectures": ["Olmo3ForCausalLM"], "num_hidden_layers": 8,
    "max_position_embeddings": 65536, "sliding_window": 4096,
    "layer_types": (["sliding_attention"] * 3 + ["full_attention"]) * 2,
    "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "attention_factor": 1.2079441541679836, "original_max_position_embeddings": 8192}}


def test_olmo3_configs_read_as_transformers_reads_them():
    """An olmo3 config.json gives what Olmo3Config builds from it: its defaults for keys left out (OLMo 2's, one
    global layer in four, window 4096, theta 500,000 for each layer type), Olmo-3-7B's layers and each layer type's
    theta, and its released yarn on the global layers: Olmo3RotaryEmbedding's frequencies and attention scaling (a
    truncate it says false ignored, as transformers reads truncate beside the layer types); what docscore does not
    compute is refused by key: a dynamic rope, and a rope_theta transformers 5 reads for the global layers only."""
    import transformers
    from transformers.models.olmo3.modeling_olmo3 import Olmo3RotaryEmbedding

    ours, theirs = config_from_hf({"model_type": "olmo3"}), transformers.Olmo3Config()
    assert_llama_sizes_as(ours, theirs)
    assert ours.post_norms and not ours.pre_norms and ours.qk_norm and ours.qk_norm_across_heads
    assert ours.sliding_layers == tuple(i for i, kind in enumerate(theirs.layer_types) if kind == "sliding_attention")
    assert (ours.sliding_window, ours.rope, ours.local_rope) == (theirs.sliding_window, Rope(500_000.0), Rope(500_000.0))
    no_yarn = {k: v for k, v in OLMO3_7B.items() if k != "rope_scaling"}
    ours, theirs = config_from_hf(no_yarn), transformers.Olmo3Config(**no_yarn)
    assert_llama_sizes_as(ours, theirs)
    assert ours.sliding_layers == (0, 1, 2, 4, 5, 6) and ours.default_seq_len == 65536  # the global layers see it all
    per_type = {"full_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1_000.0}}
    for rope in ({"rope_parameters": per_type}, {"rope_theta": 10_000.0, "layer_types": ["full_attention"] * 8}):
        hf = {**no_yarn, **rope}
        ours, theirs = config_from_hf(hf), transformers.Olmo3Config(**hf).rope_parameters
        assert ours.rope == Rope(theirs["full_attention"]["rope_theta"]), rope
        assert ours.local_rope == Rope(theirs["sliding_attention"]["rope_theta"]), rope
    # transformers 5 reads a rope_theta for the global layers only and gives the local ones its 500,000
    assert transformers.Olmo3Config(**{**no_yarn, "rope_theta": 10_000.0}).rope_parameters["sliding_attention"][
        "rope_theta"] == 500_000.0
    for hf in (OLMO3_7B, {**OLMO3_7B, "rope_scaling": {**OLMO3_7B["rope_scaling"], "truncate": False}}):
        ours, rotary = config_from_hf(hf), Olmo3RotaryEmbedding(transformers.Olmo3Config(**json.loads(json.dumps(hf))))
        assert ours.rope == Rope(500_000.0, "yarn", 8.0, original_max_positions=8192,
                                 attention_factor=1.2079441541679836, beta_fast=32.0, beta_slow=1.0, truncate=True)
        assert ours.local_rope == Rope(500_000.0)
        assert ours.rope.attention_factor == rotary.full_attention_attention_scaling
        assert rotary.sliding_attention_attention_scaling == 1.0
        np.testing.assert_array_equal(rope_frequencies(ours.rope, ours.head_dim), rotary.full_attention_inv_freq.numpy())
        np.testing.assert_array_equal(rope_frequencies(ours.local_rope, ours.head_dim),
                                      rotary.sliding_attention_inv_freq.numpy())
    for hf, says in (({**no_yarn, "rope_scaling": {"rope_type": "dynamic", "factor": 8.0}},
                      'full_attention layers: rope_scaling.rope_type "dynamic" is not supported'),
                     ({**no_yarn, "rope_theta": 10_000.0}, "rope_theta 10000.0 is not supported for olmo3: "
                                                           "transformers 5 rotates only the full_attention layers"),
                     ({**no_yarn, "sliding_window": None}, "sliding_window is null; it must be a whole number >= 1"),
                     ({**no_yarn, "rope_parameters": {"rope_type": "default"}}, "OLMo 3's are per layer type")):
        with pytest.raises(models.ModelLoadError, match=re.escape(says)):
            config_from_hf(hf)


GRANITE_3_8B = {  # granite-3.3-8b-base's config.json (sizes cut down): its four multipliers
    "model_type": "granite", "architectures": ["GraniteForCausalLM"], "vocab_size": 320, "hidden_size": 64,
    "intermediate_size": 112, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 10_000_000.0, "rope_scaling": None,
    "embedding_multiplier": 12.0, "attention_multiplier": 0.0078125, "residual_multiplier": 0.22,
    "logits_scaling": 16.0, "attention_bias": False, "mlp_bias": False, "hidden_act": "silu",
    "tie_word_embeddings": True}


def test_granite_configs_read_as_transformers_reads_them():
    """A granite config.json gives GraniteConfig's multipliers (each 1.0 when left out) and sizes (its defaults
    for keys left out); a multiplier that is no positive, finite number is refused naming its key."""
    import transformers

    for hf in (GRANITE_3_8B, {"model_type": "granite"}):
        ours, theirs = config_from_hf(hf), transformers.GraniteConfig(**{k: v for k, v in hf.items() if k != "model_type"})
        assert_llama_sizes_as(ours, theirs)
        assert (ours.embed_scale, ours.attention_multiplier, ours.residual_multiplier, ours.logits_divisor) == (
            theirs.embedding_multiplier, theirs.attention_multiplier, theirs.residual_multiplier, theirs.logits_scaling)
        assert ours.rope == Rope(theirs.rope_parameters["rope_theta"])
    for change, says in (({"logits_scaling": 0}, "logits_scaling is 0; it must be a positive, finite number"),
                         ({"attention_multiplier": None}, "attention_multiplier is null; it must be a positive"),
                         ({"residual_multiplier": "abc"}, 'residual_multiplier is "abc"; it must be a positive'),
                         ({"embedding_multiplier": True}, "embedding_multiplier is true; it must be a positive")):
        with pytest.raises(models.ModelLoadError, match=re.escape(says)):
            config_from_hf({**GRANITE_3_8B, **change})


SMOLLM3_3B = {  # SmolLM3-3B's config.json (sizes cut down): every fourth layer without rotary positions, no window
    "model_type": "smollm3", "architectures": ["SmolLM3ForCausalLM"], "vocab_size": 320, "hidden_size": 64,
    "intermediate_size": 112, "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 65536, "rms_norm_eps": 1e-6, "rope_theta": 5_000_000.0, "rope_scaling": None,
    "no_rope_layers": [1, 1, 1, 0] * 2, "no_rope_layer_interval": 4, "use_sliding_window": False,
    "sliding_window": None, "max_window_layers": 28, "pretraining_tp": 2, "attention_bias": False, "mlp_bias": False,
    "hidden_act": "silu", "tie_word_embeddings": True, "pad_token_id": 2}


def test_smollm3_configs_read_as_transformers_reads_them():
    """A smollm3 config.json gives the NoPE and local layers SmolLM3Config and SmolLM3ForCausalLM build from it:
    no_rope_layers as written (1 rotates), else from no_rope_layer_interval; windows only with use_sliding_window,
    on the NoPE layers unless layer_types says; its defaults for keys left out (4 kv heads, a tied head, theta
    2,000,000); pretraining_tp, which SmolLM3-3B sets to 2 and transformers' SmolLM3 never reads, is not refused.
    What transformers could not run, or would run two ways, is refused by key."""
    import transformers

    def theirs(hf):
        return transformers.SmolLM3Config(**{k: v for k, v in hf.items() if k != "model_type"})

    def unturned(config) -> tuple[int, ...]:
        return tuple(i for i, rotates in enumerate(config.no_rope_layers) if not rotates)

    def sliding(config) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(config.layer_types) if kind == "sliding_attention")

    interval = {k: v for k, v in SMOLLM3_3B.items() if k != "no_rope_layers"}
    for hf in (SMOLLM3_3B, {**interval, "no_rope_layer_interval": 3}, {"model_type": "smollm3"},
               {**SMOLLM3_3B, "use_sliding_window": True, "sliding_window": 64},
               {**SMOLLM3_3B, "use_sliding_window": True, "sliding_window": 64, "layer_types": ["sliding_attention"] * 8}):
        ours, reference = config_from_hf(hf), theirs(hf)
        assert_llama_sizes_as(ours, reference)
        assert ours.nope_layers == unturned(reference) and ours.sliding_layers == sliding(reference), hf
        assert ours.sliding_window == (reference.sliding_window if ours.sliding_layers else 0)
        assert ours.rope == Rope(reference.rope_parameters["rope_theta"])
    assert config_from_hf(SMOLLM3_3B).nope_layers == (3, 7) and config_from_hf({"model_type": "smollm3"}).kv_heads == 4
    for change, says in (({"no_rope_layers": [1, 0]}, "no_rope_layers has 2 entries for num_hidden_layers 8"),
                         ({"no_rope_layers": [1, 1, 1, 2] * 2}, "no_rope_layers holds 2; each layer's entry must be 0"),
                         ({"no_rope_layers": None, "no_rope_layer_interval": 0}, "no_rope_layer_interval is 0"),
                         ({"layer_types": ["full_attention", "sliding_attention"] * 4, "sliding_window": 64},
                          "layer_types marks layers [1, 3, 5, 7] sliding_attention, but use_sliding_window is false"),
                         ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
                          'rope_scaling.rope_type "dynamic" is not supported')):
        with pytest.raises(models.ModelLoadError, match=re.escape(says)):
            config_from_hf({**SMOLLM3_3B, **change})
