"""Which files a run reads: --input (a path, a glob, a directory, gs:// or local, tfds:NAME) expanded to shards.

Holds plain functions over fsspec that find the shards and refuse, before any data is read, an --input that
would lose or misread records (unknown formats, folders that cannot be listed, special files, a missing bucket).
Reading the shards' records is pipeline/io/sources.py.
"""
from __future__ import annotations

import fnmatch
import os
import posixpath
import stat
from collections.abc import Sequence
from typing import NamedTuple

import fsspec
from fsspec.implementations.local import LocalFileSystem

from pipeline.io import tfds_reader
from pipeline.records import printable, utf8_size

# Each format docscore reads by its files' name endings: one entry per format (its reader is sources.py's
# READERS entry), which shard_format and every message listing the formats read.
SUFFIXES = {
    "jsonl": (".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz"),
    "parquet": (".parquet",),
    "text": (".txt", ".md"),
}
READABLE = tuple(suffix for suffixes in SUFFIXES.values() for suffix in suffixes)
ARRAY_RECORD_MARK = ".array_record"  # TFDS shards (name.array_record-00000-of-00004), read through tfds:NAME only
GCS_PROTOCOLS = ("gs", "gcs")  # gcsfs's protocols: check_bucket speaks the GCS JSON API
SUPPORTED = ", ".join(READABLE) + ", tfds:NAME"


def shard_format(path: str) -> str | None:
    """A SUFFIXES format or array_record, or None for a file we do not read."""
    name = path.rsplit("/", 1)[-1].lower()
    fmt = next((fmt for fmt, suffixes in SUFFIXES.items() if name.endswith(suffixes)), None)
    return fmt or ("array_record" if ARRAY_RECORD_MARK in name else None)


class InputFiles(NamedTuple):
    shards: list[str]  # sorted shard paths/URLs
    skipped: list[str]  # files of a directory --input in no readable format, sorted (a glob refuses them instead)


