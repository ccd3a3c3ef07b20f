"""A run becomes visible as one unit: its summary.json is the commit record, written last.

Layout under the output root (file outputs; BigQuery publishes in one transaction instead):
    scores/run_id=ID/part-LAUNCH-*.parquet   errors/run_id=ID/part-LAUNCH-*.parquet
    runs/run_id=ID/history-LAUNCH.parquet    runs/run_id=ID/summary.json
LAUNCH is unique per `docscore run` launch, so a new launch's files land beside the committed run's
without touching them. summary.json names every file of the run (`files`, relative to the output root)
and its `launch_id`; replacing it is the one atomic step (a rename locally, one object upload on gs://,
where directories cannot be renamed). Before that step readers see the previous run; after it, the new
one. Files no committed summary names are left-overs of failed launches, removed after a commit; the
replaced launch's files stay for REPLACED_GRACE_S (the summary lists them under `retired`), so a reader
that read the previous summary just before the commit can still open them, and go at the first commit
or launch after that. Readers therefore read through the summary (committed_files), never by listing a
partition.

Holds placing staged files, the commit, clean-up and the readers' side. Must not decide when to publish
(pipeline/runs/publish.py) nor compute the summary (pipeline/runs/summary.py).
"""
from __future__ import annotations

import errno
import json
import logging
import os
import posixpath
import re
import shutil
import threading
import time
import uuid
from collections import Counter
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from pipeline.records import finite_or_none

TABLES = ("scores", "errors")
OUTPUT_FOLDERS = (*TABLES, "runs", "_staging", "_leases")  # what docscore writes under an --output, nothing else
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.html"
FILES_KEY = "files"  # summary.json: {table: [paths relative to the output root]}
LAUNCH_KEY = "launch_id"
# summary.json: the launches this run replaced within the last REPLACED_GRACE_S, [{launch_id, retired_at, files}]:
# a reader that read the previous summary just before the commit still finds the files it names
RETIRED_KEY = "retired"
REPLACED_GRACE_S = 600.0
LAUNCH_HISTORY_NAME = re.compile(r"^history-[0-9a-f]+\.parquet$")  # history_name's: one per launch
LEGACY_SUCCESS = "_SUCCESS"  # runs published before the run-level commit marked each partition
# what docscore writes inside a partition (and may therefore remove there): part files, history rows,
# its own temporary files and the old per-partition marker; anything else is left alone
OWNED_NAME = re.compile(r"^(part-.*\.(parquet|jsonl)|history(-[0-9a-f]+)?\.parquet|\..*\.docscore-tmp|_SUCCESS)$")

log = logging.getLogger(__name__)
# held while a launch places and commits its files, so an interrupt handler in this process sees a commit
# whole or not at all (pipeline/launch.py exit_on_interrupt)
COMMIT_LOCK = threading.RLock()


class CommitError(RuntimeError):
    """The run cannot be committed (files gone, a link where a partition should be, another launch's
    lease); the previous committed run, if any, is untouched."""


# ---- paths ---------------------------------------------------------------------------------------


RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def safe_run_id(run_id: object) -> bool:
    """run_id names directories (TABLE/run_id=ID): one plain path segment, never `..`."""
    return isinstance(run_id, str) and bool(RUN_ID_PATTERN.fullmatch(run_id)) and ".." not in run_id


PARTITION_PREFIX = "run_id="


def partition_name(run_id: str) -> str:
    """The folder name a run's files live in: run_id=ID."""
    return f"{PARTITION_PREFIX}{run_id}"


def partition_run_id(path: str) -> str | None:
    """ID of a path whose last segment is run_id=ID; None for any other path."""
    base = posixpath.basename(path.rstrip("/"))
    return base[len(PARTITION_PREFIX):] or None if base.startswith(PARTITION_PREFIX) else None


RUN_FILES = (SUMMARY_FILE, REPORT_FILE)  # the files of DIR/runs/run_id=ID that `docscore run` prints


