"""Every configuration check of `docscore run`, done BEFORE the pipeline is built or any data read.

Turns EvalOptions into a RunPlan (shards, read spec, model spec, resolved kernel, window spec) or
raises ConfigError with a message naming the flag and the fix. Must not start a pipeline; the field
checks (input_checks.py) read the schema or the first records of the first shards, and classify and similarity the
first shard's first labels.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import os
import re
import tempfile
from collections.abc import Sequence

import fsspec
import fsspec.utils

from models import sharding
from models.builtin import BUILTINS
from models.tokenizer import MIN_SEQ_LEN
from pipeline import dataflow_checks, input_checks, process_setup, tasks
from pipeline.io import input_files, run_commit, sinks, sources, tfds_reader
from pipeline.options import (DTYPES, OUTPUT_FORMATS, TARGET_BACKENDS, ConfigError, EvalOptions, parse_labels,
                              set_by_config)
from pipeline.stages import batching, shadow
from pipeline.stages.inference import ModelSpec, shared_model, texts_embedder
from pipeline.stages.preprocess import WindowSpec
from pipeline.telemetry import memory
from pipeline.telemetry.progress import SAMPLES_FILE, direct_workers, runs_locally


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """Everything the pipeline graph needs, checked."""

    shards: tuple[str, ...]
    read_spec: sources.ReadSpec
    model_spec: ModelSpec
    window_spec: WindowSpec
    labels: dict[str, str]
    kernel: str  # the --attention choice resolved for the target backend
    target_backend: str
    model_family: str
    model_id: str
    fingerprint: str
    prefix_len: int  # special tokens before the text in each window
    suffix_len: int  # special tokens after the text in each window
    batch: batching.BatchSettings  # rows per call, calls per Beam batch, local threads
    shadow: shadow.ShadowSpec | None = None  # --shadow_attention: a second kernel on a share of batches
    notices: tuple[str, ...] = ()  # choices that work but cost: the launcher prints them before the job
    sharding: dict | None = None  # how the model is laid out over the devices (models/sharding.py MeshLayout.summary)
    pooling: str | None = None  # how the run's embeddings are pooled (metadata.json's pooling); None: a per-token task
    prompts: dict[str, str] = dataclasses.field(default_factory=dict)  # the model's prompts the run puts before texts
    # what validation compiled for the run (a local run's label embeddings): [count, seconds, cached count, seconds]
    compiles: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)


def run_prompts(eo: EvalOptions) -> tuple[tuple[str, str], ...]:
    """The run's --document_prompt / --query_prompt as ModelSpec.prompts; each only where the task puts that prompt
    somewhere (Task.prompt_roles), else a ConfigError naming the flag."""
    task = tasks.get(eo.task)
    given = tuple((role, text) for role, text in (("document", eo.document_prompt), ("query", eo.query_prompt))
                  if text is not None)
    for role, _ in given:
        if role not in task.prompt_roles:
            where = ("only --task similarity embeds a query" if role == "query" and task.prompt_roles
                     else f"--task={eo.task} scores token log-probabilities, which no prompt is put before")
            raise ConfigError(f"--{role}_prompt: --task={eo.task} puts no {role} prompt anywhere ({where}); drop "
                              f"--{role}_prompt")
    return given


def check_choice(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"--{flag}={value} is not known; use one of {', '.join(choices)}")


def check_run_id(run_id: str) -> None:
    """run_id names directories (TABLE/run_id=ID) under --output: it must stay one plain path segment."""
    if not run_commit.safe_run_id(run_id):
        raise ConfigError(
            f"--run_id={run_id!r} is not a safe partition name; use letters, digits, '.', '_' or '-', starting "
            "with a letter or digit (at most 128, no '/', no '..')"
        )


def target_backend(choice: str) -> str:
    return local_backend() if choice == "auto" else choice


def local_backend() -> str:
    """This machine's JAX backend; a ConfigError when JAX_PLATFORMS names one JAX cannot start here."""
    import jax

    problem = process_setup.unusable_backend()
    if problem:
        raise ConfigError(problem)
    return jax.default_backend()


def check_reachable_backend(eo: EvalOptions, backend: str) -> None:
    """A local runner runs inference on this machine: a --target_backend this machine does not have would run
    on another backend than the one the run records, or fail after reading data."""
    if eo.target_backend == "auto" or not runs_locally(eo):
        return
    here = local_backend()
    if backend != here:
        preset = dataflow_checks.from_preset(eo, "target_backend")
        fix = (f"pass --target_backend auto (or {here}) to run the preset here, or drop --runner to run it on its "
               "Dataflow workers") if preset else (
               f"drop --target_backend (or set it to {here}), or run on {backend} workers with a Dataflow preset "
               "(--preset dataflow-..., runners/presets)")
        raise ConfigError(f"--target_backend={backend}{preset} cannot run with the local runner: inference runs on "
                          f"this machine, whose backend is {here}; {fix}")


def check_loaded_model(eo: EvalOptions, backend: str, where: str):
    """What needs the model but no data (runners/scheduling.py checks a schedule's run with it too): the kernel
    --attention resolves to for the model's own attention (auto may depend on length; a sliding window or head_dim
    may rule a kernel out), loaded here or for the workers' backend and GPU as their loader will; the task's family
    and windows; a --shadow_attention. (model spec, loaded model, loaded with the run's spec, kernel, window
    length, shadow spec)."""
    model_spec = ModelSpec(eo.model, attention=eo.attention, dtype=eo.dtype, cache_dir=eo.cache_dir,
                           matmul_precision=eo.matmul_precision, max_seq_len=eo.max_seq_len, prompts=run_prompts(eo))
    loaded, same_backend = load_for_checks(model_spec, backend, here=runs_locally(eo))
    kernel = loaded.attention if same_backend else resolve_kernel(
        eo.attention, backend, dtype=eo.dtype, loaded=loaded, where=where, gpu=dataflow_checks.worker_gpu(eo),
        max_len=eo.max_seq_len)
    max_len = check_task_and_windows(eo, loaded)
    shadow_spec = check_shadow(eo, model_spec, loaded, backend, kernel, where)
    return model_spec, loaded, same_backend, kernel, max_len, shadow_spec


