"""`docscore report`: one self-contained HTML page about a finished run, with matplotlib charts.

Holds the loading of a run's files (summary.json, the scores and errors tables, progress.json),
one plain function per chart (returns PNG bytes, Agg canvas, no pyplot state) and the HTML page.
Must not compute run statistics the pipeline already recorded, nor write anywhere but report.html.
"""
from __future__ import annotations

import base64
import dataclasses
import html
import io
import posixpath
import sys
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pipeline import options, tasks
from pipeline.cli import SubcommandParser
from pipeline.io import run_commit, run_lease, sinks, sources
from pipeline.records import SCORES_SCHEMA
from pipeline.runs import history
from pipeline.runs.compare import bigquery_message, unreadable_file_message
from pipeline.runs.history import summary_value
from pipeline.telemetry import progress
from pipeline.telemetry.timing import STAGES

SHADOW_SCORE_COLUMNS = ("shadow_output_max_abs_diff", "shadow_score_abs_diff")  # null on documents not shadowed
SCORE_COLUMNS = ("task", "score", "label", "gold_label", "perplexity", "n_tokens") + tuple(f"{s}_ms" for s in STAGES) + SHADOW_SCORE_COLUMNS
ERROR_COLUMNS = ("source", "record_index", "stage", "error_type", "message")
ERRORS_LISTED = 20  # the report lists this many error rows; the table has them all
LEAST_CONFIDENT_LISTED = 10  # classify: the report lists this many documents with the lowest top probability
LEAST_CONFIDENT_COLUMNS = ("doc_id", "label", "score", "gold_label")
STAGE_COLORS = {"read": "#4c72b0", "tokenize": "#55a868", "infer": "#c44e52", "postprocess": "#8172b2"}


class ReportError(Exception):
    """The run's files cannot be found or read; the message says which and what to pass instead."""


@dataclasses.dataclass
class RunData:
    """What one report shows, loaded from the run's files."""

    output_dir: str
    run_id: str
    summary: dict[str, Any]
    scores: pa.Table | None  # SCORE_COLUMNS only (no embeddings); None when the table is not readable here
    errors: pa.Table | None  # ERROR_COLUMNS only
    samples: list[progress.ProgressSample]
    least_confident: pa.Table | None = None  # classify: LEAST_CONFIDENT_COLUMNS of the lowest-score rows, lowest first


# ---- finding and loading a run ------------------------------------------------------------------


def locate_run(path: str, run_id: str | None = None) -> tuple[str, str]:
    """RUN_DIR argument -> (output DIR, run_id).

    Accepts what compare accepts as a run (run_commit.named_run: one of the run's partitions, its summary.json or
    report.html, the paths `docscore run` prints at its end), or the output DIR with run_id given,
    or the output DIR alone (then the run that finished last; a damaged summary.json of another run is
    skipped, named on stderr).
    """
    if path.startswith(sinks.BQ_PREFIX):
        raise ReportError(bigquery_message(path, "report"))
    if not path.strip():
        raise ReportError("no run given (an empty argument): pass the output DIR, a run's folder or its summary.json")
    if run_id is not None and not run_id.strip():  # `--run_id "$RUN"` with RUN unset: not "the run that finished last"
        raise ReportError(f"--run_id={run_id!r} is empty (an unset variable?); pass the run's id, or leave --run_id out "
                          "for the run that finished last")
    path = path.rstrip("/") or "/"
    named = run_commit.named_run(path)
    if named:
        if run_id and run_id != named[1]:
            raise ReportError(f"{path} is run {named[1]!r} but --run_id says {run_id!r}; pass one of them")
        return named
    if run_id:
        if not run_commit.safe_run_id(run_id):
            raise ReportError(f"--run_id={run_id!r} is not a run_id docscore writes (letters, digits, '.', '_' or '-', starting with a letter or digit; "
                              "no '/', no '..'); pass the run's id")
        return path, run_id
    fs, fs_path = fsspec.core.url_to_fs(path)
    summaries = run_commit.summary_files(fs, fs_path)
    if not summaries:
        raise ReportError(
            f"no finished run under {path}: expected {path}/runs/run_id=ID/{run_commit.SUMMARY_FILE}; pass the --output "
            f"directory of a `docscore run` that finished, or the run's directory DIR/runs/run_id=ID"
        )
    finished = []
    for summary_file in summaries:
        try:
            summary = run_commit.read_summary(fs, summary_file)
        except ValueError as e:  # one damaged run must not hide every other run under DIR
            shown = posixpath.join(path, posixpath.relpath(summary_file, fs_path))
            print(f"docscore report: skipped {shown}: damaged ({type(e).__name__}: {str(e)[:200]})", file=sys.stderr)
            continue
        if run_commit.safe_run_id(summary.get("run_id")):  # a summary.json docscore did not write names no run
            finished.append((str(summary.get("finished_at") or ""), summary["run_id"]))
    if not finished:
        raise ReportError(f"no run under {path} has a summary.json with a run_id docscore writes; pass the run's "
                          "directory DIR/runs/run_id=ID")
    return path, max(finished)[1]


