"""Model inference inside Beam: FlaxModelHandler (a Beam ModelHandler) used through RunInference.

Holds the process-wide model cache and the handler that adapts docscore's model loop (windows packed into
fixed-shape rows by pipeline/stages/packing.py) to Beam. Batching, retries, dead letters
and latency metrics come from Beam. Must not score documents (pipeline/stages/scoring.py does).
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
import numpy as np


@contextlib.contextmanager
def torch_hidden() -> Iterator[None]:
    """Imports inside run as on docscore's runtime install, which has no torch: Beam 2.77 imports torch at
    the top of RunInference's optional model manager (docscore does not use it; Beam sets it to None when
    that import fails). Where torch is installed as well (a user's environment, the test venv) that import
    cost every command seconds and memory (benchmarks/PERF_NOTES.md). torch stays importable afterwards."""
    if "torch" in sys.modules:  # imported already (or hidden by an enclosing call): nothing to save
        yield
        return
    sys.modules["torch"] = None  # `import torch` raises ImportError while this entry is None
    try:
        yield
    finally:
        del sys.modules["torch"]


with torch_hidden():
    from apache_beam.ml.inference.base import ModelHandler, PredictionResult, RunInference  # noqa: E402

from pipeline import tasks
from pipeline.records import Batch
from pipeline.stages import batching, shadow
from pipeline.stages.packing import MIN_ROW_LEN, TAIL_CALL_FRACTION, run_model
from pipeline.stages.preprocess import TokenizedDoc, tokens_of
from pipeline.telemetry import device_time, memory, progress
from pipeline.process_setup import CpuTuning, apply_cpu_tuning
from pipeline.telemetry.profiling import profile_batch

# What RunInference turns into dead letters (one infer error row per document of the batch): the model
# rejected the batch's data, and a retry would fail again. Anything else (device or runtime errors, out
# of memory, a lost worker) propagates so that the runner retries the bundle; the retried bundle's
# outputs replace the failed attempt's, so every document still yields exactly one row.
RECORD_ERRORS = (ValueError, TypeError, IndexError, KeyError)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Which model a worker loads (hashable: the key of the process-wide cache)."""

    name: str
    attention: str = "auto"
    dtype: str = "float32"
    cache_dir: str | None = None
    matmul_precision: str | None = None  # --matmul_precision (models/precision.py)
    max_seq_len: int | None = None  # --max_seq_len (None: the model's): the rows its kernel is chosen for
    # --document_prompt / --query_prompt: (role, text) replacing the model's prompt of that role ("" none)
    prompts: tuple[tuple[str, str], ...] = ()


# Not Beam's shared.Shared (RunInference already holds load_model's result in one): it holds weakly, with one keep-alive
# per process, so models and their compiled shapes would be loaded again between the jobs of one process.
_MODELS: dict[ModelSpec, Any] = {}
_MODELS_LOCK = threading.Lock()


def shared_model(spec: ModelSpec):
    """models.load(...) once per process; every DoFn and thread of the process shares the result."""
    with _MODELS_LOCK:
        if spec not in _MODELS:
            import models

            apply_cpu_tuning(CpuTuning(dtype=spec.dtype, cache_dir=spec.cache_dir))  # before jax starts here
            _MODELS[spec] = models.load(spec.name, attention=spec.attention, dtype=spec.dtype, cache_dir=spec.cache_dir,
                                         matmul_precision=spec.matmul_precision, max_seq_len=spec.max_seq_len)
            _MODELS[spec].while_compiling = device_time.PROCESS_CLOCK.idle  # compiling is host time, not device time
            if spec.prompts:
                _MODELS[spec].tokenizer = _MODELS[spec].tokenizer.with_prompts(dict(spec.prompts))
        return _MODELS[spec]


@dataclasses.dataclass
class ShadowOutput:
    """The same document's outputs from the shadow kernel (--shadow_attention)."""

    window_outputs: list[np.ndarray]
    query_outputs: list[np.ndarray]
    attention_impl: str
    label_embeddings: np.ndarray | None = None


@dataclasses.dataclass
class InferenceOutput:
    """Per document: one model output per window (embedding [D] or next-token log-probs [len]) and
    the document's share of the batch's time and computed (padded) tokens."""

    window_outputs: list[np.ndarray]
    query_outputs: list[np.ndarray]
    infer_ms: float
    computed_tokens: float
    model_id: str
    attention_impl: str
    fingerprint: str
    backend: str
    label_names: tuple[str, ...] = ()
    label_embeddings: np.ndarray | None = None
    shadow: ShadowOutput | None = None  # set on the documents of shadowed batches


def embed_texts(loaded, texts: Sequence[str], *, max_len: int, batch_size: int, min_row_len: int = MIN_ROW_LEN,
                tail_fraction: int = TAIL_CALL_FRACTION, stride: int = 0, max_windows: int = 8) -> np.ndarray:
    """[len(texts), D] normalised embeddings (mean of windows) through the same fixed shapes (min_row_len and
    tail_fraction: run_model's); a long text is split into windows, and prompted, as documents are (stride,
    max_windows, the model's document prompt)."""
    from pipeline.stages.scoring import pool_windows

    encoded = loaded.tokenizer.encode_windows(list(texts), max_len=max_len, stride=stride, max_windows=max_windows,
                                              role="document")
    rows = [w for doc in encoded for w in doc.windows]
    outputs, _, _ = run_model(loaded, rows, max_len=max_len, batch_size=batch_size, min_row_len=min_row_len,
                              tail_fraction=tail_fraction)
    result, k = [], 0
    for doc in encoded:
        result.append(pool_windows(outputs[k : k + len(doc.windows)]))
        k += len(doc.windows)
    return np.stack(result)


def texts_embedder(loaded, call_shapes: dict[str, int], windows: tuple[int, int]) -> Callable[[list[str]], np.ndarray]:
    """texts -> their embeddings through `loaded` in calls of `call_shapes` (BatchSettings.call_shapes), a long text
    split into windows by (stride, max windows): what a task prepares at load (classify: its labels)."""
    stride, max_windows = windows
    return lambda texts: embed_texts(loaded, texts, stride=stride, max_windows=max_windows, **call_shapes)


@dataclasses.dataclass
class ScoringModel:
    """What load_model returns: the loaded model plus task state computed once per load."""

    loaded: Any
    backend: str
    label_names: tuple[str, ...] = ()
    label_embeddings: np.ndarray | None = None
    shadow_loaded: Any = None  # the same model with the --shadow_attention kernel
    shadow_label_embeddings: np.ndarray | None = None
    # what the task's prepare compiled at load ([count, seconds, cached count, cached seconds]); the first batch
    # adds it to the compile metrics (Beam records metrics while bundles run, not while a model loads)
    load_compiles: np.ndarray | None = None
    _take_lock: Any = dataclasses.field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def take_load_compiles(self) -> np.ndarray | None:
        """load_compiles to the first caller, None to every later one (a model's threads share it)."""
        with self._take_lock:
            taken, self.load_compiles = self.load_compiles, None
        return taken


def document_outputs(docs: Sequence[TokenizedDoc], outputs: Sequence[np.ndarray], timings: Sequence[Any],
                     model: ScoringModel, shadow_outputs: Sequence[np.ndarray] | None = None) -> list[InferenceOutput]:
    """run_model's per-window outputs and costs (each document's windows, then its query windows, in order) as
    one InferenceOutput per document, with its share of the batch's time and computed tokens, and the shadow
    kernel's outputs of the same windows where there are some."""
    loaded, per_doc, k = model.loaded, [], 0
    for doc in docs:
        n, q = len(doc.windows), len(doc.query_windows)
        share = timings[k : k + n + q]
        output = InferenceOutput(
            window_outputs=outputs[k : k + n],
            query_outputs=outputs[k + n : k + n + q],
            infer_ms=sum(t.ms_per_row for t in share),
            computed_tokens=sum(t.computed_tokens_per_row for t in share),
            model_id=loaded.model_id,
            attention_impl=loaded.attention,
            fingerprint=loaded.fingerprint,
            backend=model.backend,
            label_names=model.label_names,
            label_embeddings=model.label_embeddings,
        )
        if shadow_outputs is not None:
            output.shadow = ShadowOutput(
                window_outputs=shadow_outputs[k : k + n],
                query_outputs=shadow_outputs[k + n : k + n + q],
                attention_impl=model.shadow_loaded.attention,
                label_embeddings=model.shadow_label_embeddings,
            )
        per_doc.append(output)
        k += n + q
    return per_doc


class FlaxModelHandler(ModelHandler[list[TokenizedDoc], PredictionResult, ScoringModel]):
    """Beam ModelHandler for docscore models. An example is a list of TokenizedDocs (the pipeline moves
    documents in lists); its PredictionResult's inference is the list of their InferenceOutputs."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        task: str,
        max_len: int,
        batch_size: int,
        calls_per_beam_batch: int,
        kernel: str,
        min_row_len: int = MIN_ROW_LEN,  # graph.py passes the run's BatchSettings.shortest_row(max_len)
        tail_fraction: int = TAIL_CALL_FRACTION,  # graph.py passes the run's BatchSettings.tail_call_fraction
        labels: dict[str, str] | None = None,
        label_windows: tuple[int, int] = (0, 8),  # (stride, max windows) of a label description: the documents'
        shadow_spec: shadow.ShadowSpec | None = None,
        profile_dir: str | None = None,
        progress_dir: str | None = None,
    ):
        tokens = batching.beam_batch_tokens(batch_size, max_len, calls_per_beam_batch)
        super().__init__(min_batch_size=tokens, max_batch_size=tokens, element_size_fn=tokens_of)  # sizes count tokens
        self._spec = spec
        self._task = task
        # the shapes of this handler's model calls: every run_model call it makes (documents, labels, shadow) gets them
        self._call_shapes = {"max_len": max_len, "batch_size": batch_size, "min_row_len": min_row_len,
                             "tail_fraction": tail_fraction}
        self._kernel = kernel
        self._labels = dict(labels or {})
        self._label_windows = label_windows
        self._shadow = shadow_spec
        self._profile_dir = profile_dir
        self._progress_dir = progress_dir
        self._done: progress.RecordCounter | None = None  # made where it counts: one per worker copy of the handler
        self._memory = memory.MemoryWatch()

    def load_model(self) -> ScoringModel:
        import jax

        loaded = shared_model(self._spec)
        model = ScoringModel(loaded=loaded, backend=jax.default_backend())
        if self._shadow is not None:
            model.shadow_loaded = shared_model(dataclasses.replace(self._spec, attention=self._shadow.attention))
        task = tasks.get(self._task)
        compiles_before = loaded.compiles_by_this_thread()
        prepared = task.prepare(self._labels, self._embed_with(loaded))
        model.load_compiles = loaded.compiles_by_this_thread() - compiles_before
        model.label_names, model.label_embeddings = prepared.label_names, prepared.label_embeddings
        if model.shadow_loaded is not None and model.label_names:  # the labels through the shadow kernel too: scores
            # compare end to end. As they come out, unchecked: a label the shadow kernel embeds as NaN is its divergence,
            # which its documents' outputs and scores show and the gate judges, not a fault of --labels ending the run
            shadow_before = model.shadow_loaded.compiles_by_this_thread()
            embed = self._embed_with(model.shadow_loaded)
            model.shadow_label_embeddings = embed([self._labels[name] for name in model.label_names])
            model.load_compiles += model.shadow_loaded.compiles_by_this_thread() - shadow_before
        return model

    def _embed_with(self, loaded: Any) -> Callable[[list[str]], np.ndarray]:
        return texts_embedder(loaded, self._call_shapes, self._label_windows)

    def get_metrics_namespace(self) -> str:
        return f"docscore_inference_{self._kernel}"

    def get_num_bytes(self, batch: Sequence[list[TokenizedDoc]]) -> int:
        return int(sum(w.nbytes for docs in batch for doc in docs for w in doc.windows + doc.query_windows))

    def run_inference(
        self, batch: Sequence[list[TokenizedDoc]], model: ScoringModel, inference_args: dict[str, Any] | None = None
    ) -> Iterable[PredictionResult]:
        docs = [doc for chunk in batch for doc in chunk]
        if not docs:  # Beam's BatchElements hands over an empty batch before an element larger than its budget
            return []
        loaded = model.loaded
        rows = [w for doc in docs for w in doc.windows + doc.query_windows]
        compiles_before = loaded.compiles_by_this_thread()
        # --profile_dir: a trace of this process's first batches, the shadow kernel's calls included
        with profile_batch(self._profile_dir):
            t0 = time.perf_counter()
            with device_time.PROCESS_CLOCK.busy():
                outputs, timings, totals = run_model(
                    loaded, rows, **self._call_shapes, per_token=tasks.get(self._task).per_token,
                    on_call_read=self._count_finished(docs),
                )
            batch_ms = (time.perf_counter() - t0) * 1000.0
            self._done.flush()  # the batch's last counts show now, not at the next flush tick
            compiles = loaded.compiles_by_this_thread() - compiles_before
            at_load = model.take_load_compiles()
            shadow_before = model.shadow_loaded.compiles_by_this_thread() if model.shadow_loaded is not None else None
            try:
                shadow_outputs = self._run_shadow(docs, rows, model)
            finally:  # the batch ran and compiled even when the shadow kernel failed it (its rows become errors)
                if shadow_before is not None:
                    compiles = compiles + model.shadow_loaded.compiles_by_this_thread() - shadow_before
                self._record_metrics(totals, compiles if at_load is None else compiles + at_load, batch_ms)
        model_id = f"{loaded.model_id}/{loaded.attention}"  # RunInference's model id names the kernel
        per_doc = document_outputs(docs, outputs, timings, model, shadow_outputs)
        results, k = [], 0
        for chunk in batch:
            results.append(PredictionResult(example=chunk, inference=Batch(per_doc[k : k + len(chunk)]), model_id=model_id))
            k += len(chunk)
        return results

    def _count_finished(self, docs: Sequence[TokenizedDoc]) -> Callable[[list[int]], None]:
        """A run_model callback: each call's windows -> the documents whose last window it was, counted as
        done for the progress bar (so progress moves per model call, not per Beam batch)."""
        if self._done is None:
            self._done = progress.RecordCounter(self._progress_dir, "done")
        owner = [d for d, doc in enumerate(docs) for _ in range(len(doc.windows) + len(doc.query_windows))]
        left = [len(doc.windows) + len(doc.query_windows) for doc in docs]

        def call_read(windows: list[int]) -> None:
            finished = 0
            for w in windows:
                left[owner[w]] -= 1
                finished += left[owner[w]] == 0
            self._done.add(finished)

        return call_read

    def _run_shadow(self, batch: Sequence[TokenizedDoc], rows: list[np.ndarray],
                    model: ScoringModel) -> list[np.ndarray] | None:
        """The batch's rows through the shadow kernel as well, when --shadow_fraction chooses this batch. Its
        time is kept out of infer_ms (metrics: shadow_batches, shadow_batch_us, compiling left out as infer_ms
        leaves it out) but is device busy time like any model batch."""
        if self._shadow is None or not shadow.is_shadowed([d.doc.doc_id for d in batch], self._shadow.fraction):
            return None
        compiling_before = model.shadow_loaded.compiles_by_this_thread()[1]
        t0 = time.perf_counter()
        with device_time.PROCESS_CLOCK.busy():
            outputs, _, _ = run_model(model.shadow_loaded, rows, **self._call_shapes,
                                      per_token=tasks.get(self._task).per_token)
        seconds = time.perf_counter() - t0 - (model.shadow_loaded.compiles_by_this_thread()[1] - compiling_before)
        namespace = self.get_metrics_namespace()
        beam.metrics.Metrics.counter(namespace, "shadow_batches").inc()
        beam.metrics.Metrics.distribution(namespace, "shadow_batch_us").update(int(max(seconds, 0.0) * 1e6))
        return outputs

    def _record_metrics(self, totals: dict[str, float], compiles: np.ndarray, batch_ms: float) -> None:
        """compiles: the batch's difference of LoadedModel.compiles_by_this_thread."""
        namespace = self.get_metrics_namespace()
        beam.metrics.Metrics.counter(namespace, "model_calls").inc(int(totals["calls"]))
        beam.metrics.Metrics.counter(namespace, "computed_tokens").inc(int(totals["computed_tokens"]))
        beam.metrics.Metrics.counter(namespace, "real_tokens").inc(int(totals["real_tokens"]))
        beam.metrics.Metrics.distribution(namespace, "batch_us").update(int(batch_ms * 1000))
        beam.metrics.Metrics.counter("docscore", "device_busy_us").inc(int(device_time.PROCESS_CLOCK.take_new_seconds() * 1e6))
        count, seconds, cached, cached_seconds = compiles
        if count > 0:
            beam.metrics.Metrics.counter(namespace, "compiles").inc(int(count))
            beam.metrics.Metrics.counter(namespace, "compile_ms").inc(int(round(seconds * 1000)))
            beam.metrics.Metrics.counter(namespace, "compiles_cached").inc(int(cached))
            beam.metrics.Metrics.counter(namespace, "compile_cached_ms").inc(int(round(cached_seconds * 1000)))
        self._memory.record_batch()