def named_run(path: str) -> tuple[str, str] | None:
    """(output DIR, run_id) of a path naming one run: one of its partitions (DIR/scores|errors|runs/run_id=ID) or
    a file of DIR/runs/run_id=ID that `docscore run` prints (summary.json, report.html); None for any other path.
    What `docscore report` and `docscore compare` take as a run."""
    path = path.rstrip("/") or "/"
    folder = posixpath.dirname(path)
    if posixpath.basename(path) in RUN_FILES and posixpath.basename(posixpath.dirname(folder)) == "runs":
        path = folder
    run_id = partition_run_id(path)
    if run_id is None or posixpath.basename(posixpath.dirname(path)) not in (*TABLES, "runs"):
        return None
    return posixpath.dirname(posixpath.dirname(path)), run_id


def partition(output: str, table: str, run_id: str) -> str:
    """DIR/<table>/run_id=ID (table: scores, errors or runs; _staging for the launches' staging)."""
    return posixpath.join(output.rstrip("/"), table, partition_name(run_id))


def summary_path(output: str, run_id: str) -> str:
    return posixpath.join(partition(output, "runs", run_id), SUMMARY_FILE)


def placed_name(staged_name: str, launch: str) -> str:
    """part-00000-of-00002.parquet -> part-LAUNCH-00000-of-00002.parquet: unique per launch."""
    return f"part-{launch}-{staged_name[len('part-'):]}" if staged_name.startswith("part-") else f"part-{launch}-{staged_name}"


def report_path(output: str, run_id: str) -> str:
    """runs/run_id=ID/report.html: derived from the committed run, not part of its commit."""
    return posixpath.join(partition(output, "runs", run_id), REPORT_FILE)


def history_name(launch: str) -> str:
    return f"history-{launch}.parquet"


def relative(output: str, url: str) -> str:
    return posixpath.relpath(fs_path(url), fs_path(output))


# ---- writing -------------------------------------------------------------------------------------


def write_atomic(url: str, data: bytes) -> None:
    """Write `url` so that a reader sees the old content or the new, never part of it: locally a
    temporary file in the same directory renamed over it (after fsync, so a crash cannot leave an
    empty file under the final name); on object stores one upload, which appears whole or not at all."""
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    if not is_local(fs):
        fs.pipe_file(path, data)
        return
    tmp = posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.{uuid.uuid4().hex[:8]}.docscore-tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise


def place_staged(output: str, run_id: str, launch: str, table: str, staged: list[str]) -> list[str]:
    """Move (locally) or copy (object stores) this launch's staged files of `table` into its partition
    under launch-unique names; returns their paths relative to the output root. Safe to repeat: a file
    already placed by an earlier attempt (staged copy gone, placed file there) is kept."""
    fs, dest_dir = fsspec.core.url_to_fs(partition(output, table, run_id))
    refuse_linked_partition(fs, dest_dir)
    fs.makedirs(dest_dir, exist_ok=True)
    placed = []
    for src in sorted(staged):
        src_path = fs_path(src)
        dest = posixpath.join(dest_dir, placed_name(posixpath.basename(src_path), launch))
        if fs.exists(src_path):
            if is_local(fs):
                _move_local(src_path, dest)
            else:
                fs.copy(src_path, dest)
        elif not fs.exists(dest):
            raise CommitError(
                f"cannot publish {partition(output, table, run_id)}: the staged file {src} is gone and was not placed "
                "(staging removed by hand?); the previous run, if any, stays published; rerun with the same --run_id")
        placed.append(relative(output, fs.unstrip_protocol(dest) if not is_local(fs) else dest))
    return placed


