"""Run statistics computed IN the pipeline: counts, per-stage totals and p50/p95/p99 (Beam's
ApproximateQuantilesCombineFn), tokens, padding, task metrics; one small JSON element that the job's Publish
step (pipeline/runs/publish.py) turns into summary.json. Must not read the output tables back.
"""
from __future__ import annotations

import json
import zlib
from collections import Counter
from typing import Any

import apache_beam as beam
from apache_beam.transforms.stats import ApproximateQuantilesCombineFn

from pipeline import tasks
from pipeline.records import ErrorRow
from pipeline.stages import shadow
from pipeline.tasks.base import GoldTotals
from pipeline.stages.postprocess import DocStats
from pipeline.telemetry import timing


class RunTotals(beam.CombineFn):
    """Sums and distinct values over DocStats (constant memory except the gold pairs of a task that gathers them)."""

    def __init__(self, task: str):
        self._task = task
        self._gathers = tasks.get(task).gathers

    def create_accumulator(self):
        return {
            "scored": 0,
            "n_tokens": 0,
            "window_tokens": 0,
            "computed_tokens": 0.0,
            "stage_ms": {timing.stage_column(s): 0.0 for s in timing.STAGES},
            "distinct": {"model_id": set(), "attention_impl": set(), "fingerprint": set(), "backend": set()},
            "pairs": [],
            "sums": [0.0, 0],  # (prediction, gold) summed: loglik's total log-likelihood and scored tokens
        }

    def add_input(self, acc, stats: DocStats):
        acc["scored"] += 1
        acc["n_tokens"] += stats.n_tokens
        acc["window_tokens"] += stats.window_tokens
        acc["computed_tokens"] += stats.computed_tokens
        for column, value in stats.timings.items():
            acc["stage_ms"][column] += value
        for key in acc["distinct"]:
            acc["distinct"][key].add(getattr(stats, key))
        if self._gathers == "sums":
            acc["sums"][0] += stats.prediction
            acc["sums"][1] += stats.gold
        elif self._gathers == "gold_pairs" and stats.gold is not None:
            acc["pairs"].append((stats.prediction, stats.gold))
        return acc

    def merge_accumulators(self, accumulators):
        accumulators = list(accumulators)
        merged = self.create_accumulator()
        for acc in accumulators:
            for key in ("scored", "n_tokens", "window_tokens", "computed_tokens"):
                merged[key] += acc[key]
            for column, value in acc["stage_ms"].items():
                merged["stage_ms"][column] += value
            for key, values in acc["distinct"].items():
                merged["distinct"][key] |= values
            merged["pairs"] += acc["pairs"]
            merged["sums"][0] += acc["sums"][0]
            merged["sums"][1] += acc["sums"][1]
        return merged

    def extract_output(self, acc):
        result = {k: acc[k] for k in ("scored", "n_tokens", "window_tokens", "computed_tokens")}
        result["stage_total_ms"] = acc["stage_ms"]
        result.update({key: sorted(values) for key, values in acc["distinct"].items()})
        result["task_metrics"] = tasks.get(self._task).metrics(GoldTotals(
            documents=acc["scored"], pairs=acc["pairs"], prediction_sum=acc["sums"][0], gold_sum=acc["sums"][1]))
        return result


def assemble(totals: dict, quantiles: dict, error_counts: dict, shard_errors: int, shadow_totals: dict | None = None,
             duplicates: tuple[int, int] = (0, 0), read_documents: int | None = None,
             shard_sources: list[str] | None = None) -> str:
    """One JSON document from the pieces the pipeline computed."""
    errors = sum(error_counts.values())
    stages = {}
    for stage in timing.STAGES:
        column = timing.stage_column(stage)
        entry = {"total_ms": totals["stage_total_ms"].get(column, 0.0)}
        if column in quantiles:
            entry.update(timing.percentiles_from_quantiles(quantiles[column]))
        stages[stage] = entry
    by_stage = Counter()
    for key, n in error_counts.items():
        by_stage[key.split("/", 1)[0]] += n
    # Each window holds a float share of its call's tokens; a call's shares add up to its whole row count.
    computed_tokens = round(totals["computed_tokens"])
    stats: dict[str, Any] = {
        "counts": {
            "records": totals["scored"] + errors,
            "scored": totals["scored"],
            "errors": errors,
            "shard_errors": shard_errors,
            "shard_error_sources": shard_sources or [],  # the first SHARD_SOURCES_KEPT of them, in path order
            "errors_by_stage": dict(sorted(by_stage.items())),
            "errors_by_type": dict(sorted(error_counts.items())),
            "error_fraction": error_fraction(totals["scored"] + errors, errors),  # --max_error_fraction gates on it
            **record_accounting(totals["scored"], errors, by_stage, read_documents),
            "duplicate_doc_ids": duplicates[0],  # doc_ids scored more than once (each row is kept)
            "duplicate_rows": duplicates[1],  # scored rows beyond the first of their doc_id
        },
        "tokens": {
            "text_tokens": totals["n_tokens"],
            "model_tokens": totals["window_tokens"],
            "computed_tokens": computed_tokens,
            "padding_efficiency": (totals["window_tokens"] / computed_tokens) if computed_tokens else None,
        },
        "stages": stages,
        "model_id": totals["model_id"],
        "attention_impl": totals["attention_impl"],
        "fingerprint": totals["fingerprint"],
        "worker_backend": totals["backend"],
        "task_metrics": totals["task_metrics"],
    }
    if shadow_totals is not None:
        stats["shadow"] = shadow_totals
    return json.dumps(stats, sort_keys=True)


