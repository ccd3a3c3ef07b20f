"""GPT-2-family decoder (Flax NNX), laid out like the paper's diagram: token + position embeddings,
pre-norm causal blocks, final norm, language-model head tied to the token embedding.

Must not tokenize, score or pick a kernel: the attention name comes in through the constructor.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models.config import ModelConfig
from models.layers import (COMPUTE_DTYPES, FeedForward, SelfAttention, embedding_dense, layer_norm,
                           positions_in_segments, run_blocks)


class GPT2Block(nnx.Module):
    """One pre-norm causal block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig, layer_index: int, *, attention_impl: str, dtype: jnp.dtype,
                 rngs: nnx.Rngs):
        scale = config.head_dim ** -0.5
        if config.scale_attn_by_inverse_layer_idx:
            scale /= layer_index + 1
        self.attention_norm = layer_norm(config.hidden_size, config.layer_norm_eps, rngs)
        self.attention = SelfAttention(config.hidden_size, config.num_heads, attention_impl=attention_impl,
                                       causal=True, scale=scale, dtype=dtype, rngs=rngs)
        self.feed_forward_norm = layer_norm(config.hidden_size, config.layer_norm_eps, rngs)
        self.feed_forward = FeedForward(config.hidden_size, config.intermediate_size,
                                        activation=config.activation, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array, segment_ids: jax.Array) -> jax.Array:
        x = x + self.attention(self.attention_norm(x), segment_ids)
        return x + self.feed_forward(self.feed_forward_norm(x))


class GPT2Decoder(nnx.Module):
    """input ids [B, L] + segment ids [B, L] (0 = padding) -> next-token logits [B, L, V] float32
    (= logits(final_hidden(...)); the pipeline calls the two apart, models/heads.py next_token_logprobs)."""

    def __init__(self, config: ModelConfig, *, attention_impl: str, dtype: str = "float32", rngs: nnx.Rngs):
        self.compute_dtype = COMPUTE_DTYPES[dtype]
        self.token_embedding = nnx.Embed(config.vocab_size, config.hidden_size, rngs=rngs)
        self.position_embedding = nnx.Embed(config.position_table, config.hidden_size, rngs=rngs)
        self.layers = nnx.List([GPT2Block(config, i, attention_impl=attention_impl, dtype=self.compute_dtype,
                                          rngs=rngs) for i in range(config.num_layers)])
        self.final_norm = layer_norm(config.hidden_size, config.layer_norm_eps, rngs)
        self.dense = embedding_dense(config, rngs)  # a sentence-transformers model's Dense modules after pooling

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array) -> jax.Array:
        return self.logits(self.final_hidden(input_ids, segment_ids))

    def final_hidden(self, input_ids: jax.Array, segment_ids: jax.Array) -> jax.Array:
        x = self.token_embedding(input_ids) + self.position_embedding(positions_in_segments(segment_ids))
        return self.final_norm(run_blocks(self.layers, x, segment_ids))

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Logits over the vocabulary: hidden @ token_embedding^T (tied weights), float32 out."""
        table = self.token_embedding.embedding[...].astype(self.compute_dtype)
        return jnp.einsum("bld,vd->blv", hidden.astype(self.compute_dtype), table,
                          preferred_element_type=jnp.float32)