def commit(output: str, run_id: str, summary: dict[str, Any], files: dict[str, list[str]], launch: str) -> dict[str, Any]:
    """The one atomic step: summary.json, naming the run's files, replaces the previous one. Every named
    file must exist (checked first: a summary must never name a missing file). Returns the summary written."""
    fs, root = fsspec.core.url_to_fs(output)
    missing = [f for names in files.values() for f in names if not fs.exists(posixpath.join(root, f))]
    if missing:
        raise CommitError(f"cannot commit run {run_id}: {missing[:3]} are missing; nothing was published")
    now = time.time()
    previous = with_legacy_files(output, run_id, summary_to_replace(output, run_id),
                                 {f for names in files.values() for f in names})
    committed = {**summary, LAUNCH_KEY: launch, FILES_KEY: {k: sorted(v) for k, v in files.items()},
                 RETIRED_KEY: retired_after(previous, launch, now), "committed_at": now}
    write_atomic(summary_path(output, run_id), _json(committed))
    return committed


def rewrite_summary(output: str, summary: dict[str, Any]) -> None:
    """Replace a committed summary with an enriched one of the same launch (same files); refused when
    another launch has committed since (its files are what readers must see)."""
    current = committed_summary(output, summary["run_id"])
    if current is None or current.get(LAUNCH_KEY) != summary.get(LAUNCH_KEY):
        raise CommitError(f"run {summary['run_id']}: launch {summary.get(LAUNCH_KEY)} is no longer the committed one; "
                          "its summary was not rewritten")
    write_atomic(summary_path(output, summary["run_id"]),
                 _json({**summary, FILES_KEY: current[FILES_KEY], RETIRED_KEY: current.get(RETIRED_KEY, [])}))


def with_legacy_files(output: str, run_id: str, previous: dict[str, Any] | None,
                      placed: set[str]) -> dict[str, Any] | None:
    """`previous` with `files` where it is a run published before the run-level commit: what committed_files
    reads of it (but the files this launch `placed` beside them), with the _SUCCESS markers that make its parts
    readable, so it is retired (kept for REPLACED_GRACE_S) as any replaced run is, not removed at the commit."""
    if previous is None or FILES_KEY in previous:
        return previous
    files = {}
    for table in (*TABLES, "history"):
        files[table] = [r for r in (relative(output, f) for f in committed_files(output, run_id, table, previous))
                        if r not in placed]
        if table != "history" and files[table]:  # committed_files found its parts behind this marker
            files[table].append(relative(output, posixpath.join(partition(output, table, run_id), LEGACY_SUCCESS)))
    return {**previous, FILES_KEY: files}


def retired_after(previous: dict[str, Any] | None, launch: str, now: float) -> list[dict[str, Any]]:
    """The `retired` list of a summary that replaces `previous`: previous's own launch (its files) and the
    launches it still listed, each kept while younger than REPLACED_GRACE_S."""
    if previous is None or FILES_KEY not in previous or previous.get(LAUNCH_KEY) == launch:
        return []
    kept = [r for r in previous.get(RETIRED_KEY, []) if now - r["retired_at"] < REPLACED_GRACE_S]
    files = sorted(f for names in previous[FILES_KEY].values() for f in names)
    return [*kept, {LAUNCH_KEY: previous.get(LAUNCH_KEY), "retired_at": now, "files": files}]


def kept_files(summary: dict[str, Any], now: float) -> set[str]:
    """What clean-up must leave: the files the summary names and those of launches it replaced less than
    REPLACED_GRACE_S ago."""
    named = {f for names in summary.get(FILES_KEY, {}).values() for f in names}
    return named | {f for r in summary.get(RETIRED_KEY, []) if now - r["retired_at"] < REPLACED_GRACE_S
                    for f in r["files"]}


def replaced_files(output: str, run_id: str) -> set[str]:
    """The files of the launches the committed run replaced that its summary still lists (`retired`)."""
    summary = summary_to_replace(output, run_id) or {}
    return {f for r in summary.get(RETIRED_KEY, []) for f in r["files"]}