def check_task_and_windows(eo: EvalOptions, loaded) -> int:
    """The task's model family, --max_seq_len against the model's and --stride against a window's text tokens, for a
    loaded model (no data needed: runners/scheduling.py checks a schedule's run with them too), and classify labels
    the tokenizer cannot tell apart; the window length."""
    task = tasks.get(eo.task)
    family = loaded.config.family
    if not task.model.accepts(family, loaded.pooling):
        raise ConfigError(task.model.refuse(eo.task, eo.model, family))
    if task.per_token and not loaded.config.causal:
        why = {"gemma3_text": "use_bidirectional_attention: an embedder",
               "eurobert": "model_type eurobert: an encoder"}.get(loaded.config.model_type, "is_causal false: an embedder")
        raise ConfigError(f"--task={eo.task} scores each token from those before it, but --model {eo.model} attends "
                          f"both ways ({why}); use it with --task embed, similarity or classify")
    prompted = next((role for role in ("document", "query") if getattr(eo, f"{role}_prompt", None)), None)
    if prompted and not loaded.include_prompt:
        raise ConfigError(f"--{prompted}_prompt: --model {eo.model}'s sentence-transformers pooling leaves a prompt's "
                          "tokens out (include_prompt false), which docscore does not; its embeddings would differ "
                          f"from the model's: drop --{prompted}_prompt")
    if task.per_token and not loaded.config.lm_head:
        raise ConfigError(f"--task={eo.task} scores tokens with the model's language-model head, but --model {eo.model} "
                          "is a decoder embedder converted without one (its checkpoint had no lm_head.weight); use it "
                          "with --task embed, similarity or classify")
    model_max = loaded.tokenizer.max_seq_len
    max_len = eo.max_seq_len or model_max
    if max_len > model_max:
        positions = loaded.config.max_positions
        again = (f", or convert the model again with `docscore convert --max_seq_len` up to its {positions} positions"
                 if positions > model_max and eo.model not in BUILTINS else "")
        raise ConfigError(f"--max_seq_len={max_len} exceeds the model's {model_max} (the max_seq_len it was converted "
                          f"with); use <= {model_max}{again}")
    # each window of an embedding task holds the model's prompt too (or the run's --document_prompt/--query_prompt)
    prompted, role = max(((loaded.tokenizer.prompt_tokens(role), role) for role in task.prompt_roles
                          if hasattr(loaded.tokenizer, "prompts")), default=(0, None))
    content = max_len - int(getattr(loaded.tokenizer, "n_special", 0)) - prompted
    given = getattr(eo, f"{role}_prompt", None) if role else None  # the flag that set the longest prompt, if one did
    whose = f"--{role}_prompt's" if given else "the model's"
    beside = f" beside {whose} {prompted}-token prompt" if prompted else ""
    if prompted and content < 1:
        fix = f"shorten --{role}_prompt or raise --max_seq_len (<= {model_max})" if given else "raise --max_seq_len"
        raise ConfigError(f"--max_seq_len={max_len} leaves no room for text{beside} and the special tokens; {fix}")
    if eo.stride >= content and task.tokenize is None:  # a task making its own windows (choice) takes no --stride
        raise ConfigError(f"--stride={eo.stride} (tokens shared by consecutive windows) must be < {content}, the text "
                          f"tokens of a --max_seq_len={max_len} window{beside}; lower --stride{f', shorten --{role}_prompt' if given else ''} or raise --max_seq_len")
    if task.per_token and task.tokenize is None and eo.stride == 0 and not len(getattr(loaded.tokenizer, "prefix", ())):
        raise ConfigError(f"--stride=0 with --task={eo.task}: {eo.model}'s tokenizer starts a window with no special "
                          "token, so the first token of every window after the first could not be predicted from "
                          "anything and would go unscored; use --stride >= 1 (default 32)")
    if task.takes_labels:
        check_labels_read_apart(parse_labels(eo.classify_labels), loaded.tokenizer, max_len, eo.stride, eo.max_chunks)
    return max_len


def check_matmul_precision(eo: EvalOptions, backend: str) -> None:
    """--matmul_precision: known, with the dtype it applies to (float32), on a backend that runs it (tf32: GPU
    only); models/precision.py says why in each case."""
    from models.precision import choice_problem

    problem = choice_problem(eo.dtype, eo.matmul_precision, backend)
    if problem:
        raise ConfigError(problem)


def resolve_kernel(attention: str, backend: str, flag: str = "--attention", dtype: str | None = None,
                   loaded=None, where: str = "", instead_of: str | None = None, gpu=None,
                   max_len: int | None = None) -> str:
    """The kernel `attention` means on `backend` for the pipeline's rows (packed segment ids, `dtype`) and, given
    the loaded model, for its attention (heads, head_dim, causal, sliding window) on rows of `max_len` tokens (the
    run's --max_seq_len; None: the model's), as the workers' loader resolves it. `where` says where the backend
    comes from, for the message; a refusal does not suggest `instead_of`; `gpu` is the workers' GPU
    (dataflow_checks.worker_gpu) when known."""
    from kernels import KernelUnsupportedError, resolve
    from models.loader import model_kernel, run_rows

    try:
        if loaded is None:
            return resolve(attention, backend=backend, has_segments=True, dtype=dtype, instead_of=instead_of, gpu=gpu)
        rows = run_rows(max_len, loaded.tokenizer.max_seq_len)
        return model_kernel(attention, loaded.config, rows, dtype, backend, instead_of=instead_of, gpu=gpu)
    except KernelUnsupportedError as e:
        raise ConfigError(f"{kernel_refusal(e, flag, attention)} ({where or f'target backend {backend}'})") from None