def find_input(pattern: str, *, tfds_data_dir: str | None = None, split: str = "test") -> InputFiles:
    """Expand --input to a sorted list of shard paths/URLs. A directory means every regular file of a
    readable format under it, except under `_`/`.` folders; a glob every regular file it matches. Named pipes, sockets and devices are
    skipped (opening a named pipe waits for a writer forever); symlinked directories are followed, each
    real directory once, never into a directory that holds the link (a loop) (local_regular_files), and a
    directory's files are read once per real file (each_real_file_once).

    Raises FileNotFoundError when nothing matches (naming the missing bucket, or the missing remote path) and
    ValueError for files of an unknown format, or when --input names one file that is not a regular file; a
    gs:// bucket these credentials may not list raises PermissionError, and a store that cannot be reached
    its own error (an OSError or aiohttp's), never an empty result.
    """
    if pattern.startswith(tfds_reader.TFDS_PREFIX):
        if not tfds_data_dir:
            raise ValueError(f"--input {pattern}: pass --tfds_data_dir DIR (the data_dir the dataset was prepared in)")
        dataset = tfds_reader.locate_dataset(pattern, tfds_data_dir)
        return InputFiles(dataset.shard_paths(split), [])
    skipped: list[str] = []
    protocol = fsspec.core.split_protocol(pattern)[0]
    if protocol in GCS_PROTOCOLS:
        check_bucket(pattern)
    existing = existing_local_path(pattern)
    remote = None if existing is not None else existing_remote_path(pattern)
    if existing is not None:  # a[1].jsonl, b*c.jsonl, d::e.jsonl: that file or directory, not a pattern or a chained URL
        fs, paths = LocalFileSystem(), [existing]
    elif remote is not None:  # gs://b/a[1].jsonl, gs://b/d::e.jsonl: that object (or folder), as locally
        fs, existing = remote
        paths = [existing]
    else:
        fs, _, paths = fsspec.get_fs_token_paths(pattern)
        if fsspec.core.has_magic(pattern) and "*" not in pattern:  # fsspec expands a pattern only when it holds a *
            paths = sorted(fs.glob(fsspec.core.url_to_fs(pattern)[1]))
    local = isinstance(fs, LocalFileSystem)

    def as_written(path: str) -> str:  # a path fsspec found, with the scheme --input was written with
        return fs.unstrip_protocol(path) if protocol not in (None, "file") else path

    # a glob skips _/. names (_SUCCESS, .crc) and folders (_tmp/, .git/) below its fixed prefix; a file named explicitly is read
    glob_root = _fixed_prefix(existing or fsspec.core.url_to_fs(pattern)[1])
    one_path = existing is not None or (not fsspec.core.has_magic(pattern) and len(paths) == 1)
    if one_path and (os.path.isdir(paths[0]) if local else remote_kind(fs, pattern, paths[0]) == "directory"):
        unlisted: list[str] = []
        files = (local_regular_files(paths[0], unlisted) if local  # a key ending in / is a console's folder placeholder
                 else [p for p, info in fs.find(paths[0], detail=True).items() if info.get("type") == "file"
                       and not p.endswith("/")])
        root = paths[0].rstrip("/") + "/"
        lost = [d for d in unlisted if not _hidden_below(root, d.rstrip("/") + "/x")
                and posixpath.basename(d.rstrip("/")) != SYSTEM_FOLDER]
        if lost:  # its files would be missing from the run without a row saying so
            raise PermissionError(f"--input {pattern}: the folder {printable(lost[0])}"
                                  + (f" (and {len(lost) - 1} more)" if len(lost) > 1 else "")
                                  + " cannot be listed, so its files would be missing from the run; make it readable, "
                                  "or pass a glob that leaves it out")
        # a file under a `_`/`.` folder is hidden too (_staging/, _temporary/, .git/): only the part below the root counts
        found = [p for p in files if not _hidden_below(root, p) and shard_format(p)]
        if local:  # one file twice (a link beside its target) would be read twice: duplicate rows without a word
            found = each_real_file_once(found)
        skipped = sorted(p for p in files if not _hidden_below(root, p) and not shard_format(p))
    else:
        if one_path and local and os.path.lexists(paths[0]) and not _is_regular(paths[0]):
            raise ValueError(
                f"--input {pattern}: {printable(paths[0])} is {_special_kind(paths[0])}, not a regular file; docscore "
                "reads regular files only (a named pipe would keep the job waiting for a writer forever); pass a "
                "regular file, a directory or a glob"
            )
        # one remote path is a file here: remote_kind raised if it was neither a file nor a directory
        written = () if one_path else glob_parts(pattern, glob_root)
        found = [p for p in paths if (one_path or not _hidden_below(glob_root, p, written))
                 and (_is_regular(p) if local else not p.endswith("/") and (one_path or fs.isfile(p)))]
        unknown = [p for p in found if shard_format(p) is None]
        if unknown and one_path:  # one file named: no pattern to change, only the file
            raise ValueError(f"--input {pattern}: cannot read {as_written(unknown[0])}: "
                             f"{format_fix(unknown[0]) or f'it is in no format docscore reads ({SUPPORTED})'}")
        if unknown:
            raise ValueError(
                f"--input {pattern}: cannot read {as_written(unknown[0])}"
                + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
                + f"; use a pattern matching only {SUPPORTED} files{first_fix(unknown)}"
            )
    if not found:
        others = [as_written(p) for p in skipped]
        holds = (f"; it holds only files of other formats: {', '.join(others[:3])}"
                 + (f" and {len(others) - 3} more" if len(others) > 3 else "")) if others else ""
        is_folder = os.path.isdir if local else fs.isdir
        folders = ([p for p in sorted(fs.glob(fsspec.core.url_to_fs(pattern)[1])) if is_folder(p)]
                   if not one_path and not holds else [])  # a glob of folders: what it matched was left out above
        if folders:
            shown = [printable(as_written(f) if not local else os.path.relpath(f) if not os.path.isabs(pattern) else f)
                     for f in folders[:3]]
            holds = (f"; it matches only folders ({', '.join(shown)}"
                     + (f" and {len(folders) - 3} more" if len(folders) > 3 else "")
                     + f"), and a glob names files: add the files' part, e.g. {posixpath.join(pattern, '*')}, "
                     "or pass one folder")
        raise FileNotFoundError(f"--input {pattern}: matches no readable shard ({SUPPORTED}){holds}{first_fix(skipped)}")
    refuse_array_record(pattern, found)
    undecodable = [p for p in found if utf8_size(p) is None]
    if undecodable:  # every row would carry it as `source`, and no table can hold it
        raise ValueError(f"--input {pattern}: the file name {printable(undecodable[0])!r} is not valid UTF-8; rename it")
    return InputFiles(sorted(map(as_written, found)), list(map(as_written, skipped)))