def clean_after_commit(output: str, run_id: str, now: float | None = None) -> list[str]:
    """Remove what the committed summary does not keep (kept_files) from the run's partitions: files of
    failed launches, of launches replaced REPLACED_GRACE_S or more before `now`, and the old
    per-partition markers (a run never committed keeps nothing of them).
    Only names docscore writes (OWNED_NAME) are removed, links as links (never their targets), never
    directories; a run published before the run-level commit is left as it is. Call it only while no
    other launch of the run is writing (after this launch's commit, holding the run's lease, or finding neither
    a live lease nor another launch's staging of the run: run_lease.remove_replaced). Errors
    are logged, not raised. Returns what was removed (relative paths). A damaged summary keeps everything: which
    files were the run's is unknown until a launch commits over it."""
    try:
        summary = committed_summary(output, run_id)
    except DamagedSummary:  # the launch about to replace it says so; its own commit cleans the partitions
        return []
    fs, root = fsspec.core.url_to_fs(output)
    if summary is not None and FILES_KEY not in summary:
        return []
    if summary is None and fs.exists(fs_path(posixpath.join(partition(output, "scores", run_id), LEGACY_SUCCESS))):
        return []
    keep = kept_files(summary or {}, time.time() if now is None else now)
    removed = []
    for table in (*TABLES, "runs"):
        directory = fs_path(partition(output, table, run_id))
        if is_local(fs) and os.path.islink(directory):
            continue
        for path in _ls(fs, directory):
            name = posixpath.basename(path)
            rel = posixpath.relpath(path, root)
            if rel in keep or not OWNED_NAME.match(name) or _is_dir(fs, path):
                continue
            try:
                _delete_file(fs, path)
                removed.append(rel)
            except OSError as e:
                log.warning("run %s: could not remove the left-over %s (%s)", run_id, rel, e)
    return removed


def discard_launch(output: str, run_id: str, launch: str, staging: str) -> None:
    """After a launch failed: remove its staging and the files it placed, unless it committed. The
    committed run (another launch's, or none) is untouched."""
    summary = summary_to_replace(output, run_id)
    if summary is not None and summary.get(LAUNCH_KEY) == launch:
        return
    fs, _ = fsspec.core.url_to_fs(output)
    for table in (*TABLES, "runs"):
        for path in _ls(fs, fs_path(partition(output, table, run_id))):
            name = posixpath.basename(path)
            if (name.startswith(f"part-{launch}-") or name == history_name(launch)) and not _is_dir(fs, path):
                try:
                    _delete_file(fs, path)
                except OSError as e:
                    log.warning("could not remove %s of the failed launch %s (%s)", path, launch, e)
    remove_staging(staging)


def refuse_linked_partition(fs, path: str) -> None:
    """A partition that is a symlink would have docscore write (and later delete) in its target."""
    if is_local(fs) and os.path.islink(path):
        raise CommitError(f"{path} is a symlink (to {os.readlink(path)}); docscore does not write or delete through "
                          "links: remove the link (its target is yours) or choose another --output")


def linked_partitions(output: str, run_id: str) -> list[str]:
    """The run's partition directories (or their parents) that are symlinks, for validation."""
    fs, root = fsspec.core.url_to_fs(output)
    if not is_local(fs):
        return []
    candidates = [posixpath.join(root, t) for t in (*TABLES, "runs")]
    candidates += [fs_path(partition(output, t, run_id)) for t in (*TABLES, "runs")]
    return [p for p in candidates if os.path.islink(p)]


# ---- staging -------------------------------------------------------------------------------------


def remove_staging(staging: str) -> None:
    """Remove one launch's staging directory (unique per launch), then _staging/run_id=ID and _staging
    only if empty: other launches stage beside it."""
    fs, path = fsspec.core.url_to_fs(staging)
    if (is_local(fs) and os.path.islink(path)) or fs.exists(path):
        _delete_tree(fs, path)
    _remove_if_empty(fs, posixpath.dirname(path))
    _remove_if_empty(fs, posixpath.dirname(posixpath.dirname(path)))


