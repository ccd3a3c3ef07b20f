"""Blocks of several structures stacked by their repeating runs (models/layers.py block_runs, stack_blocks): the
released layer patterns (Gemma 3's five local and one global layer, ModernBERT's layer 0 and then local, local,
global, a Qwen2 with max_window_layers) laid out as the fewest traced blocks, blocks of one structure as they always
were; a Gemma 3 and a ModernBERT built in transformers and converted give through the scanned periods what their
blocks give run one after another, and what transformers gives; stack_params and unstack_params turn the
checkpoint's per-block parameters into that layout and back, exactly."""
from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

import models
from models.architecture import abstract_model
from models.checkpoint import restore_params
from models.config import config_from_hf
from models.layers import Run, StackedBlocks, stack_params, stacked_abstract, stacked_runs, unstack_params
from models.model_dir import PARAMS
from pipeline.convert import main as convert_main
from tests.conftest import padded, transformers_logprobs

LOCAL, GLOBAL = "sliding_attention", "full_attention"
# gemma-3's text configs in few dimensions: 5 local layers then 1 global, repeating
GEMMA3 = {"model_type": "gemma3_text", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 112,
          "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 4096,
          "sliding_window": 512, "query_pre_attn_scalar": 256,
          "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
QWEN2 = {"model_type": "qwen2", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 10,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096}


def layout(hf: dict) -> list[Run] | None:
    """The runs the loaded model's blocks are laid out in (None: one per block), read off its abstract state."""
    config = config_from_hf(hf)
    _, state = stacked_abstract(*abstract_model(config, attention_impl="xla", dtype="float32"))
    runs = stacked_runs(nnx.to_pure_dict(state)["layers"])
    return runs and [run for run, _ in runs]


def test_released_layer_patterns_are_stacked_by_their_repeating_runs():
    from tests.test_models_modernbert import hub_config

    # gemma-3-1b (26 layers), gemma-3-4b (34) and EmbeddingGemma (24): the 6-layer period repeated, local ones after
    assert layout({**GEMMA3, "num_hidden_layers": 26}) == [Run(6, 4), Run(1, 2)]
    assert layout({**GEMMA3, "num_hidden_layers": 34}) == [Run(6, 5), Run(1, 4)]
    assert layout({**GEMMA3, "num_hidden_layers": 24, "use_bidirectional_attention": True}) == [Run(6, 4)]
    # ModernBERT base (22) and large (28): layer 0 (no attention norm) alone, then local, local, global repeated
    assert layout(hub_config()) == [Run(1, 1), Run(3, 7)]
    assert layout(hub_config(num_hidden_layers=28)) == [Run(1, 1), Run(3, 9)]
    # Qwen2 sliding from max_window_layers on: each kind one run; without a window every block alike: one run
    window = {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 4}
    assert layout({**QWEN2, **window}) == [Run(1, 4), Run(1, 6)]
    assert layout(QWEN2) == [Run(1, 10)]
    # ... in the layout such a model always had: layers/stacked/<the block's parameters>
    _, state = stacked_abstract(*abstract_model(config_from_hf(QWEN2), attention_impl="xla", dtype="float32"))
    layers = nnx.to_pure_dict(state)["layers"]
    assert list(layers) == ["stacked"] and layers["stacked"]["attention"]["query"]["kernel"].shape == (10, 64, 64)
    # no structure repeats in a row (local, global, local): the blocks stay a list, one by one
    assert layout({**GEMMA3, "num_hidden_layers": 3, "layer_types": [LOCAL, GLOBAL, LOCAL]}) is None


def blocks_one_by_one(loaded) -> nnx.Module:
    """The loaded model with its blocks as the checkpoint holds them (an nnx.List run one after another)."""
    graphdef, state = abstract_model(loaded.config, attention_impl=loaded.attention, dtype=loaded.dtype)
    nnx.replace_by_pure_dict(state, unstack_params(nnx.to_pure_dict(loaded._state)))
    return nnx.merge(graphdef, state)


def assert_round_trip(loaded, model_dir: Path) -> None:
    """stack_params of the checkpoint is the loaded layout and unstack_params of that the checkpoint, bit for bit."""
    checkpoint = restore_params(str(model_dir / PARAMS), nnx.to_pure_dict(abstract_model(
        loaded.config, attention_impl=loaded.attention, dtype=loaded.dtype)[1]))
    held = jax.tree.map(np.asarray, nnx.to_pure_dict(loaded._state))
    back = unstack_params(held)
    assert jax.tree.structure(back) == jax.tree.structure(checkpoint)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(checkpoint)))
    again = stack_params(back, held)
    assert jax.tree.structure(again) == jax.tree.structure(held)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(held)))