def kernel_refusal(error: Exception, flag: str, attention: str) -> str:
    """A kernel's refusal (which names --attention) as the message of the flag that chose the kernel."""
    message = str(error).replace("--attention", flag)
    return message if flag in message else f"{flag}={attention}: {message}"


def backend_origin(eo: EvalOptions, backend: str) -> str:
    """Where the run's target backend comes from, as a kernel refusal says it (only a remote runner other
    than Dataflow takes --target_backend from the user)."""
    if runs_locally(eo):
        return f"target backend {backend}: this machine's"
    if dataflow_checks.is_dataflow(eo):
        return f"target backend {backend}: the Dataflow workers' accelerator"
    return f"target backend {backend}: set --target_backend if the workers differ"


def check_output_outside_input(eo: EvalOptions, shards: Sequence[str]) -> None:
    """--output must not lie inside a directory --input reads, nor hold a shard it matches: each run would
    read the tables of the runs before it as input."""
    if eo.output.startswith(sinks.BQ_PREFIX) or eo.input.startswith(tfds_reader.TFDS_PREFIX):
        return
    output = run_commit.one_spelling(eo.output) + "/"
    written = tuple(f"{output}{folder}/" for folder in run_commit.OUTPUT_FOLDERS)  # where docscore writes under --output
    reads_output = any(run_commit.one_spelling(shard).startswith(written) for shard in shards)
    input_dir = not fsspec.core.has_magic(eo.input) and len(shards) and run_commit.one_spelling(shards[0]) != run_commit.one_spelling(eo.input)
    if reads_output or (input_dir and output.startswith(run_commit.one_spelling(eo.input) + "/")) or (
            fsspec.core.has_magic(eo.input) and glob_matches_output(eo, output)):
        raise ConfigError(f"--output {eo.output} is inside what --input {eo.input} reads, so every run would read "
                          "the tables of the runs before it as input; write the output outside the input")


def glob_matches_output(eo: EvalOptions, output: str) -> bool:
    """Whether the --input glob would match a file this run writes under `output` (the one spelling, ending in /):
    the first run's check sees no such file yet, the next run would read them (`in/**/*.parquet` with --output in)."""
    suffix = ".jsonl" if eo.output_format == "jsonl" else ".parquet"
    partition = run_commit.partition_name(eo.run_id)
    written = [f"{output}{table}/{partition}/{sinks.PART_PREFIX}-0123456789ab-00000-of-00001{suffix}"
               for table in run_commit.TABLES]
    written += [f"{output}runs/{partition}/{name}" for name in (run_commit.SUMMARY_FILE, run_commit.REPORT_FILE,
                                                                 SAMPLES_FILE, "history-0123456789ab.parquet")]
    pattern = re.compile(fsspec.utils.glob_translate(run_commit.one_spelling(eo.input)))
    return any(pattern.match(path) for path in written)


def check_label_embeddings(eo: EvalOptions, task, labels: dict[str, str], loaded, batch,
                           max_len: int) -> tuple[float, float, float, float]:
    """The task's label embeddings as its workers compute them at load (tasks/classify.py refuses one that is NaN
    or zeros), for a local run (its model is loaded here as its workers load it; in-process workers reuse what this
    compiled, worker processes compile it again). Remote workers' load refuses them, failing the job before it
    scores anything. Returns what it compiled (LoadedModel.compiles_by_this_thread's difference), which the run's
    summary counts."""
    before = loaded.compiles_by_this_thread()
    try:
        task.prepare(labels, texts_embedder(loaded, batch.call_shapes(max_len), (eo.stride, eo.max_chunks)))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return tuple(float(x) for x in loaded.compiles_by_this_thread() - before)


def check_labels_read_apart(labels: dict[str, str], tokenizer, max_len: int, stride: int, max_chunks: int) -> None:
    """Two label descriptions the model reads as the same windows of tokens (an uncased tokenizer: "Sport" and
    "SPORT") have one embedding: every document ties them and the first always wins, as for one description given
    twice (options.distinct_labels refuses the text; this, the tokens)."""
    names, descriptions = list(labels), list(labels.values())
    encoded = tokenizer.encode_windows(descriptions, max_len=max_len, stride=stride, max_windows=max_chunks,
                                       role="document")
    seen: dict[tuple, str] = {}
    for name, description, doc in zip(names, descriptions, encoded):
        if doc.n_tokens == 0:  # only the special tokens: the empty text's embedding, which wins documents
            raise ConfigError(f"--labels: {name!r} has the description {description!r}, in which the model's tokenizer "
                              "finds no token (zero-width, control or combining characters only); describe the class in words")
        key = tuple(tuple(int(t) for t in window) for window in doc.windows)
        if key in seen:
            first = seen[key]
            raise ConfigError(f"--labels: {first!r} and {name!r} have descriptions ({labels[first]!r} and {description!r}) "
                              "that the model's tokenizer reads as the same tokens, so no document could tell them "
                              "apart; describe each class differently")
        seen[key] = name


