"""The docscore model directory: config.json, tokenizer.json, params/ (Orbax), metadata.json.

Holds the file layout, the metadata record, the atomic write of a whole directory, the cache
directory and the copy of a remote (gs://, any fsspec URL) directory into that cache.
Must not build models or convert weights (hf_import.py, loader.py).
"""
from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import os
import shutil
import stat
import time
import uuid
from pathlib import Path
from typing import Any

from models.checkpoint import fingerprint, save_params
from models.errors import DamagedModelDir, ModelDirNotWritten, ModelLoadError, disk_full, short_of, shortage
from models.config import DENSE_ACTIVATIONS, ENCODER_FAMILIES, MAX_SIZES, Dense
from models.heads import POOLINGS
from models.tokenizer import PROMPT_ROLES

CONFIG, TOKENIZER, PARAMS, METADATA = "config.json", "tokenizer.json", "params", "metadata.json"
FORMAT = "docscore-model/1"
MAX_SEQ_LEN = 1_048_576  # metadata.json's max_seq_len bound (config.MAX_SIZES' max_positions)


@dataclasses.dataclass(frozen=True)
class ModelMetadata:
    """metadata.json: what the directory holds and the content fingerprint to check it against."""

    family: str
    fingerprint: str
    max_seq_len: int
    source: str
    format: str = FORMAT
    # how a segment's embedding is pooled (models/heads.py POOLINGS), from the sentence-transformers Pooling module;
    # None: a decoder that embeds nothing (a language model). Unwritten, it is its family's unwritten_pooling.
    pooling: str | None = "mean"
    # the text sentence-transformers puts before a document and before a query (models/tokenizer.py PROMPT_ROLES),
    # from config_sentence_transformers.json; left unwritten when there is none
    prompts: dict[str, str] = dataclasses.field(default_factory=dict)
    # the sentence-transformers Dense modules after the pooling, in order (models/config.py Dense's fields); left
    # unwritten when there are none
    dense: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # false: the sentence-transformers Pooling leaves a prompt's tokens out of a mean or CLS pooling, which docscore
    # does not compute, so no prompt may be put before this model's texts; left unwritten when true
    include_prompt: bool = True


def unwritten_pooling(family: str) -> str | None:
    """What a directory without a recorded pooling holds: an encoder's is mean (the only pooling converted before
    one was recorded), a decoder's none (decoders were converted as language models only)."""
    return "mean" if family in ENCODER_FAMILIES else None


def metadata_json(metadata: ModelMetadata) -> str:
    """metadata.json's text. A pooling its family implies (unwritten_pooling) is left unwritten: such a directory stays
    the one earlier docscore versions read, and they refuse another pooling as an unknown field rather than
    computing it as mean, or embedding with a decoder they would not know how to pool."""
    fields = dataclasses.asdict(metadata)
    if fields["pooling"] == unwritten_pooling(metadata.family):
        del fields["pooling"]
    for name in ("prompts", "dense"):
        if not fields[name]:
            del fields[name]
    if fields["include_prompt"]:
        del fields["include_prompt"]
    return json.dumps(fields, indent=2) + "\n"


CACHE_DIR_ENV = "DOCSCORE_CACHE_DIR"


def default_cache_dir() -> str:
    """$DOCSCORE_CACHE_DIR, else ~/.cache/docscore."""
    return os.environ.get(CACHE_DIR_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "docscore")


def local_cache_dir(cache_dir: str | None) -> str:
    """Where models are converted and copied: cache_dir, or the default when it is None or remote (a gs://
    --cache_dir holds the compilation cache that a job's workers share; models are cached on each machine)."""
    return cache_dir.removeprefix("file://") if cache_dir and not is_remote(cache_dir) else default_cache_dir()


