"""pipeline.telemetry.stats.RunStatsFn: the one combine that assembles the run stats, split over accumulators the
way a runner splits it (add to several, merge, extract), and through a real DirectRunner."""
import json
import math

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamPipeline
from apache_beam.testing.util import assert_that

from pipeline.records import ErrorRow
from pipeline.stages.postprocess import DocStats
from pipeline.telemetry.stats import ComputeRunStats, RunStatsFn, TaggedPartial
from pipeline.telemetry.timing import StageMetrics, stage_column


def _doc(doc_id: str, infer_ms: float) -> DocStats:
    return DocStats(timings={stage_column("infer"): infer_ms}, n_tokens=10, window_tokens=12, computed_tokens=16.0,
                    model_id="m", attention_impl="xla", fingerprint="f", backend="cpu", doc_id=doc_id)


def _error(stage: str, record_index: int | None) -> ErrorRow:
    return ErrorRow(source="s.jsonl", record_index=record_index, stage=stage, error_type="ValueError", message="bad")


def test_parts_added_to_several_accumulators_merge_into_one_summary():
    fn = RunStatsFn("embed")
    parts = [("doc", _doc(str(i), float(i))) for i in range(101)]  # infer_ms 0..100: percentile p is p
    parts += [("read", 1)] * 3 + [("error", ("parse/ValueError", None)), ("error", ("read/OSError", "s.jsonl")), ("repeated", 3)]
    accumulators = [fn.create_accumulator(), fn.create_accumulator()]
    for i, part in enumerate(parts):
        fn.add_input(accumulators[i % 2], part)
    stats = json.loads(fn.extract_output(fn.merge_accumulators(accumulators)))
    counts = stats["counts"]
    assert (counts["scored"], counts["errors"], counts["records"], counts["shard_errors"]) == (101, 2, 103, 1)
    assert counts["errors_by_stage"] == {"parse": 1, "read": 1}
    assert (counts["duplicate_doc_ids"], counts["duplicate_rows"]) == (1, 2)
    assert counts["records_read"] == 3 + 2 and counts["accounted"] is False  # 5 read, 103 accounted for
    infer = stats["stages"]["infer"]
    assert infer["total_ms"] == sum(range(101)) and (infer["p50"], infer["p95"], infer["p99"]) == (50.0, 95.0, 99.0)
    assert "p50" not in stats["stages"]["read"]  # no document timed that stage
    assert stats["tokens"]["padding_efficiency"] == 12 / 16


def test_the_summary_names_the_first_shards_not_read_whatever_order_they_merge_in():
    fn = RunStatsFn("embed")
    sources = [f"in/part-{i:02d}.jsonl" for i in range(25)]
    accumulators = [fn.create_accumulator() for _ in range(3)]
    for i, source in enumerate(reversed(sources)):
        part = ("error", ("read/corrupt_file", source))
        fn.add_input(accumulators[i % 3], part)
        fn.add_input(accumulators[i % 3], part)  # two rows of one shard: counted twice, named once
    fn.add_input(accumulators[0], ("error", ("parse/ValueError", None)))  # a record's error names no shard
    merged = fn.merge_accumulators([fn.merge_accumulators(accumulators[1:]), accumulators[0]])
    counts = json.loads(fn.extract_output(merged))["counts"]
    assert counts["shard_errors"] == 50 and counts["shard_error_sources"] == sources[:10]
    assert json.loads(fn.extract_output(fn.create_accumulator()))["counts"]["shard_error_sources"] == []


def test_computed_tokens_is_the_whole_number_the_windows_shares_add_up_to():
    """Seven windows sharing a call of 16 computed tokens hold 16/7 each: their running float sum is 15.999999999999996,
    the summary's count is 16 (the model's computed tokens are a whole number)."""
    fn = RunStatsFn("embed")
    accumulator = fn.create_accumulator()
    for i in range(7):
        doc = _doc(str(i), 1.0)
        doc.computed_tokens, doc.window_tokens = 16 / 7, 2
        fn.add_input(accumulator, ("doc", doc))
    running = 0.0
    for _ in range(7):  # as the accumulator adds (Python 3.12's sum() compensates and gets 16.0)
        running += 16 / 7
    assert running != 16
    tokens = json.loads(fn.extract_output(accumulator))["tokens"]
    assert tokens["computed_tokens"] == 16 and isinstance(tokens["computed_tokens"], int)
    assert tokens["padding_efficiency"] == 14 / 16