def refuse_array_record(pattern: str, found: list[str]) -> None:
    """Raise ValueError when a path or glob --input holds TFDS array_record shards: they are read only through
    their dataset's features.json, and read otherwise each would become a corrupt_file row of a published run."""
    shards = [p for p in found if shard_format(p) == "array_record"]
    if shards:
        raise ValueError(
            f"--input {pattern}: {printable(shards[0])}"
            + (f" (and {len(shards) - 1} more)" if len(shards) > 1 else "")
            + " is a TFDS array_record shard, read only through its dataset: pass --input tfds:NAME "
            "--tfds_data_dir DIR (the data_dir it was prepared in), or an --input matching only "
            f"{', '.join(READABLE)} files"
        )


# compressions docscore does not decompress, with the command that does: (name, command)
OTHER_COMPRESSIONS = {".zst": ("zstd", "zstd -d"), ".zstd": ("zstd", "zstd -d"), ".bz2": ("bzip2", "bunzip2"),
                      ".xz": ("xz", "unxz"), ".lz4": ("lz4", "lz4 -d"), ".snappy": ("snappy", None),
                      ".zip": ("zip", "unzip")}


def format_fix(path: str) -> str | None:
    """What to do with a file whose name is close to a format docscore reads (z.jsonl.zst, Spark's part-0.json,
    notes.txt.gz), or None: a message that only says "unsupported" leaves the user guessing the fix."""
    name = path.rsplit("/", 1)[-1].lower()
    base, ext = posixpath.splitext(name)
    compression = OTHER_COMPRESSIONS.get(ext, ("gzip", "gunzip") if ext == ".gz" else None)
    if compression and shard_format(base) == "jsonl":  # only gzip is read: .jsonl.zst, .ndjson.bz2
        how = f" ({compression[1]})" if compression[1] else ""
        return (f"it is {compression[0]}-compressed JSON lines, and docscore decompresses gzip only: decompress "
                f"it{how}, or recompress it with gzip as .jsonl.gz")
    if compression and shard_format(base) in ("parquet", "text"):  # Parquet compresses inside; text is read as is
        return f"it is a {compression[0]}-compressed {posixpath.splitext(base)[1]} file, which docscore does not read: decompress it"
    if name.endswith(".json") or (compression and base.endswith(".json")):
        return ("docscore reads JSON lines from .jsonl files: if it holds one JSON object per line (as Spark's "
                "part-*.json files do), rename it to .jsonl" + (".gz" if ext == ".gz" else "")
                + (f" (after decompressing it: {compression[0]} is not read)" if compression and ext != ".gz" else "")
                + "; if it is one JSON document (an array), write its records one per line first (jq -c '.[]')")
    return None


def first_fix(paths: list[str]) -> str:
    """format_fix of the first of `paths` that has one, as a message's last words ("" when none has)."""
    fix = next(((path, fix) for path in paths if (fix := format_fix(path))), None)
    return f" ({posixpath.basename(fix[0])}: {fix[1]})" if fix else ""


def existing_remote_path(pattern: str):
    """(file system, path) of a remote --input that exists as written although it holds glob characters or `::`
    (gs://b/a[1].jsonl, memory://d/e::f.jsonl), else None: fsspec would read it as a pattern or a chained URL.
    Opened with its protocol's own file system; a chained URL (simplecache::gs://...) is left to fsspec."""
    protocol = fsspec.core.split_protocol(pattern)[0]
    if protocol in (None, "file") or "::" in protocol or not ("::" in pattern or fsspec.core.has_magic(pattern)):
        return None
    fs = fsspec.filesystem(protocol)
    try:
        return fs, fs.info(pattern)["name"]
    except FileNotFoundError:
        return None


def existing_local_path(pattern: str) -> str | None:
    """The absolute path of a local --input that exists as written (a link too, even a broken one), else None:
    such a path names that file or directory, even when it holds glob characters or `::`."""
    if fsspec.core.split_protocol(pattern)[0] not in (None, "file"):
        return None
    path = pattern[len("file://"):] if pattern.startswith("file://") else pattern
    return os.path.abspath(path) if path and os.path.lexists(path) else None


