"""Rotary BERT encoder (Flax NNX) for NomicBertModel (nomic-embed-text-v1, v1.5) and GteModel (Alibaba's "new"
architecture: gte-multilingual-base, gte-base-en-v1.5's blocks, snowflake-arctic-embed-m-v2.0) checkpoints: word
embedding plus token type 0, LayerNorm; BERT's post-norm blocks (attention with rotary positions on whole heads ->
add & norm -> gated MLP -> add & norm), no final norm. What differs between the two is config: GTE's q/k/v/o and
MLP down projection have biases (ModelConfig.qkv_bias, output_bias, mlp_output_bias), NomicBERT's none; the
activation (SiLU, GELU).

Must not pool, tokenize or pick a kernel: the attention name comes in through the constructor, and the kernel
sees the contract's plain q/k/v (no bias, both ways, scale head_dim^-1/2). Rotary positions restart in every packed
segment (transformers numbers a padded row's tokens from 0), so a document packed into a row is computed as alone.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models.config import ModelConfig
from models.layers import COMPUTE_DTYPES, embedding_dense, layer_norm, run_blocks
from models.llama import GatedFeedForward, GroupedQueryAttention


class RotaryBertEmbeddings(nnx.Module):
    """word + token-type-0 embeddings (none without token types: GTE's type_vocab_size 0), then LayerNorm."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        self.word = nnx.Embed(config.vocab_size, config.hidden_size, rngs=rngs)
        self.token_type = nnx.Embed(config.type_vocab_size, config.hidden_size, rngs=rngs) if config.type_vocab_size else None
        self.norm = layer_norm(config.hidden_size, config.layer_norm_eps, rngs)

    def __call__(self, input_ids: jax.Array) -> jax.Array:
        x = self.word(input_ids)
        if self.token_type is not None:  # one text per segment, so every token has token type 0
            x = x + self.token_type.embedding[0]
        return self.norm(x)


class RotaryBertLayer(nnx.Module):
    """One post-norm block: norm(x + attn(x)), then norm(x + mlp(x))."""

    def __init__(self, config: ModelConfig, *, attention_impl: str, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.attention = GroupedQueryAttention(config, attention_impl=attention_impl, dtype=dtype, rngs=rngs,
                                               causal=False)
        self.attention_norm = layer_norm(config.hidden_size, config.layer_norm_eps, rngs)
        self.feed_forward = GatedFeedForward(config.hidden_size, config.intermediate_size, bias=config.mlp_bias,
                                             output_bias=config.mlp_output_bias, dtype=dtype, rngs=rngs,
                                             activation=config.activation)
        self.output_norm = layer_norm(config.hidden_size, config.layer_norm_eps, rngs)

    def __call__(self, x: jax.Array, segment_ids: jax.Array) -> jax.Array:
        x = self.attention_norm(x + self.attention(x, segment_ids))
        return self.output_norm(x + self.feed_forward(x))


class RotaryBertEncoder(nnx.Module):
    """input ids [B, L] + segment ids [B, L] (0 = padding) -> final hidden states [B, L, D] float32."""

    def __init__(self, config: ModelConfig, *, attention_impl: str, dtype: str = "float32", rngs: nnx.Rngs):
        compute = COMPUTE_DTYPES[dtype]
        self.embeddings = RotaryBertEmbeddings(config, rngs)
        self.layers = nnx.List([RotaryBertLayer(config, attention_impl=attention_impl, dtype=compute, rngs=rngs)
                                for _ in range(config.num_layers)])
        self.dense = embedding_dense(config, rngs)  # a sentence-transformers model's Dense modules after pooling

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array) -> jax.Array:
        return run_blocks(self.layers, self.embeddings(input_ids), segment_ids)

    def final_hidden(self, input_ids: jax.Array, segment_ids: jax.Array) -> jax.Array:
        """The hidden states an embedding pools, as every family names them (a decoder's precede its logits)."""
        return self(input_ids, segment_ids)
