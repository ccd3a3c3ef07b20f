"""Transformer building blocks shared by the encoder and the decoder: self-attention through the
kernels contract, feed-forward, float32 layer norm, position ids of packed segments, and the blocks:
per block as checkpoints hold them, or stacked once at load and run as one scanned step.

Must not choose or implement an attention kernel: `SelfAttention` passes the name it was built
with to `kernels.attention` and knows nothing else about kernels.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kernels import attention
from models.sharding import STACKED, constrain_rows

COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def gelu_erf(x: jax.Array) -> jax.Array:
    """Exact GELU, x * Phi(x), written with erf as PyTorch and Hugging Face BERT compute it. Same values
    as jax.nn.gelu(approximate=False) (to float32 rounding), which XLA:CPU lowers through erfc at
    twice the cost (benchmarks/README.md)."""
    return x * 0.5 * (1.0 + jax.lax.erf(x * (2.0 ** -0.5)))


ACTIVATIONS = {
    "gelu": gelu_erf,
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,  # the Llama family's gated MLP
}


class EmbeddingDense(nnx.Module):
    """A sentence-transformers Dense module (models/config.py Dense): activation(x @ kernel + bias) of a pooled
    embedding, in float32."""

    def __init__(self, spec: Any, rngs: nnx.Rngs):
        self.linear = nnx.Linear(spec.in_features, spec.out_features, use_bias=spec.bias, rngs=rngs)
        self.activation = spec.activation

    def __call__(self, x: jax.Array) -> jax.Array:
        y = self.linear(x)
        return jnp.tanh(y) if self.activation == "tanh" else y


def embedding_dense(config: Any, rngs: nnx.Rngs) -> nnx.Sequential | None:
    """The Dense modules an embedding passes through after its pooling (config.dense), in order; None when there
    are none, so a model without them keeps the parameters it always had."""
    return nnx.Sequential(*[EmbeddingDense(spec, rngs) for spec in config.dense]) if config.dense else None


def layer_norm(features: int, eps: float, rngs: nnx.Rngs, *, bias: bool = True) -> nnx.LayerNorm:
    """LayerNorm computed in float32 whatever the matmul dtype (two-pass variance, as PyTorch); without a bias
    where the checkpoint has none (ModernBERT's norm_bias false)."""
    return nnx.LayerNorm(features, epsilon=eps, dtype=jnp.float32, use_fast_variance=False, use_bias=bias, rngs=rngs)


def linear(features_in: int, features_out: int, dtype: jnp.dtype, rngs: nnx.Rngs) -> nnx.Linear:
    """Dense layer: float32 params cast to `dtype` for the matmul, accumulated and returned in float32. No
    precision of its own: the dot runs at the one models/precision.py sets where the program is traced."""
    return nnx.Linear(features_in, features_out, dtype=dtype,
                      preferred_element_type=jnp.float32, rngs=rngs)


def positions_in_segments(segment_ids: jax.Array, counted: jax.Array | None = None) -> jax.Array:
    """Position ids [B, L] that restart at 0 where each segment starts (0 on padding), so a document
    packed into a row sees the same positions as alone in its own row. With `counted` (bool [B, L]), a position is
    the number of counted tokens before it in its segment (RoBERTa does not count its padding id)."""
    index = jnp.arange(segment_ids.shape[1], dtype=jnp.int32)[None, :]
    before = index if counted is None else jnp.cumsum(counted, axis=1, dtype=jnp.int32) - counted  # non-decreasing
    previous = jnp.pad(segment_ids[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
    starts = jnp.where(segment_ids != previous, before, 0)
    return jnp.where(segment_ids > 0, before - jax.lax.cummax(starts, axis=1), 0)


class SelfAttention(nnx.Module):
    """Multi-head self-attention: q/k/v projections, the injected kernel, output projection."""

    def __init__(self, hidden: int, heads: int, *, attention_impl: str, causal: bool, scale: float,
                 dtype: jnp.dtype, rngs: nnx.Rngs):
        self.query = linear(hidden, hidden, dtype, rngs)
        self.key = linear(hidden, hidden, dtype, rngs)
        self.value = linear(hidden, hidden, dtype, rngs)
        self.output = linear(hidden, hidden, dtype, rngs)
        self.dtype = dtype
        self.heads = heads
        self.attention_impl = attention_impl
        self.causal = causal
        self.scale = scale

    def __call__(self, x: jax.Array, segment_ids: jax.Array) -> jax.Array:
        batch, length, hidden = x.shape

        def split_heads(t: jax.Array) -> jax.Array:  # [B, L, D] -> [B, L, N, H] (BTNH), compute dtype
            return t.reshape(batch, length, self.heads, hidden // self.heads).astype(self.dtype)

        context = attention(split_heads(self.query(x)), split_heads(self.key(x)), split_heads(self.value(x)),
                            segment_ids=segment_ids, causal=self.causal, scale=self.scale,
                            impl=self.attention_impl)
        return self.output(context.reshape(batch, length, hidden))


class FeedForward(nnx.Module):
    """Position-wise MLP: up projection, activation (float32), down projection."""

    def __init__(self, hidden: int, intermediate: int, *, activation: str, dtype: jnp.dtype, rngs: nnx.Rngs):
        self.up = linear(hidden, intermediate, dtype, rngs)
        self.down = linear(intermediate, hidden, dtype, rngs)
        self.activation = activation

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(ACTIVATIONS[self.activation](self.up(x)))


class StackedBlocks(nnx.Module):
    """Blocks of one structure held as one block whose every parameter carries a leading layer axis
    (parameter paths layers/stacked/..., models/sharding.py's STACKED), run as one jax.lax.scan over it.
    Made once at load (stack_blocks) from the per-block form that checkpoints, fingerprints and the
    Hugging Face conversion hold (layers/0/...), so no call copies the weights to stack them."""

    def __init__(self, stacked: nnx.Module):
        self.stacked = stacked  # the attribute name is sharding.STACKED

    def __call__(self, x: jax.Array, segment_ids: jax.Array) -> jax.Array:
        graphdef, state = nnx.split(self.stacked)

        def step(x: jax.Array, layer: nnx.State) -> tuple[jax.Array, None]:
            return constrain_rows(nnx.merge(graphdef, layer)(x, segment_ids)), None

        x, _ = jax.lax.scan(step, constrain_rows(x), state)
        return x


def run_blocks(blocks: nnx.List | StackedBlocks, x: jax.Array, segment_ids: jax.Array) -> jax.Array:
    """x through `blocks` in order: stacked blocks as one scanned step (JAX traces and compiles one block,
    not every block: faster compiles, benchmarks/README.md), a list of blocks (of different structure,
    e.g. GPT-2's with a per-layer attention scale, or a model stack_blocks was not applied to) one after
    another. Under a model mesh (models/sharding.py) each block's input and output stay split by rows and
    whole in hidden."""
    if isinstance(blocks, StackedBlocks):
        return blocks(x, segment_ids)
    for block in blocks:
        x = constrain_rows(block(constrain_rows(x), segment_ids))
    return x


def stack_blocks(model: nnx.Module) -> nnx.Module:
    """`model` with its blocks (model.layers, an nnx.List) replaced by StackedBlocks when there are two or more
    of one structure (the same graphdef), in place; unchanged when they differ or are stacked already. Works on
    an abstract model (nnx.eval_shape) as on one with arrays (stacked with jnp.stack: one copy, at load)."""
    blocks = model.layers
    if isinstance(blocks, StackedBlocks) or len(blocks) < 2:
        return model
    parts = [nnx.split(block) for block in blocks]
    graphdef = parts[0][0]
    if any(other != graphdef for other, _ in parts[1:]):
        return model
    state = jax.tree.map(lambda *leaves: jnp.stack(leaves), *(state for _, state in parts))
    model.layers = StackedBlocks(nnx.merge(graphdef, state))
    return model


def stacked_abstract(graphdef: nnx.GraphDef, state: nnx.State) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, state of ShapeDtypeStructs) of a per-block abstract model (models/architecture.py abstract_model)
    -> those of the model stack_blocks makes of it: the layout the programs receive, nothing allocated."""
    return nnx.split(nnx.eval_shape(lambda per_block: stack_blocks(nnx.merge(graphdef, per_block)), state))


def stack_params(params: dict[str, Any]) -> dict[str, Any]:
    """A pure parameter dict in the checkpoint layout (layers/0/..., layers/1/...) -> StackedBlocks' layout
    (layers/stacked/..., each parameter of every block stacked on a leading axis), for a model stack_blocks
    stacks. Consumes params["layers"]: each block's array is let go once stacked, so the host holds the
    layers' weights about once, not twice."""
    blocks = params.pop("layers")
    flat = []
    for key in sorted(blocks, key=int):  # 0, 1, ..., n-1
        leaves, treedef = jax.tree_util.tree_flatten(blocks.pop(key))
        flat.append(leaves)
    count = len(flat)
    stacked = []
    for leaf in range(len(flat[0])):
        stacked.append(np.stack([flat[index][leaf] for index in range(count)]))
        for index in range(count):
            flat[index][leaf] = None
    return {**params, "layers": {STACKED: jax.tree_util.tree_unflatten(treedef, stacked)}}


def unstack_params(params: dict[str, Any]) -> dict[str, Any]:
    """stack_params' inverse: a pure dict in StackedBlocks' layout -> the checkpoint layout (layers/0/...);
    a dict in the checkpoint layout is returned as it is."""
    blocks = params["layers"]
    if STACKED not in blocks:
        return params
    count = int(jax.tree.leaves(blocks[STACKED])[0].shape[0])
    return {**params, "layers": {index: jax.tree.map(lambda leaf: leaf[index], blocks[STACKED])
                                 for index in range(count)}}