# ---- reading -------------------------------------------------------------------------------------


class DamagedSummary(ValueError):
    """A run's summary.json that is not a JSON object: the message names the file, the run and the fix."""


def committed_summary(output: str, run_id: str) -> dict[str, Any] | None:
    """The committed summary.json of run_id, or None when the run has none (never committed); DamagedSummary
    when it is damaged (read_summary)."""
    shown = summary_path(output, run_id)
    fs, path = fsspec.core.url_to_fs(shown)
    try:
        summary = read_summary(fs, path)
        outside = files_outside_the_run(summary, run_id)
        if outside:  # readers would open it: a summary must name only its own run's files
            raise ValueError(f"it names {outside!r}, which is not a file of run {run_id}'s partitions")
        return summary
    except FileNotFoundError:
        return None
    except ValueError as e:  # json's decode error is one
        raise DamagedSummary(f"{shown} is damaged ({type(e).__name__}: {str(e)[:200]}): it is the commit record of "
                             f"run {run_id!r}, so the run cannot be read; restore it, or publish the run again "
                             f"(`docscore run` with --run_id {run_id})") from None


def files_outside_the_run(summary: dict[str, Any], run_id: str) -> str | None:
    """The first entry of the summary's `files` that is not TABLE/run_id=ID/NAME of this run (a path with .. or
    a leading /, another run's partition: an edited or foreign summary), or None."""
    files = summary.get(FILES_KEY)
    if files is None:
        return None
    if not isinstance(files, dict):
        return repr(files)[:100]
    for table, names in files.items():
        folder = "runs" if table == "history" else table
        for name in names if isinstance(names, list) else [names]:
            parts = name.split("/") if isinstance(name, str) else []
            if (len(parts) != 3 or parts[0] != folder or parts[1] != partition_name(run_id)
                    or parts[2] in ("", ".", "..") or "\\" in name):
                return str(name)
    return None


def summary_to_replace(output: str, run_id: str) -> dict[str, Any] | None:
    """committed_summary for a launch that is replacing the run: a damaged summary names no file a reader can use
    (readers refuse it), so it counts as none and the next commit replaces it."""
    try:
        return committed_summary(output, run_id)
    except DamagedSummary:
        return None


def read_summary(fs, path: str) -> dict[str, Any]:
    """A summary.json's object. ValueError when the file is not a JSON object (damaged or cut short since the
    run, or not docscore's)."""
    summary = json.loads(fs.cat_file(path))
    if not isinstance(summary, dict):
        raise ValueError(f"a JSON {type(summary).__name__}, not an object")
    return summary


def committed_files(output: str, run_id: str, table: str, summary: dict[str, Any] | None = None) -> list[str]:
    """The files (URLs/paths) of `table` (scores, errors, history) in the committed run, in name order;
    [] when the run was never committed. Runs published before the run-level commit (no `files` in their
    summary) are read as they were published then: the partition's part files behind its _SUCCESS."""
    summary = committed_summary(output, run_id) if summary is None else summary
    if summary is None:
        return []
    fs, root = fsspec.core.url_to_fs(output)
    if FILES_KEY in summary:
        return [_url(fs, posixpath.join(root, f)) for f in sorted(summary[FILES_KEY].get(table, []))]
    directory = fs_path(partition(output, "runs" if table == "history" else table, run_id))
    if table != "history" and not fs.exists(posixpath.join(directory, LEGACY_SUCCESS)):
        return []
    wanted = (lambda n: n == "history.parquet") if table == "history" else (lambda n: n.startswith("part"))
    return [_url(fs, p) for p in sorted(_ls(fs, directory)) if wanted(posixpath.basename(p))]


