"""--task=choice: multiple-choice scoring as lm-evaluation-harness does it (decoder). A record's text
(--text_field) is the context, its `choices` the candidate continuations, its `label` (optional) the gold
index; each candidate's score is its log-likelihood given the context, and the run's accuracy compares
the chosen index with the gold one.

Tokens (lm-evaluation-harness's `_encode_pair`): trailing whitespace of the context moves to the front of
each candidate; the candidate's tokens are tokenize(context + candidate) after the first
len(tokenize(context)) tokens; the model reads the tokenizer's own leading special tokens (Llama's <s>,
none for GPT-2), the context's tokens, then the candidate's. A context too long for the window loses its
head (the special tokens stay), so that the candidate fits (truncated=True); a context over 64K characters is
tokenized only as far back as a window reaches (context_tail; n_tokens then counts that tail's tokens).
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.stages import long_text, scoring
from pipeline.tasks.base import DECODER, RecordError, Task, TaskWindows

CHOICES_FIELD = "choices"  # the record's candidate continuations: a non-empty list of strings
GOLD_FIELD = "label"  # the gold index, as for the other tasks' gold (`gold_label` in the scores table)


@dataclasses.dataclass(frozen=True)
class ChoiceSpans:
    """Per candidate (one window each, in order): its scored tokens and the UTF-8 bytes of its text; the gold."""

    tokens: tuple[int, ...]
    bytes: tuple[int, ...]
    gold: int | None
    # the first candidate whose window is the same tokens, as many of them its own (itself when none is): equal
    # candidates get one score, which the model, run on them in different rows of a batch, would give to the
    # last few float32 bits only
    same_as: tuple[int, ...] = ()


def check_choices(fields: dict[str, Any]) -> list[str]:
    choices = fields.get(CHOICES_FIELD)
    if choices is None:
        raise RecordError("missing_choices", f"--task=choice needs a `{CHOICES_FIELD}` field: a list of the candidate "
                                             "continuations")
    if not isinstance(choices, (list, tuple)) or not all(isinstance(c, str) for c in choices):
        raise RecordError("bad_choices", f"`{CHOICES_FIELD}` must be a list of strings, not {_kind(choices)}")
    if not choices:
        raise RecordError("empty_choices", f"`{CHOICES_FIELD}` is an empty list: there is nothing to choose from")
    for i, c in enumerate(choices):
        if not c.isascii():
            try:
                c.encode("utf-8")
            except UnicodeEncodeError:  # JSON allows a lone "\ud800" escape; no tokenizer or table takes it
                raise RecordError("invalid_unicode", f"choice {i} holds a lone surrogate (an unpaired \\ud800-\\udfff "
                                                     "escape), which is not valid Unicode text") from None
    return list(choices)


def _kind(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        bad = next(c for c in value if not isinstance(c, str))
        return f"a list holding a {type(bad).__name__}"
    return f"a {type(value).__name__}"


def gold_index(value: Any, n_choices: int) -> int | None:
    """The record's gold as an index into its choices: an integer or a string of digits (None: no gold)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):  # NaN: pandas' missing value, no gold
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise RecordError("bad_gold", f"`{GOLD_FIELD}` must be the index of the right choice, not a {type(value).__name__}")
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, float):
        if not (math.isfinite(text) and text.is_integer()):
            raise RecordError("bad_gold", f"`{GOLD_FIELD}`={value!r} is not an index of `{CHOICES_FIELD}`")
        text = int(text)
    if isinstance(text, str):
        if not re.fullmatch(r"-?[0-9]+", text):
            raise RecordError("bad_gold", f"`{GOLD_FIELD}`={value!r} is not an index of `{CHOICES_FIELD}` (0 is the first)")
        text = int(text)
    if not 0 <= text < n_choices:
        raise RecordError("gold_out_of_range", f"`{GOLD_FIELD}`={value!r} is out of range: the record has {n_choices} "
                                               f"choices, indexed 0 to {n_choices - 1}")
    return text


def split_pair(context: str, choice: str) -> tuple[str, str]:
    """lm-evaluation-harness's whitespace rule: the context's trailing whitespace belongs to the continuation,
    so that "Answer: " + "Paris" and "Answer:" + " Paris" are tokenized alike."""
    n = len(context) - len(context.rstrip())
    return (context[:-n], context[-n:] + choice) if n else (context, choice)


def context_tail(tokenizer, context: str, max_len: int) -> str:
    """The context, or for one over long_text.FULL_TOKENIZE_CHARS a tail of it, cut at whitespace where it can
    be, that yields NO_SPACE_SPARE_TOKENS tokens more than a window holds: only a window's worth of the context's
    end is read, and the cut changes at most the tail's first tokens. A 5 MB context then costs milliseconds,
    not seconds and gigabytes for each of its candidates. A context whose tail yields too few tokens even at
    MAX_PREFIX_CHARS_PER_TOKEN (one huge run the tokenizer merges) is tokenized whole: a cut inside such a run
    may change the tokens right before the candidate."""
    needed = max_len + long_text.NO_SPACE_SPARE_TOKENS
    chars = max(long_text.FULL_TOKENIZE_CHARS, needed * long_text.PREFIX_CHARS_PER_TOKEN)
    while chars < len(context) and chars <= needed * long_text.MAX_PREFIX_CHARS_PER_TOKEN:
        start = len(context) - chars
        tail = context[long_text.space_after(context, start) or start:]
        if len(tokenizer.encode_ids([tail])[0]) >= needed:
            return tail
        chars *= 4  # long words or unknown runs: fewer tokens a character than guessed
    return context


