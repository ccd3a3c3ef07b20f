"""The run's gates, as the user sees them: a real `docscore run` (DirectRunner, MiniLM) whose error rows are
past --max_error_fraction exits 4 AND says so in its summary ("gates") and at the top of its report; a
shadow kernel that compared no document says it did not run (and how to make it run), never that it passed.
"""
from __future__ import annotations

import json

import pytest

from conftest import SENTENCES, common_flags, read_summary, read_table, run_docscore, write_jsonl
from pipeline import launch
from pipeline.runs import history
from test_report import PageOutline


def _page(out, run_id) -> tuple[str, PageOutline]:
    page = (out / "runs" / f"run_id={run_id}" / "report.html").read_text()
    return page, PageOutline(page)


@pytest.mark.integration
def test_a_run_past_the_error_fraction_says_so_in_its_summary_and_at_the_top_of_its_report(tmp_path, capsys):
    records = [{"id": f"s{i}", "text": t} for i, t in enumerate(SENTENCES[:4])] + ['{"id": "broken", "text": ', {"id": "no-text"}]
    shard = write_jsonl(tmp_path / "docs.jsonl", records)
    out = tmp_path / "out"
    code = run_docscore("--input", shard, *common_flags("err", out), "--attention", "native", "--no_progress",
                        "--max_error_fraction", "0.1")  # the last --max_error_fraction wins over common_flags' 1
    assert code == 4
    err = capsys.readouterr().err
    summary = read_summary(out, "err")
    gate = summary["gates"]["error_fraction"]
    assert (gate["limit"], gate["passed"], gate["errors"], gate["records"]) == (0.1, False, 2, 6)
    assert gate["value"] == pytest.approx(2 / 6) == summary["counts"]["error_fraction"]
    assert gate["message"] in err and "--max_error_fraction=0.1" in gate["message"]
    assert "shadow" not in summary["gates"]  # no shadow kernel, no shadow gate
    page, outline = _page(out, "err")
    # the banner comes right after the title, before anything else the page shows
    (kind, text), = [item for item in outline.outline if item[0].startswith("banner")]
    assert kind == "banner failed" and text.startswith("error_fraction gate FAILED") and "2 of 6 records" in text
    assert outline.outline[0][0] == "h1" and outline.outline[1] == (kind, text)
    assert page.index("class='banner failed'") < page.index("class='facts'")
    # the run's published history row says the gate failed (written again once the launcher added the gates)
    (row,) = read_table(out, "history", "err")[0].to_dict("records")
    assert (row["errors"], row["max_error_fraction"], row["error_gate_passed"]) == (2, 0.1, False)


