"""The run report, run history and docs/queries.md on the outputs of a REAL run: `docscore run`
(pipeline.launch.main, DirectRunner, MiniLM, zero-shot classify with gold labels and bad records),
then the report opened in headless Chromium (selenium + Debian's chromium-driver).
"""
from __future__ import annotations

import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import common_flags
from pipeline import launch
from pipeline.io import run_commit, sinks
from pipeline.runs import history, report

pytestmark = pytest.mark.integration  # README.md, "Development"

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
INSTALL_HINT = "install the browser with `apt-get install -y chromium chromium-driver` (Debian) and `pip install selenium==4.51.0`"

LABELS = {
    "sports": "an article about sport, games and athletes",
    "finance": "an article about money, markets and companies",
    "weather": "a weather forecast about rain, sun and temperature",
}
DOCS = [
    ("sports", "The striker scored twice as the home team won the football final."),
    ("sports", "The tennis champion lost in straight sets at the open."),
    ("sports", "Fans cheered as the runner broke the marathon world record."),
    ("sports", "The basketball coach praised his players after the playoff game."),
    ("finance", "Shares of the bank fell after quarterly profits missed forecasts."),
    ("finance", "The central bank raised interest rates to fight inflation."),
    ("finance", "Investors moved money into bonds as stock markets slid."),
    ("finance", "The company agreed to buy its rival for four billion dollars."),
    ("weather", "Heavy rain and strong winds are expected across the north tomorrow."),
    ("weather", "A sunny weekend with temperatures reaching thirty degrees."),
    ("weather", "Snow will fall on the hills overnight, with frost by morning."),
    ("weather", "Forecasters warn of thunderstorms and hail in the afternoon."),
]
BAD_LINES = ['{"id": "broken", "text": ', '{"id": "no-text", "body": "the text field is missing"}']


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One real classify run (+ its history row and report), shared by the tests of this module."""
    root = tmp_path_factory.mktemp("report_run")
    shard = root / "shard-000.jsonl"
    lines = [json.dumps({"id": f"d{i}", "text": text, "label": label}) for i, (label, text) in enumerate(DOCS)]
    shard.write_text("\n".join(lines[:6] + BAD_LINES[:1] + lines[6:] + BAD_LINES[1:]) + "\n")
    output = str(root / "out")
    labels = ";".join(f"{k}={v}" for k, v in LABELS.items())
    # the shapes and kernel the other in-process pipeline tests use, so model and compilations are shared
    # every batch also through the flash kernel (blockwise on CPU): the shadow section of the report
    argv = ["--input", str(shard), "--task", "classify", "--labels", labels, "--attention", "native",
            "--shadow_attention", "flash", "--shadow_fraction", "1", *common_flags("r1", root / "out")]
    assert launch.main(argv) == 0
    run_files = {p.name for p in (root / "out/runs/run_id=r1").iterdir()}
    summary = json.loads((root / "out/runs/run_id=r1/summary.json").read_text())
    assert report.main([f"{output}/runs/run_id=r1"]) == 0
    return output, summary, run_files


class PageOutline(HTMLParser):
    """A report page parsed: `outline`, its headings, gate banners and images in page order, as (kind, text),
    kind "h1", "h2", "banner failed" / "banner notrun" or "img" (text: the alt); `tables`, each table's
    classes and rows of cell texts."""

    def __init__(self, page: str):
        super().__init__()
        self.outline: list[tuple[str, str]] = []
        self.tables: list[tuple[list[str], list[list[str]]]] = []
        self._open: tuple[str, list[str]] | None = None  # the heading or banner whose text is being read
        self._cell: list[str] | None = None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        if tag in ("h1", "h2"):
            self._open = (tag, [])
        elif tag == "div" and "banner" in classes:
            self._open = (" ".join(classes), [])
        elif tag == "img":
            self.outline.append(("img", attrs.get("alt", "")))
        elif tag == "table":
            self.tables.append((classes, []))
        elif tag == "tr" and self.tables:
            self.tables[-1][1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][1][-1].append("".join(self._cell).strip())
            self._cell = None
        elif self._open and (tag in ("h1", "h2") and self._open[0] == tag or tag == "div"):
            self.outline.append((self._open[0], "".join(self._open[1]).strip()))
            self._open = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._open:
            self._open[1].append(data)

    def table(self, css_class: str) -> list[list[str]]:
        (rows,) = [rows for classes, rows in self.tables if css_class in classes]
        return rows


def test_the_run_itself_writes_report_history_and_progress(finished_run):
    *_, run_files = finished_run
    assert {"summary.json", "progress.json", "report.html"} <= run_files
    assert [name for name in run_files if name.startswith("history-")] == [name for name in run_files if name.endswith(".parquet")]


def _scores(output):
    return pq.read_table(run_commit.committed_files(output, "r1", "scores"), partitioning=None).to_pylist()


def _errors(output):
    return pq.read_table(run_commit.committed_files(output, "r1", "errors"), partitioning=None).to_pylist()


def test_report_opens_in_chromium_with_every_chart(finished_run, tmp_path):
    output, summary, run_files = finished_run
    path = Path(run_commit.report_path(output, "r1"))
    page = path.read_text()
    # self-contained: nothing fetched from anywhere, every image inline
    assert not re.search(r"""(src|href)=['"](?!data:image/png;base64,)""", page)
    assert "<script" not in page
    for fact in ("docscore run r1", summary["model"]["fingerprint"], "native -&gt; xla",
                 f"jax {summary['versions']['jax']}", "accuracy", "invalid_json", "missing_field",
                 "Shadow kernel: PASSED", "xla (primary) vs blockwise (shadow)"):
        assert fact in page, fact
    n_scores, n_errors = len(_scores(output)), len(_errors(output))
    assert f"{n_scores + n_errors} / {n_scores} / {n_errors}" in page  # records / scored / errors

    browser = _chromium(tmp_path)
    try:
        browser.get(path.as_uri())
        images = browser.execute_script(
            "return Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight])"
        )
        console = browser.get_log("browser")
        screenshot = tmp_path / "report.png"
        assert browser.save_screenshot(str(screenshot))
    finally:
        browser.quit()
    assert console == [], f"console errors: {console}"
    alts = [alt for alt, *_ in images]
    assert alts == ["Time per stage", "Per-stage latency distribution", "Throughput over the run", "Label distribution",
                    "Errors by stage / type", "Shadow kernel divergence"]
    assert all(complete and width > 0 and height > 0 for _, complete, width, height in images), images
    assert screenshot.stat().st_size > 10_000


def _chromium(tmp_path):
    if shutil.which(CHROMIUM) is None or shutil.which(CHROMEDRIVER) is None:
        pytest.fail(f"headless Chromium is needed for the report test: {INSTALL_HINT}")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail(f"selenium is needed for the report test: {INSTALL_HINT}")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1400,2400", f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # an explicit driver path: selenium-manager never looks for (or downloads) a driver
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


def test_history_row_agrees_with_the_tables(finished_run):
    output, summary, run_files = finished_run
    row = history.history_row(summary)
    scores, errors = _scores(output), _errors(output)
    assert (row["run_id"], row["task"], row["attention_impl"]) == ("r1", "classify", "xla")
    assert row["runner"] == "DirectRunner"  # no --runner: Beam's default, named
    assert (row["pooling"], row["max_seq_len"], row["matmul_precision"]) == ("mean", 32, "highest")  # --max_seq_len 32, f32
    assert row["document_prompt"] is row["query_prompt"] is None
    assert row["model_fingerprint"] == summary["model"]["fingerprint"] and len(row["model_fingerprint"]) == 64
    assert (row["input_records"], row["scored"], row["errors"]) == (len(DOCS) + len(BAD_LINES), len(scores), len(errors))
    assert row["error_rate"] == pytest.approx(len(errors) / (len(scores) + len(errors)))
    assert row["started_at"] < row["finished_at"]
    accuracy = sum(r["label"] == r["gold_label"] for r in scores) / len(scores)
    assert dict(row["task_metrics"])["accuracy"] == pytest.approx(accuracy)
    infer = sorted(r["infer_ms"] for r in scores)
    for column in ("read_p50_ms", "read_p95_ms", "tokenize_p50_ms", "infer_p50_ms", "infer_p95_ms", "postprocess_p95_ms"):
        assert row[column] is not None and row[column] >= 0, column
    assert infer[0] <= row["infer_p50_ms"] <= infer[-1]
    # flash vs native: every document shadowed, different (so really another kernel) but within tolerance
    gate = summary["shadow"]
    diffs = [r["shadow_output_max_abs_diff"] for r in scores]
    assert (row["shadow_attention_impl"], row["shadow_documents"], row["shadow_passed"]) == ("blockwise", len(scores), True)
    assert row["shadow_output_max_abs_diff"] == gate["output_max_abs_diff"] == max(diffs)
    assert 0 < max(diffs) <= gate["tolerance"] == 1e-5
    assert row["shadow_score_max_abs_diff"] == max(r["shadow_score_abs_diff"] for r in scores)
    assert gate["label_flips"] == sum(r["shadow_label_flip"] for r in scores) == 0
    # what was written is exactly that row
    (history_file,) = run_commit.committed_files(output, "r1", "history")
    written = pq.read_table(history_file)
    assert written.schema == history.HISTORY_SCHEMA and written.num_rows == 1
    assert written.to_pylist()[0]["scored"] == row["scored"]
    # what the run cost besides throughput: the written row holds the summary's values
    written_row = written.to_pylist()[0]
    assert written_row["command_wall_s"] == summary["command_wall_s"] > summary["wall_s"]
    assert written_row["device_busy_fraction"] == summary["device"]["busy_fraction"] and 0 < written_row["device_busy_fraction"] <= 1
    assert written_row["host_us_per_doc"] == summary["device"]["host_us_per_doc"] > 0
    assert (written_row["compile_cold_count"], written_row["compile_cached_count"], written_row["batch_size"]) == (
        summary["compile"]["cold_count"], summary["compile"]["cached_count"], summary["batching"]["batch_size"])
    assert written_row["compile_cold_count"] + written_row["compile_cached_count"] == summary["compile"]["count"]


def test_report_command_finds_the_latest_run_and_explains_a_wrong_path(finished_run, tmp_path, capsys):
    output, *_ = finished_run
    assert report.main([output]) == 0  # the output DIR alone: the run that finished last
    assert capsys.readouterr().out.strip() == run_commit.report_path(output, "r1")
    assert report.main([str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "no finished run under" in err and "DIR/runs/run_id=ID" in err
    assert report.main([output, "--run_id", "r9"]) == 2
    assert "run 'r9' did not finish" in capsys.readouterr().err
    assert report.main([""]) == 2  # `docscore report "$OUT"` with OUT unset
    assert "no run given (an empty argument)" in capsys.readouterr().err
    # any of the run's directories names it, as for compare, and so do the summary.json and report.html paths
    # `docscore run` prints at its end (compare took report.html, report refused it); a --run_id saying otherwise
    # is refused, not ignored
    from pipeline.runs.compare import RunRef

    for run_path in [f"{output}/{table}/run_id=r1" for table in ("runs", "scores", "errors")] + [
            f"{output}/runs/run_id=r1/summary.json", f"{output}/runs/run_id=r1/report.html"]:
        assert report.main([run_path]) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.strip() == run_commit.report_path(output, "r1")
        assert (RunRef.parse(run_path).output_dir, RunRef.parse(run_path).run_id) == (output, "r1")
    assert report.main([f"{output}/runs/run_id=r1", "--run_id", "r9"]) == 2
    assert "but --run_id says 'r9'" in capsys.readouterr().err
    # a --run_id that is no partition name cannot lead the report out of DIR
    assert report.main([output, "--run_id", "r1/../../../elsewhere"]) == 2
    assert "is not a run_id docscore writes" in capsys.readouterr().err
    assert not (Path(output).parents[2] / "elsewhere").exists()


def test_a_damaged_summary_of_another_run_is_skipped_and_of_the_run_asked_for_is_exit_2(finished_run, tmp_path, capsys):
    """The run that finished last is chosen among the summaries that read; one that does not (cut short, edited,
    not an object) is named on stderr and skipped, not a JSONDecodeError traceback. Asked for by name, it is exit 2."""
    output, *_ = finished_run
    copy = tmp_path / "out"
    shutil.copytree(output, copy)
    for run_id, text in (("r2", '{"run_id": "r2", "finished'), ("r3", "[]")):
        (copy / "runs" / f"run_id={run_id}").mkdir()
        (copy / "runs" / f"run_id={run_id}" / "summary.json").write_text(text)
    assert report.main([str(copy)]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == run_commit.report_path(str(copy), "r1")
    assert f"skipped {copy}/runs/run_id=r2/summary.json: damaged (JSONDecodeError: " in captured.err
    assert f"skipped {copy}/runs/run_id=r3/summary.json: damaged (ValueError: a JSON list, not an object)" in captured.err
    for run_id, argv in (("r2", [str(copy), "--run_id", "r2"]), ("r3", [f"{copy}/runs/run_id=r3"])):
        assert report.main(argv) == 2
        err = capsys.readouterr().err
        assert f"{copy}/runs/run_id={run_id}/summary.json is damaged (" in err and "publish the run again" in err, err


def test_a_summary_of_another_shape_or_a_folder_it_cannot_write_is_exit_2(finished_run, tmp_path, capsys):
    """A summary.json that is a JSON object but not docscore's (a comparison written over it), or a run folder
    that is read-only: one line and exit 2, not a TypeError or PermissionError traceback with exit 1."""
    output, *_ = finished_run
    copy = tmp_path / "out"
    shutil.copytree(output, copy)
    summary = copy / "runs" / "run_id=r1" / "summary.json"
    saved = summary.read_text()
    summary.write_text(json.dumps({"documents": {"matched": 4}, "violations": [], "limits": {}}))
    assert report.main([str(copy), "--run_id", "r1"]) == 2
    assert capsys.readouterr().err.startswith(f"docscore report: cannot report on {copy}: ")
    summary.write_text(saved)
    page = copy / "runs" / "run_id=r1" / "report.html"
    page.unlink(missing_ok=True)
    page.mkdir()  # where the page goes, as a folder: no write there (root may write anywhere else)
    assert report.main([str(copy), "--run_id", "r1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"docscore report: {copy}/runs/run_id=r1/report.html: cannot be written (") and "must be writable" in err


def test_a_committed_file_gone_since_the_run_is_exit_2_naming_it(finished_run, tmp_path, capsys):
    """`rm OUT/scores/run_id=X/*.parquet`: the file the summary names is missing. A one-line message naming it and
    what to do (exit 2, as compare), not sinks.read_parts' FileNotFoundError traceback."""
    output, *_ = finished_run
    copy = tmp_path / "out"
    shutil.copytree(output, copy)
    (part,) = (copy / "scores" / "run_id=r1").glob("*.parquet")
    part.unlink()
    assert report.main([str(copy), "--run_id", "r1"]) == 2
    err = capsys.readouterr().err
    assert f"run 'r1' under {copy}: a file its summary.json names cannot be read (FileNotFoundError: " in err
    assert part.name in err and "publish the run again" in err


def queries_from_docs() -> list[tuple[str, str]]:
    """(title, SQL) of every ```sql block in docs/queries.md, titled by the heading above it."""
    text = (REPO / "docs" / "queries.md").read_text()
    found, title = [], ""
    for block in re.split(r"(^#+ .*$)", text, flags=re.M):
        if block.startswith("#"):
            title = block.lstrip("# ").strip()
            continue
        found += [(title, sql) for sql in re.findall(r"```sql\n(.*?)```", block, flags=re.S)]
    return found


def test_every_query_in_docs_runs_on_the_run(finished_run):
    output, summary, run_files = finished_run
    queries = queries_from_docs()
    assert len(queries) >= 6
    results, con = {}, duckdb.connect()
    changed = "Documents whose label changed between two runs"
    for title, sql in queries:
        results[title] = con.execute(sql.replace("DIR", output)).fetchall()
        assert results[title] or sql.startswith("CREATE") or title == changed, f"{title}: no rows"
    scores, errors = _scores(output), _errors(output)
    assert results[changed] == []  # r1 against itself
    # against a run B in which one document's label changed, only that document
    (sql,) = [sql for title, sql in queries if title == changed]
    first = min(scores, key=lambda r: (r["source"], r["record_index"]))
    b = (f"(SELECT * REPLACE (CASE WHEN record_index = {first['record_index']} THEN 'another' ELSE label END AS label) "
         "FROM scores WHERE run_id = 'r1') b")
    assert sql.count("(SELECT * FROM scores WHERE run_id = 'r1') b") == 1
    rows = con.execute(sql.replace("(SELECT * FROM scores WHERE run_id = 'r1') b", b)).fetchall()
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in rows] == [
        (first["source"], first["record_index"], first["doc_id"], first["label"], "another")]
    assert results["Documents per predicted label"] and sum(n for _, n in results["Documents per predicted label"]) == len(scores)
    assert sum(r[-1] for r in results["Errors by stage and type"]) == len(errors)
    assert results["Accuracy per run"] == [("r1", len(scores), pytest.approx(summary["task_metrics"]["accuracy"]))]
    runs = results["Runs over time"]
    assert len(runs) == 1 and runs[0][0] == "r1"
    assert runs[0][-11] == pytest.approx(summary["task_metrics"]["accuracy"])
    assert runs[0][-9:-5] == ("blockwise", summary["shadow"]["output_max_abs_diff"], True, summary["gates"]["error_fraction"]["passed"])
    assert runs[0][-6] is True  # error_gate_passed: the run's error rows are within its --max_error_fraction
    assert runs[0][-5:] == (round(summary["command_wall_s"], 1), round(summary["device"]["busy_fraction"], 2),
                            round(summary["device"]["host_us_per_doc"]), summary["compile"]["cold_count"],
                            summary["compile"]["cached_count"])
    (per_stage,) = results["Time per stage, from the per-document timing columns"]
    infer = summary["timing"]["stages"]["infer"]
    assert per_stage[-2:] == (round(infer["p50"], 2), round(infer["p95"], 2))  # the summary's percentiles, same rank
    (shadowed,) = results["Shadow kernel divergence"]
    assert shadowed[:4] == ("r1", "xla", "blockwise", len(scores))
    assert shadowed[4] == summary["shadow"]["output_max_abs_diff"] and shadowed[-1] == 0


def test_the_documented_views_are_the_ones_the_code_makes():
    (views,) = [sql for title, sql in queries_from_docs() if sql.startswith("CREATE")]
    def flat(sql: str) -> str:
        return re.sub(r"\(\s+", "(", " ".join(sql.split()))

    assert flat(views) == flat(run_commit.duckdb_views_sql("DIR"))


def old_layout_copy(output: str, run_id: str, dest: Path, *, marked: bool = True) -> None:
    """The committed run `run_id` of `output` copied to dest as docscore published before the run-level commit:
    part-NNNNN-of-NNNNN.parquet files behind a _SUCCESS per partition (marked=False: a run that did not finish
    publishing), runs/run_id=ID/history.parquet and a summary.json without `files` nor `launch_id`."""
    for table in ("scores", "errors"):
        files = run_commit.committed_files(output, run_id, table)
        folder = dest / table / f"run_id={run_id}"
        folder.mkdir(parents=True)
        for i, path in enumerate(files):
            shutil.copy(path, folder / f"part-{i:05d}-of-{len(files):05d}.parquet")
        if marked:
            (folder / run_commit.LEGACY_SUCCESS).write_text("")
    folder = dest / "runs" / f"run_id={run_id}"
    folder.mkdir(parents=True)
    (history_file,) = run_commit.committed_files(output, run_id, "history")
    shutil.copy(history_file, folder / "history.parquet")
    summary = run_commit.committed_summary(output, run_id)
    old = {k: v for k, v in summary.items() if k not in ("files", "launch_id", "retired", "committed_at")}
    (folder / "summary.json").write_text(json.dumps(old))


def view_rows(output: str) -> dict[str, int]:
    """Rows of each view over `output`."""
    con = duckdb.connect()
    con.execute(run_commit.duckdb_views_sql(output))
    return {view: con.execute(f"SELECT count(*) FROM {view}").fetchall()[0][0] for view in ("scores", "errors", "history")}


def committed_rows(output: str) -> dict[str, int]:
    """Rows of each table in the files committed_files reads, over every committed run."""
    return {view: sum(pq.read_metadata(f).num_rows for run_id in run_commit.committed_run_ids(output)
                      for f in run_commit.committed_files(output, run_id, view))
            for view in ("scores", "errors", "history")}


def test_the_views_read_runs_of_the_old_layout_as_committed_files_does(finished_run, tmp_path):
    """An output of old-layout runs only, then one with runs of both layouts: the views hold exactly the rows of
    the files committed_files reads (an old partition without its _SUCCESS marker is no committed run)."""
    output, *_ = finished_run
    old = tmp_path / "old"
    old_layout_copy(output, "r1", old)
    expected = {"scores": len(_scores(output)), "errors": len(_errors(output)), "history": 1}
    assert committed_rows(str(old)) == expected
    assert view_rows(str(old)) == expected
    mixed = tmp_path / "mixed"
    shutil.copytree(output, mixed)
    old_layout_copy(output, "r1", mixed / "legacy")
    for name in ("scores", "errors", "runs"):  # the old run as run r0 beside the new layout's r1
        (mixed / "legacy" / name / "run_id=r1").rename(mixed / name / "run_id=r0")
    old_layout_copy(output, "r1", mixed / "unmarked", marked=False)
    for name in ("scores", "errors"):  # a run of the old layout that never finished publishing: r2
        (mixed / "unmarked" / name / "run_id=r1").rename(mixed / name / "run_id=r2")
    assert committed_rows(str(mixed)) == {view: 2 * n for view, n in expected.items()}
    assert view_rows(str(mixed)) == committed_rows(str(mixed))


def test_a_report_rendered_while_a_launch_replaces_the_run_is_not_written(finished_run, tmp_path, monkeypatch, capsys):
    """`docscore report` loads run r1; while it renders, a launch replaces r1 and writes its own report. The page
    of the run as it was must not land over it, beside the new summary: refused (exit 2), naming the change."""
    output, *_ = finished_run
    copy = tmp_path / "out"
    shutil.copytree(output, copy)
    shard = tmp_path / "three.jsonl"
    shard.write_text("".join(json.dumps({"id": f"n{i}", "text": text}) + "\n" for i, (_, text) in enumerate(DOCS[:3])))
    render, rendered, relaunched = report.render_html, [], []

    def relaunch_while_rendering(run):
        rendered.append(run.summary["counts"]["records"])
        if len(rendered) == 1:  # the launch's own report renders as the second page
            labels = ";".join(f"{k}={v}" for k, v in LABELS.items())
            relaunched.append(launch.main(["--input", str(shard), "--task", "classify", "--labels", labels,
                                           "--attention", "native", "--no_progress", *common_flags("r1", copy)]))
        return render(run)

    monkeypatch.setattr(report, "render_html", relaunch_while_rendering)
    assert report.main([str(copy), "--run_id", "r1"]) == 2
    assert relaunched == [0] and rendered == [len(DOCS) + len(BAD_LINES), 3]
    err = capsys.readouterr().err
    assert "run 'r1' under" in err and "changed while its report was rendered (launch " in err and "replaced it)" in err
    page = PageOutline(Path(run_commit.report_path(str(copy), "r1")).read_text())
    facts = dict([rows for classes, rows in page.tables if "facts" in classes][0])
    assert facts["records / scored / errors"] == "3 / 3 / 0"  # the launch's report, not the replaced run's


def test_a_report_rendered_while_its_launch_rewrites_the_summary_is_not_written(finished_run, tmp_path, monkeypatch, capsys):
    """The launcher adds Beam metrics and gates to its committed summary, then writes the report: a page rendered
    from the summary before that is refused too."""
    output, summary, _ = finished_run
    copy = tmp_path / "out"
    shutil.copytree(output, copy)
    render = report.render_html
    monkeypatch.setattr(report, "render_html", lambda run: (
        run_commit.rewrite_summary(str(copy), {**run.summary, "wall_s": run.summary["wall_s"] + 1}), render(run))[1])
    before = Path(run_commit.report_path(str(copy), "r1")).read_text()
    assert report.main([str(copy), "--run_id", "r1"]) == 2
    assert f"(its launch {summary['launch_id']} rewrote its summary.json)" in capsys.readouterr().err
    assert Path(run_commit.report_path(str(copy), "r1")).read_text() == before


def test_a_run_of_no_documents_prints_no_made_up_zeros(tmp_path, capsys):
    """An input with no records has no percentiles, padding efficiency or host time per document: the printed
    line shows "-" where the summary and the report have none."""
    shard = tmp_path / "empty.jsonl"
    shard.write_text("")
    assert launch.main(["--input", str(shard), "--task", "embed", "--attention", "native", "--no_progress",
                        "--shadow_attention", "flash", *common_flags("empty", tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "out/runs/run_id=empty/summary.json").read_text())
    assert summary["counts"]["records"] == 0 and summary["tokens"]["padding_efficiency"] is None
    assert "read: p50 - p95 -" in printed and "padding efficiency -;" in printed
    shadow = summary["shadow"]  # no document compared: no difference measured, no gate passed
    assert (shadow["documents"], shadow["output_max_abs_diff"], shadow["passed"]) == (0, None, None)
    assert "max |output diff| -, max |score diff| -" in printed
    assert "p50 0.0" not in printed and "0.00" not in printed


def test_report_reads_jsonl_tables_like_parquet(finished_run, tmp_path):
    """--output_format jsonl: the same run's rows as the JSON lines the sink writes, read back the same."""
    output, summary, _ = finished_run
    jsonl_out = tmp_path / "out"
    files = {"history": []}
    for table in ("scores", "errors"):
        part = jsonl_out / table / "run_id=r1" / "part-00000-of-00001.jsonl"
        part.parent.mkdir(parents=True)
        rows = pq.read_table(run_commit.committed_files(output, "r1", table), partitioning=None).to_pylist()
        part.write_text("".join(json.dumps(row) + "\n" for row in rows))
        files[table] = [f"{table}/run_id=r1/{part.name}"]
    run_dir = jsonl_out / "runs" / "run_id=r1"
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({**summary, "files": files,
                                                      "config": {**summary["config"], "output_format": "jsonl"}}))
    from_jsonl = report.load_run(str(jsonl_out), "r1")
    from_parquet = report.load_run(output, "r1")
    for table in ("scores", "errors"):
        a, b = getattr(from_jsonl, table), getattr(from_parquet, table)
        assert a.column_names == b.column_names
        assert a.to_pylist() == b.to_pylist()  # JSON keeps doubles exactly
    assert report.main([str(run_dir)]) == 0
    assert (run_dir / "report.html").read_text().count("data:image/png;base64,") >= 4


def test_report_of_a_jsonl_run_without_errors(tmp_path):
    """A real --output_format jsonl run whose records are all fine: its errors part is an empty file,
    which reads as zero rows with the errors table's types (the run writes its report itself)."""
    shard = tmp_path / "shard-000.jsonl"
    shard.write_text("".join(json.dumps({"id": f"d{i}", "text": text}) + "\n" for i, (_, text) in enumerate(DOCS[:3])))
    out = tmp_path / "out"
    assert launch.main(["--input", str(shard), "--attention", "native", "--output_format", "jsonl",
                              "--no_progress", *common_flags("clean", out)]) == 0
    errors_dir = out / "errors" / "run_id=clean"
    assert [p.stat().st_size for p in errors_dir.glob("part-*.jsonl")] == [0], "expected one empty errors part"
    assert (out / "runs" / "run_id=clean" / "report.html").exists(), "the run did not write its report"
    run = report.load_run(str(out), "clean")
    assert run.errors.num_rows == 0 and run.errors.column_names == list(report.ERROR_COLUMNS)
    assert run.errors.schema.field("record_index").type == pa.int64()
    assert run.scores.num_rows == 3 and run.scores.schema.field("n_tokens").type == pa.int64()
    page = (out / "runs" / "run_id=clean" / "report.html").read_text()
    assert "data:image/png;base64," in page and "<h2>Error rows</h2>" not in page
    # embed computes no metrics whatever its records carry: the page does not send the reader looking for gold labels
    assert "no task metrics (embed computes none)" in page and "no gold labels" not in page


# ---- for the analyst: how the classifier did, document by document --------------------------------


def test_classify_report_shows_the_confusion_matrix_and_per_class_rates_before_the_label_chart(finished_run):
    output, summary, _ = finished_run
    page = PageOutline(Path(run_commit.report_path(output, "r1")).read_text())
    scores = [r for r in _scores(output) if r["gold_label"] is not None]
    labels = sorted({r["gold_label"] for r in scores} | {r["label"] for r in scores})
    matrix = page.table("confusion")
    assert matrix[0] == ["gold \\ predicted", *labels]
    for gold, *cells in matrix[1:]:
        assert [int(c) for c in cells] == [sum(r["gold_label"] == gold and r["label"] == p for r in scores) for p in labels]
    assert [row[0] for row in matrix[1:]] == labels
    assert sum(int(c) for row in matrix[1:] for c in row[1:]) == len(scores) == summary["task_metrics"]["n_gold"]
    rates = {row[0]: row[1:] for row in page.table("per-class")[1:]}
    assert set(rates) == set(labels)
    for label in labels:
        hits = sum(r["gold_label"] == label == r["label"] for r in scores)
        predicted = sum(r["label"] == label for r in scores)
        support = sum(r["gold_label"] == label for r in scores)
        precision, recall, shown_support, shown_predicted = rates[label]
        assert precision == (report._fmt(hits / predicted) if predicted else "-")
        assert recall == (report._fmt(hits / support) if support else "-")
        assert (int(shown_support), int(shown_predicted)) == (support, predicted)
    # macro-F1 from the shown rates agrees with the pipeline's own metric
    f1 = [2 * p * r / (p + r) if p and r else 0.0 for p, r in (
        (float(rates[l][0]) if rates[l][0] != "-" else 0.0, float(rates[l][1]) if rates[l][1] != "-" else 0.0) for l in labels)]
    assert sum(f1) / len(f1) == pytest.approx(summary["task_metrics"]["macro_f1"], abs=1e-3)
    kinds = [text for kind, text in page.outline if kind in ("h2", "img")]
    assert kinds.index("Confusion matrix") < kinds.index("Per-class precision and recall") < kinds.index("Label distribution")
    # a run whose gates passed has no banner
    assert not [kind for kind, _ in page.outline if kind.startswith("banner")]
    assert summary["gates"]["error_fraction"]["passed"] is True and summary["gates"]["shadow"]["passed"] is True


def test_classify_report_lists_the_lowest_confidence_documents(finished_run):
    output, _, _ = finished_run
    page = PageOutline(Path(run_commit.report_path(output, "r1")).read_text())
    listed = page.table("least-confident")
    assert listed[0] == ["doc_id", "predicted label", "score (probability)", "gold label"]
    expected = sorted(_scores(output), key=lambda r: (r["score"], r["doc_id"]))[:report.LEAST_CONFIDENT_LISTED]
    assert len(listed) - 1 == len(expected) == min(report.LEAST_CONFIDENT_LISTED, len(_scores(output)))
    assert listed[1:] == [[r["doc_id"], r["label"], report._fmt(r["score"]), report._fmt(r["gold_label"])] for r in expected]


@pytest.mark.parametrize("output_format", ["parquet", "jsonl"])
def test_lowest_scores_scans_the_table_in_batches(tmp_path, monkeypatch, output_format):
    """Many parts and many record batches each: the k lowest of the whole table, though no more than one
    batch (plus k rows) is held at a time; nulls and missing columns are skipped / read as null."""
    monkeypatch.setattr(sinks, "READ_BATCH_ROWS", 7)
    import random

    rng = random.Random(0)
    rows = [{"doc_id": f"d{i:03d}", "label": rng.choice("abc"), "score": round(rng.random(), 2),
             "gold_label": rng.choice(["a", "b", None])} for i in range(300)]
    rows[5]["score"] = None
    part_dir = tmp_path / "scores" / "run_id=x"
    part_dir.mkdir(parents=True)
    held = []
    real_concat = pa.concat_tables
    monkeypatch.setattr(report.pa, "concat_tables", lambda tables: held.append(sum(t.num_rows for t in tables)) or real_concat(tables))
    files = []
    for n, start in enumerate(range(0, 300, 40)):
        chunk = rows[start:start + 40]
        if output_format == "parquet":
            pq.write_table(pa.Table.from_pylist(chunk), part_dir / f"part-{n:05d}.parquet", row_group_size=9)
        else:
            (part_dir / f"part-{n:05d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chunk))
        files.append(f"scores/run_id=x/part-{n:05d}.{output_format}")
    (tmp_path / "runs" / "run_id=x").mkdir(parents=True)
    (tmp_path / "runs" / "run_id=x" / "summary.json").write_text(json.dumps({"run_id": "x", "files": {"scores": files}}))
    lowest = report.lowest_scores(str(tmp_path), "x", 10)
    expected = sorted((r for r in rows if r["score"] is not None), key=lambda r: (r["score"], r["doc_id"]))[:10]
    assert lowest.to_pylist() == [{k: r[k] for k in report.LEAST_CONFIDENT_COLUMNS} for r in expected]
    assert len(held) > 300 // 40 and max(held) <= 10 + 40  # never more than k rows + one batch (jsonl: <= a part)
    if output_format == "parquet":
        assert max(held) <= 10 + 7


def test_class_labels_from_the_data_never_break_the_label_chart():
    """A label is data: `$...$` would be matplotlib mathtext (an unparsable one failed the whole report) and a
    label of thousands of characters collapsed the axes. Both are drawn as plain, cut text."""
    import pyarrow as pa

    from pipeline.runs.report import CHART_TEXT_CHARS, chart_text, outcome_chart

    labels = ["$\\foo{$", "$\\alpha$", "x" * 5000, "plain"]
    scores = pa.table({"label": labels, "gold_label": labels[::-1]})
    png, title = outcome_chart(scores, "classify")
    assert title == "Label distribution" and png.startswith(b"\x89PNG")
    assert chart_text("$\\alpha$") == "\\$\\alpha\\$" and len(chart_text("x" * 5000)) == CHART_TEXT_CHARS
    assert chart_text("red\x1b[31m\x00") == "red\ufffd[31m\ufffd"  # matplotlib's glyph warnings echoed them raw


def test_a_label_chart_of_scripts_the_font_lacks_draws_without_a_warning_per_glyph():
    """CJK or emoji labels (DejaVu Sans lacks them) and control characters: one UserWarning per missing glyph went
    to the console, quoting the raw characters (escape sequences included)."""
    import warnings

    import pyarrow as pa

    from pipeline.runs.report import outcome_chart

    scores = pa.table({"label": ["東京", "\U0001F600", "a\x1b[2J"], "gold_label": ["東京", "a\x1b[2J", "x"]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        png, _ = outcome_chart(scores, "classify")
    assert png and not [w for w in caught if "Glyph" in str(w.message)], [str(w.message) for w in caught]


def test_label_chart_counts_predicted_and_gold_over_the_same_records():
    """Predicted bars over all 5 records beside gold bars over the 3 with gold read as 2x over-prediction of
    "a": with gold labels both count the records that have one."""
    import pyarrow as pa

    from pipeline.runs.report import label_counts

    scores = pa.table({"label": ["a", "a", "b", "a", None], "gold_label": ["a", None, "b", None, "b"]})
    counts = label_counts(scores)
    assert (counts.labels, counts.predicted, counts.gold, counts.counted, counts.scored) == (["a", "b"], [1, 1], [1, 1], 2, 5)
    no_gold = label_counts(pa.table({"label": ["a", "a", "b", None], "gold_label": pa.array([None] * 4, pa.string())}))
    assert (no_gold.labels, no_gold.predicted, no_gold.gold, no_gold.counted) == (["a", "b"], [2, 1], [], 3)


def test_thousands_of_gold_labels_fold_into_one_other_label_not_a_square_matrix():
    """Free-text gold labels (or float ones run as classify): the confusion matrix had a row and a column per
    label, 305 MB of HTML for 4,000. The most frequent labels are shown one by one, the rest as one label, in the
    matrix and the chart; the counts keep every document."""
    import pyarrow as pa

    from pipeline.runs.report import SHOWN_LABELS, confusion_counts, label_counts, other_labels

    gold = ["sports"] * 50 + ["politics"] * 30 + [f"g{i}" for i in range(4000)]
    predicted = ["sports"] * 40 + ["politics"] * 10 + ["politics"] * 30 + ["sports"] * 4000
    scores = pa.table({"label": predicted, "gold_label": gold})
    labels, counts, folded = confusion_counts(scores)
    assert len(labels) == SHOWN_LABELS and folded == labels[-1] == other_labels(4002 - (SHOWN_LABELS - 1))
    assert {"sports", "politics"} <= set(labels) and sum(counts.values()) == len(gold)
    assert counts[("sports", "sports")] == 40 and counts[("politics", "politics")] == 30
    assert counts[(folded, "sports")] == 4000 - (SHOWN_LABELS - 3)  # g-labels not among the most frequent
    chart = label_counts(scores)
    assert len(chart.labels) == SHOWN_LABELS and sum(chart.gold) == sum(chart.predicted) == len(gold)
    small = confusion_counts(pa.table({"label": ["a", "b"], "gold_label": ["a", "a"]}))
    assert small == (["a", "b"], {("a", "a"): 1, ("a", "b"): 1}, None)


def test_report_header_shows_what_the_run_cost(finished_run):
    """The page's facts: the whole command beside the pipeline, compiles split cold / cached, the device's busy
    share and host time per document, the batch settings, as summary.json has them."""
    output, summary, _ = finished_run
    page = PageOutline(Path(run_commit.report_path(output, "r1")).read_text())
    facts = dict([rows for classes, rows in page.tables if "facts" in classes][0])  # the header's, first
    assert facts["wall time (s): pipeline / whole command"] == (
        f"{report._fmt(summary['wall_s'])} / {report._fmt(summary['command_wall_s'])}")
    compile_ = summary["compile"]
    assert facts["compiles"].endswith(f": {compile_['cold_count']} compiled, {compile_['cached_count']} from the "
                                      "compilation cache")
    device = summary["device"]
    assert facts["device busy"].startswith(f"{device['busy_fraction']:.2f} of the pipeline's wall time")
    assert f"host {report._fmt(device['host_us_per_doc'])} us a document" in facts["device busy"]
    assert "older docscore" not in facts["device busy"] and summary["format_version"] == 1
    # the same figures in a summary an older docscore wrote (no format_version) are marked as possibly defined
    # otherwise; a run without them says it was not recorded (it said "several processes or remote workers")
    older = {k: v for k, v in summary.items() if k != "format_version"}
    assert report.device_text(history.history_row(older), older).endswith(
        "(an older docscore wrote this run: its definitions may differ, docs/summary.md \"Older runs\")")
    oldest = {k: v for k, v in older.items() if k != "device"}
    assert report.device_text(history.history_row(oldest), oldest) == "- (not recorded by the older docscore that wrote this run)"
    # an older run over several processes: that is why, as for a run of today
    processes = {**older, "device": {**older["device"], "busy_fraction": None, "host_us_per_doc": None, "busy_processes": 4}}
    assert report.device_text(history.history_row(processes), processes) == (
        "- (not known for a run over several processes or remote workers)")
    batching = summary["batching"]
    assert facts["batching"] == (f"{batching['batch_size']} rows a call, {batching['calls_per_beam_batch']} calls a "
                                 f"Beam batch ({batching['beam_batch_tokens']} tokens), 1 parallel bundle(s)")


def test_every_history_column_is_described_in_the_docs():
    """docs/queries.md's table of the history columns names each column HISTORY_SCHEMA has (a stage's p50/p95 by
    the STAGE_ pattern), so an analyst can read what a column holds; a column added to the schema fails here."""
    from pipeline.runs.history import HISTORY_SCHEMA
    from pipeline.telemetry.timing import STAGES

    text = (REPO / "docs" / "queries.md").read_text()
    section = text.split("## The history table's columns", 1)[1].split("\n## ", 1)[0]
    described = set(re.findall(r"^\| `([a-z_]+)`", section, re.M))
    stage_columns = {f"{stage}_{stat}_ms" for stage in STAGES for stat in ("p50", "p95")}
    assert "`STAGE_p50_ms`, `STAGE_p95_ms`" in section and all(stage in section for stage in STAGES)
    assert set(HISTORY_SCHEMA.names) - stage_columns == described


def test_the_output_dir_alone_reports_the_run_that_finished_last(tmp_path):
    """`docscore report DIR`: of several runs, the one whose finished_at is the latest, whatever its run_id or the
    order its folder is listed in."""
    import numpy as np

    from tests.test_compare import score_rows, summary, write_run

    out = str(tmp_path / "out")
    for run_id, finished in (("a-late", "2026-12-02T08:00:00+00:00"), ("b-early", "2026-12-01T09:30:00+00:00"),
                             ("c-middle", "2026-12-01T23:59:59.500000+00:00")):
        write_run(out, run_id, score_rows(run_id, "embed", 2, embeddings=np.eye(2, 4)),
                  run_summary={**summary(run_id, "embed"), "finished_at": finished})
    assert report.locate_run(out) == (out, "a-late")
    # an empty --run_id (`--run_id "$RUN"` with RUN unset) is refused, not read as "the run that finished last"
    for empty in ("", " "):
        with pytest.raises(report.ReportError, match="--run_id=.* is empty"):
            report.locate_run(out, empty)


def test_the_pages_tables_say_what_the_summary_says():
    """The header's runner and error rate, and the stage table's columns, from a summary in the layout
    pipeline/runs/summary.py writes: each figure in its own column, the rate in percent, the runner named once."""
    from tests.test_history import summary_in_layout

    summary = {**summary_in_layout("r1", scored=90, errors=10, docs_per_s=1.5, accuracy=0.75),
               "runner": {"runner": "DirectRunner", "direct_running_mode": "multi_threading", "direct_num_workers": 4}}
    facts = dict(report.header_facts(summary))
    assert facts["error rate"] == "10.00%" and facts["records / scored / errors"] == "100 / 90 / 10"
    assert facts["runner"] == "DirectRunner (direct_running_mode=multi_threading, direct_num_workers=4)"
    assert report.runner_text({"runner": {"runner": "DataflowRunner"}}) == "DataflowRunner"
    rows = PageOutline(report.stage_table(summary)).table("grid")
    assert rows[0] == ["stage", "total ms", "p50 ms", "p95 ms", "p99 ms"]
    assert {row[0]: row[1:] for row in rows[1:]}["infer"] == ["5000", "2.5", "9", "12"]


def test_per_class_rates_and_the_error_rows_listed():
    """Precision is over the documents predicted as a label, recall over those whose gold label it is; the error
    rows' note says how many were left out only when some were."""
    from pipeline.records import ERRORS_SCHEMA

    counts = {("a", "a"): 3, ("a", "b"): 1, ("b", "a"): 2, ("b", "b"): 4, ("c", "b"): 1}
    rates = {r["label"]: r for r in report.per_class_rates(["a", "b", "c"], counts)}
    assert (rates["a"]["precision"], rates["a"]["recall"], rates["a"]["support"], rates["a"]["predicted"]) == (3 / 5, 3 / 4, 4, 5)
    assert (rates["b"]["precision"], rates["b"]["recall"]) == (4 / 6, 4 / 6)
    assert (rates["c"]["precision"], rates["c"]["recall"], rates["c"]["support"]) == (None, 0.0, 1)  # never predicted

    def errors(n):
        return pa.Table.from_pylist([{"source": "s.jsonl", "record_index": i, "stage": "parse", "error_type": "E",
                                      "message": "bad"} for i in range(n)],
                                    schema=pa.schema([ERRORS_SCHEMA.field(c) for c in report.ERROR_COLUMNS]))

    listed = report.ERRORS_LISTED
    assert "first" not in report.errors_table(errors(listed))
    assert len(PageOutline(report.errors_table(errors(listed))).table("grid")) == listed + 1
    assert f"first {listed} of {listed + 1} error rows" in report.errors_table(errors(listed + 1))


def test_as_many_labels_as_are_shown_are_all_shown_one_by_one():
    """SHOWN_LABELS labels (a 25-class classify) are each shown; one more folds the least frequent into one."""
    from collections import Counter

    n = report.SHOWN_LABELS
    labels, fold = report.shown_labels(Counter({f"l{i:02d}": 100 - i for i in range(n)}))
    assert labels == [f"l{i:02d}" for i in range(n)] and fold("l07") == "l07"
    labels, fold = report.shown_labels(Counter({f"l{i:02d}": 100 - i for i in range(n + 1)}))
    assert labels == [f"l{i:02d}" for i in range(n - 1)] + [report.other_labels(2)] and fold(f"l{n:02d}") == labels[-1]