def test_a_tagged_partial_merges_like_the_parts_themselves():
    fn = RunStatsFn("embed")
    docs = [_doc("a", 1.0), _doc("b", 3.0), _doc("b", 5.0)]
    partial = TaggedPartial(fn, "doc")
    # as a runner runs a lifted combine: each bundle adds its lists into its own accumulator, then they merge
    bundles = [partial.add_input(partial.create_accumulator(), docs[:2]), partial.create_accumulator(),
               partial.add_input(partial.create_accumulator(), docs[2:])]
    part = partial.extract_output(partial.merge_accumulators(bundles))
    assert part[0] == "partial"

    def summary(parts):
        acc = fn.create_accumulator()
        for p in parts + [("read", "doc")] * 3:
            acc = fn.add_input(acc, p)
        return json.loads(fn.extract_output(acc))

    via_partial, direct = summary([part]), summary([("doc", d) for d in docs])
    assert via_partial == direct
    assert via_partial["counts"]["scored"] == 3 and via_partial["stages"]["infer"]["total_ms"] == 9.0
    reads = TaggedPartial(fn, "read")  # a list of reads is counted in one step, as its documents one by one
    read_part = reads.extract_output(reads.merge_accumulators([reads.add_input(reads.create_accumulator(), ["x"] * 4),
                                                               reads.add_input(reads.create_accumulator(), ["y"])]))
    one_by_one = fn.create_accumulator()
    for _ in range(5):
        one_by_one = fn.add_input(one_by_one, ("read", "doc"))
    assert read_part[1]["read"] == one_by_one["read"] == 5



def _scored(doc_id: str, prediction, gold) -> DocStats:
    doc = _doc(doc_id, 1.0)
    doc.prediction, doc.gold = prediction, gold
    return doc


def test_records_without_gold_are_left_out_of_classify_and_choice_accuracy():
    """A labelled task's run may hold records without a label: they are scored, but accuracy is over the records
    that have gold only (two of four here, both right), or the unlabelled half would count as wrong answers."""
    fn = RunStatsFn("classify")
    acc = fn.create_accumulator()
    for i, (prediction, gold) in enumerate([("a", "a"), ("b", "b"), ("a", None), ("b", None)]):
        fn.add_input(acc, ("doc", _scored(str(i), prediction, gold)))
    stats = json.loads(fn.extract_output(acc))
    assert stats["counts"]["scored"] == 4
    assert stats["task_metrics"]["n_gold"] == 2 and stats["task_metrics"]["accuracy"] == 1.0

    fn = RunStatsFn("choice")
    acc = fn.create_accumulator()
    for i, (prediction, gold) in enumerate([(("0", "0", "1"), "0"), (("1", "1", "1"), None), (("1", "0", "0"), None)]):
        fn.add_input(acc, ("doc", _scored(str(i), prediction, gold)))
    metrics = json.loads(fn.extract_output(acc))["task_metrics"]
    assert metrics == {"n_docs": 3, "n_gold": 1, "accuracy": 1.0, "accuracy_per_token": 1.0, "accuracy_per_byte": 0.0}


def test_merged_accumulators_keep_every_gold_pair_and_both_loglik_sums():
    """A runner adds documents to several accumulators and merges them: every accumulator's gold pairs (classify's
    accuracy) and both of loglik's sums (log-likelihood and scored tokens, hence perplexity) must survive the
    merge, whichever accumulator a document went to."""
    fn = RunStatsFn("classify")
    accumulators = [fn.create_accumulator(), fn.create_accumulator()]
    for i, (prediction, gold) in enumerate([("a", "a"), ("a", "b"), ("b", "b"), ("b", "b"), ("a", "a")]):
        fn.add_input(accumulators[i % 2], ("doc", _scored(str(i), prediction, gold)))
    metrics = json.loads(fn.extract_output(fn.merge_accumulators(accumulators)))["task_metrics"]
    assert metrics["n_gold"] == 5 and metrics["accuracy"] == 4 / 5

    fn = RunStatsFn("loglik")
    accumulators = [fn.create_accumulator(), fn.create_accumulator()]
    for i, (loglik, tokens) in enumerate([(-10.0, 4), (-6.0, 2), (-4.0, 4)]):  # (total log-likelihood, tokens)
        fn.add_input(accumulators[i % 2], ("doc", _scored(str(i), loglik, tokens)))
    metrics = json.loads(fn.extract_output(fn.merge_accumulators(accumulators)))["task_metrics"]
    assert (metrics["n_docs"], metrics["total_loglik"], metrics["loglik_tokens"]) == (3, -20.0, 10)
    assert metrics["corpus_perplexity"] == pytest.approx(math.exp(20.0 / 10))

