"""What --input's first records say about a run's configuration, checked before the job starts.

Reads the schema (Parquet footer, TFDS features) or the first PEEKED_RECORDS JSONL records of each of the first
PEEKED_SHARDS shards: a field --text_field, --id_field or the task needs that no shard has is a configuration error
(check_fields), and so is an input whose every shard looked at this user may not open (the run would read nothing);
gold labels the task will not score as the user expects are notices. Any other shard that cannot be read is never an
error here: its reader reports it as an error row.
"""
from __future__ import annotations

import itertools
import os
import pwd
from collections.abc import Sequence
from typing import Any

from pipeline import tasks
from pipeline.io import input_files, sources
from pipeline.options import ConfigError, EvalOptions
from pipeline.stages.postprocess import gold_value

DEFAULT_ID_FIELD = "id"
PEEKED_SHARDS = 8  # shards whose first PEEKED_RECORDS records check_fields reads
PEEKED_RECORDS = 20


def first_record_fields(shard: str, read_spec: sources.ReadSpec, peek: int = PEEKED_RECORDS) -> set[str] | None:
    """The field names of a shard's schema, or of the first `peek` JSONL records together (so one bad
    first record cannot fail the run); None when they cannot be known without reading more data."""
    fmt = input_files.shard_format(shard)
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            with sources.open_shard(shard) as f:
                return set(pq.ParquetFile(f).schema_arrow.names)
        if fmt == "array_record" and read_spec.tfds is not None:
            return set(read_spec.tfds.feature_kinds)
        if fmt == "jsonl":
            return set().union(*first_jsonl_records(shard, read_spec, peek)) or None
    except Exception:  # an unreadable shard is the reader's to report as an error row
        return None
    return None


def first_jsonl_records(shard: str, read_spec: sources.ReadSpec, peek: int) -> list[dict]:
    """The JSON objects among the first `peek` records of a JSONL shard, read as the reader reads them (lines
    that are too large or not JSON objects are skipped: the reader reports them as error rows)."""
    first = itertools.islice(sources.jsonl_records(shard, read_spec), peek)
    return [record for _, record, _ in first if isinstance(record, dict)]


def check_fields(eo: EvalOptions, shards: list[str], read_spec: sources.ReadSpec) -> None:
    """The fields --text_field, --id_field and the task need, in the first record (or schema) of each of the
    first PEEKED_SHARDS shards: a configuration error when none of them has them all (in a Parquet column of a
    type that can hold them), or none can be split into records (a JSONL shard in UTF-16, ...). One shard without
    them among others with them is bad input, not a bad flag: its records become error rows."""
    problems = []
    for shard in shards[:PEEKED_SHARDS]:
        fmt = input_files.shard_format(shard)
        fields = None if fmt == "text" else first_record_fields(shard, read_spec)
        # a shard whose records or schema were just read opens: only the others are opened to ask (a request on gs://)
        if (fields is None or fmt == "array_record") and (problem := unopenable_problem(eo, shard)) is not None:
            pass
        elif fmt == "text":  # one record: the whole text, no other field
            problem = missing_task_field(eo, f"{shard} is a plain text file (its text is one record, with no other field)")
        elif fields is None:
            problem = unsplittable_problem(eo, shard) if fmt == "jsonl" else None
            if problem is None:  # a shard the reader will report
                continue
        else:
            problem = missing_field(eo, shard, fields, read_spec) or (
                column_type_problem(eo, shard, read_spec) if fmt == "parquet" else None)
        if problem is None:
            return
        problems.append(problem)
    if problems:
        others = len(problems) - 1
        raise ConfigError(problems[0] + (f" (nor {'does the other shard' if others == 1 else f'do the {others} other shards'}"
                                         " looked at)" if others else ""))


