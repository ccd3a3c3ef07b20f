"""One launch at a time per (output, run_id): a lease the launcher holds from validation until it exits.

Local outputs: DIR/_leases/run_id=ID.lock held with flock, which the kernel releases when the holder
dies however it dies, so a killed launch never blocks the next one. Object stores (gs://) have no
locks: the lease is an object read first and then created only if absent (a generation precondition,
for two launches at the same moment), holding an expiry that the holder renews while it runs; an expired
lease is taken over by deleting the generation that was read (another precondition: of two launches taking
it over at once, one gets it). The lease file also names the
holder (launch id, host, pid), which is what the message to a refused launch and the commit's check
read. Must not publish or delete tables (pipeline/io/run_commit.py).
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import posixpath
import socket
import threading
import time
from typing import Any

import fsspec

from pipeline.io import run_commit
from pipeline.io.run_commit import is_local

log = logging.getLogger(__name__)

LEASE_DIR = "_leases"
TTL_S = 120.0  # object-store leases: renewed every TTL_S / 3 by a live holder


class LeaseHeld(RuntimeError):
    """Another live launch holds the lease of this (output, run_id)."""


@dataclasses.dataclass
class Lease:
    output: str
    run_id: str
    launch: str
    _fd: int | None = None
    _stop: threading.Event | None = None

    def release(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._fd is not None:
            os.close(self._fd)  # the kernel drops the flock; the file stays for the next launch
            self._fd = None
        elif self._stop is not None:
            release_if_held_by(self.output, self.run_id, self.launch)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


# is_held's probe holds a shared lock for a moment; a launch trying the lease then retries for this long before it
# takes the probe for a live holder
PROBE_WAIT_S = 1.0


def _lock_exclusive(fd: int) -> bool:
    """flock(LOCK_EX) without waiting on a holder, only past another process's momentary is_held probe."""
    deadline = time.monotonic() + PROBE_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


def lease_path(output: str, run_id: str) -> str:
    return posixpath.join(output.rstrip("/"), LEASE_DIR, f"{run_commit.partition_name(run_id)}.lock")


