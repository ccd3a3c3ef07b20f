"""What a task is: the Task record every stage asks instead of branching on the task's name.

A task module builds one Task from the math in pipeline/stages/scoring.py; pipeline/tasks/__init__.py
lists them. Must not import the stages that ask it (inference, postprocess, stats, report): they import
this package, so the direction is stages -> tasks -> scoring.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from pipeline.records import Document


@dataclasses.dataclass(frozen=True)
class ModelKind:
    """The models a task can run (by models' config.family, and for embeddings the pooling the model was converted
    with) and why another cannot."""

    families: tuple[str, ...]
    refusal: str  # format fields: task, model, family (the model's actual family)
    pooled: bool = False  # also any model converted with an embedding pooling (a decoder embedder: Qwen3-Embedding)

    def accepts(self, family: str, pooling: str | None) -> bool:
        return family in self.families or (self.pooled and pooling is not None)

    def refuse(self, task: str, model: str, family: str) -> str:
        return self.refusal.format(task=task, model=model, family=family)


EMBEDDER = ModelKind(
    ("bert", "modernbert", "rotary_bert", "t5"),
    "--task={task} needs a model that embeds (an encoder: BERT family, ModernBERT, NomicBERT/GTE or T5; or a decoder converted from a "
    "sentence-transformers directory with its pooling, such as Qwen3-Embedding) but --model {model} is a {family} "
    "language model, converted without a pooling; use --task=loglik with it, or an encoder such as --model minilm-l6",
    pooled=True,
)
DECODER = ModelKind(
    ("gpt2", "llama"),
    "--task={task} needs a decoder (GPT-2 or Llama-family) model but --model {model} is {family}; "
    "pass a GPT-2 or Llama-family model directory (docscore convert --hf DIR --out DIR)",
)


class WindowOutputs(Protocol):
    """What a task scores one document from (pipeline.stages.postprocess.TaskInput: a document's InferenceOutput
    and what its task's tokenize said of its windows)."""

    window_outputs: list[np.ndarray]
    query_outputs: list[np.ndarray]
    label_names: tuple[str, ...]
    label_embeddings: np.ndarray | None
    spans: Any  # what the task's own tokenize said of the windows (TaskWindows.spans); None for the others
    truncated: bool  # --max_chunks cut the document: its last window is not its end


class ScoreSettings(Protocol):
    """The run's scoring settings (pipeline.stages.postprocess.ScoreSpec)."""

    temperature: float
    stride: int
    prefix_len: int
    suffix_len: int


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What a task computes once per model load (classify: the label descriptions' embeddings)."""

    label_names: tuple[str, ...] = ()
    label_embeddings: np.ndarray | None = None


class RecordError(ValueError):
    """A record the task cannot score (Task.tokenize): an error row of this snake_case error_type."""

    def __init__(self, error_type: str, message: str):
        super().__init__(message)
        self.error_type = error_type


@dataclasses.dataclass
class TaskWindows:
    """A document's model windows made by its task (Task.tokenize) and what its score needs to know of them."""

    windows: list[np.ndarray]
    n_tokens: int
    truncated: bool
    spans: Any = None


# (documents, the model's DocTokenizer, tokens per window) -> per document its windows or why it cannot be scored
TokenizeRecords = Callable[[Sequence[Document], Any, int], list["TaskWindows | RecordError"]]

EmbedTexts = Callable[[list[str]], np.ndarray]  # texts -> their pooled embeddings through the loaded model


@dataclasses.dataclass
class GoldTotals:
    """The run's task totals: `pairs` when the task gathers gold pairs, the sums when it sums."""

    documents: int
    pairs: list[tuple[Any, Any]]
    prediction_sum: float
    gold_sum: float


def prepare_nothing(labels: Mapping[str, str], embed: EmbedTexts) -> Prepared:
    return Prepared()


def prediction_none(fields: dict[str, Any], gold: Any) -> tuple[Any, Any]:
    return None, gold


def no_metrics(totals: GoldTotals) -> dict[str, Any]:
    return {}


GATHERS = ("nothing", "gold_pairs", "sums")
CHARTS = ("lengths", "scores", "labels")


@dataclasses.dataclass(frozen=True)
class Task:
    """One task: what it needs, what the model computes for it, how a document and a run are scored."""

    name: str
    model: ModelKind
    # a document's columns from its window outputs (gold_label too, for a task that reads its gold itself: choice)
    score: Callable[[WindowOutputs, ScoreSettings], dict[str, Any]]
    with_query: bool = False  # records carry a `query` field, embedded alongside the document
    per_token: bool = False  # the model returns per-token log-probs, not one embedding per window
    takes_labels: bool = False  # --labels: the classes documents are scored against
    numeric_gold: bool = False  # a record's `label` is a number (validate notices text ones)
    record_fields: tuple[str, ...] = ()  # fields every record needs besides the text (validate checks the first records)
    # a task whose record is several texts (choice: a context and its candidates) makes its own windows;
    # None: the text in windows of --max_seq_len overlapping by --stride (pipeline/stages/preprocess.py)
    tokenize: TokenizeRecords | None = None
    prepare: Callable[[Mapping[str, str], EmbedTexts], Prepared] = prepare_nothing
    # (the document's columns, its record's `label`) -> DocStats (prediction, gold)
    prediction: Callable[[dict[str, Any], Any], tuple[Any, Any]] = prediction_none
    gathers: str = "nothing"  # per document for the run: nothing, (prediction, gold) pairs with a gold, or sums
    metrics: Callable[[GoldTotals], dict[str, Any]] = no_metrics  # the summary's task_metrics
    chart: str = "lengths"  # the report's outcome chart: document lengths, a histogram, label counts
    chart_column: str = "score"  # chart="scores": the column histogrammed
    chart_axis: str = "score"  # chart="scores": its axis label

    @property
    def prompt_roles(self) -> tuple[str, ...]:
        """The model's prompts this task's texts take (models/tokenizer.py PROMPT_ROLES): an embedding task's
        documents the document prompt, similarity's queries the query prompt too; a per-token task none."""
        return () if self.per_token else ("document", "query") if self.with_query else ("document",)

    def __post_init__(self):
        if self.gathers not in GATHERS or self.chart not in CHARTS:
            raise ValueError(f"task {self.name}: gathers must be one of {GATHERS}, chart one of {CHARTS}")
