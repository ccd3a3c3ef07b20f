"""Llama-family decoder (Flax NNX) for LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
Phi3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, Olmo2ForCausalLM, Olmo3ForCausalLM, GraniteForCausalLM and
SmolLM3ForCausalLM checkpoints: token embedding (Gemma, Granite: scaled), pre-norm blocks (RMSNorm, grouped-query
causal attention with rotary positions (SmolLM3: not on every layer; Phi-3: on a head's first dimensions only where
partial_rotary_factor says so) and Qwen3's and Gemma 3's per-head q/k norms (OLMo 2's over all heads at once), Gemma
2's soft-capped scores, Granite's own attention scale, gated SiLU or GELU MLP; Gemma: norms after the attention and
MLP too; OLMo 2: only after them; Granite: their outputs scaled before they are added), final RMSNorm, and an output
head tied to the embedding or its own (Gemma 2: its logits soft-capped; Granite: divided).

Must not tokenize, score or pick a kernel: the attention name comes in through the constructor, and the
kernel sees only the contract's q/k/v, segment ids and causal flag. Rotary positions restart in every packed
segment (and longrope's factors follow each segment's own length), so a document packed into a row is computed
exactly as alone in its own row.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kernels import attention
from kernels.masking import soft_capped
from models.config import ModelConfig, Rope
from models.layers import (ACTIVATIONS, COMPUTE_DTYPES, embedding_dense, linear, positions_in_segments, run_blocks,
                           segment_lengths)


def dense(features_in: int, features_out: int, *, bias: bool, dtype: jnp.dtype, rngs: nnx.Rngs) -> nnx.Linear:
    """layers.linear with the bias a required choice (Llama's projections have none; Qwen2's q/k/v do)."""
    return linear(features_in, features_out, dtype, rngs, bias=bias)


def rotary_width(rope: Rope, head_dim: int) -> int:
    """How many of a head's first dimensions rotary positions turn: Phi-3's partial rotary_dim, else all of them."""
    return rope.rotary_dim or head_dim


def rope_frequencies(rope: Rope, head_dim: int, *, long: bool = False) -> np.ndarray:
    """Inverse frequencies [rotary_width / 2] float32, computed as transformers' rope init functions do
    (default, linear, llama3, yarn, longrope; over int(head_dim * partial_rotary_factor) dimensions where only those
    turn), so the angles match theirs to the last bits that matter at 1e-4. longrope's are its short factors'
    (transformers' inv_freq), or with `long` its long factors'."""
    f32 = np.float32  # every step in float32 as torch does: one ulp of a frequency is 1e-4 rad at 4k positions
    dim = rotary_width(rope, head_dim)  # transformers' init functions take dim = int(head_dim * partial_rotary_factor)
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(f32) / f32(dim)
    # theta ** e rounded once to float32, which torch's vectorised powf gives in nearly every element
    powers = np.power(float(rope.theta), exponents.astype(np.float64)).astype(f32)
    if rope.kind == "longrope":  # each frequency divided by its own factor
        factors = np.asarray(rope.long_factor if long else rope.short_factor, dtype=f32)
        return (f32(1.0) / (factors * powers)).astype(np.float32)
    inv_freq = f32(1.0) / powers
    if rope.kind == "linear":
        inv_freq = inv_freq / f32(rope.factor)
    elif rope.kind == "llama3":  # long wavelengths divided by factor, short ones kept, the band between blended
        old, factor = f32(rope.original_max_positions), f32(rope.factor)
        low, high = f32(rope.low_freq_factor), f32(rope.high_freq_factor)
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = (f32(1) / inv_freq) * f32(2 * math.pi)  # torch's scalar / tensor is reciprocal(tensor) * scalar
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = ((f32(1) / wavelen) * old - low) / (high - low)
        blended = (f32(1) - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv_freq = np.where(medium, blended, scaled)
    elif rope.kind == "yarn":
        inv_freq = yarn_frequencies(rope, dim, powers)
    return inv_freq.astype(np.float32)


def yarn_frequencies(rope: Rope, dim: int, powers: np.ndarray) -> np.ndarray:
    """YaRN's inverse frequencies over `dim` rotated dimensions from theta ** (2i / dim) (`powers`), as transformers'
    _compute_yarn_parameters: the fast-rotating dimensions kept (extrapolated), the slow ones divided by factor
    (interpolated), a linear ramp between the dimensions that turn beta_fast and beta_slow times in the original
    context (its ends rounded outwards where truncate)."""
    f32 = np.float32

    def dimension(rotations: float) -> float:  # in Python floats, as transformers' find_correction_dim
        return (dim * math.log(rope.original_max_positions / (rotations * 2 * math.pi))) / (
            2 * math.log(rope.theta))

    low, high = dimension(rope.beta_fast), dimension(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=f32) - f32(low)) / f32(high - low), f32(0), f32(1))
    extrapolated = f32(1) - ramp  # the share of each dimension kept as is
    return (f32(1.0) / (f32(rope.factor) * powers)) * (f32(1) - extrapolated) + (f32(1.0) / powers) * extrapolated


def rotary_tables(segment_ids: jax.Array, rope: Rope, head_dim: int) -> tuple[jax.Array, jax.Array]:
    """(cos, sin) [B, L, 1, rotary_width] float32 at each token's position within its segment, both times the rope's
    attention_factor (yarn, longrope) as transformers scales them. longrope's frequencies are chosen per segment: its
    long factors where the segment is longer than original_max_positions, which is what transformers gives that
    document encoded alone (it chooses once per call, by the batch's longest position), so a document's scores and
    embedding never depend on what it is packed or batched with."""
    positions = positions_in_segments(segment_ids).astype(jnp.float32)[:, :, None]
    angles = positions * jnp.asarray(rope_frequencies(rope, head_dim))[None, None, :]
    if rope.kind == "longrope":  # both tables at static shapes, then each token's by its segment's length
        long = (segment_lengths(segment_ids) > rope.original_max_positions)[:, :, None]
        angles = jnp.where(long, positions * jnp.asarray(rope_frequencies(rope, head_dim, long=True))[None, None, :],
                           angles)
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    if rope.attention_factor != 1.0:
        scale = jnp.float32(rope.attention_factor)
        cos, sin = cos * scale, sin * scale
    return cos, sin


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x * cos + rotate_half(x) * sin over the last axis (the halves layout of Hugging Face checkpoints), on its
    first cos.shape[-1] dimensions only where the tables are narrower (Phi-3's partial rotary: the rest pass through
    unchanged, as transformers' Phi3 apply_rotary_pos_emb slices them)."""
    width = cos.shape[-1]
    turned, passed = x[..., :width], x[..., width:]
    half = width // 2
    rotated = jnp.concatenate([-turned[..., half:], turned[..., :half]], axis=-1)
    turned = turned * cos + rotated * sin
    return turned if width == x.shape[-1] else jnp.concatenate([turned, passed.astype(turned.dtype)], axis=-1)


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