def scans(loaded, ids: np.ndarray, segments: np.ndarray) -> int:
    return str(jax.make_jaxpr(loaded.model)(ids, segments)).count("scan[")


@pytest.mark.integration
def test_gemma3s_periods_scanned_equal_its_blocks_one_by_one_and_transformers(tmp_path):
    """Local, local, global twice, then two local layers (Gemma 3's pattern in fewer layers): the period as one scan,
    the two leftovers as another, equal to the blocks run one after another and to transformers."""
    from tests.test_models_llama import build_hf, documents

    hf_dir = build_hf(tmp_path / "hf", "gemma3", num_hidden_layers=8, layer_types=[LOCAL, LOCAL, GLOBAL] * 2 + [LOCAL] * 2)
    assert convert_main(["--hf", str(hf_dir), "--out", str(tmp_path / "docscore")]) == 0
    loaded = models.load(str(tmp_path / "docscore"), attention="native")
    layers = nnx.to_pure_dict(loaded._state)["layers"]
    assert [type(entry) for entry in loaded.model.layers] == [StackedBlocks, StackedBlocks]
    assert layers[0]["stacked"][2]["attention"]["query"]["kernel"].shape == (2, 64, 128)  # the global one, twice
    assert layers[1]["stacked"]["attention"]["query"]["kernel"].shape == (2, 64, 128)
    ids, segments = padded(documents(loaded.config.vocab_size))
    assert scans(loaded, ids, segments) == 2

    stacked = np.asarray(loaded.model.final_hidden(ids, segments))
    one_by_one = np.asarray(blocks_one_by_one(loaded).final_hidden(ids, segments))
    assert np.abs(stacked).max() > 1.0
    np.testing.assert_allclose(stacked, one_by_one, atol=1e-5 * np.abs(one_by_one).max(), rtol=0)
    expected = transformers_logprobs(hf_dir, ids, segments)
    assert np.abs(loaded.token_logprobs(ids, segments) - expected).max() <= 1e-4
    assert_round_trip(loaded, tmp_path / "docscore")


@pytest.mark.integration
def test_modernberts_periods_scanned_equal_its_blocks_one_by_one_and_transformers(tmp_path):
    """Layer 0 (no attention norm) alone, then local, local, global twice as one scan, equal to the blocks run one
    after another and to transformers."""
    from tests.test_models_modernbert import build_hf, documents, transformers_hidden

    hf_dir = build_hf(tmp_path / "hf", "base", num_hidden_layers=7)  # global layers 0, 3 and 6
    assert convert_main(["--hf", str(hf_dir), "--out", str(tmp_path / "docscore"), "--max_seq_len", "320"]) == 0
    loaded = models.load(str(tmp_path / "docscore"), attention="native")
    layers = nnx.to_pure_dict(loaded._state)["layers"]
    assert [type(entry).__name__ for entry in loaded.model.layers] == ["ModernBertLayer", "StackedBlocks"]
    assert "attention_norm" not in layers[0] and layers[1]["stacked"][0]["attention_norm"]["scale"].shape == (2, 32)
    ids, segments = padded(documents(loaded.config.vocab_size))
    assert scans(loaded, ids, segments) == 1

    stacked = np.asarray(loaded.model(ids, segments))
    one_by_one = np.asarray(blocks_one_by_one(loaded)(ids, segments))
    real = segments > 0
    assert np.abs(stacked[real]).max() > 1.0
    np.testing.assert_allclose(stacked[real], one_by_one[real], atol=1e-5 * np.abs(one_by_one[real]).max(), rtol=0)
    expected = transformers_hidden(hf_dir, ids, segments, "eager")
    assert np.abs(stacked[real] - expected[real]).max() <= 1e-4
    assert_round_trip(loaded, tmp_path / "docscore")