def tokenize(docs: Sequence, tokenizer, max_len: int) -> list[TaskWindows | RecordError]:
    """Each record's candidates as windows (prefix + the context's kept tail + the candidate's tokens), from
    one batch encode of every context and context + candidate."""
    texts: list[str] = []
    plans: list[tuple[list[str], int | None, bool] | RecordError] = []
    for doc in docs:
        try:
            choices = check_choices(doc.fields)
            gold = gold_index(doc.fields.get(GOLD_FIELD), len(choices))
        except RecordError as e:
            plans.append(e)
            continue
        whole = split_pair(doc.text, "")[0]
        context = context_tail(tokenizer, whole, max_len)
        plans.append((choices, gold, len(context) < len(whole)))
        texts += [context] + [context + split_pair(doc.text, c)[1] for c in choices]
    encoded = iter(tokenizer.encode_ids(texts))
    prefix = np.asarray(tokenizer.prefix, np.int32)
    results: list[TaskWindows | RecordError] = []
    for doc, plan in zip(docs, plans):
        if isinstance(plan, RecordError):
            results.append(plan)
            continue
        choices, gold, cut = plan
        context_ids = next(encoded)
        continuations = [next(encoded)[len(context_ids):] for _ in choices]
        try:
            windows = _windows(doc.text, choices, gold, prefix, context_ids, continuations, max_len)
            results.append(dataclasses.replace(windows, truncated=True) if cut else windows)
        except RecordError as e:
            results.append(e)
    return results


def _windows(context: str, choices: list[str], gold: int | None, prefix: np.ndarray, context_ids: np.ndarray,
             continuations: list[np.ndarray], max_len: int) -> TaskWindows:
    if len(prefix) + len(context_ids) == 0:
        raise RecordError("empty_text", "the context has no tokens (only whitespace, control, zero-width or combining "
                                        "characters), so nothing predicts the first token of a choice")
    windows, truncated = [], False
    for i, cont in enumerate(continuations):
        if len(cont) == 0:
            raise RecordError("empty_choice", f"choice {i} ({choices[i][:80]!r}) has no tokens of its own after the context")
        # at least one token must precede the continuation: it predicts the continuation's first token
        room = max_len - len(prefix) - len(cont)
        if room < (0 if len(prefix) else 1):
            before = f"the {len(prefix)} special tokens" if len(prefix) else "the context's last token"
            raise RecordError("choice_too_long", f"choice {i} has {len(cont)} tokens: after {before} it does not fit a "
                                                 f"window of {max_len} tokens (--max_seq_len)")
        keep = min(len(context_ids), room)
        truncated |= keep < len(context_ids)
        windows.append(np.concatenate([prefix, context_ids[len(context_ids) - keep:], cont]).astype(np.int32))
    first: dict[tuple[bytes, int], int] = {}
    spans = ChoiceSpans(tokens=tuple(len(c) for c in continuations),
                        bytes=tuple(len(split_pair(context, c)[1].encode("utf-8")) for c in choices),
                        gold=gold, same_as=tuple(first.setdefault((w.tobytes(), len(c)), i)
                                                 for i, (w, c) in enumerate(zip(windows, continuations))))
    return TaskWindows(windows=windows, n_tokens=len(context_ids) + sum(spans.tokens), truncated=truncated, spans=spans)


def score(outputs, settings):
    """Each candidate's log-likelihood (its tokens' log-probs summed), the index chosen by it (and per token, per
    byte), the chosen candidate's probability among the candidates (softmax of the log-likelihoods) as `score`."""
    spans: ChoiceSpans = outputs.spans
    logliks = scoring.continuation_logliks(outputs.window_outputs, spans.tokens)
    logliks = [logliks[j] for j in spans.same_as or range(len(logliks))]
    if not np.isfinite(logliks).any():  # softmax would be NaN and the choice the first candidate, by no measure
        raise ValueError(f"every candidate's log-likelihood is {logliks[0]}: the model gives each a probability of 0 "
                         "(a value overflowed inside it), so none can be chosen")
    per_token = [ll / n for ll, n in zip(logliks, spans.tokens)]
    per_byte = [ll / n for ll, n in zip(logliks, spans.bytes)]
    chosen = int(np.argmax(logliks))  # the first of equal scores, as lm-evaluation-harness
    return {
        "score": float(scoring.softmax(np.asarray(logliks, np.float64))[chosen]),
        "label": str(chosen),
        "gold_label": None if spans.gold is None else str(spans.gold),
        "scores": [{"label": str(i), "score": ll} for i, ll in enumerate(logliks)],
        "choice_tokens": list(spans.tokens),
        "choice_bytes": list(spans.bytes),
        "label_per_token": str(int(np.argmax(per_token))),
        "label_per_byte": str(int(np.argmax(per_byte))),
    }


def prediction(fields, gold):
    """(the chosen indexes: by log-likelihood, per token, per byte), the gold index; a record without gold has none."""
    return (fields["label"], fields["label_per_token"], fields["label_per_byte"]), fields.get("gold_label")


def metrics(totals):
    pairs = totals.pairs
    gold = [g for _, g in pairs]
    accuracy = {name: scoring.accuracy([p[k] for p, _ in pairs], gold)
                for k, name in enumerate(("accuracy", "accuracy_per_token", "accuracy_per_byte"))}
    return {"n_docs": totals.documents, "n_gold": len(gold), **accuracy}


TASK = Task(name="choice", model=DECODER, score=score, per_token=True, record_fields=(CHOICES_FIELD,), tokenize=tokenize,
            prediction=prediction, gathers="gold_pairs", metrics=metrics, chart="labels")