def committed_run_ids(output: str) -> list[str]:
    """run_ids under `output` that have a committed summary."""
    fs, root = fsspec.core.url_to_fs(output)
    return sorted(partition_run_id(posixpath.dirname(p)) for p in summary_files(fs, root))


def summary_files(fs, root: str) -> list[str]:
    """Paths of root/runs/run_id=*/summary.json, found by listing (not a glob: the root may hold * [ ?)."""
    return sorted(p for p in run_files(fs, root)
                  if posixpath.basename(p) == SUMMARY_FILE and partition_run_id(posixpath.dirname(p)))


def run_files(fs, root: str) -> list[str]:
    """Every file of root/runs/run_id=*/, listed afresh (another process may have committed since)."""
    runs = posixpath.join(root, "runs")
    fs.invalidate_cache(runs)
    try:
        return fs.find(runs, maxdepth=2)
    except (FileNotFoundError, NotADirectoryError):
        return []


def runs_with_replaced_launches(output: str) -> list[str]:
    """run_ids whose runs/ partition holds the history rows of more than one launch: the committed one's and a
    replaced (or failed) launch's, whose files clean_after_commit may remove. One listing of runs/, so a launch
    need not read every run's summary to find them."""
    fs, root = fsspec.core.url_to_fs(output)
    launches = Counter(partition_run_id(posixpath.dirname(p)) for p in run_files(fs, root)
                       if LAUNCH_HISTORY_NAME.match(posixpath.basename(p)))
    return sorted(run_id for run_id, n in launches.items() if run_id and n > 1)


# A view's file as its summary names it (TABLE/run_id=ID/NAME): by name alone, a copied partition
# (scores/run_id=ID.bak/) would count its run's rows twice.
RELATIVE_PATH = "regexp_extract(filename, '[^/]+/[^/]+/[^/]+$')"


def duckdb_views_sql(output: str, views: tuple[str, ...] = ("scores", "errors", "history")) -> str:
    """SQL creating the views scores, errors and history over the committed files of every run under
    `output`, as committed_files reads them (docs/queries.md shows the same statements): the files a summary
    names, and of a run published before the run-level commit (a summary without `files`) its partition's part
    files behind _SUCCESS and its history.parquet. DuckDB refuses a view over a pattern that matches no file:
    name only the tables that have some."""
    root = duckdb_glob_literal(output.rstrip("/"))
    summaries = (f"read_json('{root}/runs/*/{SUMMARY_FILE}', filename = true, "
                 "columns = {files: 'STRUCT(scores VARCHAR[], errors VARCHAR[], history VARCHAR[])'})")
    partition_of = "parse_filename(parse_dirpath({}))"  # DIR/TABLE/run_id=ID/NAME -> run_id=ID
    legacy_runs = f"SELECT {partition_of.format('filename')} FROM {summaries} WHERE files IS NULL"
    statements = []
    for view, glob in (("scores", "scores/*/*.parquet"), ("errors", "errors/*/*.parquet"),
                       ("history", "runs/*/history*.parquet")):
        if view not in views:
            continue
        if view == "history":
            legacy = (f"parse_filename(filename) = 'history.parquet' AND {partition_of.format('filename')} IN ("
                      f"{legacy_runs})")
        else:  # a legacy partition's parts count only behind its _SUCCESS marker
            marked = f"SELECT {partition_of.format('file')} FROM glob('{root}/{view}/*/{LEGACY_SUCCESS}')"
            legacy = (f"parse_filename(filename) LIKE 'part%' AND {partition_of.format('filename')} IN ("
                      f"{legacy_runs} INTERSECT {marked})")
        statements.append(
            f"CREATE OR REPLACE VIEW {view} AS SELECT * EXCLUDE (filename) FROM read_parquet('{root}/{glob}', "
            f"filename = true, union_by_name = true, hive_partitioning = false) "
            f"WHERE {RELATIVE_PATH} IN (SELECT unnest(files.{view}) FROM {summaries}) "
            f"OR ({legacy});")
    return "\n".join(statements)


