"""`models.load(...) -> LoadedModel`: a model directory, gs:// URL or built-in name -> a ready model
whose embed_packed / token_logprobs take numpy batches and return numpy.

Holds loading (with integrity checks), the kernel resolution for the model's shapes and the per-shape
compile cache. Must not batch, pad or pack documents (the pipeline does) nor hold kernel code.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import shutil
import threading
import time
from typing import Any, Callable, ContextManager

import jax
import numpy as np
from flax import nnx

import kernels
from models.architecture import abstract_model, every_param_shape
from models.builtin import BUILTINS, builtin_dir, discard_copy
from models.checkpoint import fingerprint, restore_params, stored_shapes
from models.config import Dense, ModelConfig, hf_keys, read_config, with_checkpoint_head
from models.errors import DamagedModelDir, MachineShortOf, ModelLoadError, short_of, shortage
from models.heads import POOLINGS, next_token_logprobs, segment_embeddings
from models.layers import COMPUTE_DTYPES, stack_blocks, stack_params, stacked_abstract
from models.model_dir import CONFIG, PARAMS, TOKENIZER, fetch_remote, is_remote, local_cache_dir, read_metadata, read_text
from models.precision import choice_problem, matmul_precision, with_matmul_precision
from models.sharding import MeshLayout, ModelDoesNotFit, choose_layout, local_data_parallel
from models.tokenizer import DocTokenizer

log = logging.getLogger(__name__)


class CacheHits:
    """Persistent compilation cache hits in this process, counted from jax.monitoring's event (the one
    public signal of a hit); compiles under LoadedModel's lock read it before and after."""

    EVENT = "/jax/compilation_cache/cache_hits"

    def __init__(self) -> None:
        self.count = 0
        jax.monitoring.register_event_listener(self._on_event)

    def _on_event(self, event: str, **_: Any) -> None:
        if event == self.EVENT:
            self.count += 1


PERSISTENT_CACHE_HITS = CacheHits()


def embed_packed_program(graphdef: nnx.GraphDef, state: nnx.State, input_ids: jax.Array, segment_ids: jax.Array,
                         max_segments: int, *, pooling: str = "mean") -> jax.Array:
    """What LoadedModel.embed_packed runs: the model's segment embeddings (an encoder's output, a decoder's final
    hidden states), pooled as the model was converted."""
    model = nnx.merge(graphdef, state)
    hidden = model.final_hidden(input_ids, segment_ids)
    return segment_embeddings(hidden, segment_ids, max_segments, pooling, dense=model.dense)


def token_logprobs_program(graphdef: nnx.GraphDef, state: nnx.State, input_ids: jax.Array,
                           segment_ids: jax.Array) -> jax.Array:
    """What LoadedModel.token_logprobs runs: a decoder's next-token log-probabilities, its logits a block of
    positions at a time."""
    model = nnx.merge(graphdef, state)
    return next_token_logprobs(model.final_hidden(input_ids, segment_ids), model.logits, input_ids, segment_ids)


