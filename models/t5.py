"""T5 encoder (Flax NNX) for T5EncoderModel checkpoints and the encoder of T5 and mT5 models (sentence-t5, GTR-T5):
token embedding (unscaled), pre-norm blocks (RMSNorm, then attention without biases or 1/sqrt(d) scaling plus a
relative position bias by key-query offset; RMSNorm, then a ReLU MLP or T5 v1.1's and mT5's gated-GELU one), a final
RMSNorm. transformers' layer 0 holds the bias table and hands the bias it computes to every later layer; here the
table is the encoder's own, looked up once per call and passed to every block as the kernels' relative_bias, so the
blocks are alike and run as one scan.

Must not pool, tokenize or pick a kernel: the attention name comes in through the constructor. Offsets are of row
indices, so a document packed into a row sees between its tokens the bias it would see alone (T5 has no other
positions).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models.config import ModelConfig
from models.layers import (COMPUTE_DTYPES, FeedForward, SelfAttention, embedding_dense, relative_position_bias,
                           run_blocks)
from models.llama import GatedFeedForward, RMSNorm


class T5Block(nnx.Module):
    """x + attn(norm(x)), then x + mlp(norm(x)). No projection has a bias; the attention's heads are d_kv wide and
    its kernel runs at scale 1 (T5 folds the scaling into its weights) with the relative bias; the MLP is T5's
    DenseReluDense, down(act(up(x))) (wi, wo), or the gated one."""

    def __init__(self, config: ModelConfig, *, attention_impl: str, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.attention_norm = RMSNorm(config.hidden_size, config.layer_norm_eps)
        self.attention = SelfAttention(config.hidden_size, config.num_heads, head_dim=config.head_dim, bias=False,
                                       attention_impl=attention_impl, causal=False, scale=1.0, dtype=dtype, rngs=rngs)
        self.feed_forward_norm = RMSNorm(config.hidden_size, config.layer_norm_eps)
        if config.gated_feed_forward:  # wi_0 is the gate (activated), wi_1 the up projection
            self.feed_forward = GatedFeedForward(config.hidden_size, config.intermediate_size, bias=False, dtype=dtype,
                                                 rngs=rngs, activation=config.activation)
        else:
            self.feed_forward = FeedForward(config.hidden_size, config.intermediate_size, bias=False,
                                            activation=config.activation, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array, segment_ids: jax.Array, relative_bias: jax.Array) -> jax.Array:
        x = x + self.attention(self.attention_norm(x), segment_ids, relative_bias)
        return x + self.feed_forward(self.feed_forward_norm(x))


class T5Encoder(nnx.Module):
    """input ids [B, L] + segment ids [B, L] (0 = padding) -> final hidden states [B, L, D] float32."""

    def __init__(self, config: ModelConfig, *, attention_impl: str, dtype: str = "float32", rngs: nnx.Rngs):
        compute = COMPUTE_DTYPES[dtype]
        self.token_embedding = nnx.Embed(config.vocab_size, config.hidden_size, rngs=rngs)
        # transformers' encoder.block.0.layer.0.SelfAttention.relative_attention_bias: [buckets, heads]
        self.relative_attention_bias = nnx.Embed(config.relative_attention_buckets, config.num_heads, rngs=rngs)
        self.buckets, self.max_distance = config.relative_attention_buckets, config.relative_attention_max_distance
        self.layers = nnx.List([T5Block(config, attention_impl=attention_impl, dtype=compute, rngs=rngs)
                                for _ in range(config.num_layers)])
        self.final_norm = RMSNorm(config.hidden_size, config.layer_norm_eps)
        self.dense = embedding_dense(config, rngs)  # a sentence-transformers model's Dense modules after pooling

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array) -> jax.Array:
        bias = relative_position_bias(self.relative_attention_bias.embedding[...], input_ids.shape[1], self.buckets,
                                      self.max_distance)
        x = run_blocks(self.layers, self.token_embedding(input_ids), segment_ids, relative_bias=bias)
        return self.final_norm(x)

    def final_hidden(self, input_ids: jax.Array, segment_ids: jax.Array) -> jax.Array:
        """The hidden states an embedding pools, as every family names them (a decoder's precede its logits)."""
        return self(input_ids, segment_ids)