def test_compute_run_stats_on_the_direct_runner():
    def check(outputs):
        assert len(outputs) == 1
        counts = json.loads(outputs[0])["counts"]
        assert (counts["scored"], counts["errors"], counts["duplicate_doc_ids"], counts["duplicate_rows"]) == (3, 3, 1, 1)
        assert counts["records_read"] == 6 and counts["accounted"] is True
        assert counts["shard_errors"] == 1  # the unreadable shard's row (no record index), not the records' parse errors

    with BeamPipeline() as p:
        docs = p | "Docs" >> beam.Create([[_doc("a", 1.0), _doc("a", 2.0)], [_doc("b", 3.0)]])  # lists of DocStats
        errors = p | "Errors" >> beam.Create([_error("parse", 3), _error("parse", 4), _error("read", None)])
        read = p | "Read" >> beam.Create([["a", "a"], ["b"]])  # the readers' document lists (their sizes are what matters)
        assert_that((docs, errors, read) | ComputeRunStats("embed"), check)


def test_empty_run_still_yields_its_stats():
    def check(outputs):
        counts = json.loads(outputs[0])["counts"]
        assert (counts["scored"], counts["errors"], counts["records_read"]) == (0, 0, 0)

    with BeamPipeline() as p:
        docs = p | "Docs" >> beam.Create([]).with_output_types(list[DocStats])
        errors = p | "Errors" >> beam.Create([]).with_output_types(ErrorRow)
        read = p | "Read" >> beam.Create([]).with_output_types(list[str])
        assert_that((docs, errors, read) | ComputeRunStats("embed"), check)


def test_a_run_without_records_has_no_error_fraction_nor_padding_efficiency():
    """docs/summary.md: error_fraction (the --max_error_fraction gate's value) and padding_efficiency are null when
    there is nothing to divide by; a made-up 0.0 would read as a run that met the gate, or a number it never had."""
    fn = RunStatsFn("embed")
    stats = json.loads(fn.extract_output(fn.create_accumulator()))
    assert stats["counts"]["error_fraction"] is None and stats["tokens"]["padding_efficiency"] is None
    assert stats["counts"]["records"] == stats["tokens"]["computed_tokens"] == 0


def test_records_read_but_never_written_are_not_accounted_for():
    """Three documents read, one scored, no error row: two records went missing between the readers and the
    tables, which `accounted` must say (it is false also when fewer were read than written, as tested above)."""
    fn = RunStatsFn("embed")
    acc = fn.create_accumulator()
    for part in [("read", "a"), ("read", "b"), ("read", "c"), ("doc", _doc("a", 1.0))]:
        acc = fn.add_input(acc, part)
    counts = json.loads(fn.extract_output(acc))["counts"]
    assert (counts["records_read"], counts["records"], counts["accounted"]) == (3, 1, False)
    assert counts["error_fraction"] == 0.0  # one record, no error: a real zero


class _RecordTimings(beam.DoFn):
    """StageMetrics used as ScoreDocuments uses it: made once per DoFn, one record() per document."""

    def __init__(self):
        self._metrics = StageMetrics()

    def process(self, timings):
        self._metrics.record(timings)
        yield timings


def test_stage_metrics_are_microsecond_distributions_of_every_timed_stage():
    """summary.json's `metrics` (and Dataflow's console) hold docscore_timing/<stage>_us: the documents' stage times
    in microseconds, a 0 ms time counted as one, a stage a document did not time left out."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.telemetry.progress import metric_values

    p = beam.Pipeline(options=PipelineOptions(["--direct_num_workers", "1"]))
    _ = (p | beam.Create([{stage_column("read"): 1.5, stage_column("infer"): 0.0},
                          {stage_column("read"): 2.25, stage_column("infer"): None}])
         | beam.ParDo(_RecordTimings()))
    result = p.run()
    result.wait_until_finish()
    values = metric_values(result, "docscore_timing")
    assert values["docscore_timing/read_us"] == {"sum": 3750, "count": 2, "min": 1500, "max": 2250}
    assert values["docscore_timing/infer_us"] == {"sum": 0, "count": 1, "min": 0, "max": 0}
    assert "docscore_timing/tokenize_us" not in values