READER_STAGES = ("read", "parse")  # error rows only the shard readers write


def record_accounting(scored: int, errors: int, errors_by_stage: Counter, read_documents: int | None) -> dict[str, Any]:
    """records_read: what the readers emitted (documents + their error rows, a corrupt shard's row included);
    accounted: every one of them ended as exactly one scores or errors row. Empty without the read count."""
    if read_documents is None:
        return {}
    records_read = read_documents + sum(errors_by_stage.get(stage, 0) for stage in READER_STAGES)
    return {"records_read": records_read, "accounted": records_read == scored + errors}


def error_fraction(records: int, errors: int) -> float | None:
    """errors / records; None when there are no records (summary.json counts.error_fraction, the gate's value)."""
    return errors / records if records else None


class RunStatsFn(beam.CombineFn):
    """Every tagged part of the run's statistics -> the run-stats JSON (assemble). Parts, as (tag, value):
    ("doc", DocStats), ("error", (stage/error_type, the shard's source if the row is a whole shard's, else None)),
    ("read", anything: one document read), ("repeated", times a doc_id was scored, when > 1), ("partial", an accumulator of this
    CombineFn: TaggedPartial). One CombineFn for all of them: one global combine in the graph instead of one
    per statistic. Per-stage p50/p95/p99 come from Beam's approximate quantiles of each document's stage
    times, kept per stage column inside the accumulator (bounded memory)."""

    def __init__(self, task: str, shadow_tolerance: float | None = None):
        self._totals = RunTotals(task)
        self._shadow = shadow.ShadowTotals(shadow_tolerance) if shadow_tolerance is not None else None
        self._quantiles = ApproximateQuantilesCombineFn.create(num_quantiles=timing.NUM_QUANTILES)

    def create_accumulator(self):
        return {
            "totals": self._totals.create_accumulator(),
            "shadow": self._shadow.create_accumulator() if self._shadow else None,
            "errors": Counter(),
            "shard_errors": 0,
            "shard_sources": [],  # the shards not read to their end, sorted, at most SHARD_SOURCES_KEPT
            "read": 0,
            "stage_values": {},  # stage column -> approximate quantile state of the documents' times
            "duplicates": [0, 0],  # doc_ids scored more than once, rows beyond the first of their doc_id
        }

    def add_input(self, acc, part):
        tag, value = part
        if tag == "doc":
            self._totals.add_input(acc["totals"], value)
            for column, ms in value.timings.items():
                state = acc["stage_values"].get(column)
                if state is None:
                    state = acc["stage_values"][column] = self._quantiles.create_accumulator()
                self._quantiles.add_input(state, ms)
            if self._shadow is not None and value.shadow is not None:
                self._shadow.add_input(acc["shadow"], value.shadow)
        elif tag == "error":
            key, shard_source = value
            acc["errors"][key] += 1
            if shard_source is not None:
                acc["shard_errors"] += 1
                acc["shard_sources"] = _first_sources([acc["shard_sources"], [shard_source]])
        elif tag == "read":
            acc["read"] += 1
        elif tag == "repeated":
            acc["duplicates"][0] += 1
            acc["duplicates"][1] += value - 1
        elif tag == "partial":
            return self.merge_accumulators([acc, value])
        else:
            raise ValueError(f"unknown run-stats part {tag!r}")
        return acc

    def add_tagged_list(self, acc, tag: str, values: list):
        """add_input of (tag, value) for each of a list's values; a list's reads are counted in one step."""
        if tag == "read":
            acc["read"] += len(values)
            return acc
        for value in values:
            acc = self.add_input(acc, (tag, value))
        return acc

    def merge_accumulators(self, accumulators):
        accumulators = list(accumulators)
        merged = self.create_accumulator()
        merged["totals"] = self._totals.merge_accumulators([a["totals"] for a in accumulators])
        if self._shadow is not None:
            merged["shadow"] = self._shadow.merge_accumulators([a["shadow"] for a in accumulators])
        for acc in accumulators:
            merged["errors"].update(acc["errors"])
            merged["shard_errors"] += acc["shard_errors"]
            merged["shard_sources"] = _first_sources([merged["shard_sources"], acc["shard_sources"]])
            merged["read"] += acc["read"]
            merged["duplicates"] = [m + a for m, a in zip(merged["duplicates"], acc["duplicates"])]
        columns = {column for acc in accumulators for column in acc["stage_values"]}
        merged["stage_values"] = {column: self._quantiles.merge_accumulators(
            [acc["stage_values"][column] for acc in accumulators if column in acc["stage_values"]]) for column in columns}
        return merged

    def extract_output(self, acc) -> str:
        return assemble(
            self._totals.extract_output(acc["totals"]),
            {column: self._quantiles.extract_output(state) for column, state in acc["stage_values"].items()},
            dict(acc["errors"]),
            acc["shard_errors"],
            self._shadow.extract_output(acc["shadow"]) if self._shadow is not None else None,
            tuple(acc["duplicates"]),
            acc["read"],
            acc["shard_sources"],
        )


