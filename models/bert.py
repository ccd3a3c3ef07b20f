"""BERT-family encoder (Flax NNX) for BERT, RoBERTa, XLM-RoBERTa, CamemBERT, DistilBERT and MPNet checkpoints, laid
out like the paper's diagram: embeddings, post-norm blocks (attention -> add & norm -> feed-forward -> add & norm),
final hidden states. MPNet adds to every block's scores a relative position bias by key-query offset, looked up once
per call in the table its layers share and passed to the kernels contract (relative_bias).

Must not pool, tokenize or pick a kernel: the attention name comes in through the constructor.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models.config import MPNET_BUCKETS, MPNET_MAX_DISTANCE, ModelConfig
from models.layers import (COMPUTE_DTYPES, FeedForward, SelfAttention, embedding_dense, layer_norm, positions_in_segments,
                           relative_position_bias, run_blocks)


class BertEmbeddings(nnx.Module):
    """word + position + token-type embeddings, then LayerNorm."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        self.word = nnx.Embed(config.vocab_size, config.hidden_size, rngs=rngs)
        self.position = nnx.Embed(config.position_table, config.hidden_size, rngs=rngs)
        self.position_offset = config.position_offset  # RoBERTa: positions start after the padding id
        # DistilBERT has no token types
        self.token_type = nnx.Embed(config.type_vocab_size, config.hidden_size, rngs=rngs) if config.type_vocab_size else None
        self.norm = layer_norm(config.hidden_size, config.layer_norm_eps, rngs)

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array) -> jax.Array:
        # one text per segment, so every token has token type 0
        positions = positions_in_segments(segment_ids)
        if self.position_offset:  # as transformers numbers them: the padding id takes position pad and is not counted
            pad = self.position_offset - 1
            counted = positions_in_segments(segment_ids, counted=input_ids != pad) + self.position_offset
            positions = jnp.where(input_ids == pad, pad, counted)
        x = self.word(input_ids) + self.position(positions)
        if self.token_type is not None:
            x = x + self.token_type.embedding[0]
        return self.norm(x)


class BertLayer(nnx.Module):
    """One post-norm transformer block."""

    def __init__(self, config: ModelConfig, *, attention_impl: str, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.attention = SelfAttention(config.hidden_size, config.num_heads, attention_impl=attention_impl,
                                       causal=False, scale=config.head_dim ** -0.5, dtype=dtype, rngs=rngs)
        self.attention_norm = layer_norm(config.hidden_size, config.layer_norm_eps, rngs)
        self.feed_forward = FeedForward(config.hidden_size, config.intermediate_size,
                                        activation=config.activation, dtype=dtype, rngs=rngs)
        self.output_norm = layer_norm(config.hidden_size, config.layer_norm_eps, rngs)

    def __call__(self, x: jax.Array, segment_ids: jax.Array, relative_bias: jax.Array | None = None) -> jax.Array:
        x = self.attention_norm(x + self.attention(x, segment_ids, relative_bias))
        return self.output_norm(x + self.feed_forward(x))


class BertEncoder(nnx.Module):
    """input ids [B, L] + segment ids [B, L] (0 = padding) -> final hidden states [B, L, D] float32."""

    def __init__(self, config: ModelConfig, *, attention_impl: str, dtype: str = "float32", rngs: nnx.Rngs):
        compute = COMPUTE_DTYPES[dtype]
        self.embeddings = BertEmbeddings(config, rngs)
        self.layers = nnx.List([BertLayer(config, attention_impl=attention_impl, dtype=compute, rngs=rngs)
                                for _ in range(config.num_layers)])
        # MPNet: one [buckets, heads] table for every layer (transformers' encoder.relative_attention_bias)
        buckets = config.relative_attention_buckets
        self.relative_attention_bias = nnx.Embed(buckets, config.num_heads, rngs=rngs) if buckets else None
        self.dense = embedding_dense(config, rngs)  # a sentence-transformers model's Dense modules after pooling

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array) -> jax.Array:
        x = self.embeddings(input_ids, segment_ids)
        if self.relative_attention_bias is None:
            return run_blocks(self.layers, x, segment_ids)
        # offsets of row indices: within a packed segment the same as in the document's own unpadded row
        bias = relative_position_bias(self.relative_attention_bias.embedding[...], input_ids.shape[1], MPNET_BUCKETS,
                                      MPNET_MAX_DISTANCE)
        return run_blocks(self.layers, x, segment_ids, relative_bias=bias)

    def final_hidden(self, input_ids: jax.Array, segment_ids: jax.Array) -> jax.Array:
        """The hidden states an embedding pools, as every family names them (a decoder's precede its logits)."""
        return self(input_ids, segment_ids)