def check_writable_location(flag: str, location: str, kinds: str) -> None:
    """`location` (local or gs://) can be written: the folder made and a probe file written there
    (sinks.check_writable); otherwise a ConfigError naming `flag`, a missing bucket, an unreachable store."""
    try:
        sinks.check_writable(location)
    except OSError as e:
        if sources.is_transient(e) and "://" in location:  # aiohttp's refused connection is an OSError too
            raise ConfigError(sources.unreachable_message(f"{flag} {location}", e)) from None
        if isinstance(e, FileNotFoundError) and fsspec.core.split_protocol(location)[0] in input_files.GCS_PROTOCOLS:
            bucket = fsspec.core.url_to_fs(location)[1].split("/", 1)[0]
            raise ConfigError(input_files.missing_bucket_message(f"{flag} {location}", bucket)) from None
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ConfigError(f"{flag} {location}: its disk is full ({e.strerror}); free space there, or choose "
                              "another directory") from None
        if e.errno in (errno.EEXIST, errno.ENOTDIR) and "://" not in location:  # it, or a folder above it, is a file
            raise ConfigError(f"{flag} {location} is a file, or lies under one, where a directory is needed "
                              f"({e.strerror}); choose a directory") from None
        raise ConfigError(f"{flag} {location} is not writable ({e}); choose a directory you can write to") from None
    except ValueError as e:
        raise ConfigError(f"{flag} {location}: {e}; use {kinds}") from None
    except Exception as e:  # a store that answers 503 or drops the connection, after gcsfs's retries
        if not sources.is_transient(e):
            raise
        raise ConfigError(sources.unreachable_message(f"{flag} {location}", e)) from None


def check_output_layout(eo: EvalOptions) -> None:
    """A local --output where a file stands in for a folder the run writes (DIR/scores, DIR/runs/run_id=ID, ...), a
    folder for a file (summary.json), or one of those folders that cannot be written (another user's DIR/scores):
    the job would read everything and fail at its publish. Each existing folder gets a probe file, as the root did."""
    protocol, root = fsspec.core.split_protocol(eo.output)
    if protocol not in (None, "file") or eo.output.startswith(sinks.BQ_PREFIX):
        return
    for folder in run_commit.OUTPUT_FOLDERS:
        for path in (os.path.join(root, folder), os.path.join(root, folder, run_commit.partition_name(eo.run_id))):
            if os.path.lexists(path) and not os.path.isdir(path):
                raise ConfigError(f"--output {eo.output}: {path} is a file where the run writes a folder; move it "
                                  "away, or choose another --output")
            if os.path.isdir(path):
                try:
                    fd, probe = tempfile.mkstemp(prefix=".docscore-probe-", dir=path)
                    os.close(fd)
                    os.unlink(probe)
                except OSError as e:
                    raise ConfigError(f"--output {eo.output}: {path} cannot be written ({e.strerror or e}), and the run "
                                      "writes there; make it writable, or choose another --output") from None
    for path in (fsspec.core.split_protocol(run_commit.summary_path(eo.output, eo.run_id))[1],
                 fsspec.core.split_protocol(run_commit.report_path(eo.output, eo.run_id))[1]):
        if os.path.isdir(path):
            raise ConfigError(f"--output {eo.output}: {path} is a folder where the run writes a file; move it away, "
                              "or choose another --output")


def validate(eo: EvalOptions) -> RunPlan:
    """All checks (validate_plan); a configuration error leaves no directory behind that the checks made (the
    writability probe of a local --output creates it)."""
    missing = _missing_dirs(eo.output) if eo.output else []
    try:
        return validate_plan(eo)
    except ConfigError:
        for directory in reversed(missing):  # deepest first; one that holds something now is left alone
            with contextlib.suppress(OSError):
                os.rmdir(directory)
        raise


def _missing_dirs(output: str) -> list[str]:
    """The local directories of `output` and its parents that do not exist yet, outermost first."""
    protocol, path = fsspec.core.split_protocol(output)
    if protocol not in (None, "file"):
        return []
    missing, path = [], os.path.abspath(path)
    while not os.path.exists(path) and path != os.path.dirname(path):
        missing.insert(0, path)
        path = os.path.dirname(path)
    return missing