class TaggedPartial(beam.CombineFn):
    """Lists of values of one tag -> one RunStatsFn accumulator, emitted as one ("partial", accumulator) part.
    Applied as its own CombineGlobally, Beam lifts it (adds each bundle's values where they are produced, as
    it does not through the Flatten in front of RunStatsFn), so the per-document parts never cross a stage
    boundary one by one."""

    def __init__(self, combine_fn: RunStatsFn, tag: str):
        self._fn = combine_fn
        self._tag = tag

    def create_accumulator(self):
        return self._fn.create_accumulator()

    def add_input(self, acc, values: list):
        return self._fn.add_tagged_list(acc, self._tag, values)

    def merge_accumulators(self, accumulators):
        return self._fn.merge_accumulators(accumulators)

    def extract_output(self, acc):
        return "partial", acc


SHARD_SOURCES_KEPT = 10  # shards named in the summary (and so in the gate's message); shard_errors counts them all


def _first_sources(lists: list[list[str]]) -> list[str]:
    """The first SHARD_SOURCES_KEPT distinct sources of `lists` in path order: the same whatever order Beam adds
    and merges them in, and bounded however many shards fail."""
    return sorted({source for sources in lists for source in sources})[:SHARD_SOURCES_KEPT]


def _error_part(error: ErrorRow) -> tuple[str, tuple[str, str | None]]:
    """An error row -> ("error", (stage/error_type, its shard's source when the row is a whole shard's, else None))."""
    return "error", (f"{error.stage}/{error.error_type}", error.source if error.record_index is None else None)


DOC_ID_BUCKETS = 16  # doc_ids are counted in this many keyed groups: per list of documents, a few elements


def doc_id_buckets(stats: list[DocStats]) -> list[tuple[int, list[str]]]:
    """A list of documents' doc_ids grouped by a stable hash bucket, so counting them costs Beam a few
    elements per list instead of one per document."""
    buckets: dict[int, list[str]] = {}
    for doc in stats:
        buckets.setdefault(zlib.crc32(doc.doc_id.encode("utf-8", "surrogatepass")) % DOC_ID_BUCKETS, []).append(doc.doc_id)
    return list(buckets.items())


class RepeatedDocIds(beam.CombineFn):
    """One bucket's doc_ids -> how many times each doc_id scored more than once was scored."""

    def create_accumulator(self) -> Counter:
        return Counter()

    def add_input(self, acc: Counter, doc_ids: list[str]) -> Counter:
        acc.update(doc_ids)
        return acc

    def merge_accumulators(self, accumulators) -> Counter:
        merged = Counter()
        for acc in accumulators:
            merged.update(acc)
        return merged

    def extract_output(self, acc: Counter) -> list[int]:
        return [times for times in acc.values() if times > 1]


def _repeated_parts(bucket_repeats: tuple[int, list[int]]) -> list[tuple[str, int]]:
    """("repeated", times scored) for each doc_id of the bucket scored more than once."""
    _, repeats = bucket_repeats
    return [("repeated", times) for times in repeats]


class ComputeRunStats(beam.PTransform):
    """(lists of DocStats, ErrorRows, the readers' Document lists) -> a PCollection holding the run-stats
    JSON string (one element)."""

    def __init__(self, task: str, shadow_tolerance: float | None = None):
        super().__init__()
        self._task = task
        self._shadow_tolerance = shadow_tolerance  # None: the run has no shadow kernel

    def expand(self, pcolls):
        doc_stats, errors, read_docs = pcolls
        combine_fn = RunStatsFn(self._task, self._shadow_tolerance)
        parts = [  # docs and reads arrive pre-combined (TaggedPartial), not one part per document
            doc_stats | "DocsPartial" >> beam.CombineGlobally(TaggedPartial(combine_fn, "doc")).without_defaults(),
            errors | "TagErrors" >> beam.Map(_error_part),
            doc_stats
            | "DocIds" >> beam.FlatMap(doc_id_buckets)
            | "CountDocIds" >> beam.CombinePerKey(RepeatedDocIds())
            | "TagRepeated" >> beam.FlatMap(_repeated_parts),
            read_docs | "ReadPartial" >> beam.CombineGlobally(TaggedPartial(combine_fn, "read")).without_defaults(),
        ]
        return parts | "StatsParts" >> beam.Flatten() | "Assemble" >> beam.CombineGlobally(combine_fn)