@pytest.mark.integration
def test_a_shard_not_read_to_its_end_fails_the_error_gate_unless_the_loss_is_accepted(tmp_path, capsys):
    """A .gz cut short: what precedes the break is scored, the rest is lost and only one error row says so,
    so an error fraction under the limit would pass a run missing most of a file. It exits 4 instead, unless
    --max_error_fraction is 1."""
    import gzip

    write_jsonl(tmp_path / "in" / "good.jsonl", [{"id": f"g{i}", "text": t} for i, t in enumerate(SENTENCES * 3)])
    lines = "".join(json.dumps({"id": f"c{i}", "text": f"{SENTENCES[i % len(SENTENCES)]} {i}"}) + "\n" for i in range(400))
    packed = gzip.compress(lines.encode())
    (tmp_path / "in" / "cut.jsonl.gz").write_bytes(packed[: len(packed) // 2])
    out = tmp_path / "out"
    code = run_docscore("--input", tmp_path / "in", *common_flags("cut", out), "--attention", "native", "--no_progress",
                        "--max_error_fraction", "0.1")
    summary = read_summary(out, "cut")
    counts, gate = summary["counts"], summary["gates"]["error_fraction"]
    assert counts["shard_errors"] == 1 and counts["error_fraction"] < 0.1  # the loss is not in the fraction
    assert code == 4 and gate["passed"] is False and gate["value"] <= gate["limit"]
    assert "1 shard could not be read to the end" in gate["message"] and gate["message"] in capsys.readouterr().err
    (source,) = counts["shard_error_sources"]  # the gate's message names the file to fix
    assert source.endswith("cut.jsonl.gz") and f"read to the end: {source} (" in gate["message"]
    assert len(read_table(out, "scores", "cut")[0]) == counts["scored"] > len(SENTENCES) * 3  # what was read is published
    accepted = run_docscore("--input", tmp_path / "in", *common_flags("ok", out), "--attention", "native", "--no_progress")
    assert accepted == 0 and read_summary(out, "ok")["gates"]["error_fraction"]["passed"] is True  # common_flags: 1


@pytest.mark.integration
def test_a_shadow_kernel_that_compared_nothing_did_not_pass(tmp_path, capsys):
    shard = write_jsonl(tmp_path / "docs.jsonl", [{"id": f"s{i}", "text": t} for i, t in enumerate(SENTENCES[:6])])
    out = tmp_path / "out"
    # a fraction so small that the hash picks none of the run's batches
    code = run_docscore("--input", shard, *common_flags("none", out), "--attention", "native", "--no_progress",
                        "--shadow_attention", "flash", "--shadow_fraction", "1e-12")
    assert code == 0  # nothing failed; but nothing was checked either, and the run says so
    err = capsys.readouterr().err
    summary = read_summary(out, "none")
    shadow = summary["shadow"]
    assert (shadow["documents"], shadow["batches"], shadow["passed"]) == (0, 0, None)
    gate = summary["gates"]["shadow"]
    assert gate["passed"] is None and gate["documents"] == 0 and gate["value"] is None
    assert "NOT RUN" in gate["message"] and "raise --shadow_fraction" in gate["message"]
    assert gate["message"] in summary["notices"] and f"note: {gate['message']}" in err
    assert summary["gates"]["error_fraction"]["passed"] is True
    assert "shadow gate FAILED" not in err
    page, outline = _page(out, "none")
    headings = [text for kind, text in outline.outline if kind == "h2"]
    assert "Shadow kernel: NOT RUN" in headings and "Shadow kernel: PASSED" not in page
    assert [kind for kind, _ in outline.outline if kind.startswith("banner")] == ["banner notrun"]
    assert history.history_row(summary)["shadow_passed"] is None


def test_gates_from_a_summary():
    """The gate logic on its own: every outcome of both gates, and the exit code order (shadow first)."""
    base = {"counts": {"records": 10, "errors": 3, "scored": 7, "errors_by_type": {"read/invalid_json": 3}},
            "kernel": {"resolved": "xla"}, "notices": ["earlier"]}
    shadow = {"impl": "blockwise", "fraction": 0.5, "tolerance": 1e-5, "documents": 4, "documents_over_tolerance": 1,
              "output_max_abs_diff": 3e-5, "worst_ratio_to_tolerance": 3.0, "passed": False}
    failed = launch.with_gates({**base, "shadow": shadow}, 0.2)
    assert [code for code, _ in launch.failed_gates(failed)] == [3, 4]
    assert failed["gates"]["shadow"]["value"] == pytest.approx(3e-5) and failed["notices"] == ["earlier"]
    passing = launch.with_gates({**base, "shadow": {**shadow, "documents_over_tolerance": 0, "passed": True}}, 0.3)
    assert launch.failed_gates(passing) == []
    # outputs of magnitude 10 (log-likelihoods): 5e-5 apart is 5e-6 relative, within the 1e-5 tolerance, and the
    # gate's value is that relative measure, so passed agrees with value <= limit
    large = launch.with_gates({**base, "shadow": {**shadow, "documents_over_tolerance": 0, "output_max_abs_diff": 5e-5,
                                                  "worst_ratio_to_tolerance": 0.5, "passed": True}}, 0.3)["gates"]["shadow"]
    assert large["passed"] is True and large["value"] == pytest.approx(5e-6) and large["value"] <= large["limit"]
    assert all(g["passed"] is True and g["message"] is None for g in passing["gates"].values())
    empty = {**shadow, "documents": 0, "documents_over_tolerance": 0, "output_max_abs_diff": 0.0, "passed": None}
    not_run = launch.with_gates({**base, "shadow": empty}, 0.3)
    assert launch.failed_gates(not_run) == [] and launch.shadow_gate_failure(not_run) is None
    assert not_run["notices"][1:] == [not_run["gates"]["shadow"]["message"]]
    assert launch.with_gates(not_run, 0.3)["notices"] == not_run["notices"]  # not repeated when redone
    nothing_scored = launch.with_gates({**base, "counts": {**base["counts"], "scored": 0}, "shadow": empty}, 1)
    assert "no document was scored" in nothing_scored["gates"]["shadow"]["message"]
    no_records = launch.with_gates({**base, "counts": {**base["counts"], "records": 0, "errors": 0}}, 0.1)
    assert no_records["gates"]["error_fraction"]["passed"] is None
    json.dumps(failed)  # the summary stays JSON


def _counts(records: int, errors: int, shard_errors: int = 0, sources: list[str] | None = None) -> dict:
    return {"counts": {"records": records, "errors": errors, "shard_errors": shard_errors,
                       "shard_error_sources": sources or [],
                       "errors_by_type": {"parse/bad_field_type": errors} if errors else {}}}


def test_the_error_gate_names_the_first_shards_not_read_and_counts_the_rest():
    sources = [f"gs://b/in/part-{i}.jsonl.gz" for i in range(5)]
    message = launch.error_fraction_failure(_counts(20, 5, shard_errors=5, sources=sources), 0.5)
    assert "5 shards could not be read to the end: gs://b/in/part-0.jsonl.gz, gs://b/in/part-1.jsonl.gz, " \
           "gs://b/in/part-2.jsonl.gz and 2 more (" in message
    one = launch.error_fraction_failure(_counts(20, 1, shard_errors=1, sources=sources[:1]), 0.5)
    assert "1 shard could not be read to the end: gs://b/in/part-0.jsonl.gz (" in one and "more" not in one
    # a summary written before counts.shard_error_sources still gets the count
    older = _counts(20, 1, shard_errors=1)
    del older["counts"]["shard_error_sources"]
    assert "1 shard could not be read to the end (" in launch.error_fraction_failure(older, 0.5)
    # past the names the summary keeps, the rows (two for a .gz cut while read) give no shard count: a lower bound
    many = [f"gs://b/in/part-{i:02d}.jsonl.gz" for i in range(10)]
    capped = launch.error_fraction_failure(_counts(100, 24, shard_errors=24, sources=many), 0.5)
    assert ("10 or more shards (24 whole-shard error rows) could not be read to the end: gs://b/in/part-00.jsonl.gz, "
            "gs://b/in/part-01.jsonl.gz, gs://b/in/part-02.jsonl.gz and more (") in capped, capped


def test_an_error_fraction_past_the_limit_and_a_lost_shard_are_both_named():
    """Raising --max_error_fraction below 1 cannot pass a run with a shard not read to its end: when both hold, the
    message names both and the one value that accepts both."""
    both = launch.error_fraction_failure(_counts(20, 3, shard_errors=1), 0.1)
    assert "3 of 20 records (15.0%) are error rows, more than --max_error_fraction=0.1" in both
    assert "1 shard could not be read to the end" in both and "--max_error_fraction 1 to accept both" in both
    assert "raise --max_error_fraction" not in both
    alone = launch.error_fraction_failure(_counts(20, 3), 0.1)
    assert "raise --max_error_fraction" in alone and "shard" not in alone
    assert launch.error_fraction_failure(_counts(20, 3, shard_errors=1), 1) is None
    # mostly outputs that overflowed inside the model: the input is not what to fix
    overflowed = _counts(20, 12)
    overflowed["counts"]["errors_by_type"] = {"infer/nan_output": 10, "parse/bad_field_type": 2}
    message = launch.error_fraction_failure(overflowed, 0.1)
    assert "check the model's weights and --dtype" in message and "fix the input" not in message


def test_a_run_of_no_records_says_its_error_gate_had_nothing_to_check(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "empty.jsonl").write_text("")
    out = tmp_path / "out"
    assert run_docscore("--input", tmp_path / "in", *common_flags("empty", out), "--attention", "native", "--no_progress") == 0
    summary = read_summary(out, "empty")
    gate = summary["gates"]["error_fraction"]
    assert gate["passed"] is None and "no record was read" in gate["message"] and gate["message"] in summary["notices"]
    assert "check that --input names the data you meant" in capsys.readouterr().err


@pytest.mark.integration
def test_a_failed_gate_keeps_its_exit_code_when_the_summary_cannot_be_given_the_gates(tmp_path, capsys, monkeypatch):
    """The disk fills after the commit, before the launcher writes the gates into the summary: the run is published
    and the command says so, and the error gate still fails it (exit 4), as the committed summary's counts show."""
    from pipeline.runs import publish

    records = [{"id": f"s{i}", "text": t} for i, t in enumerate(SENTENCES[:3])] + ['{"broken', '{"also broken']
    shard = write_jsonl(tmp_path / "docs.jsonl", records)

    def disk_full(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(publish.run_commit, "rewrite_summary", disk_full)
    code = run_docscore("--input", shard, *common_flags("full", tmp_path / "out"), "--attention", "native",
                        "--no_progress", "--max_error_fraction", "0.1")
    err = capsys.readouterr().err
    assert code == 4, err
    assert "the run is published, but the launcher's additions to its summary" in err
    assert "2 of 5 records (40.0%) are error rows, more than --max_error_fraction=0.1" in err


def test_a_gz_shard_cut_while_read_is_one_shard_in_the_gates_message(tmp_path):
    """A .jsonl.gz cut after the run found it gives two whole-shard rows (shard_changed, then corrupt_file when its
    gzip stream ends early): counts.shard_errors counts both, and the exit-4 message said "2 shards could not be
    read to the end: <it> and 1 more", naming a second shard that does not exist."""
    import gzip

    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that

    from pipeline.io.sources import ReadSpec, read_shard
    from pipeline.records import ErrorRow
    from pipeline.stages.postprocess import DocStats
    from pipeline.telemetry.stats import ComputeRunStats
    from pipeline.telemetry.timing import stage_column

    lines = b"".join(json.dumps({"id": str(i), "text": f"words {i} " * 40}).encode() + b"\n" for i in range(400))
    whole = gzip.compress(lines)
    shard = tmp_path / "cut.jsonl.gz"
    shard.write_bytes(whole[: len(whole) // 2])  # as it is when read; len(whole) when the run found it
    rows = [row for row in read_shard(str(shard), ReadSpec(sizes={str(shard): len(whole)})) if isinstance(row, ErrorRow)]
    assert [(row.record_index, row.error_type) for row in rows] == [(None, "shard_changed"), (None, "corrupt_file")]
    doc = DocStats(timings={stage_column("infer"): 1.0}, n_tokens=10, window_tokens=12, computed_tokens=16.0,
                   model_id="m", attention_impl="xla", fingerprint="f", backend="cpu", doc_id="d")
    def check(outputs):
        (summary,) = [json.loads(output) for output in outputs]
        assert summary["counts"]["shard_errors"] == 2 and summary["counts"]["shard_error_sources"] == [str(shard)]
        message = launch.error_fraction_failure(summary, 0.1)
        assert f"1 shard could not be read to the end: {shard} (" in message and "more" not in message, message

    with TestPipeline() as p:
        docs = p | "Docs" >> beam.Create([[doc]] * 40)
        errors = p | "Errors" >> beam.Create(rows)
        read = p | "Read" >> beam.Create([["d"] * 40])
        assert_that((docs, errors, read) | ComputeRunStats("embed"), check)
