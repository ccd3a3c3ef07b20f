"""Transformer building blocks shared by the encoder and the decoder: self-attention through the
kernels contract, feed-forward, float32 layer norm, position ids of packed segments, and the stack
of blocks run as one scanned step.

Must not choose or implement an attention kernel: `SelfAttention` passes the name it was built
with to `kernels.attention` and knows nothing else about kernels.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kernels import attention
from models.sharding import constrain_rows

COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def gelu_erf(x: jax.Array) -> jax.Array:
    """Exact GELU, x * Phi(x), written with erf as PyTorch and Hugging Face BERT compute it. Same values
    as jax.nn.gelu(approximate=False) (max abs diff 1e-6 in float32), which XLA:CPU lowers through
    erfc at twice the cost: 2.8 ms against 5.5 ms for a [4096, 1536] float32 activation, 3-6% of a
    MiniLM forward (benchmarks/README.md)."""
    return x * 0.5 * (1.0 + jax.lax.erf(x * (2.0 ** -0.5)))


ACTIVATIONS = {
    "gelu": gelu_erf,
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
}


def layer_norm(features: int, eps: float, rngs: nnx.Rngs) -> nnx.LayerNorm:
    """LayerNorm computed in float32 whatever the matmul dtype (two-pass variance, as PyTorch)."""
    return nnx.LayerNorm(features, epsilon=eps, dtype=jnp.float32, use_fast_variance=False, rngs=rngs)


def matmul_precision(dtype: jnp.dtype) -> jax.lax.Precision | None:
    """None: the dense layers' dots take the precision the program is traced under (LoadedModel traces
    every program under models/precision.py's: float32 -> highest, or --matmul_precision's choice)."""
    return None


def linear(features_in: int, features_out: int, dtype: jnp.dtype, rngs: nnx.Rngs) -> nnx.Linear:
    """Dense layer: float32 params cast to `dtype` for the matmul, accumulated and returned in float32."""
    return nnx.Linear(features_in, features_out, dtype=dtype, precision=matmul_precision(dtype),
                      preferred_element_type=jnp.float32, rngs=rngs)


def positions_in_segments(segment_ids: jax.Array) -> jax.Array:
    """Position ids [B, L] that restart at 0 where each segment starts (0 on padding), so a document
    packed into a row sees the same positions as alone in its own row."""
    index = jnp.arange(segment_ids.shape[1], dtype=jnp.int32)[None, :]
    previous = jnp.pad(segment_ids[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
    starts = jnp.where(segment_ids != previous, index, 0)
    return jnp.where(segment_ids > 0, index - jax.lax.cummax(starts, axis=1), 0)


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


def run_blocks(blocks: nnx.List, x: jax.Array, segment_ids: jax.Array) -> jax.Array:
    """x through `blocks` in order. Blocks of one structure (the same graphdef: all of BERT's; GPT-2's
    unless its attention scale varies by layer) run as one jax.lax.scan over their parameters stacked
    on a new leading axis, so JAX traces and lowers one block, not every block, and the compiled program
    holds it once. With a warm compilation cache, a MiniLM run's compile time (its 5 shapes) fell from
    1.2-1.4 s to 0.7-0.9 s; cold compiles and the time per call did not measurably change
    (benchmarks/README.md). The parameters stay per block (layers/0/...), as checkpoints and fingerprints
    hold them; the stacking is one copy inside the program. Under a model mesh (models/sharding.py) each
    block's input and output stay split by rows and whole in hidden, the Megatron layout's activations."""
    parts = [nnx.split(block) for block in blocks]  # (graphdef, state) of each block
    graphdef = parts[0][0] if parts else None
    if len(parts) < 2 or any(other != graphdef for other, _ in parts[1:]):  # nothing to share
        for block in blocks:
            x = constrain_rows(block(constrain_rows(x), segment_ids))
        return x
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *(state for _, state in parts))

    def step(x: jax.Array, state: nnx.State) -> tuple[jax.Array, None]:
        return constrain_rows(nnx.merge(graphdef, state)(x, segment_ids)), None

    x, _ = jax.lax.scan(step, constrain_rows(x), stacked)
    return x