def load_run(output_dir: str, run_id: str) -> RunData:
    shown = run_commit.summary_path(output_dir, run_id)
    try:
        summary = run_commit.committed_summary(output_dir, run_id)
    except run_commit.DamagedSummary as e:
        raise ReportError(str(e)) from None
    if summary is None:
        writing = run_lease.writer(output_dir, run_id)
        if writing:
            raise ReportError(f"run {run_id!r} under {output_dir} is being written by {writing} and has no committed "
                              f"{run_commit.SUMMARY_FILE} yet; that launch writes its report when it finishes")
        raise ReportError(
            f"{shown} does not exist: run {run_id!r} did not finish or is not "
            f"under {output_dir}; check --run_id and the output directory (`ls {output_dir}/runs`)"
        )
    classify = chart_of(summary_value(summary, history.DESCRIPTION["task"])) == "labels"
    try:
        return RunData(
            output_dir=output_dir,
            run_id=run_id,
            summary=summary,
            scores=read_table(output_dir, "scores", run_id, SCORE_COLUMNS),
            errors=read_table(output_dir, "errors", run_id, ERROR_COLUMNS),
            samples=progress.read_samples(progress.samples_path(output_dir, run_id), summary.get(run_commit.LAUNCH_KEY)),
            least_confident=lowest_scores(output_dir, run_id, LEAST_CONFIDENT_LISTED) if classify else None,
        )
    except (OSError, ValueError, pa.ArrowException) as e:  # a file the summary names, gone or damaged since
        if sources.is_transient(e):
            raise  # not the file's fault: main names the store
        raise ReportError(unreadable_file_message(output_dir, run_id, e)) from None


def read_table(output_dir: str, table: str, run_id: str, columns: tuple[str, ...]) -> pa.Table | None:
    """The named columns of DIR/<table>/run_id=ID (parquet or jsonl parts), typed as the table's schema
    (pipeline/records.py); a table without rows (no parts, or empty parts: a jsonl run without errors)
    reads as zero rows of those columns. None for tables kept elsewhere (bq:)."""
    if output_dir.startswith(sinks.BQ_PREFIX):
        return None
    fs, parts = _table_parts(output_dir, table, run_id)
    return sinks.read_parts(fs, parts, columns, sinks.TABLES[table])


def _table_parts(output_dir: str, table: str, run_id: str) -> tuple[Any, list[str]]:
    """The filesystem and the committed files of the run's `table` (pipeline/io/run_commit.py), in name order."""
    fs, _ = fsspec.core.url_to_fs(output_dir)
    return fs, [run_commit.fs_path(f) for f in run_commit.committed_files(output_dir, run_id, table)]


def lowest_scores(output_dir: str, run_id: str, k: int) -> pa.Table | None:
    """The k scored rows with the lowest score (classify: the predicted label's probability; ties by doc_id),
    LEAST_CONFIDENT_COLUMNS only, lowest first. The scores table is scanned a record batch at a time keeping
    only the k lowest so far, so memory stays bounded by one batch whatever the table's size. None for
    tables kept elsewhere (bq:)."""
    if output_dir.startswith(sinks.BQ_PREFIX):
        return None
    typed = pa.schema([SCORES_SCHEMA.field(c).with_nullable(True) for c in LEAST_CONFIDENT_COLUMNS])
    fs, parts = _table_parts(output_dir, "scores", run_id)
    order = [("score", "ascending"), ("doc_id", "ascending")]
    kept = typed.empty_table()
    for batch in sinks.iter_parts(fs, parts, typed):
        rows = sinks.conform(pa.Table.from_batches([batch]), typed)
        rows = rows.filter(pc.is_valid(rows["score"]))
        candidates = pa.concat_tables([kept, rows])
        kept = candidates.take(pc.sort_indices(candidates, sort_keys=order)[:k])
    return kept


# ---- charts: each returns PNG bytes, or None when the run recorded nothing to draw -------------


# Margins in inches (left, right, bottom, top) for charts whose labels are known in advance. Charts whose
# labels come from the data (error types, class labels, the shadow pair) use constrained layout instead,
# which measures every label and so slows the report's render (benchmarks/README.md, "A cheaper report").
FIXED_MARGINS = (1.0, 0.3, 0.75, 0.4)
TWIN_AXIS_MARGINS = (1.0, 1.0, 0.75, 0.4)  # room for a right-hand y axis label


def _figure(width: float = 6.4, height: float = 3.6, margins: tuple[float, float, float, float] | None = FIXED_MARGINS) -> Figure:
    """A figure with fixed margins in inches, or constrained layout (margins=None)."""
    fig = Figure(figsize=(width, height), dpi=100, layout=None if margins else "constrained")
    if margins:
        left, right, bottom, top = margins
        fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height)
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():  # a label in a script the font lacks (CJK, emoji) is drawn as boxes, not a warning each
        warnings.filterwarnings("ignore", message="Glyph .* missing from font", category=UserWarning)
        fig.savefig(buffer, format="png")
    return buffer.getvalue()