def missing_field(eo: EvalOptions, shard: str, fields: Sequence[str],
                  read_spec: sources.ReadSpec | None = None) -> str | None:
    """Why a record with these fields cannot be scored as configured, or None (`read_spec`: how a JSONL shard's
    records were peeked at, for the message)."""
    shown = ", ".join(sorted(fields)[:20])
    if eo.text_field not in fields:
        return absent_field(f"--text_field={eo.text_field}", eo.text_field, shard, fields, read_spec,
                            "pass --text_field with the top-level field holding the document text")
    if eo.id_field and eo.id_field != DEFAULT_ID_FIELD and eo.id_field not in fields:
        return absent_field(f"--id_field={eo.id_field}", eo.id_field, shard, fields, read_spec,
                            "pass --id_field with a top-level field the records have, or leave it out: each id then "
                            "falls back to SOURCE#RECORD_INDEX (the shard and the record's position in it)")
    return missing_task_field(eo, f"{shard} has: {shown}", fields)


def absent_field(flag: str, name: str, shard: str, fields: Sequence[str], read_spec: sources.ReadSpec | None,
                 fix: str) -> str:
    """`flag` names a field the shard's peeked records (or schema) do not have: what was looked at, why a name
    that looks present is not (a dotted path, a partition folder in the shard's path), and `fix`."""
    shown = ", ".join(sorted(fields)[:20])
    peeked = peeked_records(shard, read_spec) if read_spec and input_files.shard_format(shard) == "jsonl" else None
    message = f"{flag}: {shard} has no such field{peeked or ''} ({'fields seen' if peeked else 'it has'}: {shown})"
    folder = next((part for part in shard.split("/")[:-1] if part.startswith(f"{name}=")), None)
    if folder:  # Hive-style partitions (lang=en/part-0.parquet): the value lives in the path, not in the records
        return (f"{message}; `{folder}` in its path is a partition folder, and partition folders are not read as "
                f"fields: write {name} into the records, or {fix}")
    if "." in name:  # a nested field (body: {text: ...}) is not reached by a dotted name
        head, tail = name.split(".", 1)
        return (f"{message}; dotted paths are not followed ({name} would be a top-level field of that name, not "
                f"`{tail}` inside `{head}`): flatten the records, or {fix}")
    return f"{message}; {fix}"


def peeked_records(shard: str, read_spec: sources.ReadSpec) -> str | None:
    """What check_fields looked at in a JSONL shard, as a message says it (" in its first 20 records, ..."): its first
    PEEKED_RECORDS records or, when it holds fewer, all of them (a field only later records have is not seen)."""
    try:
        seen = sum(1 for _ in itertools.islice(sources.jsonl_records(shard, read_spec), PEEKED_RECORDS + 1))
    except Exception:  # gone since the peek: the reader reports it
        return None
    if seen > PEEKED_RECORDS:
        return f" in its first {PEEKED_RECORDS} records, the records looked at before the run starts"
    return f" in any of its {seen} records" if seen > 1 else " in its one record"