@dataclasses.dataclass
class LoadedModel:
    """A loaded model and what it runs with. `attention` is the kernel that runs (resolved once at
    load for rows of max_seq_len tokens and built into the model). Methods compile once per input
    shape (`compile_count`; each thread's count and seconds: `compiles_by_this_thread`) and return numpy."""

    model: nnx.Module
    tokenizer: DocTokenizer
    config: ModelConfig
    fingerprint: str
    model_id: str
    attention: str
    dtype: str
    path: str = ""
    precision_choice: str | None = None  # --matmul_precision (models/precision.py); None: the dtype's own
    parallel: MeshLayout | None = dataclasses.field(default=None, repr=False)  # None: data parallel over all local devices
    # how embed_packed pools a segment (models/heads.py POOLINGS): metadata.json's pooling; None: a decoder that
    # embeds nothing (a language model)
    pooling: str | None = "mean"
    # metadata.json's include_prompt: false where the pooling leaves a prompt's tokens out, so no prompt may be used
    include_prompt: bool = True
    _compiled: dict = dataclasses.field(default_factory=dict, init=False, repr=False)
    _lock: Any = dataclasses.field(default_factory=threading.Lock, init=False, repr=False)
    _by_thread: Any = dataclasses.field(default_factory=threading.local, init=False, repr=False)
    # Entered around each compile: the pipeline's device clock leaves compiling out of the device's busy time.
    while_compiling: Callable[[], ContextManager[None]] = dataclasses.field(default=contextlib.nullcontext, repr=False)

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS and not (self.pooling is None and not self.config.is_encoder):
            raise ValueError(f"pooling {self.pooling!r} is not one of {', '.join(POOLINGS)}")
        # The programs receive each block parameter stacked on a leading layer axis (models/layers.py
        # StackedBlocks); load_model_dir stacks on the host, a model built otherwise is stacked here, once.
        graphdef, state = nnx.split(stack_blocks(self.model))
        if self.parallel is None:
            self.parallel = local_data_parallel()
        self._state = self.parallel.place(state)  # a no-op for parameters load_model_dir already placed
        # Every dot without its own precision (all of the model's) traces under this one: float32 means float32,
        # TF32 only when chosen (models/precision.py); the summary records the same function of the same choice.
        self.matmul_precision = matmul_precision(self.dtype, self.precision_choice)
        precise = lambda fn: self.parallel.traced(with_matmul_precision(fn, self.matmul_precision))

        self._functions: dict[str, Callable] = {
            "embed_packed": jax.jit(precise(functools.partial(embed_packed_program, graphdef, pooling=self.pooling)),
                                    static_argnums=3),
            "token_logprobs": jax.jit(precise(functools.partial(token_logprobs_program, graphdef))),
        }

    @property
    def compile_count(self) -> int:
        """Number of distinct (method, input shape) programs compiled so far."""
        return len(self._compiled)

    def compiles_by_this_thread(self) -> np.ndarray:
        """[count, seconds, of them read from the persistent cache: count, seconds] of the compiles the calling
        thread did (a caller's before/after difference is its own, however many threads share the model)."""
        return getattr(self._by_thread, "stats", np.zeros(4))

    def embed_packed(self, input_ids: np.ndarray, segment_ids: np.ndarray, max_segments: int) -> np.ndarray:
        """[B, L] packed rows -> [B, max_segments, D] float32: slot s = segment s + 1, zeros when absent; each
        embedding is its segment's tokens mean pooled, or its first or last token's hidden state (`pooling` "cls",
        "lasttoken"), L2-normalised (sentence-transformers). Needs a model that embeds: an encoder, or a decoder
        converted with its sentence-transformers pooling."""
        return self._run("embed_packed", input_ids, segment_ids, int(max_segments))

    def token_logprobs(self, input_ids: np.ndarray, segment_ids: np.ndarray) -> np.ndarray:
        """[B, L] -> [B, L] float32: at t, log p(input_ids[t+1] | tokens <= t of its segment); 0 where
        t+1 is padding or another segment."""
        return self._run("token_logprobs", input_ids, segment_ids)

    def _require(self, method: str) -> None:
        if method == "token_logprobs" and self.config.is_encoder:
            raise ValueError(f"token_logprobs() needs a decoder model, but {self.model_id} "
                             f"({self.config.model_type or self.config.family}) is an encoder; use embed_packed")
        if method == "token_logprobs" and self.config.bidirectional:
            raise ValueError(f"token_logprobs() needs a causal decoder, but {self.model_id} attends both ways (an "
                             "embedder); use embed_packed")
        if method == "token_logprobs" and not self.config.lm_head:
            raise ValueError(f"token_logprobs() needs a language-model head, but {self.model_id} is a decoder embedder "
                             "converted without one; use embed_packed")
        if method == "embed_packed" and self.pooling is None:
            raise ValueError(f"embed_packed() needs a model that embeds, but {self.model_id} ({self.config.family}) is "
                             "a decoder converted without a sentence-transformers pooling (a language model); use "
                             "token_logprobs")

    def start(self, method: str, input_ids: np.ndarray, segment_ids: np.ndarray, *static: int) -> jax.Array:
        """Dispatch `method` (embed_packed | token_logprobs) on the device and return at once
        (JAX runs it asynchronously; np.asarray of the result waits for it). The result may have extra
        padding rows past the input's (rows are padded to a multiple of the mesh's data axis), and
        its copy to the host starts as soon as it is computed."""
        self._require(method)
        if method == "embed_packed" and int(static[0]) < 1:
            raise ValueError(f"max_segments={static[0]} must be >= 1")
        (input_ids, segment_ids), _ = self.parallel.shard_rows(*self._checked(input_ids, segment_ids))
        key = (method, input_ids.shape, static)
        compiled = self._compiled.get(key)  # compiled programs run without waiting for another thread's compile
        if compiled is None:
            compiled = self._compile(key, method, input_ids, segment_ids, static)
        result = compiled(self._state, input_ids, segment_ids)
        result.copy_to_host_async()
        return result

    def _compile(self, key: tuple, method: str, input_ids: np.ndarray, segment_ids: np.ndarray, static: tuple):
        """The program for `key`, compiled once however many threads ask; waiting for another thread's compile
        is compiling too (while_compiling)."""
        with self.while_compiling(), self._lock:
            compiled = self._compiled.get(key)
            if compiled is None:
                start, hits = time.perf_counter(), PERSISTENT_CACHE_HITS.count
                compiled = self._functions[method].lower(self._state, input_ids, segment_ids, *static).compile()
                seconds = time.perf_counter() - start
                cached = PERSISTENT_CACHE_HITS.count > hits  # read from the persistent compilation cache
                self._by_thread.stats = self.compiles_by_this_thread() + (1, seconds, int(cached), seconds * cached)
                self._compiled[key] = compiled
        return compiled

    def _run(self, method: str, input_ids: np.ndarray, segment_ids: np.ndarray, *static: int) -> np.ndarray:
        return np.asarray(self.start(method, input_ids, segment_ids, *static), dtype=np.float32)[:len(input_ids)]

    def _checked(self, input_ids: np.ndarray, segment_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        input_ids, segment_ids = np.asarray(input_ids), np.asarray(segment_ids)
        if input_ids.ndim != 2 or input_ids.shape != segment_ids.shape:
            raise ValueError(f"input_ids and segment_ids must both be [batch, len]; got {input_ids.shape} "
                             f"and {segment_ids.shape}")
        if input_ids.size and (input_ids.min() < 0 or input_ids.max() >= self.config.vocab_size):
            raise ValueError(f"input_ids must be in [0, {self.config.vocab_size}) for {self.model_id}; got "
                             f"[{input_ids.min()}, {input_ids.max()}]")
        limit = self.config.max_positions  # a sliding window is a mask, not a cap on the segment
        if input_ids.shape[1] > limit:
            longest = longest_segment(segment_ids)
            if longest > limit:
                raise ValueError(f"a segment of {longest} tokens exceeds the {limit} positions of {self.model_id}; "
                                 f"window documents to <= {self.tokenizer.max_seq_len} tokens")
        return input_ids.astype(np.int32, copy=False), segment_ids.astype(np.int32, copy=False)


def longest_segment(segment_ids: np.ndarray) -> int:
    """Length of the longest run of one non-zero segment id in any row."""
    longest = 0
    for row in segment_ids:
        change = np.flatnonzero(np.diff(row)) + 1
        bounds = np.concatenate([[0], change, [len(row)]])
        for start, end in zip(bounds[:-1], bounds[1:]):
            if row[start] != 0:
                longest = max(longest, int(end - start))
    return longest


def load(name_or_path: str, *, attention: str = "auto", dtype: str = "float32",
         cache_dir: str | None = None, matmul_precision: str | None = None, max_seq_len: int | None = None) -> LoadedModel:
    """A built-in name (minilm-l6), a local model directory or a gs:// (any fsspec URL) model directory
    -> LoadedModel, its float32 dots at `matmul_precision` (--matmul_precision: None, float32 or tf32, GPU
    only), its kernel chosen for rows of `max_seq_len` tokens (a run's --max_seq_len; None: the model's). Raises
    ModelLoadError naming the path and problem; KernelUnsupportedError when `attention` cannot run here."""
    if dtype not in COMPUTE_DTYPES:
        raise ModelLoadError(f"dtype {dtype!r} is not supported; use one of {sorted(COMPUTE_DTYPES)}")
    # XLA compiles TF32 dots on GPUs only (XLA:CPU refuses the preset): refused here rather than at the first call.
    problem = choice_problem(dtype, matmul_precision, jax.default_backend())
    if problem:
        raise ModelLoadError(problem)
    path, name = local_model_dir(name_or_path, cache_dir)
    if name_or_path in BUILTINS:
        loaded_copy = os.stat(path).st_ino  # which copy this load reads: another process may replace it meanwhile
        try:
            return load_model_dir(path, attention=attention, dtype=dtype, name=name, precision_choice=matmul_precision,
                                  max_seq_len=max_seq_len)
        except DamagedModelDir as err:  # docscore's own copy (cut short by a full disk, another version's): made again
            log.warning("%s: docscore's copy of the built-in model %s cannot be used (%s); converting it again",
                        path, name, err)
            try:
                discard_copy(path, loaded_copy)
            except OSError:  # it cannot be moved aside (a read-only cache): the copy's own problem is the news
                raise err from None
            path, name = local_model_dir(name_or_path, cache_dir)
    elif is_remote(name_or_path):
        try:
            return load_model_dir(path, attention=attention, dtype=dtype, name=name, precision_choice=matmul_precision,
                                  max_seq_len=max_seq_len)
        except ModelLoadError as err:  # drop the bad copy so a fixed upload is fetched next time
            if not isinstance(err, MachineShortOf):  # nothing is wrong with the copy
                shutil.rmtree(path, ignore_errors=True)
            raise ModelLoadError(f"{name_or_path} (copied to {path}): {err}") from None
    return load_model_dir(path, attention=attention, dtype=dtype, name=name, precision_choice=matmul_precision,
                          max_seq_len=max_seq_len)


def local_model_dir(name_or_path: str, cache_dir: str | None = None) -> tuple[str, str]:
    """(local directory, model name) of a built-in name, a local model directory or a remote one (copied
    into the local cache directory once)."""
    cache_dir = local_cache_dir(cache_dir)
    if name_or_path in BUILTINS:
        return builtin_dir(name_or_path, cache_dir), name_or_path
    if is_remote(name_or_path):
        return fetch_remote(name_or_path, cache_dir), os.path.basename(name_or_path.rstrip("/"))
    path = name_or_path.removeprefix("file://")
    if not os.path.exists(path) and os.sep not in path:
        raise ModelLoadError(f"{name_or_path}: neither a built-in model ({', '.join(BUILTINS)}) nor an "
                             "existing model directory; make one with `docscore convert --hf SRC --out DIR`")
    return path, os.path.basename(os.path.abspath(path))


def load_tokenizer(name_or_path: str, *, cache_dir: str | None = None) -> DocTokenizer:
    """The model's tokenizer alone, without reading the weights: what a tokenizing worker needs."""
    path, _ = local_model_dir(name_or_path, cache_dir)
    metadata = read_metadata(path)
    return DocTokenizer.from_str(read_text(path, TOKENIZER), max_seq_len=metadata.max_seq_len,
                                 path=os.path.join(path, TOKENIZER), prompts=metadata.prompts)


def run_rows(max_seq_len: int | None, model_max: int) -> int:
    """The longest rows a run builds, which its kernel is chosen for: its --max_seq_len (None: the model's), never
    longer than the model takes (a longer one is refused: pipeline/validate.py check_task_and_windows)."""
    return min(max_seq_len or model_max, model_max)


def model_kernel(attention: str, config: ModelConfig, max_seq_len: int, dtype: str, backend: str | None = None,
                 instead_of: str | None = None, gpu: tuple[str, tuple[int, int]] | None = None) -> str:
    """The kernel `attention` means for this model's attention (heads, head_dim, causal, sliding window, soft cap,
    relative position bias; packed rows of up to max_seq_len tokens) on `backend` (default: this process's) and `gpu`
    (kernels.resolve). Raises KernelUnsupportedError (whose suggestions leave out `instead_of`)."""
    return kernels.resolve(attention, backend, instead_of=instead_of, gpu=gpu,
                           **model_shape_info(config, max_seq_len, dtype))


def model_shape_info(config: ModelConfig, max_seq_len: int, dtype: str) -> dict:
    """The kernels' shape info (kernels.SHAPE_KEYS) of this model's attention on the pipeline's packed rows of up to
    max_seq_len tokens."""
    return dict(heads=config.num_heads, kv_heads=config.kv_heads, head_dim=config.head_dim, dtype=dtype,
                causal=config.causal, has_segments=True, q_len=max_seq_len, kv_len=max_seq_len,
                window=config.sliding_window or None, soft_cap=config.attention_logit_cap or None,
                relative_bias=bool(config.relative_attention_buckets))


def load_model_dir(path: str, *, attention: str, dtype: str, name: str,
                   precision_choice: str | None = None, max_seq_len: int | None = None) -> LoadedModel:
    """Load and verify the local docscore model directory `path`. Every file is read and checked before the
    model is built: metadata.json and config.json are JSON of the right shape, every config size is within
    bounds and fits the parameter shapes the checkpoint stores (Orbax metadata, no array read), the tokenizer
    fits the vocabulary. The restored weights, config and tokenizer must then match metadata.json's
    fingerprint: a checksum against accidental damage, not a signature (models/checkpoint.py, fingerprint)."""
    metadata = read_metadata(path)
    config_path = os.path.join(path, CONFIG)
    config_text, tokenizer_text = read_text(path, CONFIG), read_text(path, TOKENIZER)
    config = read_config(config_path, config_text)
    if config.family != metadata.family:
        raise DamagedModelDir(f"{path}: metadata.json says {metadata.family} but config.json is "
                              f"{config.family}; re-create the directory with `docscore convert`")
    if metadata.max_seq_len > config.max_positions:
        raise DamagedModelDir(f"{os.path.join(path, 'metadata.json')}: max_seq_len {metadata.max_seq_len} exceeds the "
                              f"{config.max_positions} positions of {config_path} "
                              f"({hf_keys(config)['max_positions']}); re-create the directory with `docscore convert`")
    params_dir = os.path.join(path, PARAMS)
    if not os.path.isdir(params_dir):
        raise DamagedModelDir(f"{params_dir}: missing; {path} has no checkpoint (re-create it with "
                              "`docscore convert`)")
    stored = stored_shapes(params_dir)
    config = dataclasses.replace(config, dense=tuple(Dense(**spec) for spec in metadata.dense))
    config = with_checkpoint_head(config, "lm_head/kernel" in stored, metadata.pooling)
    check_config_fits_checkpoint(config, stored, config_path, params_dir)
    tokenizer = DocTokenizer.from_str(tokenizer_text, max_seq_len=metadata.max_seq_len,
                                      path=os.path.join(path, TOKENIZER), prompts=metadata.prompts)
    tokenizer.check_vocab(config.vocab_size, config_path)

    # the kernel is chosen for the run's rows, which a window may hide nothing in or auto's limits may judge
    # otherwise than the model's longest
    impl = model_kernel(attention, config, run_rows(max_seq_len, metadata.max_seq_len), dtype)
    graphdef, state = abstract_model(config, attention_impl=impl, dtype=dtype)  # per block, as the checkpoint
    try:  # before the checkpoint is read: a model that cannot fit is refused without filling the host's memory
        parallel = choose_layout(nnx.to_pure_dict(state))
    except ModelDoesNotFit as err:
        raise ModelLoadError(f"{path}: {err}") from None
    try:
        params = restore_params(params_dir, nnx.to_pure_dict(state))
    except Exception as err:  # Orbax/tensorstore raise many types for a damaged checkpoint
        if what := shortage(err):  # this process's limit, not the checkpoint's damage
            raise short_of(params_dir, err, what) from None
        raise DamagedModelDir(f"{params_dir}: corrupt or incomplete Orbax checkpoint ({type(err).__name__}: "
                              f"{str(err)[:300]}); re-create the directory with `docscore convert`") from None
    actual = fingerprint(params, config_text.encode(), tokenizer_text.encode())
    if actual != metadata.fingerprint:
        raise DamagedModelDir(f"{path}: content fingerprint {actual[:12]} does not match metadata.json "
                              f"({metadata.fingerprint[:12]}): the checkpoint, config or tokenizer changed after "
                              "`docscore convert` wrote them (the fingerprint is a checksum that catches accidental "
                              "damage, such as a truncated copy; it is not a signature and cannot detect deliberate "
                              "edits); re-create the directory with `docscore convert`")
    # The blocks' parameters stacked once, here on the host, into the layout the programs receive (models/layers.py
    # StackedBlocks); the checkpoint and the fingerprint above keep one entry per block.
    graphdef, state = stacked_abstract(graphdef, state)
    params = stack_params(params, nnx.to_pure_dict(state))
    nnx.replace_by_pure_dict(state, parallel.place(params))  # each device gets its share, never the whole model
    return LoadedModel(model=nnx.merge(graphdef, state), tokenizer=tokenizer, config=config,
                       fingerprint=metadata.fingerprint, model_id=f"{name}@{metadata.fingerprint[:12]}",
                       attention=impl, dtype=dtype, path=os.path.abspath(path), precision_choice=precision_choice,
                       parallel=parallel, pooling=metadata.pooling, include_prompt=metadata.include_prompt)


def check_config_fits_checkpoint(config: ModelConfig, stored: dict[str, tuple[tuple[int, ...], Any]],
                                 config_path: str, params_dir: str) -> None:
    """Raise ModelLoadError naming config.json's key when its sizes do not fit the parameters the checkpoint
    stores (`stored`: name -> (shape, dtype), checkpoint.stored_shapes). Compares the layer count first and
    then the model's shapes as two traced layers give them (every_param_shape), so even a config that asks for millions
    of layers costs nothing."""
    keys = hf_keys(config)
    fix = "(the config that belongs to these weights), or re-create the directory with `docscore convert`"
    layers = {name.split("/")[1] for name in stored if name.startswith("layers/")}
    if layers != {str(i) for i in range(config.num_layers)}:
        held = len(layers) if layers == {str(i) for i in range(len(layers))} else f"{len(layers)} (not numbered 0..n-1)"
        raise DamagedModelDir(f"{config_path}: {keys['num_layers']} is {config.num_layers} but the checkpoint "
                              f"{params_dir} holds {held} layers; set {keys['num_layers']} to {len(layers)} {fix}")
    expected = every_param_shape(config)
    missing, extra = sorted(set(expected) - set(stored)), sorted(set(stored) - set(expected))
    if missing or extra:
        raise DamagedModelDir(f"{params_dir}: the checkpoint's parameters are not those of the {config.family} model "
                              f"{config_path} describes (missing {missing[:3]}, unexpected {extra[:3]}); re-create the "
                              "directory with `docscore convert`")
    for name, spec in expected.items():
        shape, dtype = stored[name]
        want = tuple(int(n) for n in spec.shape)
        if shape == want and np.dtype(dtype) == np.dtype(spec.dtype):
            continue
        differing = [w for w, got in zip(want, shape) if w != got] if len(want) == len(shape) else []
        culprits = [key for field, key in keys.items() if field != "num_layers" and getattr(config, field) in differing]
        if not culprits:
            raise DamagedModelDir(f"{params_dir}: parameter {name} is {np.dtype(dtype)}{list(shape)} but {config_path} "
                                  f"needs {np.dtype(spec.dtype)}{list(want)}; re-create the directory with `docscore convert`")
        raise DamagedModelDir(f"{config_path}: {' / '.join(culprits)} does not fit the checkpoint: {params_dir} stores "
                              f"{name} as {list(shape)}, this config needs {list(want)}; set {' / '.join(culprits)} to the "
                              f"weights' value {fix}")