def check_options(eo: EvalOptions) -> None:
    """The checks of the options alone, cheapest first: no runner environment, backend, model or data
    (runners/scheduling.py runs them on a schedule's `run:` before anything is launched)."""
    if not eo.input:
        raise ConfigError("--input is required: a shard pattern (e.g. 'data/*.jsonl', gs://bucket/x/*.parquet) or tfds:NAME")
    if not eo.output:
        raise ConfigError("--output is required: the directory the tables are written under")
    if eo.output != eo.output.strip():  # ' ' made a folder named by a space; 'out ' one that ls shows as out
        raise ConfigError(f"--output {eo.output!r} begins or ends with white space (an unquoted or unset variable?); "
                          "pass the directory's name without it")
    for flag in ("cache_dir", "profile_dir"):  # '' is falsy: the default cache, no profile, without a word
        value = getattr(eo, flag)
        if value is not None and not value.strip():
            raise ConfigError(f"--{flag}={value!r} is empty (an unset variable?); pass a directory, or leave --{flag} "
                              "out")
    check_choice("task", eo.task, tuple(tasks.TASKS))  # the live registry: a task registered at run time counts
    check_choice("output_format", eo.output_format, OUTPUT_FORMATS)
    if eo.output.startswith(sinks.BQ_PREFIX):
        from pipeline.io.bigquery import BigQueryOutput

        try:
            BigQueryOutput.parse(eo.output)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if "\\" in eo.output and not eo.output.startswith(sinks.BQ_PREFIX):
        raise ConfigError(f"--output {eo.output} holds a backslash, which DuckDB's file patterns cannot match: the views "
                          "of docs/queries.md would find none of the run's files; choose a directory name without one")
    if eo.output_format == "jsonl" and not eo.output.startswith(sinks.BQ_PREFIX) and fsspec.core.has_magic(eo.output):
        raise ConfigError(f"--output {eo.output} holds glob characters ([ ] * ?), which Beam's text writer reads as a "
                          "pattern when it moves the JSONL files into place (a run would fail after reading all data); "
                          "choose a directory name without them, or --output_format parquet")
    remote = "://" in eo.output and not eo.output.startswith(("file://", sinks.BQ_PREFIX))
    if remote and fsspec.core.has_magic(eo.output):
        raise ConfigError(f"--output {eo.output} holds glob characters ([ ] * ?), which the remote file system reads as "
                          "a pattern when it moves the tables into place (a run would fail after reading all data); "
                          "choose a name without them")
    check_choice("dtype", eo.dtype, DTYPES)
    check_choice("target_backend", eo.target_backend, TARGET_BACKENDS)
    check_run_id(eo.run_id)
    own_windows = tasks.get(eo.task).tokenize is not None  # such a task (choice) takes no --stride or --max_chunks
    for flag, value, low in (("max_chunks", eo.max_chunks, 1), ("stride", eo.stride, 0),
                             ("max_record_bytes", eo.max_record_bytes, 1024)):
        if own_windows and flag != "max_record_bytes":
            continue
        if value < low:
            raise ConfigError(f"--{flag}={value} must be >= {low}")
    if not 0.0 <= eo.max_error_fraction <= 1.0:
        raise ConfigError(
            f"--max_error_fraction={eo.max_error_fraction} must be in [0, 1]: the share of error rows among the "
            "records past which the run exits 4 (1 never fails the run)"
        )
    budget = os.environ.get(sharding.BUDGET_ENV)
    if budget and not sharding.parses_as_bytes(budget):
        raise ConfigError(f"{sharding.BUDGET_ENV}={budget!r} is not a number of bytes per device; set it to one "
                          "(e.g. 16e9) or unset it to use what the devices report")
    if eo.max_seq_len is not None and eo.max_seq_len < MIN_SEQ_LEN:
        raise ConfigError(f"--max_seq_len={eo.max_seq_len} is too short; use at least {MIN_SEQ_LEN} (default: the model's)")
    if not 0 < eo.temperature < math.inf:
        raise ConfigError(f"--temperature={eo.temperature} must be > 0 and finite (e.g. 0.05)")
    workers = eo.get_all_options().get("direct_num_workers")
    if workers is not None and workers < 0:
        raise ConfigError(f"--direct_num_workers={workers} must be >= 1 (or 0: one per CPU core)")
    check_shadow_flags(eo)
    task = tasks.get(eo.task)
    labels = parse_labels(eo.classify_labels)
    if task.takes_labels and len(labels) < 2:
        read = f" (read {len(labels)}: {'; '.join(f'{k!r}={v!r}' for k, v in labels.items())})" if labels else ""
        raise ConfigError(
            f"--task={eo.task} needs at least two labels{read}: --labels \"name=description;name=description\", "
            "separated by ';', or a `labels:` mapping (label: description) in --config"
        )
    label_tasks = " or ".join(f"--task={t.name}" for t in tasks.TASKS.values() if t.takes_labels)
    if labels and not task.takes_labels:
        raise ConfigError(
            f"--labels is only for {label_tasks} (the classes documents are scored against); --task={eo.task} "
            f"would ignore it: drop --labels (a --config's `labels:` key is cleared by --labels ''), or pass {label_tasks}"
        )
    if "temperature" in eo.get_all_options(drop_default=True) and not task.takes_labels:
        raise ConfigError(f"--temperature is only for {label_tasks} (the softmax over its labels); --task={eo.task} "
                          f"would ignore it: drop --temperature{set_by_config(eo, 'temperature')}, or pass {label_tasks}")
    dataflow_checks.check_job_labels(eo)


# Beam (apache_beam/coders/coders.py) encodes with dill, which must be this version, for an
# --update_compatibility_version before DILL_CODERS_BEFORE; it says so only when the job runs
DILL_CODERS_BEFORE, DILL_FOR_OLD_CODERS = "2.68.0", "0.3.1.1"