def column_type_problem(eo: EvalOptions, shard: str, read_spec: sources.ReadSpec) -> str | None:
    """A Parquet column the run reads whose type can never give what the run needs from it (an int64 text, a
    struct id, a list label): every row would be an error row, found only after the whole job ran. None when the
    types can work (a cell may still be bad: that row's error row) or the shard cannot be read (the reader's)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def strings(t) -> bool:  # choices: a list of strings
        return ((pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
                 or pa.types.is_list_view(t) or pa.types.is_large_list_view(t))
                and sources.string_column(t.value_type))

    text_kinds = "string, large_string, string_view or UTF-8 binary columns, or dictionaries of them"
    checks = [(f"--text_field={eo.text_field}", eo.text_field, sources.text_column,
               f"never a document text (the text is read from {text_kinds})",
               "pass --text_field with the column holding the text, or write the text as strings")]
    if eo.id_field and eo.id_field != DEFAULT_ID_FIELD:
        checks.append((f"--id_field={eo.id_field}", eo.id_field, lambda t: not pa.types.is_nested(t),
                       "never an id (a struct, list or map id is not read)",
                       "pass --id_field with a column of scalars, or leave it out"))
    task = f"--task={eo.task}"
    if "query" in read_spec.checked_fields:
        checks.append((task, "query", sources.text_column, f"never a query (it is read as text, from {text_kinds})",
                       "write the queries as strings"))
    if "label" in read_spec.checked_fields:  # an all-null label column is records without a gold, not an error
        checks.append((task, "label", lambda t: sources.scalar_column(t) or pa.types.is_null(t),
                       "never a gold label (a label is a string or a number)", "write one label per row as a string or number"))
    if "choices" in read_spec.checked_fields:
        checks.append((task, "choices", strings, "never a list of candidate strings", "write them as a list of strings"))
    try:
        with sources.open_shard(shard) as f:
            parquet = pq.ParquetFile(f)
            schema, rows = parquet.schema_arrow, parquet.metadata.num_rows
    except Exception:  # an unreadable shard is the reader's to report as an error row
        return None
    if rows == 0:  # no row to fail (pandas writes an empty frame's text column as type null)
        return None
    for flag, name, fits, never, fix in checks:
        types = [field.type for field in schema if field.name == name]
        if len(types) == 1 and not fits(types[0]):  # two such columns are the reader's read/ambiguous_column
            lost = ("every row's doc_id would fall back to SOURCE#RECORD_INDEX" if flag.startswith("--id_field")
                    else "every row would be an error row")
            return (f"{flag}: the column {name!r} of {shard} is {str(types[0])[:120]}, which is {never}, so {lost}; "
                    f"{fix}")
    return None


def unsplittable_problem(eo: EvalOptions, shard: str) -> str | None:
    """A JSONL shard that cannot be split into records at all (sources.unsplittable: UTF-16, CR line endings, gzip
    bytes under a plain name), as a problem of --input, or None."""
    problem = sources.unsplittable_shard(shard)
    return f"--input {eo.input}: {shard}: {problem}" if problem else None


def unopenable_problem(eo: EvalOptions, shard: str) -> str | None:
    """A shard this user may not open (permission denied), as a problem of --input, or None. A problem only when every
    shard looked at has one (check_fields): the run would read nothing and publish a run of error rows in place of the
    run_id's previous one; beside readable shards it is its reader's read/unreadable_shard row."""
    try:
        with sources.open_shard(shard):
            return None
    except PermissionError as e:
        return (f"--input {eo.input}: {shard} cannot be read by this user ({current_user()}: "
                f"{e.strerror or type(e).__name__}); make the files readable to it, or run as a user that can read them")
    except Exception:  # gone, a store that answers otherwise: the reader's to report
        return None


def current_user() -> str:
    """This process's user name (its uid where it has none), for messages about file permissions."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # a uid without a passwd entry (a container's)
        return f"uid {os.geteuid()}"


def missing_task_field(eo: EvalOptions, what_shard_has: str, fields: Sequence[str] = ()) -> str | None:
    """Why records with these fields lack one --task needs (a similarity `query`, choice's `choices`), or None."""
    task = tasks.get(eo.task)
    for field in ("query",) * task.with_query + task.record_fields:
        if field not in fields:
            return f"--task={eo.task} needs a `{field}` field in each record; {what_shard_has}; add it or choose another --task"
    return None


GOLD_LOOKALIKES = ("gold", "answer", "target")  # fields other tools keep the gold in; docscore reads `label`


