"""The docscore model directory: config.json, tokenizer.json, params/ (Orbax), metadata.json.

Holds the file layout, the metadata record, the atomic write of a whole directory, the cache
directory and the copy of a remote (gs://, any fsspec URL) directory into that cache.
Must not build models or convert weights (hf_import.py, loader.py).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from models.checkpoint import fingerprint, save_params
from models.errors import ModelLoadError

CONFIG, TOKENIZER, PARAMS, METADATA = "config.json", "tokenizer.json", "params", "metadata.json"
FORMAT = "docscore-model/1"


@dataclasses.dataclass(frozen=True)
class ModelMetadata:
    """metadata.json: what the directory holds and the content fingerprint to check it against."""

    family: str
    fingerprint: str
    max_seq_len: int
    source: str
    format: str = FORMAT


def default_cache_dir() -> str:
    """$DOCSCORE_CACHE_DIR, else ~/.cache/docscore."""
    return os.environ.get("DOCSCORE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "docscore")


def is_remote(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def write_model_dir(dst: str, *, params: dict[str, Any], config_text: str, tokenizer_text: str,
                    family: str, max_seq_len: int, source: str, exist_ok: bool = False) -> ModelMetadata:
    """Write a complete model directory at `dst`, atomically: built in a temporary sibling, then renamed.
    When `dst` appears meanwhile (another process converted the same model) and exist_ok, keep theirs."""
    dst_path = Path(dst).absolute()
    dst_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst_path.parent / f".{dst_path.name}.tmp-{uuid.uuid4().hex}"
    metadata = ModelMetadata(family=family, max_seq_len=int(max_seq_len), source=source,
                             fingerprint=fingerprint(params, config_text.encode(), tokenizer_text.encode()))
    try:
        tmp.mkdir()
        (tmp / CONFIG).write_text(config_text)
        (tmp / TOKENIZER).write_text(tokenizer_text)
        save_params(str(tmp / PARAMS), params)
        (tmp / METADATA).write_text(json.dumps(dataclasses.asdict(metadata), indent=2) + "\n")
        os.rename(tmp, dst_path)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if exist_ok and (dst_path / METADATA).exists():
            return read_metadata(str(dst_path))
        raise ModelLoadError(f"{dst}: cannot write the model directory ({err}); choose an --out that does "
                             "not exist yet or delete it") from None
    return metadata


def read_metadata(path: str) -> ModelMetadata:
    """metadata.json of the model directory `path`; ModelLoadError naming the file when absent or bad."""
    file = os.path.join(path, METADATA)
    if not os.path.isdir(path):
        raise ModelLoadError(f"{path}: no such model directory; pass --model minilm-l6 or a directory made by "
                             "`docscore convert --hf SRC --out DIR`")
    try:
        with open(file) as f:
            raw = json.load(f)
        metadata = ModelMetadata(**raw)
    except FileNotFoundError:
        raise ModelLoadError(f"{file}: missing; {path} is not a complete docscore model directory "
                             "(re-create it with `docscore convert`)") from None
    except (json.JSONDecodeError, TypeError) as err:
        raise ModelLoadError(f"{file}: corrupt metadata ({err}); re-create the directory with "
                             "`docscore convert`") from None
    if metadata.format != FORMAT:
        raise ModelLoadError(f"{file}: format {metadata.format!r} is not {FORMAT!r}; re-convert the model "
                             "with this version's `docscore convert`")
    return metadata


def read_text(path: str, name: str) -> str:
    file = os.path.join(path, name)
    try:
        with open(file, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise ModelLoadError(f"{file}: missing; {path} is not a complete docscore model directory "
                             "(re-create it with `docscore convert`)") from None


def fetch_remote(url: str, cache_dir: str) -> str:
    """Copy the model directory at `url` (gs:// through gcsfs, or any fsspec URL) into
    cache_dir/remote/<fingerprint>/ once, atomically; return the local directory."""
    import fsspec

    url = url.rstrip("/")
    try:
        fs, root = fsspec.core.url_to_fs(url)
        raw = json.loads(fs.cat_file(f"{root}/{METADATA}"))
        metadata = ModelMetadata(**raw)
    except FileNotFoundError:
        raise ModelLoadError(f"{url}/{METADATA}: missing; {url} is not a docscore model directory "
                             "(upload the output of `docscore convert` there)") from None
    except (json.JSONDecodeError, TypeError) as err:
        raise ModelLoadError(f"{url}/{METADATA}: corrupt metadata ({err})") from None
    local = Path(cache_dir) / "remote" / metadata.fingerprint
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