def installed_version(distribution: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_beam_options(eo: EvalOptions) -> None:
    """What Beam checks of its own options only when the launcher makes and builds the job's pipeline, after
    validation has loaded the model and peeked at the data and the launcher has taken the run's lease (a traceback,
    exit 1): the pickling library (--pickle_library dill without dill), --resource_hints, its options validator,
    --update_compatibility_version, and --type_check_strictness ALL_REQUIRED, which docscore's graph cannot pass.
    An empty pipeline is made here for the first three, on a DirectRunner whatever --runner says: Dataflow's own
    settings are dataflow_checks', and Beam's check of its temp_location calls Cloud Storage."""
    import shutil

    import apache_beam as beam

    given = eo.get_all_options()  # one parse of the flags for every check below
    if given.get("type_check_strictness") == "ALL_REQUIRED":
        raise ConfigError("--type_check_strictness=ALL_REQUIRED needs an output type hint on every transform, which "
                          "docscore's graph (and the Beam transforms it uses) do not all declare, so the job could not "
                          "be built; drop it (the default, DEFAULT_TO_ANY, still checks the hints that are declared)")
    version = given.get("update_compatibility_version")
    try:
        before_cloudpickle_coders = eo.is_compat_version_prior_to(DILL_CODERS_BEFORE)  # as Beam reads it
    except ValueError:
        raise ConfigError(f"--update_compatibility_version={version} is not a Beam version; write it as "
                          "MAJOR.MINOR.PATCH (e.g. 2.68.0), or drop it") from None
    if before_cloudpickle_coders and installed_version("dill") != DILL_FOR_OLD_CODERS:
        raise ConfigError(f"--update_compatibility_version={version}: Beam encodes some values with dill for a version "
                          f"before {DILL_CODERS_BEFORE}, and needs dill=={DILL_FOR_OLD_CODERS} installed for it (found: "
                          f"{installed_version('dill') or 'none'}); install it, or drop the flag (a batch job "
                          "updates no running job)")
    try:
        pipeline = beam.Pipeline(runner=beam.runners.DirectRunner(), options=eo)
    except ImportError as e:  # the --pickle_library's package is not installed
        raise ConfigError(f"--pickle_library={given.get('pickle_library')}: {e} Or drop "
                          "--pickle_library (Beam's default pickles docscore's job)") from None
    except ValueError as e:  # a resource hint, or the options validator's list (which names each flag)
        message = " ".join(str(e).replace("Pipeline has validations errors:", "").split()).rstrip(".")
        flag = "--resource_hints: " if "resource hint" in message.lower() else ""
        raise ConfigError(f"{flag}{message}; Beam refuses these options when it makes the job: fix or drop the flag "
                          "it names") from None
    shutil.rmtree(pipeline.local_tempdir, ignore_errors=True)


def check_before_data(eo: EvalOptions) -> tuple[str, str, batching.BatchSettings]:
    """The checks of the options alone, with no data, model or network: (backend, kernel, batch settings). A
    scheduled run's options are checked with these before any launch (runners/scheduling.py)."""
    check_options(eo)
    dataflow_checks.check_dataflow_options(eo)
    dataflow_checks.check_paths_on_workers(eo)
    check_beam_options(eo)
    tfds_flags = [f"--{flag}" for flag in ("tfds_data_dir", "split") if flag in eo.get_all_options(drop_default=True)]
    if tfds_flags and not eo.input.startswith(tfds_reader.TFDS_PREFIX):
        them, apply = ("them", "apply") if len(tfds_flags) > 1 else ("it", "applies")
        raise ConfigError(f"{' and '.join(tfds_flags)} only {apply} to a tfds:NAME --input, and --input {eo.input} is "
                          f"not one; drop {them}")
    backend = dataflow_checks.check_worker_backend(eo) if dataflow_checks.is_dataflow(eo) else target_backend(eo.target_backend)
    check_reachable_backend(eo, backend)
    check_matmul_precision(eo, backend)
    where = backend_origin(eo, backend)
    kernel = resolve_kernel(eo.attention, backend, dtype=eo.dtype, where=where, gpu=dataflow_checks.worker_gpu(eo))
    try:
        batch = batching.settings_for(backend, batch_size=eo.batch_size, calls_per_beam_batch=eo.calls_per_beam_batch)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return backend, kernel, batch


def find_shards(eo: EvalOptions):
    """--input's shards (input_files.find_input), the folders skipped, and a tfds: dataset's description; a path
    that does not exist, cannot be listed or reached is a ConfigError naming --input."""
    try:
        tfds = None
        if eo.input.startswith(tfds_reader.TFDS_PREFIX):
            if not eo.tfds_data_dir:
                raise ConfigError(f"--input {eo.input}: pass --tfds_data_dir DIR (the data_dir it was prepared in)")
            tfds = tfds_reader.locate_dataset(eo.input, eo.tfds_data_dir)
        shards, skipped = (tfds.shard_paths(eo.split), []) if tfds is not None else input_files.find_input(eo.input)
    except (FileNotFoundError, PermissionError, ValueError, KeyError) as e:
        message = str(e).strip("'\"")
        if isinstance(e, FileNotFoundError) and eo.config and not fsspec.core.split_protocol(eo.input)[0] \
                and not os.path.isabs(eo.input):
            message += (f" (with --config {eo.config}, a relative path is still taken from the working directory "
                        f"{os.getcwd()}: run from the folder it is relative to, or write it absolute)")
        raise ConfigError(message if "--" in message else f"--input {eo.input}: {message}") from None
    except Exception as e:  # a store that cannot be reached (no network, DNS, refused): not a traceback
        if not (isinstance(e, OSError) or sources.is_transient(e)):
            raise
        raise ConfigError(sources.unreachable_message(f"--input {eo.input}", e)) from None
    return shards, skipped, tfds


def check_output(eo: EvalOptions) -> None:
    """--output (and --profile_dir) can take the run: BigQuery's temp_location, a writable directory that is not
    the file system's root and holds no foreign layout or links where the run writes."""
    temp_location = eo.get_all_options().get("temp_location")
    if eo.output.startswith(sinks.BQ_PREFIX) and not str(temp_location or "").startswith("gs://"):
        given = f" (not {temp_location})" if temp_location else ""
        raise ConfigError(f"--output {eo.output} needs --temp_location gs://BUCKET/tmp{given}: BigQuery loads its files "
                          "from Cloud Storage")
    if eo.output.startswith(sinks.BQ_PREFIX) and runs_locally(eo):  # Dataflow's own checks cover its temp_location
        check_writable_location("--temp_location", temp_location, "a gs://BUCKET/PATH you can write to")
    if not eo.output.startswith(sinks.BQ_PREFIX):
        if fsspec.core.split_protocol(eo.output)[0] in (None, "file") and os.path.abspath(
                fsspec.core.split_protocol(eo.output)[1]) == "/":
            raise ConfigError(f"--output {eo.output} is the file system's root; choose a directory for the run's tables")
        check_writable_location("--output", eo.output, "a local directory, gs://BUCKET/PATH or bq:PROJECT.DATASET.PREFIX")
        check_output_layout(eo)
        if eo.profile_dir:
            try:
                sinks.check_writable(eo.profile_dir)
            except (OSError, ValueError) as e:
                raise ConfigError(f"--profile_dir {eo.profile_dir} is not a writable directory ({e}); choose one "
                                  "you can write to") from None
        linked = run_commit.linked_partitions(eo.output, eo.run_id)
        if linked:
            raise ConfigError(f"--output {eo.output}: {linked[0]} is a symlink; docscore does not write or delete through "
                              "links in its output: remove the link (its target is left as it is) or choose another --output")


def validate_plan(eo: EvalOptions) -> RunPlan:
    """All checks, cheapest first: the options, the input's files, the output, the model (loaded once per process,
    reused by the pipeline) and what needs it, then the looks at data: the first records' fields (a schema), and the first
    shard's first labels for the gold notices."""
    backend, kernel, batch = check_before_data(eo)
    task, labels = tasks.get(eo.task), parse_labels(eo.classify_labels)
    where = backend_origin(eo, backend)
    shards, skipped, tfds = find_shards(eo)
    read_spec = sources.ReadSpec(
        text_field=eo.text_field, id_field=eo.id_field or None, tfds=tfds, max_record_bytes=eo.max_record_bytes,
        checked_fields=tuple(name for name, read in (("query", task.with_query), ("label", task.gathers == "gold_pairs"))
                             if read) + task.record_fields,
        sizes=input_files.shard_sizes(shards),
    )
    check_output_outside_input(eo, shards)

    check_output(eo)

    model_spec, loaded, same_backend, kernel, max_len, shadow_spec = check_loaded_model(eo, backend, where)
    family = loaded.config.family
    rows_notice = None
    if same_backend and runs_locally(eo):  # the run's calls are this machine's: rows split over its devices
        batch, rows_notice = rows_for_local_devices(batch)
    if same_backend:
        check_batch_memory(eo, loaded.config, batch, max_len, kernel, backend, loaded.parallel.data_size)
    compiles = (0.0, 0.0, 0.0, 0.0)
    if task.takes_labels and same_backend:  # the model was loaded here as the run's workers load it
        compiles = check_label_embeddings(eo, task, labels, loaded, batch, max_len)
    notice = bfloat16_notice(eo, backend)
    input_checks.check_fields(eo, shards, read_spec)  # last, with the notices: the checks that look at data (first records)
    gold_notice = input_checks.text_gold_notice(shards[0], read_spec) if task.numeric_gold else None
    if task.takes_labels and not gold_notice:
        gold_notice = input_checks.unknown_gold_notice(shards[0], read_spec, tuple(labels))
    if task.gathers == "gold_pairs" and not gold_notice:
        gold_notice = input_checks.unread_gold_notice(eo.task, shards[0], read_spec)
    return RunPlan(
        shards=tuple(shards),
        read_spec=read_spec,
        model_spec=model_spec,
        window_spec=WindowSpec(max_len=max_len, stride=eo.stride, max_chunks=eo.max_chunks, task=eo.task),
        labels=labels,
        kernel=kernel,
        target_backend=backend,
        model_family=family,
        model_id=loaded.model_id,
        fingerprint=loaded.fingerprint,
        pooling=loaded.pooling if not task.per_token else None,
        prompts={role: text for role, text in getattr(loaded.tokenizer, "prompts", {}).items()
                 if role in task.prompt_roles},
        prefix_len=len(getattr(loaded.tokenizer, "prefix", ())),
        suffix_len=len(getattr(loaded.tokenizer, "suffix", ())),
        shadow=shadow_spec,
        notices=tuple(n for n in (input_files.skipped_notice(eo.input, skipped), input_files.linked_outside_notice(eo.input, shards), rows_notice,
                                  notice, gold_notice) if n),
        batch=batch,
        sharding=loaded.parallel.summary() if same_backend else {
            "mesh": None, "reason": f"chosen by each {backend} worker from its devices' memory (models/sharding.py)"},
        compiles=compiles,
    )


def bfloat16_notice(eo: EvalOptions, backend: str) -> str | None:
    """--dtype bfloat16 on a local CPU run whose CPU has no bfloat16 instructions: emulated, it is no faster
    than float32 and less precise (a notice, not an error: bfloat16 still matches what a TPU or GPU run computes)."""
    from pipeline.process_setup import NATIVE_BFLOAT16_FLAGS, cpu_features, has_native_bfloat16

    if eo.dtype != "bfloat16" or backend != "cpu" or not runs_locally(eo) or has_native_bfloat16(cpu_features()) is not False:
        return None
    return (
        f"--dtype=bfloat16: this CPU has no bfloat16 instructions (none of {', '.join(sorted(NATIVE_BFLOAT16_FLAGS))} in "
        "/proc/cpuinfo), so bfloat16 matmuls are emulated: no faster than float32 on such CPUs (benchmarks/bfloat16_cpu.py) "
        "and less precise; use --dtype=float32 unless you need the bfloat16 numbers "
        "of a TPU or GPU run"
    )


def check_shadow(eo: EvalOptions, model_spec: ModelSpec, primary, backend: str, kernel: str,
                 where: str = "") -> shadow.ShadowSpec | None:
    """--shadow_attention: the second kernel resolves for the model (`primary`, as loaded for --attention, which
    runs `kernel`) on the target backend, is not the primary kernel, and loads (check_shadow_flags has checked the
    fraction and tolerance). A refusal's suggestions leave out the primary kernel: shadowing with it compares nothing."""
    if not eo.shadow_attention:
        return None
    try:
        tolerance = shadow.tolerance_for(eo.dtype, eo.shadow_tolerance)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    gpu = dataflow_checks.worker_gpu(eo)
    shadow_kernel = resolve_kernel(eo.shadow_attention, backend, flag="--shadow_attention", dtype=eo.dtype,
                                   loaded=primary, where=where, instead_of=kernel, gpu=gpu, max_len=eo.max_seq_len)
    if shadow_kernel == kernel:
        raise ConfigError(
            f"--shadow_attention={eo.shadow_attention} resolves to {shadow_kernel}, the kernel --attention={eo.attention} "
            f"already runs, so there is nothing to compare; shadow with another kernel, e.g. "
            f"--shadow_attention={other_kernel(kernel, backend, eo.dtype, primary, gpu, eo.max_seq_len)}"
        )
    load_for_checks(dataclasses.replace(model_spec, attention=eo.shadow_attention), backend, flag="--shadow_attention",
                    here=runs_locally(eo))
    return shadow.ShadowSpec(eo.shadow_attention, shadow_kernel, eo.shadow_fraction, tolerance, eo.dtype)


def other_kernel(kernel: str, backend: str, dtype: str, loaded, gpu=None, max_len: int | None = None) -> str:
    """A choice of --shadow_attention that runs this model on `backend` (and `gpu`) with another kernel than
    `kernel` (kernels.other_choice for the model's attention on rows of `max_len`, else the model's, tokens)."""
    from kernels import other_choice
    from models.loader import model_shape_info, run_rows

    rows = run_rows(max_len, loaded.tokenizer.max_seq_len)
    return other_choice(kernel, backend, gpu=gpu, **model_shape_info(loaded.config, rows, dtype))


def check_shadow_flags(eo: EvalOptions) -> None:
    """--shadow_fraction in (0, 1] and --shadow_tolerance > 0 whether or not --shadow_attention is given, and
    neither given without it (they would be ignored: `--shadow_fraction 2` ran as if it were not there). "Given"
    means different from the flag's default: a --shadow_fraction 0.1 (the default) without --shadow_attention
    passes unnoticed."""
    if not 0.0 < eo.shadow_fraction <= 1.0:
        raise ConfigError(
            f"--shadow_fraction={eo.shadow_fraction} must be in (0, 1]; e.g. 0.1 also runs a tenth of the batches "
            "through --shadow_attention"
        )
    if eo.shadow_tolerance is not None and not 0 < eo.shadow_tolerance < math.inf:
        raise ConfigError(f"--shadow_tolerance={eo.shadow_tolerance} must be > 0 and finite (or left out for the "
                          "--dtype default; an infinite one is a gate that cannot fail)")
    if eo.shadow_attention:
        return
    given = eo.get_all_options(drop_default=True)
    for flag, meaning in (("shadow_fraction", "the share of batches the shadow kernel also runs"),
                          ("shadow_tolerance", "the divergence the shadow kernel may show")):
        if flag in given:
            raise ConfigError(
                f"--{flag}={given[flag]} has no effect without --shadow_attention ({meaning}); add "
                f"--shadow_attention=KERNEL (e.g. --shadow_attention=flash) to shadow the run, or drop --{flag}"
                f"{set_by_config(eo, flag)}"
            )


def rows_for_local_devices(batch: batching.BatchSettings) -> tuple[batching.BatchSettings, str | None]:
    """The settings with --batch_size rounded up as the model calls round it (a multiple of this machine's
    devices, which each call's rows are split over), so the summary records what runs; and a notice when it
    was rounded."""
    import jax

    devices = jax.local_device_count()
    rows = batching.rows_for_devices(batch.batch_size, devices)
    if rows == batch.batch_size:
        return batch, None
    return dataclasses.replace(batch, batch_size=rows), (
        f"--batch_size={batch.batch_size} runs as {rows} rows a call: a multiple of the {devices} {batch.backend} "
        f"devices each call's rows are split over")


def check_batch_memory(eo: EvalOptions, config, batch: batching.BatchSettings, max_len: int, kernel: str,
                       backend: str, devices: int) -> None:
    """One model call of the run's batch size (rows of max_len tokens) must fit the memory of this machine's
    backend (memory.batch_size_problem: available RAM, or the device allocator's free bytes) before any data
    is read, not fail out of memory after reading. Checked for local runs only: the
    workers of a remote runner are other machines. `devices`: the mesh's data axis, which a call's rows are split over."""
    if not runs_locally(eo):
        return
    room = memory.local_memory_room(backend)
    if room is None:  # the backend reports no limit to compare with
        return
    direct = eo.get_all_options()
    workers = max(direct_workers(direct.get("direct_num_workers")), batch.local_threads)
    processes = direct.get("direct_running_mode") == "multi_processing"
    concurrent = workers if backend == "cpu" or processes else 1  # an accelerator runs one process's calls in turn
    problem = memory.batch_size_problem(
        config, batch_size=batch.batch_size, seq_len=max_len, dtype=eo.dtype, attention=kernel, room=room,
        devices=devices, concurrent_calls=concurrent,
        model_copies=workers if processes and backend == "cpu" else 0, per_token=tasks.get(eo.task).per_token)
    if problem:
        raise ConfigError(problem)


def load_for_checks(spec: ModelSpec, backend: str, flag: str = "--attention", here: bool = True):
    """Load the model to check it: with the run's own spec when the run's model calls are this process's (`here`:
    a local run) on this process's backend (the pipeline then reuses it), with the native kernel otherwise: remote
    workers resolve their own kernel, for their own GPU, even when their backend's name is this process's.
    Returns (loaded model, whether it was loaded with the run's own spec). `flag` chose spec.attention."""
    import jax

    import models
    from kernels import KernelUnsupportedError
    from models.errors import ModelDirNotWritten
    from models.model_dir import default_cache_dir

    same_backend = here and backend == jax.default_backend()
    if not same_backend:  # the kernel and matmul precision are the workers' (check_matmul_precision checked it)
        spec = dataclasses.replace(spec, attention="native", matmul_precision=None)
    try:
        return shared_model(spec), same_backend
    except models.ModelLoadError as e:
        if isinstance(e, ModelDirNotWritten):  # a run writes a model directory only to cache a built-in model
            setting = f"--cache_dir {spec.cache_dir}" if spec.cache_dir else f"--cache_dir (default {default_cache_dir()})"
            raise ConfigError(f"{setting}: models cannot be cached there: {e} (or pass another --cache_dir)") from None
        raise ConfigError(f"--model {spec.name}: {e}") from None
    except KernelUnsupportedError as e:
        raise ConfigError(kernel_refusal(e, flag, spec.attention)) from None
    except (FileNotFoundError, OSError) as e:
        if spec.cache_dir and spec.cache_dir in str(e):  # converting a built-in model into --cache_dir failed
            raise ConfigError(f"--cache_dir {spec.cache_dir}: models cannot be cached there ({e}); choose a directory "
                              "you can write to") from None
        raise ConfigError(f"--model {spec.name}: cannot be loaded ({e}); pass minilm-l6 or a model directory") from None