def missing_bucket_message(flag: str, bucket: str) -> str:
    """What to tell of a gs:// --input or --output (`flag`: the flag and its value) whose bucket is not there."""
    return (f"{flag}: bucket gs://{bucket} does not exist, or is not visible with these credentials; check the bucket "
            f"name (gcloud storage ls gs://{bucket}) and the project and credentials in use")


def check_bucket(pattern: str) -> None:
    """Raise, naming --input, when the bucket of a gs:// --input does not exist (FileNotFoundError) or these
    credentials may not list it for a glob or a directory (PermissionError). One listing request of at most one
    object: a store that cannot be reached raises gcsfs's own error (after its retries), which is not an empty path."""
    protocol, path = fsspec.core.split_protocol(pattern)  # not url_to_fs: `::` in an object name is no chain
    fs, bucket = fsspec.filesystem(protocol), path.split("/", 1)[0]
    try:
        fs.call("GET", "b/{}/o", bucket, json_out=True, maxResults=1)
    except FileNotFoundError:  # objects.list answers 404 only for a bucket that does not exist
        raise FileNotFoundError(missing_bucket_message(f"--input {pattern}", bucket)) from None
    except OSError as e:
        if not str(e).startswith("Forbidden"):  # gcsfs's OSError for a 403 answer
            raise
        if not fsspec.core.has_magic(pattern) and not pattern.endswith("/"):
            return  # one object may be readable without the right to list the bucket (objectViewer on a prefix, ...)
        raise PermissionError(
            f"--input {pattern}: these credentials may not list bucket gs://{bucket} ({_first_line(e)}); grant them "
            "storage.objects.list and storage.objects.get on it (e.g. roles/storage.objectViewer)"
        ) from None


def remote_kind(fs, pattern: str, path: str) -> str:
    """'file' or 'directory' for the one remote path --input names. A path that is neither raises
    FileNotFoundError naming it; a store that cannot be reached raises its own error (fs.isdir and
    fs.isfile would answer False, and the path would read as empty)."""
    try:
        return fs.info(path)["type"]
    except FileNotFoundError:
        url = fs.unstrip_protocol(path).rstrip("/")
        raise FileNotFoundError(
            f"--input {pattern}: {url} does not exist: no object of that name and none under {url}/; "
            "check the path"
        ) from None


def _first_line(error: BaseException) -> str:
    return str(error).strip().split("\n", 1)[0][:300]


def _fixed_prefix(pattern: str) -> str:
    """The folders of a glob before its first part with a glob character, ending in /: `/data/**/*.jsonl` -> `/data/`."""
    parts = pattern.split("/")
    fixed = next((i for i, part in enumerate(parts) if fsspec.core.has_magic(part)), len(parts) - 1)
    return "/".join(parts[:fixed]) + "/"


def glob_parts(pattern: str, root: str) -> tuple[str, ...]:
    """The parts of a glob below its fixed folders `root` (`dir/*/_ok/*.jsonl` -> `*`, `_ok`, `*.jsonl`)."""
    path = fsspec.core.url_to_fs(pattern)[1]
    return tuple(path[len(root):].split("/")) if path.startswith(root) else ()


def _hidden_below(root: str, path: str, written: tuple[str, ...] = ()) -> bool:
    """Some part of `path` below the directory `root` (ending in /) starts with `_` or `.`, unless a part of the
    glob that matches it starts so too (`_ok` or `.cache*` written in the pattern: asked for, not hidden)."""
    below = path[len(root):] if path.startswith(root) else path.rsplit("/", 1)[-1]
    return any(part.startswith(("_", ".")) and not any(w[:1] == part[:1] and fnmatch.fnmatchcase(part, w) for w in written)
               for part in below.split("/"))


SYSTEM_FOLDER = "lost+found"  # on every ext4 mount point, readable by root only, never holding shards