def duckdb_glob_literal(path: str) -> str:
    """`path` as the literal start of a DuckDB glob inside a '...' string: glob characters matched as
    themselves (bracketed), quotes doubled."""
    escaped = "".join(f"[{c}]" if c in "*?[" else c for c in path)
    return escaped.replace("'", "''")


# ---- file-system helpers (never following links where they delete) --------------------------------


def is_local(fs) -> bool:
    return isinstance(fs, LocalFileSystem)


def one_spelling(path: str) -> str:
    """A path or URL in one spelling, to tell whether two name the same place: local ones absolute and
    resolved, URLs without a trailing /."""
    protocol, rest = fsspec.core.split_protocol(path)
    if protocol in (None, "file"):
        return os.path.realpath(rest)
    return f"{protocol}://{rest.strip('/')}"


def fs_path(url: str) -> str:
    return fsspec.core.url_to_fs(url)[1]


def _url(fs, path: str) -> str:
    return path if is_local(fs) else fs.unstrip_protocol(path)


def _json(value: dict[str, Any]) -> bytes:
    """summary.json's bytes: valid JSON, so a non-finite number (an inf corpus perplexity) is null (records.finite_or_none)."""
    return json.dumps(finite_or_none(value), indent=2, sort_keys=True, default=str, allow_nan=False).encode()


def _ls(fs, path: str) -> list[str]:
    fs.invalidate_cache(path)  # gcsfs caches listings; Beam's own GCS client wrote some of these files
    try:
        return list(fs.ls(path, detail=False))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _is_dir(fs, path: str) -> bool:
    if is_local(fs):
        return os.path.isdir(path) and not os.path.islink(path)
    return fs.isdir(path)


def move(fs, src: str, dest: str) -> None:
    """A rename locally; a copy and a delete on an object store, where a rename is a request of its own that some
    stores (the emulator among them) do not answer."""
    if is_local(fs):
        _move_local(src, dest)
    else:
        fs.copy(src, dest)
        fs.rm_file(src)


def _move_local(src: str, dest: str) -> None:
    try:
        os.replace(src, dest)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        # staging on another file system: copy under a temporary name (one OWNED_NAME matches, so a copy cut off
        # by a kill is cleaned up later), then rename
        tmp = posixpath.join(posixpath.dirname(dest), f".{posixpath.basename(dest)}.{uuid.uuid4().hex[:8]}.docscore-tmp")
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, dest)
        except BaseException:  # a full disk: no half copy left beside the run's files
            _remove_quietly(tmp)
            raise
        os.remove(src)


def _delete_file(fs, path: str) -> None:
    if is_local(fs):
        os.remove(path)  # a link is removed as a link
    else:
        fs.rm_file(path)


def _delete_tree(fs, path: str) -> None:
    if is_local(fs):
        if os.path.islink(path) or not os.path.isdir(path):
            os.remove(path)
        else:
            shutil.rmtree(path)  # does not follow links inside
    else:
        fs.rm(path, recursive=True)


def _remove_if_empty(fs, path: str) -> None:
    """Locally one os.rmdir, which the kernel refuses for a non-empty directory: a listing followed by a
    recursive delete would take files another launch staged in between. Object stores have no empty
    directories to remove."""
    if is_local(fs):
        try:
            os.rmdir(path)
        except OSError:
            pass


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def file_age_s(fs, path: str) -> float | None:
    """Seconds since `path` was last modified, or None when unknown."""
    try:
        info = fs.info(path)
    except FileNotFoundError:
        return None
    modified = info.get("mtime") or info.get("updated") or info.get("created")
    if modified is None:
        return None
    if isinstance(modified, str):
        from datetime import datetime

        modified = datetime.fromisoformat(modified.replace("Z", "+00:00")).timestamp()
    elif hasattr(modified, "timestamp"):
        modified = modified.timestamp()
    return time.time() - float(modified)
