"""Long documents for decoders: a Llama-family loglik call at 8k-32k tokens through the flash kernel
(blockwise on CPU) needs memory linear in length, where native attention's [L, L] scores grow as its
square. Measured on the programs XLA compiles for a row of that length (no weights, nothing run)."""
from __future__ import annotations

import jax
import pytest

from models.config import config_from_hf
from tests.test_batch_memory import compiled_bytes

LLAMA_32K = {"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "max_position_embeddings": 32768, "rope_theta": 500_000.0}


@pytest.mark.integration
def test_flash_memory_grows_linearly_with_length_and_native_quadratically():
    if jax.default_backend() != "cpu":
        pytest.skip("XLA:CPU's buffer assignment")
    config = config_from_hf(LLAMA_32K)
    flash = {n: compiled_bytes(config, "blockwise", "float32", 1, n) for n in (8192, 16384, 32768)}
    assert 1.7 <= flash[16384] / flash[8192] <= 2.3, flash
    assert 1.7 <= flash[32768] / flash[16384] <= 2.3, flash
    native = {n: compiled_bytes(config, "xla", "float32", 1, n) for n in (4096, 8192)}
    assert native[8192] / native[4096] >= 3.0, native  # the scores, L x L per head
    assert native[8192] > 4 * flash[8192]
