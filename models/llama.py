"""Llama-family decoder (Flax NNX) for LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
Phi3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, Olmo2ForCausalLM, Olmo3ForCausalLM, GraniteForCausalLM and
SmolLM3ForCausalLM checkpoints: token embedding (Gemma, Granite: scaled), pre-norm blocks (RMSNorm, grouped-query
causal attention with rotary positions (SmolLM3: not on every layer; Phi-3: on a head's first dimensions only where
partial_rotary_factor says so) and Qwen3's and Gemma 3's per-head q/k norms (OLMo 2's over all heads at once), Gemma
2's soft-capped scores, Granite's own attention scale, gated SiLU or GELU MLP; Gemma: norms after the attention and
MLP too; OLMo 2: only after them; Granite: their outputs scaled before they are added), final RMSNorm, and an output
head tied to the embedding or its own (Gemma 2: its logits soft-capped; Granite: divided).

Must not tokenize, score or pick a kernel: the attention name comes in through the constructor, and the
kernel sees only the contract's q/k/v, segment ids and causal flag. Rotary positions (models/rope.py) restart in every
packed segment (and longrope's factors follow each segment's own length), so a document packed into a row is computed
exactly as alone in its own row.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kernels import attention
from kernels.masking import soft_capped
from models.config import ModelConfig
from models.layers import ACTIVATIONS, COMPUTE_DTYPES, embedding_dense, linear, run_blocks
from models.rope import Rope, apply_rotary, rotary_tables


def dense(features_in: int, features_out: int, *, bias: bool, dtype: jnp.dtype, rngs: nnx.Rngs) -> nnx.Linear:
    """layers.linear with the bias a required choice (Llama's projections have none; Qwen2's q/k/v do)."""
    return linear(features_in, features_out, dtype, rngs, bias=bias)


class RMSNorm(nnx.Module):
    """x / rms(x) * scale, computed in float32 whatever the matmul dtype (as transformers' LlamaRMSNorm)."""

    def __init__(self, features: int, eps: float):
        self.scale = nnx.Param(jnp.ones((features,), jnp.float32))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32)
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps) * self.scale[...]


class GroupedQueryAttention(nnx.Module):
    """q/k/v projections (kv_heads <= heads), Qwen3's RMSNorm over each head of q and k (OLMo 2's over all of q's
    heads at once, and all of k's), rotary positions on q and k (SmolLM3's NoPE layers: none), the injected kernel
    (causal; ModernBERT's encoder not), output projection."""

    def __init__(self, config: ModelConfig, *, attention_impl: str, dtype: jnp.dtype, rngs: nnx.Rngs, window: int = 0,
                 causal: bool = True, rope: Rope | None = None, rotary: bool = True):
        hidden, heads, kv_heads, head_dim = config.hidden_size, config.num_heads, config.kv_heads, config.head_dim
        self.query = dense(hidden, heads * head_dim, bias=config.qkv_bias, dtype=dtype, rngs=rngs)
        self.key = dense(hidden, kv_heads * head_dim, bias=config.qkv_bias, dtype=dtype, rngs=rngs)
        self.value = dense(hidden, kv_heads * head_dim, bias=config.qkv_bias, dtype=dtype, rngs=rngs)
        self.output = dense(heads * head_dim, hidden, bias=config.output_bias, dtype=dtype, rngs=rngs)
        self.norm_across_heads = config.qk_norm_across_heads  # OLMo 2: one RMSNorm over the whole projection
        query_width, key_width = (heads * head_dim, kv_heads * head_dim) if self.norm_across_heads else (head_dim,) * 2
        self.query_norm = RMSNorm(query_width, config.layer_norm_eps) if config.qk_norm else None
        self.key_norm = RMSNorm(key_width, config.layer_norm_eps) if config.qk_norm else None
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.rope, self.dtype, self.attention_impl = rope or config.rope, dtype, attention_impl
        self.rotary = rotary  # False: a NoPE layer (SmolLM3), whose q and k carry no positions
        self.window = window  # 0: the whole segment; else Mistral/Qwen2's sliding window, ModernBERT's local one
        self.causal = causal
        # Granite's attention_multiplier is the scale itself; Gemma scales by its own scalar's -1/2 power
        self.scale = config.attention_multiplier or (config.query_pre_attn_scalar or head_dim) ** -0.5
        self.soft_cap = config.attention_logit_cap or None  # Gemma 2 caps the scaled scores

    def __call__(self, x: jax.Array, segment_ids: jax.Array) -> jax.Array:
        batch, length, _ = x.shape
        q, k = self.query(x), self.key(x)
        if self.query_norm is not None and self.norm_across_heads:
            q, k = self.query_norm(q), self.key_norm(k)
        q = q.reshape(batch, length, self.heads, self.head_dim)
        k = k.reshape(batch, length, self.kv_heads, self.head_dim)
        if self.query_norm is not None and not self.norm_across_heads:
            q, k = self.query_norm(q), self.key_norm(k)
        if self.rotary:
            # per block, so blocks keep run_blocks' (x, segment_ids) call; elementwise work beside the projections
            cos, sin = rotary_tables(segment_ids, self.rope, self.head_dim)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        v = self.value(x).reshape(batch, length, self.kv_heads, self.head_dim)
        context = attention(q.astype(self.dtype), k.astype(self.dtype), v.astype(self.dtype),
                            segment_ids=segment_ids, causal=self.causal, scale=self.scale,
                            impl=self.attention_impl, window=self.window or None, soft_cap=self.soft_cap)
        return self.output(context.reshape(batch, length, self.heads * self.head_dim))