def unread_gold_notice(task: str, shard: str, read_spec: sources.ReadSpec) -> str | None:
    """Records with no `label` but a field that looks like the gold (lm-evaluation-harness's `gold`): a notice
    that the run computes no accuracy from it, since a metric missing without a word is easy to miss."""
    fields = first_record_fields(shard, read_spec)
    folder = next((part for part in shard.split("/")[:-1] if part.startswith("label=")), None)
    if fields is not None and "label" not in fields and folder:  # Hive-style partitions: the gold is in the path
        return (f"--task={task} reads the gold from a record's `label` field; {shard} has none, and `{folder}` in its "
                "path is a partition folder, which is not read as a field, so the summary's task_metrics get no gold; "
                "write label into the records to score against it")
    lookalike = next((f for f in GOLD_LOOKALIKES if fields and f in fields), None)
    if lookalike is None or "label" in fields:
        return None
    return (f"--task={task} reads the gold from a record's `label` field; {shard} has none but has `{lookalike}`, "
            "which is not read, so the summary's task_metrics get no gold; rename it to `label` to score against it")


def text_gold_notice(shard: str, read_spec: sources.ReadSpec, peek: int = PEEKED_RECORDS) -> str | None:
    """--task=similarity takes a record's `label` as a numeric gold score; text labels in the first `peek`
    records (JSONL or Parquet) -> a notice that no spearman/pearson comes from them. A notice, not an
    error: the scores do not depend on labels, and the field name is fixed, so a corpus whose `label`
    means a class must still be scorable."""
    from pipeline.stages.scoring import as_number

    values = [gold_value(v) for v in first_labels(shard, read_spec, peek)]  # as scoring reads them: true, not True
    numbers = (int, float)  # an integer past float's range is a number too (no gold, not text)
    text = sorted({str(v) for v in values if v is not None and as_number(v) is None and not isinstance(v, numbers)})
    if not text:
        return None
    shown = ", ".join(repr(v) for v in text[:5])
    return (f"--task=similarity takes a record's `label` as a numeric gold score, but {shard} has text labels "
            f"({shown}): records with them are scored, but give no spearman/pearson (the summary's n_gold counts "
            "only numeric labels); use numbers for the gold scores, or --task=classify for named classes")


def unknown_gold_notice(shard: str, read_spec: sources.ReadSpec, label_names: Sequence[str], peek: int = PEEKED_RECORDS) -> str | None:
    """--task=classify compares a record's `label` with the --labels names as text; gold labels in the first
    `peek` records that name no class (`Sports` for `sports`) -> a notice that they count as wrong predictions."""
    golds = (gold_value(v) for v in first_labels(shard, read_spec, peek))  # as scoring reads them: true, not True
    unknown = sorted({str(g) for g in golds if g is not None} - set(label_names))
    if not unknown:
        return None
    return (f"{shard} has gold labels that are not among --labels ({', '.join(map(repr, unknown[:5]))}; the labels are "
            f"{', '.join(map(repr, label_names))}): records with them count as wrong in accuracy and macro-F1; "
            "name the classes in --labels as the records' `label` field does")


def first_labels(shard: str, read_spec: sources.ReadSpec, peek: int) -> list[Any]:
    """The `label` field of the first `peek` records of a JSONL or Parquet shard, as the reader reads them, less
    the labels that make their record an error row (a list, an object, a lone surrogate): no record with them is
    scored. [] for other formats, or a shard that cannot be read (the reader reports that as an error row)."""
    fmt = input_files.shard_format(shard)
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            with sources.open_shard(shard) as f:
                parquet = pq.ParquetFile(f)
                if "label" not in parquet.schema_arrow.names:
                    return []
                batch = next(parquet.iter_batches(batch_size=peek, columns=["label"]), None)
                values = batch.column(0).to_pylist() if batch is not None else []
        elif fmt == "jsonl":
            values = [record.get("label") for record in first_jsonl_records(shard, read_spec, peek)]
        else:
            return []
    except Exception:  # an unreadable shard is the reader's to report as an error row
        return []
    labels = []
    for value in values:
        if isinstance(value, bytes):  # a binary column holds text as bytes
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                continue
        value = sources.plain_number(value)  # a decimal 3.00 is 3
        if value is None or sources.field_problem("label", value) is None:
            labels.append(value)
    return labels
