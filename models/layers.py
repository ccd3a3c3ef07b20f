"""Transformer building blocks shared by the encoder and the decoder: self-attention through the
kernels contract, feed-forward, float32 layer norm, position ids of packed segments, and the blocks:
per block as checkpoints hold them, or stacked once at load (each repeating run of block structures, block_runs)
and run as scanned steps.

Must not choose or implement an attention kernel: `SelfAttention` passes the name it was built
with to `kernels.attention` and knows nothing else about kernels.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
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


def linear(features_in: int, features_out: int, dtype: jnp.dtype, rngs: nnx.Rngs, *, bias: bool = True) -> nnx.Linear:
    """Dense layer: float32 params cast to `dtype` for the matmul, accumulated and returned in float32; without a
    bias where the checkpoint has none (T5's, Llama's). No precision of its own: the dot runs at the one
    models/precision.py sets where the program is traced."""
    return nnx.Linear(features_in, features_out, use_bias=bias, dtype=dtype,
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


def segment_lengths(segment_ids: jax.Array) -> jax.Array:
    """The length [B, L] of each token's segment (a run of one segment id; 0 on padding): its last position + 1,
    the length transformers sees when that document is encoded alone."""
    index = jnp.arange(segment_ids.shape[1], dtype=jnp.int32)[None, :]
    following = jnp.pad(segment_ids[:, 1:], ((0, 0), (0, 1)), constant_values=-1)
    last = jnp.where(segment_ids != following, index, segment_ids.shape[1])  # each run's last token
    end = jax.lax.cummin(last, axis=1, reverse=True)
    return jnp.where(segment_ids > 0, end - index + positions_in_segments(segment_ids) + 1, 0)


def relative_position_buckets(offsets: np.ndarray, num_buckets: int, max_distance: int) -> np.ndarray:
    """The bucket of each key-query offset j - i in T5's bidirectional buckets (T5Attention._relative_position_bucket,
    which MPNetEncoder.relative_position_bucket copies): keys after the query in the upper half of the buckets; within
    each half, distances below a quarter of the buckets exactly, then logarithmically up to max_distance, past which
    one bucket. Each step in float32 as torch computes it (tests/test_models_mpnet.py and tests/test_models_t5.py check
    every offset to +-5000, the buckets' edges among them)."""
    distance = -np.asarray(offsets, np.int64)  # query - key, as transformers' n
    half = num_buckets // 2
    upper = (distance < 0).astype(np.int64) * half
    distance = np.abs(distance)
    exact = half // 2
    ratio = (np.log(np.maximum(distance, 1).astype(np.float32) / np.float32(exact))
             / np.float32(math.log(max_distance / exact)))
    far = np.minimum(exact + (ratio * np.float32(half - exact)).astype(np.int64), half - 1)
    return upper + np.where(distance < exact, distance, far)


def relative_position_bias(table: jax.Array, length: int, num_buckets: int, max_distance: int) -> jax.Array:
    """The kernels' relative_bias [heads, 2 * length - 1] of rows of `length` tokens from a [buckets, heads] table
    (MPNet's, T5's): entry e is offset e - (length - 1), its bucket's row (static: the buckets depend on the length
    only). Offsets are of row indices: within a packed segment the same as in the document's own unpadded row."""
    buckets = relative_position_buckets(np.arange(2 * length - 1) - (length - 1), num_buckets, max_distance)
    return table[jnp.asarray(buckets)].T.astype(jnp.float32)


class SelfAttention(nnx.Module):
    """Multi-head self-attention: q/k/v projections, the injected kernel, output projection. Heads are
    hidden / heads wide unless head_dim says (T5's d_kv: heads x d_kv need not be hidden, mT5-small's 6 x 64 over
    512); the projections have biases unless bias is False (T5's)."""

    def __init__(self, hidden: int, heads: int, *, attention_impl: str, causal: bool, scale: float,
                 dtype: jnp.dtype, rngs: nnx.Rngs, head_dim: int | None = None, bias: bool = True):
        self.head_dim = head_dim or hidden // heads
        inner = heads * self.head_dim
        self.query = linear(hidden, inner, dtype, rngs, bias=bias)
        self.key = linear(hidden, inner, dtype, rngs, bias=bias)
        self.value = linear(hidden, inner, dtype, rngs, bias=bias)
        self.output = linear(inner, hidden, dtype, rngs, bias=bias)
        self.dtype = dtype
        self.heads = heads
        self.attention_impl = attention_impl
        self.causal = causal
        self.scale = scale

    def __call__(self, x: jax.Array, segment_ids: jax.Array, relative_bias: jax.Array | None = None) -> jax.Array:
        """relative_bias: the kernels' [heads, 2L - 1] bias by key-query offset (MPNet's, T5's), or None."""
        batch, length, _ = x.shape

        def split_heads(t: jax.Array) -> jax.Array:  # [B, L, N * H] -> [B, L, N, H] (BTNH), compute dtype
            return t.reshape(batch, length, self.heads, self.head_dim).astype(self.dtype)

        context = attention(split_heads(self.query(x)), split_heads(self.key(x)), split_heads(self.value(x)),
                            segment_ids=segment_ids, causal=self.causal, scale=self.scale,
                            impl=self.attention_impl, relative_bias=relative_bias)
        return self.output(context.reshape(batch, length, self.heads * self.head_dim))


class FeedForward(nnx.Module):
    """Position-wise MLP: up projection, activation (float32), down projection; biases unless bias is False
    (T5's DenseReluDense: wi, wo)."""

    def __init__(self, hidden: int, intermediate: int, *, activation: str, dtype: jnp.dtype, rngs: nnx.Rngs,
                 bias: bool = True):
        self.up = linear(hidden, intermediate, dtype, rngs, bias=bias)
        self.down = linear(intermediate, hidden, dtype, rngs, bias=bias)
        self.activation = activation

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(ACTIVATIONS[self.activation](self.up(x)))


class StackedBlocks(nnx.Module):
    """`count` repeats of a period of consecutive blocks held as one period whose every parameter carries a leading
    repeat axis (parameter paths .../stacked/... for a period of one block, .../stacked/<position>/... for longer
    ones; models/sharding.py's STACKED), run as one jax.lax.scan over it, each step the period's blocks in order.
    Made once at load (stack_blocks) from the per-block form that checkpoints, fingerprints and the Hugging Face
    conversion hold (layers/0/...), so no call copies the weights to stack them."""

    def __init__(self, stacked: nnx.Module):
        self.stacked = stacked  # one block, or an nnx.List of a period's blocks; the attribute name is sharding.STACKED

    def __call__(self, x: jax.Array, segment_ids: jax.Array, **shared: jax.Array) -> jax.Array:
        graphdef, state = nnx.split(self.stacked)

        def step(x: jax.Array, layer: nnx.State) -> tuple[jax.Array, None]:
            period = nnx.merge(graphdef, layer)
            for block in period if isinstance(period, nnx.List) else [period]:
                x = constrain_rows(block(x, segment_ids, **shared))
            return x, None

        x, _ = jax.lax.scan(step, constrain_rows(x), state)
        return x


def run_blocks(blocks: nnx.List | StackedBlocks, x: jax.Array, segment_ids: jax.Array,
               **shared: jax.Array) -> jax.Array:
    """x through `blocks` in order: stacked blocks as one scanned step (JAX traces and compiles one period of
    blocks, not every block: faster compiles, benchmarks/README.md), a list one entry after another: blocks (of
    different structure, e.g. GPT-2's with a per-layer attention scale, or a model stack_blocks was not applied
    to) and the StackedBlocks of repeating runs among them. Under a model mesh (models/sharding.py) each block's
    input and output stay split by rows and whole in hidden. `shared`: arrays every block takes beside its input,
    computed once for them all (MPNet's relative position bias, from the one table its layers share)."""
    if isinstance(blocks, StackedBlocks):
        return blocks(x, segment_ids, **shared)
    for block in blocks:
        x = constrain_rows(block(constrain_rows(x), segment_ids, **shared))
    return x


@dataclasses.dataclass(frozen=True)
class Run:
    """`count` repeats of `period` consecutive blocks, in the order stack_blocks lays blocks out: a count of 1 is one
    block left as it is (period 1), a larger one a StackedBlocks."""

    period: int
    count: int

    @property
    def blocks(self) -> int:
        return self.period * self.count


def block_runs(kinds: Sequence[Any]) -> tuple[Run, ...]:
    """Blocks of these kinds (equal kinds: one graphdef) cut into runs, each a period repeated two or more times
    (a StackedBlocks) or a block alone, so that the fewest blocks are traced: a run traces its period once. All one
    kind: one run of period 1 (every block stacked, as BERT's); Gemma 3's five local and one global layer: that
    period repeated, then the local ones left over; ModernBERT's layer 0 alone, then local, local, global
    repeated; a Qwen2 with max_window_layers: one run of each kind. Ties go to fewer runs, then to the longer first
    run (Gemma 3's leftover local layers last)."""
    n = len(kinds)
    # best[i]: the runs of kinds[i:] and their key (blocks traced, runs, minus the first run's blocks)
    best: list[tuple[tuple[int, ...], tuple[Run, ...]]] = [((0, 0, 0), ())] * (n + 1)

    def option(run: Run, start: int) -> tuple[tuple[int, ...], tuple[Run, ...]]:
        (traced, runs, _), rest = best[start + run.blocks]
        return (traced + run.period, runs + 1, -run.blocks), (run, *rest)

    for start in range(n - 1, -1, -1):
        options = [option(Run(1, 1), start)]
        for period in range(1, (n - start) // 2 + 1):
            first, count = kinds[start:start + period], 1
            while start + (count + 1) * period <= n and \
                    kinds[start + count * period:start + (count + 1) * period] == first:
                count += 1
                options.append(option(Run(period, count), start))
        best[start] = min(options, key=lambda choice: choice[0])
    return best[0][1]


def stack_blocks(model: nnx.Module) -> nnx.Module:
    """`model` with its blocks (model.layers, an nnx.List) laid out by block_runs of their graphdefs, in place: one
    StackedBlocks when one run covers them all (blocks of one structure: parameter paths layers/stacked/...), else
    an nnx.List of the runs in order, each a StackedBlocks or a block alone (layers/<run>/...); unchanged when no
    block structure repeats or they are stacked already. Works on an abstract model (nnx.eval_shape) as on one with
    arrays (stacked with jnp.stack: one copy, at load)."""
    blocks = model.layers
    if is_stacked(blocks):
        return model
    parts = [nnx.split(block) for block in blocks]
    graphdefs = [graphdef for graphdef, _ in parts]
    runs = block_runs([graphdefs.index(graphdef) for graphdef in graphdefs])  # the first equal graphdef's index
    if all(run.count == 1 for run in runs):
        return model
    entries = []
    for run, positions in run_members(runs):
        if run.count == 1:
            entries.append(blocks[positions[0][0]])
        else:
            period = [nnx.merge(graphdefs[indices[0]], jax.tree.map(lambda *leaves: jnp.stack(leaves),
                                                                   *(parts[index][1] for index in indices)))
                      for indices in positions]
            entries.append(StackedBlocks(period[0] if run.period == 1 else nnx.List(period)))
    model.layers = entries[0] if len(entries) == 1 else nnx.List(entries)
    return model


def run_members(runs: Sequence[Run]) -> list[tuple[Run, list[list[int]]]]:
    """Each run with the blocks it holds: for each position of its period, that position's block index in each
    repeat, in order (a block alone: [[its index]]). The one place block indices are laid out by runs."""
    members, start = [], 0
    for run in runs:
        members.append((run, [[start + repeat * run.period + position for repeat in range(run.count)]
                              for position in range(run.period)]))
        start += run.blocks
    return members


def is_stacked(blocks: nnx.Module) -> bool:
    """Whether model.layers is in stack_blocks' layout (a StackedBlocks, or a list holding one)."""
    return isinstance(blocks, StackedBlocks) or any(isinstance(entry, StackedBlocks) for entry in blocks)


def stacked_abstract(graphdef: nnx.GraphDef, state: nnx.State) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, state of ShapeDtypeStructs) of a per-block abstract model (models/architecture.py abstract_model)
    -> those of the model stack_blocks makes of it: the layout the programs receive, nothing allocated."""
    return nnx.split(nnx.eval_shape(lambda per_block: stack_blocks(nnx.merge(graphdef, per_block)), state))


def stacked_runs(layers: dict[Any, Any]) -> list[tuple[Run, Any]] | None:
    """The runs of a pure `layers` dict in stack_blocks' layout, each with its entry (a block's dict, or a
    StackedBlocks' {STACKED: ...}); None for the checkpoint layout (one entry per block, layers/0/...)."""
    if STACKED in layers:
        entries = [layers]
    elif any(STACKED in entry for entry in layers.values()):
        entries = [layers[key] for key in sorted(layers, key=int)]
    else:
        return None
    runs = []
    for entry in entries:
        if STACKED not in entry:
            runs.append((Run(1, 1), entry))
            continue
        period = entry[STACKED]
        count = int(jax.tree.leaves(period)[0].shape[0])
        runs.append((Run(len(period) if all(isinstance(key, int) for key in period) else 1, count), entry))
    return runs


def stack_params(params: dict[str, Any], like: dict[str, Any]) -> dict[str, Any]:
    """A pure parameter dict in the checkpoint layout (layers/0/..., layers/1/...) -> the layout of `like` (a pure
    dict of the model stack_blocks made, e.g. stacked_abstract's state): each run's blocks stacked on a leading
    axis, position by position of its period; `params` as it is when `like` has nothing stacked. Consumes
    params["layers"]: each block's array is let go once stacked, so the host holds the layers' weights about once,
    not twice."""
    runs = stacked_runs(like["layers"])
    if runs is None:
        return params
    blocks = {int(key): block for key, block in params.pop("layers").items()}
    entries = []
    for run, positions in run_members([run for run, _ in runs]):
        if run.count == 1:
            entries.append(blocks.pop(positions[0][0]))
        else:
            period = [stack_trees([blocks.pop(index) for index in indices]) for indices in positions]
            entries.append({STACKED: period[0] if run.period == 1 else dict(enumerate(period))})
    return {**params, "layers": entries[0] if len(entries) == 1 else dict(enumerate(entries))}


def stack_trees(trees: list[Any]) -> Any:
    """Trees of one structure -> one tree of their leaves stacked on a new leading axis (np.stack), each leaf let
    go once stacked (the caller holds none of `trees` after the call)."""
    flat = []
    while trees:
        leaves, treedef = jax.tree_util.tree_flatten(trees.pop(0))
        flat.append(leaves)
    stacked = []
    for leaf in range(len(flat[0])):
        stacked.append(np.stack([leaves[leaf] for leaves in flat]))
        for leaves in flat:
            leaves[leaf] = None
    return jax.tree_util.tree_unflatten(treedef, stacked)


def unstack_params(params: dict[str, Any]) -> dict[str, Any]:
    """stack_params' inverse: a pure dict in stack_blocks' layout -> the checkpoint layout (layers/0/...);
    a dict in the checkpoint layout is returned as it is."""
    runs = stacked_runs(params["layers"])
    if runs is None:
        return params
    blocks = {}
    for (run, positions), (_, entry) in zip(run_members([run for run, _ in runs]), runs):
        if run.count == 1:
            blocks[positions[0][0]] = entry
            continue
        period = [entry[STACKED][position] for position in range(run.period)] if run.period > 1 else [entry[STACKED]]
        for block, indices in zip(period, positions):
            for repeat, index in enumerate(indices):
                blocks[index] = jax.tree.map(lambda leaf: leaf[repeat], block)
    return {**params, "layers": dict(sorted(blocks.items()))}