class GatedFeedForward(nnx.Module):
    """down(act(gate(x)) * up(x)), the product in float32; act is SiLU (Llama) or ModernBERT's GeGLU's GELU. The
    down projection has a bias where `output_bias` says (GTE's alone has one), else where `bias` does."""

    def __init__(self, hidden: int, intermediate: int, *, bias: bool, dtype: jnp.dtype, rngs: nnx.Rngs,
                 activation: str = "silu", output_bias: bool | None = None):
        self.gate = dense(hidden, intermediate, bias=bias, dtype=dtype, rngs=rngs)
        self.up = dense(hidden, intermediate, bias=bias, dtype=dtype, rngs=rngs)
        self.down = dense(intermediate, hidden, bias=bias if output_bias is None else output_bias, dtype=dtype,
                          rngs=rngs)
        self.activation = activation

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(ACTIVATIONS[self.activation](self.gate(x)) * self.up(x))


def normalised(norm: RMSNorm | None, x: jax.Array) -> jax.Array:
    """norm(x), or x where the block has no such norm."""
    return x if norm is None else norm(x)


class LlamaBlock(nnx.Module):
    """One causal block: x + attn(norm(x)), then x + mlp(norm(x)). Its norms are where the model has them: before
    the attention and the MLP (pre_norms: all but OLMo 2), of their outputs before they are added (post_norms: Gemma,
    OLMo 2); Granite scales those outputs by residual_multiplier before they are added."""

    def __init__(self, config: ModelConfig, layer: int, *, attention_impl: str, dtype: jnp.dtype, rngs: nnx.Rngs):
        def norm(present: bool) -> RMSNorm | None:
            return RMSNorm(config.hidden_size, config.layer_norm_eps) if present else None

        self.attention_norm = norm(config.pre_norms)
        self.attention = GroupedQueryAttention(config, attention_impl=attention_impl, dtype=dtype, rngs=rngs,
                                               window=config.layer_window(layer), rope=config.layer_rope(layer),
                                               rotary=layer not in config.nope_layers, causal=config.causal)
        self.post_attention_norm = norm(config.post_norms)
        self.feed_forward_norm = norm(config.pre_norms)
        self.feed_forward = GatedFeedForward(config.hidden_size, config.intermediate_size, bias=config.mlp_bias,
                                             dtype=dtype, rngs=rngs, activation=config.activation)
        self.post_feed_forward_norm = norm(config.post_norms)
        self.residual_multiplier = config.residual_multiplier  # Granite's; 0: none

    def __call__(self, x: jax.Array, segment_ids: jax.Array) -> jax.Array:
        attended = self.attention(normalised(self.attention_norm, x), segment_ids)
        x = x + self.residual(normalised(self.post_attention_norm, attended))
        fed = self.feed_forward(normalised(self.feed_forward_norm, x))
        return x + self.residual(normalised(self.post_feed_forward_norm, fed))

    def residual(self, output: jax.Array) -> jax.Array:
        """What an attention's or MLP's (normalised) output adds to the stream: Granite's scaled by its multiplier."""
        return output * self.residual_multiplier if self.residual_multiplier else output