def acquire(output: str, run_id: str, launch: str, *, ttl_s: float = TTL_S) -> Lease:
    """Take the lease or raise LeaseHeld naming the holder."""
    fs, path = fsspec.core.url_to_fs(lease_path(output, run_id))
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    me = {"launch": launch, "host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
    if is_local(fs):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        if not _lock_exclusive(fd):
            holder = _read(fs, path)
            os.close(fd)
            raise LeaseHeld(_held_message(output, run_id, holder))
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        os.fsync(fd)
        return Lease(output, run_id, launch, _fd=fd)
    me["expires"] = time.time() + ttl_s
    generation = _generation(fs, path)
    current = _read(fs, path)  # read first: a store that ignores the precondition must not let us overwrite it
    if current.get("expires", 0) > time.time():
        raise LeaseHeld(_held_message(output, run_id, current))
    # expired: its holder stopped renewing (dead, or cut off); take it over, deleting only the object read (two
    # launches taking it over at once: the second would delete the lease the first had just created)
    if current and not (generation is not None and generation == _generation(fs, path)
                        and _delete_generation(fs, path, generation)):
        raise LeaseHeld(_held_message(output, run_id, _read(fs, path)))
    if not _create(fs, path, me):  # another launch created it since we read: the precondition says so
        raise LeaseHeld(_held_message(output, run_id, _read(fs, path)))
    stop = threading.Event()
    threading.Thread(target=_renew, args=(fs, path, me, ttl_s, stop), daemon=True, name="docscore-lease").start()
    return Lease(output, run_id, launch, _stop=stop)


def release_if_held_by(output: str, run_id: str, launch: str) -> None:
    """Remove the lease file of a store without locks (gs://) if `launch` holds it: Lease.release, and an
    interrupt that came while acquire() had written the file but not yet returned the Lease."""
    fs, path = fsspec.core.url_to_fs(lease_path(output, run_id))
    if is_local(fs):
        return  # a local lease is a flock, dropped with the process; its file stays for the next launch
    try:
        if _read(fs, path).get("launch") == launch:
            fs.rm_file(path)
    except (FileNotFoundError, ValueError):
        pass
    except Exception as e:  # the store is unreachable: the lease expires on its own; never hide the run's outcome
        log.warning("could not release the lease %s (%s: %s); it expires by itself", path, type(e).__name__, e)


def holder(output: str, run_id: str) -> dict[str, Any]:
    """What the lease file says of its holder ({} when there is none)."""
    fs, path = fsspec.core.url_to_fs(lease_path(output, run_id))
    return _read(fs, path)


def is_held(output: str, run_id: str) -> bool:
    """Whether a live launch holds the lease (a local flock we cannot take, or an unexpired object)."""
    fs, path = fsspec.core.url_to_fs(lease_path(output, run_id))
    if not is_local(fs):
        return _read(fs, path).get("expires", 0) > time.time()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def writer(output: str, run_id: str) -> str | None:
    """Who is writing run_id under `output` now ("launch L (pid P on HOST, started T)"), or None when no live
    launch holds its lease: what a reader says of a run that has no committed summary yet."""
    return _who(holder(output, run_id)) if is_held(output, run_id) else None


def check_holder(output: str, run_id: str, launch: str) -> None:
    """Raise unless `launch` holds the lease: called just before the commit, so a launch whose lease was
    taken over (it was cut off past the expiry) does not overwrite the newer launch's run."""
    current = holder(output, run_id)
    if current.get("launch") != launch:
        raise LeaseHeld(f"run {run_id}: this launch ({launch}) no longer holds the lease of {output}; "
                        f"{_who(current)} does; nothing was published")
    # a local lease is the launcher's flock: Beam's worker processes outlive a launcher killed with SIGKILL, and
    # must not commit after it (a new launch may be taking the run_id over meanwhile)
    if is_local(fsspec.core.url_to_fs(lease_path(output, run_id))[0]) and not is_held(output, run_id):
        raise LeaseHeld(f"run {run_id}: the launch {launch} that held the lease of {output} has ended; nothing was "
                        "published")


def _generation(fs, path: str) -> str | None:
    """The object's generation (GCS's version number of its content) as the store says now, None without one."""
    fs.invalidate_cache(path)
    try:
        generation = fs.info(path).get("generation")
    except FileNotFoundError:
        return None
    return None if generation is None else str(generation)


def _delete_generation(fs, path: str, generation: str) -> bool:
    """Delete the object if it is still that generation (a precondition GCS checks); False when it is not."""
    bucket, key = path.split("/", 1)
    try:
        fs.call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=generation)
        return True
    except (FileNotFoundError, OSError):  # gone, or replaced (412 Precondition Failed): another launch took it
        return False


def _create(fs, path: str, value: dict[str, Any]) -> bool:
    try:
        with fs.open(path, "xb") as f:  # gcsfs: an upload with ifGenerationMatch=0
            f.write(json.dumps(value).encode())
        return True
    except FileExistsError:
        return False


def _renew(fs, path: str, me: dict[str, Any], ttl_s: float, stop: threading.Event) -> None:
    while not stop.wait(ttl_s / 3):
        try:
            if _read(fs, path).get("launch") != me["launch"]:
                return  # taken over: the commit's check_holder refuses this launch
            fs.pipe_file(path, json.dumps({**me, "expires": time.time() + ttl_s}).encode())
        except Exception:  # a missed renewal is retried; after TTL_S of them the lease may be taken over
            continue


def _read(fs, path: str) -> dict[str, Any]:
    try:
        with fs.open(path, "rb") as f:
            return json.loads(f.read() or b"{}")
    except (FileNotFoundError, ValueError):
        return {}


def _who(holder: dict[str, Any]) -> str:
    if not holder:
        return "another launch"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return f"launch {holder.get('launch')} (pid {holder.get('pid')} on {holder.get('host')}, started {started})"


