"""ModernBERT encoder (Flax NNX) for ModernBertModel checkpoints (answerdotai/ModernBERT-base and the embedders
built on it): token embedding and LayerNorm, pre-norm blocks (no norm before layer 0's attention; attention with
rotary positions, global on every global_attn_every_n_layers-th layer and local elsewhere; a GeGLU MLP), a final
LayerNorm. Its LayerNorms have no bias unless the checkpoint's norm_bias.

Must not pool, tokenize or pick a kernel: the attention name comes in through the constructor. A local layer
passes its window to the kernels contract without causal (query i sees keys |i - j| < window); rotary positions
restart in every packed segment (transformers numbers a padded row's tokens from 0), so a document packed into a
row is computed as alone.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models.config import ModelConfig
from models.layers import COMPUTE_DTYPES, embedding_dense, layer_norm, run_blocks
from models.llama import GatedFeedForward, GroupedQueryAttention


class ModernBertEmbeddings(nnx.Module):
    """Token embedding, then LayerNorm (no positions: they are rotary, in every block)."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        self.word = nnx.Embed(config.vocab_size, config.hidden_size, rngs=rngs)
        self.norm = layer_norm(config.hidden_size, config.layer_norm_eps, rngs, bias=config.norm_bias)

    def __call__(self, input_ids: jax.Array) -> jax.Array:
        return self.norm(self.word(input_ids))


class ModernBertLayer(nnx.Module):
    """x + attn(norm(x)), then x + mlp(norm(x)); layer 0 has no attention norm (the embeddings' norm is its)."""

    def __init__(self, config: ModelConfig, layer: int, *, attention_impl: str, dtype: jnp.dtype, rngs: nnx.Rngs):
        norm = lambda: layer_norm(config.hidden_size, config.layer_norm_eps, rngs, bias=config.norm_bias)
        self.attention_norm = norm() if layer else None
        self.attention = GroupedQueryAttention(config, attention_impl=attention_impl, dtype=dtype, rngs=rngs,
                                               window=config.layer_window(layer), causal=False,
                                               rope=config.layer_rope(layer))
        self.feed_forward_norm = norm()
        self.feed_forward = GatedFeedForward(config.hidden_size, config.intermediate_size, bias=config.mlp_bias,
                                             dtype=dtype, rngs=rngs, activation=config.activation)

    def __call__(self, x: jax.Array, segment_ids: jax.Array) -> jax.Array:
        normed = x if self.attention_norm is None else self.attention_norm(x)
        x = x + self.attention(normed, segment_ids)
        return x + self.feed_forward(self.feed_forward_norm(x))


class ModernBertEncoder(nnx.Module):
    """input ids [B, L] + segment ids [B, L] (0 = padding) -> final hidden states [B, L, D] float32."""

    def __init__(self, config: ModelConfig, *, attention_impl: str, dtype: str = "float32", rngs: nnx.Rngs):
        compute = COMPUTE_DTYPES[dtype]
        self.embeddings = ModernBertEmbeddings(config, rngs)
        # layer 0 (no attention norm) and the local layers (their window and rotary theta) differ from the global
        # ones: stack_blocks runs layer 0 alone, then its local, local, global period as one scan (layers.block_runs)
        self.layers = nnx.List([ModernBertLayer(config, i, attention_impl=attention_impl, dtype=compute, rngs=rngs)
                                for i in range(config.num_layers)])
        self.final_norm = layer_norm(config.hidden_size, config.layer_norm_eps, rngs, bias=config.norm_bias)
        self.dense = embedding_dense(config, rngs)  # a sentence-transformers model's Dense modules after pooling

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array) -> jax.Array:
        return self.final_norm(run_blocks(self.layers, self.embeddings(input_ids), segment_ids))

    def final_hidden(self, input_ids: jax.Array, segment_ids: jax.Array) -> jax.Array:
        """The hidden states an embedding pools, as every family names them (a decoder's precede its logits)."""
        return self(input_ids, segment_ids)