def stage_time_chart(summary: dict[str, Any]) -> bytes | None:
    """Total time per stage (summed over documents), as recorded in the summary."""
    totals = {s: history.stage_stats(summary, s).get("total_ms") for s in STAGES}
    totals = {s: v / 1000.0 for s, v in totals.items() if v is not None}
    if not totals:
        return None
    fig = _figure(height=3.0)
    ax = fig.add_subplot()
    names = list(totals)[::-1]
    values = [totals[n] for n in names]
    bars = ax.barh(names, values, color=[STAGE_COLORS.get(n, "gray") for n in names])
    whole = sum(values) or 1.0
    ax.bar_label(bars, labels=[f"{v:.3g} s ({100 * v / whole:.0f}%)" for v in values], padding=3)
    # batches that ran at once (parallel bundles) are each counted in full: the sum can pass the run's wall time
    ax.set_xlabel("seconds, summed over documents\n(infer: each document's share of its batch; batches run at once "
                  "add up: device.busy_s is the time the model ran)")
    ax.set_xlim(0, max(values) * 1.3 or 1.0)
    ax.set_title("Time per stage")
    return _png(fig)


def stage_latency_chart(scores: pa.Table | None, summary: dict[str, Any]) -> bytes | None:
    """Per-document latency of each stage (box: quartiles, whiskers: 5th-95th percentile), log scale."""
    if scores is None or scores.num_rows == 0:
        return None
    present = [s for s in STAGES if f"{s}_ms" in scores.schema.names]
    if not present:
        return None
    data = [np.clip(scores[f"{s}_ms"].to_numpy(zero_copy_only=False).astype(float), 1e-3, None) for s in present]
    fig = _figure(height=3.2)
    ax = fig.add_subplot()
    box = ax.boxplot(data, orientation="horizontal", whis=(5, 95), tick_labels=present, patch_artist=True, showfliers=False)
    for patch, stage in zip(box["boxes"], present):
        patch.set_facecolor(STAGE_COLORS.get(stage, "gray"))
        patch.set_alpha(0.6)
    for i, stage in enumerate(present, start=1):
        p99 = history.stage_stats(summary, stage).get("p99")
        if p99:
            ax.plot([max(p99, 1e-3)], [i], marker="|", markersize=14, color="black")
    ax.set_xscale("log")
    ax.set_xlabel("milliseconds per document (log scale; black tick: p99 from the summary)")
    ax.set_title("Per-stage latency distribution")
    return _png(fig)


def throughput_chart(samples: list[progress.ProgressSample]) -> bytes | None:
    """Records finished (scored or error rows) over the run and the rate between samples (from the progress reporter)."""
    if len(samples) < 2:
        return None
    t = np.array([s.t_s for s in samples])
    done = np.array([s.done for s in samples], dtype=float)
    discovered = np.array([s.discovered for s in samples], dtype=float)
    fig = _figure(margins=TWIN_AXIS_MARGINS)
    ax = fig.add_subplot()
    ax.plot(t, done, color="#c44e52", label="records done")
    ax.plot(t, discovered, color="#4c72b0", linestyle="--", label="records discovered")
    ax.set_xlabel("seconds since the pipeline started")
    ax.set_ylabel("records")
    rate_ax = ax.twinx()
    dt = np.diff(t)
    rate = np.divide(np.diff(done), dt, out=np.zeros_like(dt), where=dt > 0)
    rate_ax.step(t[1:], rate, where="pre", color="#55a868", alpha=0.8, label="records/s")
    rate_ax.set_ylabel("records / s")
    rate_ax.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()
    rate_lines = rate_ax.get_legend_handles_labels()
    ax.legend(lines[0] + rate_lines[0], lines[1] + rate_lines[1], loc="upper left", fontsize="small")
    ax.set_title("Throughput over the run")
    return _png(fig)


def chart_of(task: str | None) -> str:
    """The task's outcome chart (Task.chart); a run of a task no longer registered gets document lengths."""
    return tasks.TASKS[task].chart if task in tasks.TASKS else "lengths"


CHART_TEXT_CHARS = 40  # a class label on an axis: longer ones are cut (the tables below show them whole)


def chart_text(value: Any) -> str:
    """Text from the data as matplotlib shows it literally: `$` would start mathtext (a label such as
    `$\\foo{$` failed the whole report), a label of thousands of characters collapses the axes, and control
    characters (an escape sequence) reached the terminal in matplotlib's missing-glyph warnings."""
    text = "".join(c if c.isprintable() else "\ufffd" for c in str(value))  # control characters from the data
    if len(text) > CHART_TEXT_CHARS:
        text = text[: CHART_TEXT_CHARS - 1] + "\u2026"
    return text.replace("$", r"\$")


@dataclasses.dataclass(frozen=True)
class LabelCounts:
    labels: list[str]
    predicted: list[int]
    gold: list[int]  # empty when no record has a gold label
    counted: int  # records behind the bars: those with a gold label when some have one, else every labelled one
    scored: int