def _held_message(output: str, run_id: str, holder: dict[str, Any]) -> str:
    """Who holds the lease; on an object store also when it expires, and whether its holder is a process of
    this machine that is gone (killed: its lease blocks the run_id until it expires, renewed by nobody)."""
    expires = holder.get("expires")
    if expires is None:
        return (f"--run_id {run_id} is being written to {output} by {_who(holder)}; wait for it to finish, "
                "or pass another --run_id")
    until = time.strftime("%H:%M:%S", time.localtime(expires))
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int) and not _alive(holder["pid"]):
        return (f"--run_id {run_id} is held in {output} by {_who(holder)}, a process of this machine that is gone; "
                f"its lease expires at {until} (within {TTL_S:.0f} s of its last renewal): launch again then, or pass "
                "another --run_id")
    return (f"--run_id {run_id} is being written to {output} by {_who(holder)}; wait for it to finish (its lease, "
            f"renewed while it runs, expires at {until} if it stopped), or pass another --run_id")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


STALE_REMOTE_S = 24 * 3600.0  # gs:// staging without a live lease: launches nobody waits for hold none


def remove_stale(output: str, *, own_launch: str) -> list[str]:
    """Remove what dead launches left under `output`: their staging directories (_staging/run_id=ID/LAUNCH)
    and the files they placed in partitions without committing. A launch is dead when no live lease of its
    run names it (locally exact: flock; on gs:// also only once its staging is STALE_REMOTE_S old, since a
    launch nobody waits for holds no lease). Never this launch's, never through a link. Returns what went of
    launches that did not finish (the files of replaced launches whose grace period is over go too, unlisted)."""
    fs, root = fsspec.core.url_to_fs(output)
    staging_root = posixpath.join(root, "_staging")
    removed: list[str] = []
    for run_dir in _dirs(fs, staging_root):
        run_id = run_commit.partition_run_id(run_dir)
        if not run_id:
            continue
        live = holder(output, run_id).get("launch") if is_held(output, run_id) else None
        kept = False  # a launch of this run_id may still be placing files: leave its partitions alone
        for launch_dir in _dirs(fs, run_dir):
            launch = posixpath.basename(launch_dir)
            if launch == own_launch:  # this launch has placed nothing yet (it cleans before its job runs)
                continue
            if launch == live or (not is_local(fs) and _youngest_file_age_s(fs, launch_dir) < STALE_REMOTE_S):
                kept = True
                continue
            run_commit.remove_staging(launch_dir if is_local(fs) else fs.unstrip_protocol(launch_dir))
            removed.append(launch_dir)
        if live in (None, own_launch) and not kept:  # our own run's partitions too: we hold its lease
            replaced = run_commit.replaced_files(output, run_id)
            removed += [f for f in run_commit.clean_after_commit(output, run_id) if f not in replaced]
    return removed


def remove_replaced(output: str, run_id: str, *, own_launch: str) -> list[str]:
    """At a launch holding run_id's lease: the files of launches that committed runs replaced REPLACED_GRACE_S or
    more ago (run_commit.clean_after_commit), so they go at the next launch even if it never commits; of run_id
    and of every other run_id under `output` that has some, since a run_id may never be launched again. A run
    another live launch holds is left alone, and so is one with another launch's staging left (a launch nobody
    waits for may still be placing files)."""
    removed = []
    for run in sorted({run_id, *run_commit.runs_with_replaced_launches(output)}):
        if (run != run_id and is_held(output, run)) or _staged_by_another(output, run, own_launch):
            continue
        removed += run_commit.clean_after_commit(output, run)
    return removed


def _staged_by_another(output: str, run_id: str, own_launch: str) -> bool:
    """Whether a launch other than `own_launch` has staging of run_id left under `output`."""
    fs, root = fsspec.core.url_to_fs(output)
    return any(posixpath.basename(d) != own_launch for d in _dirs(fs, run_commit.partition(root, "_staging", run_id)))


def _dirs(fs, path: str) -> list[str]:
    """Sub-directories of `path`, not following links (a linked one is not docscore's to clean)."""
    if is_local(fs):
        try:
            return [e.path for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            return []
    fs.invalidate_cache(path)
    try:
        return [info["name"] for info in fs.ls(path, detail=True) if info.get("type") == "directory"]
    except FileNotFoundError:
        return []


def _youngest_file_age_s(fs, path: str) -> float:
    """Seconds since the most recent write under `path` (0 when unknown: then it is not stale)."""
    ages = [run_commit.file_age_s(fs, p) for p in fs.find(path)]
    return min((a for a in ages if a is not None), default=0.0)