def local_regular_files(root: str, unlisted: list[str] | None = None) -> list[str]:
    """Every regular file under the local directory `root` (symlinks to regular files included), as
    root/relative/path. Named pipes, sockets, devices and broken links are skipped; a directory that cannot be
    listed is added to `unlisted` (when given) and skipped.
    Symlinked directories are followed after the real tree, each real directory once (so a link to a
    directory already listed adds nothing), and never one that holds the link itself (a loop such as
    `a -> ..` or `a -> /`): the listing always ends."""
    found: list[str] = []
    visited: set[str] = set()
    real_dirs, linked_dirs = [root.rstrip("/") or "/"], []
    while real_dirs or linked_dirs:
        directory = real_dirs.pop() if real_dirs else linked_dirs.pop()
        real = os.path.realpath(directory)
        if real in visited:
            continue
        visited.add(real)
        try:
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError:  # unreadable or vanished: the caller decides whether that loses input
            if unlisted is not None and os.path.lexists(directory):
                unlisted.append(directory)
            continue
        for entry in entries:
            path = f"{directory.rstrip('/')}/{entry.name}"
            try:
                mode = os.stat(entry.path).st_mode  # follows symlinks
            except OSError:  # a broken link, or gone since the listing
                continue
            if stat.S_ISREG(mode):
                found.append(path)
            elif stat.S_ISDIR(mode) and not entry.is_symlink():
                real_dirs.append(path)
            elif stat.S_ISDIR(mode) and not _holds(os.path.realpath(path), real):
                linked_dirs.append(path)
    return found


def each_real_file_once(paths: list[str]) -> list[str]:
    """Local `paths` less those naming a real file another of them names (latest.jsonl -> v1.jsonl beside
    v1.jsonl: v1.jsonl), the file's own name kept over a link's, else the first link's in sorted order."""
    kept: dict[str, str] = {}
    for path in sorted(paths, key=lambda p: (os.path.islink(p), p)):
        kept.setdefault(os.path.realpath(path), path)
    return sorted(kept.values())


def _holds(directory: str, path: str) -> bool:
    """`path` is `directory` or lies under it (both real, absolute paths)."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _is_regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _special_kind(path: str) -> str:
    """What a local path that is not a regular file is, in words."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a broken symbolic link"
    kinds = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def local_size(path: str) -> int | None:
    """The size of a local file (None: a remote one, or gone: its reader says so)."""
    if "://" in path and not path.startswith("file://"):
        return None
    try:
        return os.stat(path.removeprefix("file://")).st_size
    except OSError:
        return None


def shard_sizes(shards: list[str]) -> dict[str, int]:
    """{shard: size} of the local shards, for ReadSpec.sizes (remote ones are not checked)."""
    sizes = {path: local_size(path) for path in shards}
    return {path: size for path, size in sizes.items() if size is not None}


def skipped_notice(pattern: str, skipped: list[str]) -> str | None:
    """What a directory --input holds besides shards, which the run leaves out (a .csv, a .json, a .bz2)."""
    if not skipped:
        return None
    names = ", ".join(os.path.basename(p) for p in skipped[:3]) + (f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")
    return (f"--input {pattern}: {len(skipped)} file{'s' if len(skipped) > 1 else ''} in no format docscore reads "
            f"{'were' if len(skipped) > 1 else 'was'} left out ({names}); it reads {SUPPORTED.rsplit(', ', 1)[0]}"
            f"{first_fix(skipped)}")  # z.jsonl.zst: what to do with it


def linked_outside_notice(pattern: str, shards: Sequence[str]) -> str | None:
    """Local shards of a folder or glob --input that are links to files outside it (an unpacked upload can hold
    one to /etc/passwd): they are read like the others, so the run says which, without refusing links the user
    made on purpose. None for a single file --input, a remote one, or no such link."""
    if fsspec.core.split_protocol(pattern)[0] not in (None, "file") or list(shards) == [pattern]:
        return None
    path = fsspec.core.split_protocol(pattern)[1]
    glob_at = min((path.index(c) for c in "*?[" if c in path), default=None)
    root = os.path.realpath(path if glob_at is None else os.path.dirname(path[:glob_at]) or ".")
    targets = [(shard, os.path.realpath(fsspec.core.split_protocol(shard)[1])) for shard in shards]
    outside = [(shard, target) for shard, target in targets if os.path.commonpath([root, target]) != root]
    if not outside:
        return None
    shard, target = outside[0]
    more = f" and {len(outside) - 1} more" if len(outside) > 1 else ""
    links = f"{len(outside)} shards are links to files" if len(outside) > 1 else "1 shard is a link to a file"
    return (f"--input {pattern}: {links} outside it ({os.path.basename(shard)} -> {target}{more}), read like the "
            "others (a line that cannot be parsed goes to the errors table's raw column); remove such links if they "
            "were not meant to be read")