def is_remote(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


# temporary directories of writes in progress in this process: an interrupted command removes them
# (remove_unfinished) before it exits, so no model's worth of hidden files is left behind
UNFINISHED: set[Path] = set()


ALREADY_THERE = "already exists; choose an --out that does not exist yet, or an empty directory"


def taken(path: Path) -> bool:
    """Something is at `path` that a model directory may not replace: anything but an empty directory."""
    if path.is_dir() and not path.is_symlink():
        return any(path.iterdir())
    return path.exists() or path.is_symlink()


def check_new_dir(dst: str) -> None:
    """Refuse, before any work, a directory write_model_dir could not make: a remote URL, a path that exists
    (an empty directory is taken), or one under a file or where nothing may be written. ModelLoadError."""
    if is_remote(dst):
        raise ModelLoadError(f"--out {dst}: convert writes a local directory; convert into one, then copy it "
                             f"(e.g. gcloud storage cp -r DIR {dst}): `docscore run --model {dst}` reads it there")
    path = Path(dst).absolute()
    if taken(path):
        raise ModelLoadError(f"--out {dst}: {ALREADY_THERE}")
    if path.is_dir():  # empty: the write renames its copy onto it
        return
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ModelLoadError(f"--out {dst}: {parent} is a file, not a directory; choose an --out under a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ModelLoadError(f"--out {dst}: cannot create it in {parent} (not writable here: permissions or a "
                             "read-only file system); choose a directory you can write to")


def remove_unfinished() -> list[str]:
    """Remove the temporary directories of the writes in progress (an interrupt); the paths removed."""
    removed = sorted(str(tmp) for tmp in UNFINISHED)
    for tmp in list(UNFINISHED):
        shutil.rmtree(tmp, ignore_errors=True)
        UNFINISHED.discard(tmp)
    return removed


def write_model_dir(dst: str, *, params: dict[str, Any], config_text: str, tokenizer_text: str,
                    family: str, max_seq_len: int, source: str, exist_ok: bool = False,
                    pooling: str | None = "mean", prompts: dict[str, str] | None = None,
                    dense: list[dict[str, Any]] | None = None, include_prompt: bool = True) -> ModelMetadata:
    """Write a complete model directory at `dst`, atomically: built in a temporary sibling, then renamed.
    When `dst` appears meanwhile (another process converted the same model) and exist_ok, keep theirs."""
    dst_path = Path(dst).absolute()
    tmp = dst_path.parent / f".{dst_path.name}.tmp-{uuid.uuid4().hex}"
    metadata = ModelMetadata(family=family, max_seq_len=int(max_seq_len), source=source, pooling=pooling,
                             prompts=dict(prompts or {}), dense=list(dense or []), include_prompt=include_prompt,
                             fingerprint=fingerprint(params, config_text.encode(), tokenizer_text.encode()))
    dst_path.parent.mkdir(parents=True, exist_ok=True)  # outside the try: the model cache turns its OSError into --cache_dir
    UNFINISHED.add(tmp)
    written = saving = False
    try:
        tmp.mkdir()
        (tmp / CONFIG).write_text(config_text)
        (tmp / TOKENIZER).write_text(tokenizer_text)
        saving = True
        save_params(str(tmp / PARAMS), params)
        (tmp / METADATA).write_text(metadata_json(metadata))
        os.rename(tmp, dst_path)
        written = True
    except Exception as err:  # OSError, and Orbax's own errors (a full disk is its ValueError RESOURCE_EXHAUSTED)
        if exist_ok and (dst_path / METADATA).exists():
            return read_metadata(str(dst_path))
        if taken(dst_path):
            raise ModelLoadError(f"{dst}: {ALREADY_THERE}") from None
        reason = " ".join(f"{type(err).__name__}: {err}".split())[:300]
        fix = ("its disk is full: free space there, or choose another directory" if disk_full(err)
               else "check the free space and permissions there")
        raise ModelDirNotWritten(f"{dst}: cannot write the model directory ({reason}); {fix}") from None
    finally:  # renamed, or failed (an exception, Ctrl-C): no temporary directory stays behind
        if written:
            UNFINISHED.discard(tmp)
        else:
            remove_failed_write(tmp, settle=saving)
    return metadata


# How long a failed save's writes are waited out: Orbax's threads of a save that failed on a full disk write on for a
# moment after it has raised, into the space the removal frees, and left a hidden partial copy of the model
FAILED_WRITE_SETTLE_S = 1.0
_removing_at_exit = False


def remove_failed_write(tmp: Path, settle: bool) -> None:
    """Remove the temporary directory of a failed write, again until Orbax's writers have settled when it had started
    saving (`settle`), and once more when the process exits (registered once)."""
    global _removing_at_exit
    deadline = time.monotonic() + (FAILED_WRITE_SETTLE_S if settle else 0)
    shutil.rmtree(tmp, ignore_errors=True)
    while time.monotonic() < deadline:
        time.sleep(0.05)  # waiting on threads this process cannot join (tensorstore's)
        shutil.rmtree(tmp, ignore_errors=True)
    if not _removing_at_exit:
        _removing_at_exit = True
        atexit.register(remove_unfinished)


def read_metadata(path: str) -> ModelMetadata:
    """metadata.json of the model directory `path`; ModelLoadError naming the file when absent or bad, and saying
    so when `path` is a Hugging Face or sentence-transformers directory not converted yet."""
    if not os.path.isdir(path):
        raise ModelLoadError(f"{path}: no such model directory; pass --model minilm-l6 or a directory made by "
                             "`docscore convert --hf SRC --out DIR`")
    file = os.path.join(path, METADATA)
    if not os.path.lexists(file) and is_hugging_face_dir(path):
        raise ModelLoadError(f"{path}: a Hugging Face model directory, not a docscore one; convert it first "
                             f"(`docscore convert --hf {path} --out DIR`), then pass --model DIR")
    return parse_metadata(read_text(path, METADATA), file)


def is_hugging_face_dir(path: str) -> bool:
    """`path` holds what `docscore convert --hf` reads (a config.json beside weights, or a sentence-transformers
    modules.json) and no docscore params/."""
    names = set(os.listdir(path))
    weights = any(name.endswith((".safetensors", ".bin")) for name in names)
    return PARAMS not in names and ("modules.json" in names or ("config.json" in names and weights))


def parse_metadata(text: str | bytes, file: str) -> ModelMetadata:
    """The ModelMetadata of metadata.json's text; ModelLoadError naming `file` when it is not JSON, not
    this format, or a field has the wrong type (the fingerprint also names a cache directory: hex only)."""
    try:
        raw = json.loads(text)
    except UnicodeDecodeError:
        raise DamagedModelDir(f"{file}: not UTF-8 text, so not a docscore metadata.json; re-create the directory "
                              "with `docscore convert`") from None
    except (ValueError, RecursionError) as err:  # JSONDecodeError, a number too long to convert, deep nesting
        raise DamagedModelDir(f"{file}: corrupt metadata, not valid JSON ({str(err)[:200] or type(err).__name__}); "
                              "re-create the directory with `docscore convert`") from None
    if not isinstance(raw, dict):
        raise DamagedModelDir(f"{file}: corrupt metadata: a JSON {type(raw).__name__}, not an object with "
                              f"{', '.join(f.name for f in dataclasses.fields(ModelMetadata))}; re-create the directory "
                              "with `docscore convert`")
    if raw.get("format", FORMAT) != FORMAT:
        raise DamagedModelDir(f"{file}: format {raw['format']!r} is not {FORMAT!r}; re-convert the model "
                              "with this version's `docscore convert`")
    fields = {f.name for f in dataclasses.fields(ModelMetadata)}
    unknown = sorted(set(raw) - fields)
    missing = sorted(f.name for f in dataclasses.fields(ModelMetadata)
                     if f.name not in raw and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    if unknown or missing:  # another docscore version's fields (or a hand edit), not damage to this one's
        what = "; ".join(part for part in (f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}" if unknown else "",
                                           f"missing {', '.join(missing)}" if missing else "") if part)
        raise DamagedModelDir(f"{file}: not the metadata this docscore version writes ({what}): written by another "
                              "version or edited; re-create the directory with this version's `docscore convert`")
    metadata = ModelMetadata(**{"pooling": unwritten_pooling(raw.get("family")), **raw})
    problem = _metadata_problem(metadata)
    if problem:
        raise DamagedModelDir(f"{file}: corrupt metadata: {problem}; re-create the directory with `docscore convert`")
    return metadata


def _metadata_problem(metadata: ModelMetadata) -> str | None:
    for name in ("family", "fingerprint", "source", "format"):
        if not isinstance(getattr(metadata, name), str):
            return f"{name} is a {type(getattr(metadata, name)).__name__}, not a string"
    if len(metadata.fingerprint) != 64 or any(c not in "0123456789abcdef" for c in metadata.fingerprint):
        return "fingerprint is not 64 lowercase hex digits (a sha256)"
    size = metadata.max_seq_len
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_SEQ_LEN:
        return f"max_seq_len must be a whole number from 1 to {MAX_SEQ_LEN:,}"
    if metadata.pooling is None and metadata.family in ENCODER_FAMILIES:
        return "pooling is null, but an encoder's embeddings are pooled"
    if metadata.pooling is not None and metadata.pooling not in POOLINGS:
        return f"pooling {metadata.pooling!r} is not one this docscore version computes ({', '.join(POOLINGS)})"
    prompts = metadata.prompts
    if not isinstance(prompts, dict) or not all(role in PROMPT_ROLES and isinstance(text, str) and text
                                                 for role, text in prompts.items()):
        return f"prompts must map {' and/or '.join(PROMPT_ROLES)} to a non-empty string"
    if prompts and metadata.pooling is None:
        return "prompts are given, but the model embeds nothing (no pooling)"
    if not isinstance(metadata.dense, list) or not all(dense_problem(d) is None for d in metadata.dense):
        first = next((dense_problem(d) for d in metadata.dense), None) if isinstance(metadata.dense, list) else None
        return f"dense is not a list of Dense modules ({first or 'a list expected'})"
    if metadata.dense and metadata.pooling is None:
        return "dense modules are given, but the model embeds nothing (no pooling)"
    if not isinstance(metadata.include_prompt, bool):
        return "include_prompt is not true or false"
    if not metadata.include_prompt and (metadata.prompts or metadata.pooling not in ("mean", "cls")):
        return "include_prompt is false, which only a mean or CLS pooling without prompts records"
    return None


def dense_problem(entry: Any) -> str | None:
    """Why a metadata.json `dense` entry is not one models/config.py Dense reads, or None."""
    fields = {f.name for f in dataclasses.fields(Dense)}
    if not isinstance(entry, dict) or set(entry) != fields:
        return f"each entry has exactly {', '.join(sorted(fields))}"
    sizes = (entry["in_features"], entry["out_features"])
    if not all(type(n) is int and 1 <= n <= MAX_SIZES["hidden_size"] for n in sizes):
        return f"in_features and out_features are whole numbers from 1 to {MAX_SIZES['hidden_size']:,}"
    if type(entry["bias"]) is not bool or entry["activation"] not in DENSE_ACTIVATIONS.values():
        return f"bias is true or false and activation one of {', '.join(DENSE_ACTIVATIONS.values())}"
    return None


def read_text(path: str, name: str) -> str:
    """The UTF-8 text of the file `name` in the model directory `path`; ModelLoadError naming the file when
    it is missing, cannot be read (a directory, no permission, an I/O error) or is not UTF-8."""
    file = os.path.join(path, name)
    try:
        if not stat.S_ISREG(os.stat(file).st_mode):  # opening a named pipe would wait for a writer forever
            raise DamagedModelDir(f"{file}: not a regular file ({file_kind(file)}); put the file `docscore convert` "
                                  "wrote there, or re-create the directory with `docscore convert`")
        with open(file, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise DamagedModelDir(f"{file}: missing; {path} is not a complete docscore model directory "
                              "(re-create it with `docscore convert`)") from None
    except UnicodeDecodeError as err:
        raise DamagedModelDir(f"{file}: not UTF-8 text ({err}); the file is damaged: re-create the directory with "
                              "`docscore convert`") from None
    except OSError as err:  # a directory in its place, no permission, an I/O error
        if what := shortage(err):  # this process's limit, not the file's damage
            raise short_of(file, err, what) from None
        raise DamagedModelDir(f"{file}: cannot be read ({err.strerror or err}); make it a readable file, or "
                              "re-create the directory with `docscore convert`") from None


def file_kind(file: str) -> str:
    """What the path is, in words: 'a directory', 'a named pipe (FIFO)', ..."""
    mode = os.stat(file).st_mode
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def fetch_remote(url: str, cache_dir: str) -> str:
    """Copy the model directory at `url` (gs:// through gcsfs, or any fsspec URL) into
    cache_dir/remote/<fingerprint>-<max_seq_len>[-<pooling>][-<digest of prompts and Dense>]/ once, atomically; return
    the local directory. The same weights converted at another max_seq_len, pooling, prompts or Dense activations
    share the fingerprint but not the copy."""
    import fsspec

    url = url.rstrip("/")
    try:
        fs, root = fsspec.core.url_to_fs(url)
        text = fs.cat_file(f"{root}/{METADATA}")
    except FileNotFoundError:
        raise ModelLoadError(f"{url}/{METADATA}: missing; {url} is not a docscore model directory "
                             "(upload the output of `docscore convert` there)") from None
    metadata = parse_metadata(text, f"{url}/{METADATA}")
    # a pooling metadata.json leaves unwritten: the name earlier versions gave the copy; the prompts, Dense
    # activations and include_prompt, which the fingerprint does not cover (the Dense weights it does): a digest
    pooled = "" if metadata.pooling == unwritten_pooling(metadata.family) else f"-{metadata.pooling}"
    if metadata.prompts or metadata.dense or not metadata.include_prompt:
        outside = json.dumps({"prompts": metadata.prompts, "dense": metadata.dense,
                              **({} if metadata.include_prompt else {"include_prompt": False})}, sort_keys=True)
        pooled += "-" + hashlib.sha256(outside.encode()).hexdigest()[:12]
    local = Path(cache_dir) / "remote" / f"{metadata.fingerprint}-{metadata.max_seq_len}{pooled}"
    if (local / METADATA).exists():
        return str(local)
    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = local.parent / f".{local.name}.tmp-{uuid.uuid4().hex}"
    try:
        for remote_file in fs.find(root):
            target = tmp / os.path.relpath(remote_file, root)
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(remote_file, str(target))
        os.rename(tmp, local)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (local / METADATA).exists():  # else another process fetched it first
            raise ModelLoadError(f"{url}: cannot copy the model directory into {local} ({err})") from None
    return str(local)