class LlamaDecoder(nnx.Module):
    """input ids [B, L] + segment ids [B, L] (0 = padding) -> next-token logits [B, L, V] float32
    (= logits(final_hidden(...)); the pipeline calls the two apart, models/heads.py next_token_logprobs)."""

    def __init__(self, config: ModelConfig, *, attention_impl: str, dtype: str = "float32", rngs: nnx.Rngs):
        self.compute_dtype = COMPUTE_DTYPES[dtype]
        self.token_embedding = nnx.Embed(config.vocab_size, config.hidden_size, rngs=rngs)
        self.layers = nnx.List([LlamaBlock(config, i, attention_impl=attention_impl, dtype=self.compute_dtype,
                                           rngs=rngs) for i in range(config.num_layers)])
        self.embed_scale = config.embed_scale  # Gemma's sqrt(hidden_size), Granite's embedding_multiplier; 0: none
        self.final_norm = RMSNorm(config.hidden_size, config.layer_norm_eps)
        self.dense = embedding_dense(config, rngs)  # a sentence-transformers model's Dense modules after pooling
        # An untied head is its own [hidden, vocab] matrix; a tied one reads the embedding table; an embedder saved
        # without its untied head has none (config.lm_head).
        self.has_lm_head = config.lm_head
        self.final_logit_cap = config.final_logit_cap  # Gemma 2's cap * tanh(logits / cap); 0: none
        self.logits_divisor = config.logits_divisor  # Granite's logits_scaling; 0: none
        self.lm_head = None if config.tie_word_embeddings or not config.lm_head else dense(
            config.hidden_size, config.vocab_size, bias=False, dtype=self.compute_dtype, rngs=rngs)

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array) -> jax.Array:
        return self.logits(self.final_hidden(input_ids, segment_ids))

    def final_hidden(self, input_ids: jax.Array, segment_ids: jax.Array) -> jax.Array:
        x = self.token_embedding(input_ids)
        if self.embed_scale:
            x = x * jnp.asarray(self.embed_scale, x.dtype)
        return self.final_norm(run_blocks(self.layers, x, segment_ids))

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Logits over the vocabulary, float32 out; divided by Granite's logits_scaling, and soft-capped, cap *
        tanh(logits / cap), where the model caps them (Gemma 2's final_logit_softcapping), before any log-softmax."""
        if not self.has_lm_head:
            raise ValueError("this decoder was converted without its language-model head (an embedder's checkpoint)")
        if self.lm_head is not None:
            logits = self.lm_head(hidden)
        else:
            table = self.token_embedding.embedding[...].astype(self.compute_dtype)
            logits = jnp.einsum("bld,vd->blv", hidden.astype(self.compute_dtype), table,
                                preferred_element_type=jnp.float32)
        if self.logits_divisor:
            logits = logits.astype(jnp.float32) / jnp.float32(self.logits_divisor)
        if self.final_logit_cap:
            logits = soft_capped(logits.astype(jnp.float32), self.final_logit_cap)
        return logits