def label_counts(scores: pa.Table) -> LabelCounts:
    """Predicted and gold counts per label over the same records: with gold labels, only the records that have
    one (predicted bars over every record beside gold bars over some would read as over-prediction). At most
    SHOWN_LABELS labels, the most frequent; the rest are one bar, other_labels(n)."""
    predicted = scores["label"].to_pylist()
    gold = scores["gold_label"].to_pylist() if "gold_label" in scores.schema.names else [None] * len(predicted)
    pairs = [(p, g) for p, g in zip(predicted, gold) if p is not None and g is not None]
    if pairs:
        predicted, gold = [p for p, _ in pairs], [g for _, g in pairs]
    else:
        predicted, gold = [p for p in predicted if p is not None], []
    shown, fold = shown_labels(Counter(predicted) + Counter(gold))
    predicted_by, gold_by = Counter(map(fold, predicted)), Counter(map(fold, gold))
    return LabelCounts(shown, [predicted_by[l] for l in shown], [gold_by[l] for l in shown] if gold else [],
                       len(predicted), scores.num_rows)


SHOWN_LABELS = 25  # labels a chart or confusion matrix shows one by one (gold labels from the data can be thousands)


def other_labels(n: int) -> str:
    return f"({n} other labels)"


def shown_labels(frequency: Counter) -> tuple[list[str], Callable[[str], str]]:
    """The labels to show, sorted (every one, or the SHOWN_LABELS - 1 most frequent and other_labels(n) last), and
    the function mapping a label to the one it is shown as."""
    kept = {label for label, _ in sorted(frequency.items(), key=lambda kv: (-kv[1], kv[0]))[: SHOWN_LABELS - 1]}
    if len(frequency) <= SHOWN_LABELS:
        return sorted(frequency), lambda label: label
    other = other_labels(len(frequency) - len(kept))
    return sorted(kept) + [other], lambda label: label if label in kept else other


def outcome_chart(scores: pa.Table | None, task: str | None) -> tuple[bytes | None, str]:
    """The task's chart (Task.chart): labels (classify, choice): predicted (and gold) label counts; scores
    (similarity, loglik): a histogram of its chart_column; lengths (embed): tokens per document."""
    if scores is None or scores.num_rows == 0:
        return None, "Scores"
    chart = chart_of(task)
    fig = _figure(margins=None if chart == "labels" else FIXED_MARGINS)  # class labels come from the data
    ax = fig.add_subplot()
    names = scores.schema.names
    if chart == "labels" and "label" in names:
        counts = label_counts(scores)
        x = np.arange(len(counts.labels))
        width = 0.4 if counts.gold else 0.8
        ax.bar(x - (width / 2 if counts.gold else 0), counts.predicted, width, label="predicted", color="#4c72b0")
        if counts.gold:
            ax.bar(x + width / 2, counts.gold, width, label="gold", color="#dd8452")
        ax.set_xticks(x, [chart_text(label) for label in counts.labels], rotation=30, ha="right")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("records")
        ax.legend(fontsize="small")
        title = "Label distribution"
        if counts.gold and counts.counted < counts.scored:
            ax.set_title(f"the {counts.counted} of {counts.scored} records with a gold label", fontsize="small", loc="right")
    elif chart == "scores" and "score" in names:
        spec = tasks.TASKS[task]
        column = spec.chart_column if spec.chart_column in names else "score"
        values = np.array([v for v in scores[column].to_pylist() if v is not None], dtype=float)
        outside = int((~np.isfinite(values)).sum())  # an inf perplexity, a NaN score: no bin holds them
        values = values[np.isfinite(values)]
        if values.size == 0:
            return None, "Scores"
        ax.hist(values, bins=min(40, max(5, values.size // 3)), color="#4c72b0")
        ax.set_xlabel(spec.chart_axis if column == spec.chart_column else "score")
        ax.set_ylabel("records")
        if outside:
            ax.set_title(f"{outside} record(s) not finite (inf or NaN), not drawn", fontsize="small", loc="right")
        title = "Perplexity histogram" if column == "perplexity" else "Score histogram"
    else:
        values = np.array(scores["n_tokens"].to_pylist(), dtype=float)
        ax.hist(values, bins=min(40, max(5, values.size // 3)), color="#4c72b0")
        ax.set_xlabel("tokens per document (embed has no score)")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("records")
        title = "Document length"
    ax.set_title(title, loc="left" if ax.get_title(loc="right") else "center")
    return _png(fig), title


def errors_chart(summary: dict[str, Any]) -> bytes | None:
    """Error rows by stage/error_type, as counted in the pipeline."""
    by_type = summary_value(summary, history.ERRORS_BY_TYPE) or {}
    if not by_type:
        return None
    items = sorted(by_type.items(), key=lambda kv: kv[1])
    fig = _figure(height=max(2.2, 0.45 * len(items) + 1.2), margins=None)  # error types come from the data
    ax = fig.add_subplot()
    bars = ax.barh([k for k, _ in items], [v for _, v in items], color="#c44e52")
    ax.bar_label(bars, padding=3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("error rows")
    ax.set_xlim(0, max(v for _, v in items) * 1.2)
    ax.set_title("Errors by stage / type")
    return _png(fig)


def shadow_chart(scores: pa.Table | None, tolerance: float | None) -> bytes | None:
    """Per shadowed document: max |output difference| and |score difference| between the two kernels."""
    if scores is None or not all(c in scores.schema.names for c in SHADOW_SCORE_COLUMNS):
        return None
    columns = {c: np.array([v for v in scores[c].to_pylist() if v is not None], dtype=float) for c in SHADOW_SCORE_COLUMNS}
    if columns["shadow_output_max_abs_diff"].size == 0:
        return None
    floor = 1e-12  # identical results (difference 0) are drawn here on the log scale
    fig = _figure(width=9.0, height=3.2, margins=None)
    titles = {"shadow_output_max_abs_diff": "max |model output difference|", "shadow_score_abs_diff": "|score difference|"}
    for i, (column, values) in enumerate(columns.items(), start=1):
        ax = fig.add_subplot(1, 2, i)
        values = np.clip(values[~np.isnan(values)], floor, None)
        if values.size:
            bins = np.logspace(np.log10(values.min()) - 0.5, np.log10(values.max()) + 0.5, 25)
            ax.hist(values, bins=bins, color="#8172b2")
        if tolerance and column == "shadow_output_max_abs_diff":
            ax.axvline(tolerance, color="#c44e52", linestyle="--", label=f"tolerance {tolerance:g}")
            ax.legend(fontsize="small")
        ax.set_xscale("log")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(titles[column] + " per document")
        ax.set_ylabel("records")
    fig.suptitle("Shadow kernel divergence")
    return _png(fig)


def shadow_section(run: RunData) -> str:
    section = summary_value(run.summary, history.SHADOW)
    if not isinstance(section, dict):
        return ""
    verdict = {True: "PASSED", False: "FAILED"}.get(section.get("passed"), "NOT RUN")
    outcome = (f"{_fmt(section.get('documents_over_tolerance'))} of {_fmt(section.get('documents'))} shadowed documents "
               "over tolerance") if section.get("documents") else "no document was shadowed, so nothing was compared"
    facts = [
        ("verdict", f"{verdict}: {outcome}"),
        ("kernels", f"{_fmt(summary_value(run.summary, 'kernel.resolved'))} (primary) vs {_fmt(section.get('impl'))} (shadow)"),
        ("fraction of batches", section.get("fraction")),
        ("tolerance", f"{_fmt(section.get('tolerance'))} ({_fmt(section.get('dtype'))}; relative to max(1, |output|))"),
        ("output max / mean |diff|", f"{_fmt(section.get('output_max_abs_diff'))} / {_fmt(section.get('output_mean_abs_diff'))}"),
        ("score max / mean |diff|", f"{_fmt(section.get('score_max_abs_diff'))} / {_fmt(section.get('score_mean_abs_diff'))}"),
        ("worst / tolerance", section.get("worst_ratio_to_tolerance")),
        ("label flips", section.get("label_flips")),
        ("shadow cost", f"{_fmt(section.get('batches'))} batches, {_fmt(section.get('time_ms'))} ms (not in infer_ms)"),
    ]
    chart = _figure_html(shadow_chart(run.scores, section.get("tolerance")), "Shadow kernel divergence",
                         "no shadowed document in the scores table")
    css = verdict.lower().replace(" ", "")
    return f"<h2 class='{css}'>Shadow kernel: {verdict}</h2>{_table(facts)}<div class='wide'>{chart}</div>"


# ---- classify: how the predictions meet the gold labels ------------------------------------------


def confusion_counts(scores: pa.Table | None) -> tuple[list[str], dict[tuple[str, str], int], str | None]:
    """(labels, {(gold, predicted): documents}) over the scored rows that carry a gold label; labels are every
    gold or predicted label among them, sorted, or past SHOWN_LABELS the most frequent and one other_labels(n),
    which stands for the rest in the counts too (a matrix of every label grew as their square: 305 MB of HTML
    for 4,000 free-text gold labels), and that label (None when every label is shown). Empty when no row has a
    gold label."""
    if scores is None or not {"label", "gold_label"} <= set(scores.schema.names):
        return [], {}, None
    pairs = scores.select(["gold_label", "label"]).filter(pc.is_valid(scores["gold_label"]))
    grouped = pairs.group_by(["gold_label", "label"]).aggregate([([], "count_all")])
    by_pair = {(row["gold_label"], row["label"]): row["count_all"] for row in grouped.to_pylist()}
    frequency: Counter = Counter()
    for (gold, predicted), n in by_pair.items():
        frequency[gold] += n
        if predicted is not None:
            frequency[predicted] += n
    labels, fold = shown_labels(frequency)
    counts: Counter = Counter()
    for (gold, predicted), n in by_pair.items():
        counts[(fold(gold), None if predicted is None else fold(predicted))] += n
    folded = labels[-1] if len(frequency) > len(labels) else None
    return labels, dict(counts), folded


def per_class_rates(labels: list[str], counts: dict[tuple[str, str], int]) -> list[dict[str, Any]]:
    """Per label: precision (of the documents predicted as it, how many are it), recall (of the documents that
    are it, how many were predicted as it) and support (documents whose gold label it is); None where the
    denominator is 0."""
    rows = []
    for label in labels:
        hits = counts.get((label, label), 0)
        predicted = sum(n for (_, p), n in counts.items() if p == label)
        support = sum(n for (g, _), n in counts.items() if g == label)
        rows.append({"label": label, "precision": hits / predicted if predicted else None,
                     "recall": hits / support if support else None, "support": support, "predicted": predicted})
    return rows


def classification_section(run: RunData) -> str:
    """classify with gold labels: the confusion matrix and per-class precision / recall."""
    if chart_of(summary_value(run.summary, history.DESCRIPTION["task"])) != "labels":
        return ""
    labels, counts, folded = confusion_counts(run.scores)
    if not labels:
        return "<h2>Confusion matrix</h2><p class='note'>no scored document has a gold label</p>"
    head = "<tr><th>gold \\ predicted</th>" + "".join(f"<th>{html.escape(p)}</th>" for p in labels) + "</tr>"
    body = "".join(
        f"<tr><th>{html.escape(g)}</th>" + "".join(
            f"<td class='{'hit' if g == p != folded else 'miss' if counts.get((g, p)) else ''}'>{counts.get((g, p), 0)}</td>"
            for p in labels) + "</tr>"
        for g in labels)
    rates = per_class_rates([label for label in labels if label != folded], counts)
    rate_head = "<tr><th>label</th><th>precision</th><th>recall</th><th>support (gold)</th><th>predicted</th></tr>"
    rate_body = "".join(
        f"<tr><th>{html.escape(r['label'])}</th>" + "".join(
            f"<td>{html.escape(_fmt(r[k]))}</td>" for k in ("precision", "recall", "support", "predicted")) + "</tr>"
        for r in rates)
    n = sum(counts.values())
    shown = (f"; the {len(labels) - 1} most frequent labels one by one, the others together as "
             f"{html.escape(folded)}") if folded else ""
    return (f"<h2>Confusion matrix</h2><p class='note'>{n} scored documents with a gold label; rows: gold label, "
            f"columns: predicted label{shown}</p><table class='grid confusion'>{head}{body}</table>"
            f"<h2>Per-class precision and recall</h2><table class='grid per-class'>{rate_head}{rate_body}</table>")


def least_confident_section(run: RunData) -> str:
    """classify: the documents whose predicted label had the lowest probability."""
    rows = run.least_confident
    if rows is None or rows.num_rows == 0:
        return ""
    columns = {"doc_id": "doc_id", "label": "predicted label", "score": "score (probability)", "gold_label": "gold label"}
    head = "".join(f"<th>{html.escape(name)}</th>" for name in columns.values())
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(row[c]))}</td>" for c in columns) + "</tr>"
                   for row in rows.to_pylist())
    return (f"<h2>Lowest-confidence documents</h2><p class='note'>the {rows.num_rows} scored documents whose predicted "
            f"label had the lowest probability</p><table class='grid least-confident'><tr>{head}</tr>{body}</table>")


# ---- gates ---------------------------------------------------------------------------------------


def gate_banner(summary: dict[str, Any]) -> str:
    """At the top of the page: each gate that failed (the run exited non-zero), then each that did not run."""
    gates = summary_value(summary, "gates") or {}
    banners = []
    for passed, css, verdict in ((False, "failed", "FAILED"), (None, "notrun", "NOT RUN")):
        for name, gate in gates.items():
            if isinstance(gate, dict) and "passed" in gate and gate["passed"] is passed and gate.get("message"):
                title = f"{name} gate {verdict}"
                message = str(gate["message"]).removeprefix(f"{title}: ")  # a message that says it already
                banners.append(f"<div class='banner {css}' role='alert'><strong>{html.escape(title)}</strong>"
                               f": {html.escape(message)}</div>")
    return "".join(banners)


# ---- the page ------------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _table(rows: list[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(_fmt(v))}</td></tr>" for k, v in rows)
    return f"<table class='facts'>{body}</table>"


def _figure_html(png: bytes | None, alt: str, missing: str) -> str:
    if png is None:
        return f"<figure><figcaption>{html.escape(alt)}</figcaption><p class='note'>{html.escape(missing)}</p></figure>"
    data = base64.b64encode(png).decode("ascii")
    return f"<figure><img src='data:image/png;base64,{data}' alt='{html.escape(alt)}'></figure>"


def _when(value: Any) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def runner_text(summary: dict[str, Any]) -> str:
    """'DirectRunner (direct_running_mode=in_memory, direct_num_workers=1)' from the summary's runner options."""
    options = summary_value(summary, "runner")
    if not isinstance(options, dict):
        return _fmt(options)
    name = options.get("runner") or "DirectRunner (Beam's default)"
    rest = ", ".join(f"{k}={v}" for k, v in options.items() if k != "runner")
    return f"{name} ({rest})" if rest else str(name)


def device_text(row: dict[str, Any], summary: dict[str, Any]) -> str:
    """'0.54 of the pipeline's wall time; host 64.0 us a document' (one process's; summed over processes: -)."""
    older = "format_version" not in summary  # docs/summary.md, "Older runs"
    if row["device_busy_fraction"] is None:
        several = ((summary_value(summary, "device.busy_processes") or 0) > 1
                   or progress.runner_name(summary_value(summary, "runner.runner")) not in progress.LOCAL_RUNNERS)
        return "- (not known for a run over several processes or remote workers)" if several or not older else (
            "- (not recorded by the older docscore that wrote this run)")
    return (f"{row['device_busy_fraction']:.2f} of the pipeline's wall time with a model call in flight; "
            f"host {_fmt(row['host_us_per_doc'])} us a document"
            + (" (an older docscore wrote this run: its definitions may differ, docs/summary.md \"Older runs\")"
               if older else ""))


def batching_text(summary: dict[str, Any]) -> str:
    """'16 rows a call, 32 calls a Beam batch (131072 tokens), 1 local thread' from the summary's batching."""
    batching = summary_value(summary, "batching")
    if not isinstance(batching, dict):
        return "-"
    return (f"{_fmt(batching.get('batch_size'))} rows a call, {_fmt(batching.get('calls_per_beam_batch'))} calls a "
            f"Beam batch ({_fmt(batching.get('beam_batch_tokens'))} tokens), {_fmt(batching.get('local_threads'))} "
            f"parallel bundle(s)")


def header_facts(summary: dict[str, Any]) -> list[tuple[str, Any]]:
    row = history.history_row(summary)
    kernel_rows = summary_value(summary, "kernel.in_rows")
    return [
        ("task", row["task"]),
        ("model", f"{row['model']} ({row['model_id']})"),
        ("model fingerprint", row["model_fingerprint"]),
        ("attention", f"{row['attention']} -> {row['attention_impl']}" + (f" (rows: {', '.join(kernel_rows)})" if kernel_rows else "")),
        ("backend", row["backend"]),
        ("runner", runner_text(summary)),
        ("dtype", row["dtype"]),
        ("input", row["input"]),
        ("started / finished (UTC)", " / ".join(_when(row[k]) for k in ("started_at", "finished_at"))),
        ("wall time (s): pipeline / whole command", f"{_fmt(row['wall_s'])} / {_fmt(row['command_wall_s'])}"),
        ("records / scored / errors", f"{_fmt(row['input_records'])} / {_fmt(row['scored'])} / {_fmt(row['errors'])}"),
        ("error rate", None if row["error_rate"] is None else f"{100 * row['error_rate']:.2f}%"),
        ("throughput", f"{_fmt(row['docs_per_s'])} docs/s, {_fmt(row['tokens_per_s'])} tokens/s"),
        ("padding efficiency", row["padding_efficiency"]),
        ("compiles", f"{_fmt(row['compile_count'])} ({_fmt(row['compile_ms'])} ms): {_fmt(row['compile_cold_count'])} "
                     f"compiled, {_fmt(row['compile_cached_count'])} from the compilation cache"),
        ("device busy", device_text(row, summary)),
        ("batching", batching_text(summary)),
        ("peak RSS (MB)", row["peak_rss_mb"]),
    ]


def stage_table(summary: dict[str, Any]) -> str:
    head = "<tr><th>stage</th><th>total ms</th><th>p50 ms</th><th>p95 ms</th><th>p99 ms</th></tr>"
    body = ""
    for stage in STAGES:
        stats = history.stage_stats(summary, stage)
        cells = "".join(f"<td>{html.escape(_fmt(stats.get(k)))}</td>" for k in ("total_ms", "p50", "p95", "p99"))
        body += f"<tr><th>{html.escape(stage)}</th>{cells}</tr>"
    return f"<table class='grid'>{head}{body}</table>"


def errors_table(errors: pa.Table | None) -> str:
    if errors is None or errors.num_rows == 0:
        return ""
    columns = [c for c in ERROR_COLUMNS if c in errors.schema.names]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = ""
    for row in errors.slice(0, ERRORS_LISTED).to_pylist():
        body += "<tr>" + "".join(f"<td>{html.escape(_fmt(row.get(c))[:200])}</td>" for c in columns) + "</tr>"
    more = f"<p class='note'>first {ERRORS_LISTED} of {errors.num_rows} error rows</p>" if errors.num_rows > ERRORS_LISTED else ""
    return f"<h2>Error rows</h2><table class='grid'><tr>{head}</tr>{body}</table>{more}"


STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1400px; }
h1 { margin-bottom: 4px; } h2 { margin-top: 28px; }
table { border-collapse: collapse; font-size: 14px; }
.facts th { text-align: left; padding: 2px 16px 2px 0; color: #555; font-weight: 500; }
.grid th, .grid td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(560px, 1fr)); gap: 16px; }
figure { margin: 0; border: 1px solid #eee; padding: 8px; }
figure img { width: 100%; height: auto; display: block; }
.note { color: #777; font-style: italic; }
.versions { color: #555; font-size: 13px; }
h2.passed { color: #2e7d32; } h2.failed { color: #c62828; } h2.notrun { color: #9a6700; }
.banner { padding: 10px 14px; margin: 12px 0; border-radius: 4px; border: 1px solid; }
.banner.failed { background: #fdecea; border-color: #c62828; color: #8e1b1b; }
.banner.notrun { background: #fff8e1; border-color: #d4a72c; color: #6b4e00; }
.confusion td { text-align: right; } .confusion td.hit { background: #e8f5e9; } .confusion td.miss { background: #fdecea; }
.wide { max-width: 1000px; margin-top: 12px; }
"""


def render_html(run: RunData) -> str:
    summary = run.summary
    task = summary_value(summary, history.DESCRIPTION["task"])
    outcome_png, outcome_title = outcome_chart(run.scores, task)
    table_note = "the tables are not readable from here (BigQuery output)" if run.scores is None else "no scored rows"
    charts = [
        _figure_html(stage_time_chart(summary), "Time per stage", "the run recorded no stage timing"),
        _figure_html(stage_latency_chart(run.scores, summary), "Per-stage latency distribution", table_note),
        _figure_html(
            throughput_chart(run.samples),
            "Throughput over the run",
            "no progress samples (runs/run_id=ID/progress.json): the run was made without the progress reporter",
        ),
        _figure_html(outcome_png, outcome_title, table_note),
        _figure_html(errors_chart(summary), "Errors by stage / type", "no errors: every input record was scored"),
    ]
    metrics = summary_value(summary, history.TASK_METRICS) or {}
    why_none = (f"{task} computes none" if task in tasks.TASKS and tasks.TASKS[task].gathers == "nothing"
                else "no gold labels")
    metrics_html = (_table([(k, v) for k, v in metrics.items()]) if metrics
                    else f"<p class='note'>no task metrics ({html.escape(why_none)})</p>")
    versions = summary_value(summary, history.VERSIONS) or {}
    versions_html = ", ".join(f"{html.escape(k)} {html.escape(str(v))}" for k, v in sorted(versions.items()))
    title = f"docscore run {run.run_id}"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>{STYLE}</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
{gate_banner(summary)}
<p class="versions">{versions_html}</p>
{_table(header_facts(summary))}
<h2>Task metrics</h2>
{metrics_html}
{classification_section(run)}
{least_confident_section(run)}
<h2>Stages</h2>
{stage_table(summary)}
<h2>Charts</h2>
<div class="charts">
{"".join(charts)}
</div>
{shadow_section(run)}
{errors_table(run.errors)}
</body>
</html>
"""


def write_report(output_dir: str, run_id: str) -> str:
    """Write DIR/runs/run_id=ID/report.html for a finished run and return its path; ReportError, writing
    nothing, when the run changed while the page was rendered (still_committed)."""
    run = load_run(output_dir, run_id)
    page = render_html(run).encode("utf-8")
    still_committed(run)
    path = run_commit.report_path(output_dir, run_id)
    try:
        run_commit.write_atomic(path, page)
    except OSError as e:  # a read-only mount, a colleague's output
        raise ReportError(f"{path}: cannot be written ({type(e).__name__}: {str(e)[:200]}); the run's folder must be "
                          "writable to hold its report") from None
    return path


def still_committed(run: RunData) -> None:
    """Raise ReportError unless the run's committed summary is still the one `run` was loaded from: a launch that
    replaced the run (or its launcher, adding Beam metrics and gates) meanwhile writes its own report after its
    summary, which a page rendered from the old one must not overwrite. A commit between this check and the
    write is followed by that launch's own report, rendered after it, which replaces the page."""
    try:
        current = run_commit.committed_summary(run.output_dir, run.run_id)
    except run_commit.DamagedSummary as e:
        raise ReportError(str(e)) from None
    if current == run.summary:
        return
    launch = (current or {}).get(run_commit.LAUNCH_KEY)
    change = ("its summary.json is gone" if current is None else
              f"launch {launch} replaced it" if launch != run.summary.get(run_commit.LAUNCH_KEY) else
              f"its launch {launch} rewrote its summary.json")
    raise ReportError(f"run {run.run_id!r} under {run.output_dir} changed while its report was rendered ({change}); "
                      "no report was written, since it would describe the run as it was: the launch writes its own "
                      f"when it finishes, else rerun `docscore report {run.output_dir} --run_id {run.run_id}`")


def main(argv: list[str] | None = None) -> int:
    parser = SubcommandParser(
        prog="docscore report",
        description="Write the HTML report of a finished run to DIR/runs/run_id=ID/report.html.",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's directory DIR/runs/run_id=ID (or its summary.json), or the --output DIR of the run")
    parser.add_argument("--run_id", default=None, help="which run under DIR (default: the one that finished last)")
    args = parser.parse_args(argv)
    options.quiet_beam_noise()  # among it gcsfs's traceback of a store out of retries, which is named below
    try:
        output_dir, run_id = locate_run(args.run_dir, args.run_id)
        path = write_report(output_dir, run_id)
    except ReportError as e:
        print(f"docscore report: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        raise
    except Exception as e:
        if sources.is_transient(e):  # the store cannot be reached (no network, DNS, refused): not a traceback
            print(f"docscore report: {sources.unreachable_message(args.run_dir, e)}", file=sys.stderr)
        else:  # a summary or table edited into a shape docscore did not write (as compare says of them)
            print(f"docscore report: cannot report on {args.run_dir}: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
        return 2
    print(path)
    return 0
