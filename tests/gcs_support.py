"""GCS for tests: gcp-storage-emulator on 127.0.0.1, a fault-injecting HTTP proxy in front of it,
and the pytest fixtures that point gcsfs and Beam's GCS filesystem at them.

Holds test infrastructure only (no docscore logic). Must not reach the network: every gs:// request
goes to the emulator, and the credentials it sets are a local token the emulator ignores.
Use: `pytest_plugins = ["gcs_support"]` in a test module (tests/ is on sys.path).
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import http.client
import http.server
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# gcsfs reads this once, when it is first imported: its experimental zonal/HNS file system asks
# APIs the emulator does not have. tests/conftest.py should set it too (it is imported first).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

# A user credential whose access token never expires: google.auth.default() finds it at once
# (otherwise Beam retries the lookup for ~25 s) and nothing ever asks Google for a token.
EMULATOR_CREDENTIALS = {
    "type": "authorized_user",
    "client_id": "gcs-emulator",
    "client_secret": "gcs-emulator",
    "refresh_token": "gcs-emulator",
    "token": "gcs-emulator",
    "expiry": "2999-01-01T00:00:00Z",
}
EMULATOR_PROJECT = "docscore-test"
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_listening(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")


@dataclasses.dataclass
class GcsEmulator:
    """gcp-storage-emulator in its own process, in memory, on a free port of 127.0.0.1."""

    port: int = 0
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "GcsEmulator":
        self.port = self.port or free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
             "--port", str(self.port), "--in-memory", "--quiet"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until_listening(self.port)
        except TimeoutError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


@dataclasses.dataclass
class FaultStats:
    requests: int = 0
    answered_503: int = 0
    dropped: int = 0

    @property
    def faults(self) -> int:
        return self.answered_503 + self.dropped

    @property
    def fault_fraction(self) -> float:
        return self.faults / self.requests if self.requests else 0.0


class FaultSchedule:
    """Decides, request by request, whether to pass, answer 503, or drop the connection.

    Requests are counted in windows of round(1 / fault_rate); in each window exactly one request,
    at a seeded position, fails: answered 503 in one window, dropped in the next. So the share of failed requests is
    fault_rate whatever the traffic, at most 2 fail in a row (the end of one window and the start
    of the next), and the same seed and request order give the same faults.
    """

    def __init__(self, fault_rate: float = 0.125, seed: int = 0):
        self.window = round(1 / fault_rate) if fault_rate > 0 else 0
        self._rng = random.Random(seed)
        self._seed = seed
        self._fault_at = -1
        self._kind = "503"
        self._lock = threading.Lock()
        self.stats = FaultStats()

    def next_action(self) -> str:
        """'pass' | '503' | 'drop'."""
        with self._lock:
            n = self.stats.requests
            self.stats.requests += 1
            if not self.window:
                return "pass"
            if n % self.window == 0:  # a new window: where its fault falls, and which kind
                self._fault_at = n + self._rng.randrange(self.window)
                self._kind = ("503", "drop")[(n // self.window + self._seed) % 2]
            if n != self._fault_at:
                return "pass"
            if self._kind == "503":
                self.stats.answered_503 += 1
            else:
                self.stats.dropped += 1
            return self._kind


OBJECT_LISTING = re.compile(r"^/storage/v1/b/[^/]+/o/?$")  # objects.list (a GET of one object names it after /o/)
OBJECT_PATH = re.compile(r"^(?:/upload)?/storage/v1/b/([^/]+)/o(?:/(.+))?$")  # an object's bucket and (quoted) name


def precondition_target(command: str, path: str, body: bytes) -> tuple[str, str, str] | None:
    """(bucket, object name, the generation it must have: "0" = must not exist) of a request with GCS's
    ifGenerationMatch precondition, which gcp-storage-emulator ignores; None for any other request."""
    url = urllib.parse.urlsplit(path)
    expected = urllib.parse.parse_qs(url.query).get("ifGenerationMatch")
    match = OBJECT_PATH.match(url.path)
    if not expected or not match:
        return None
    bucket, name = match.group(1), urllib.parse.unquote(match.group(2) or "")
    if not name:  # an upload: the name is a query parameter (resumable) or in the multipart's JSON part (simple)
        name = (urllib.parse.parse_qs(url.query).get("name") or [""])[0]
        if not name and command == "POST":
            found = re.search(rb'\{"name": ?"((?:[^"\\]|\\.)*)"', body)
            name = json.loads(b'"' + found.group(1) + b'"') if found else ""
    return (bucket, name, expected[0]) if name else None


def exact_multipart(content_type: str, body: bytes) -> bytes:
    """A multipart upload's body with its media part base64-encoded (Content-Transfer-Encoding), so the emulator
    stores the very bytes sent. The emulator reads the body with Python's email parser, which takes a "\\r" ending
    the media for part of the line break before the closing boundary and drops it (gcsfs breaks lines with "\\n"
    alone): about one upload in 256 of binary data lost its last byte. The body unchanged if it is not
    boundary-delimited parts."""
    found = re.search(r'boundary="?([^";]+)"?', content_type)
    if not content_type.startswith("multipart/related") or not found:
        return body
    dash = b"--" + found.group(1).encode()
    if not body.startswith(dash):
        return body
    newline = b"\r\n" if body[len(dash):len(dash) + 2] == b"\r\n" else b"\n"  # the client's line break, as sent
    parts = (newline + body).split(newline + dash)[1:]  # each part after its boundary line's break; then "--"
    if len(parts) < 3 or not parts[-1].startswith(b"--") or any(newline * 2 not in part for part in parts[:-1]):
        return body
    rebuilt = []
    for number, part in enumerate(parts[:-1], 1):
        headers, content = part.removeprefix(newline).split(newline * 2, 1)
        if number == len(parts) - 1:  # the media: the last part before the closing boundary
            headers, content = headers + newline + b"Content-Transfer-Encoding: base64", base64.encodebytes(content)
        rebuilt.append(dash + b"\r\n" + headers.replace(newline, b"\r\n") + b"\r\n\r\n" + content + b"\r\n")
    return b"".join(rebuilt) + dash + b"--\r\n"


def generation_of(upstream_port: int, bucket: str, name: str) -> str:
    """The object's current generation on the emulator, "0" when there is none."""
    connection = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
    try:
        connection.request("GET", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}")
        response = connection.getresponse()
        data = response.read()
        return str(json.loads(data)["generation"]) if response.status == 200 else "0"
    finally:
        connection.close()


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_ProxyServer"

    def log_message(self, *args):  # quiet
        pass

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _send_json(self, status: int, error: str) -> None:
        payload = json.dumps({"error": {"code": status, "message": error}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _handle(self) -> None:
        body = self._read_body()
        if "/moveTo/" in self.path.split("?", 1)[0]:
            # The emulator lacks objects.move and answers 501, which gcsfs retries for ~30 s before
            # falling back to copy + delete; a 400 makes it fall back at once (the path it takes
            # on any bucket without the move API).
            self._send_json(400, "objects.move is not implemented by gcp-storage-emulator")
            return
        if self.server.forbid_listing and self.command == "GET" and OBJECT_LISTING.match(self.path.split("?", 1)[0]):
            self._send_json(403, "injected: storage.objects.list denied")
            return
        action = self.server.schedule.next_action()
        if action == "drop":
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if action == "503":
            self._send_json(503, "injected fault: backend unavailable")
            return
        if self.command == "POST" and "uploadType=multipart" in self.path:
            body = exact_multipart(self.headers.get("Content-Type", ""), body)
        target = precondition_target(self.command, self.path, body)
        if target is None:
            self._forward(body)
            return
        with self.server.precondition_lock:  # GCS checks and acts at once: no other precondition in between
            if generation_of(self.server.upstream_port, target[0], target[1]) != target[2]:
                self._send_json(412, "Precondition Failed (checked by the test proxy: the emulator does not)")
                return
            self._forward(body)

    def _forward(self, body: bytes) -> None:
        # The Host header goes through unchanged: the emulator builds upload/media URLs from it,
        # so follow-up requests come back through the proxy.
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"content-length"}}
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=60)
        try:
            upstream.request(self.command, self.path, body=body if body or self.command in ("POST", "PUT", "PATCH") else None,
                             headers=headers)
            response = upstream.getresponse()
            data = response.read()
            self.send_response(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in HOP_BY_HOP | {"content-length"}:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            upstream.close()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle


class _ProxyServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    forbid_listing = False

    def handle_error(self, request, client_address):
        """A client that hung up mid-response (it gave up, or we dropped it) is not a proxy bug."""
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)

    def __init__(self, port: int, upstream_port: int, schedule: FaultSchedule):
        self.upstream_port = upstream_port
        self.schedule = schedule
        self.precondition_lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _ProxyHandler)


class FaultProxy:
    """An HTTP proxy in front of the emulator that answers 503 or drops the connection for a
    seeded, bounded share of requests (FaultSchedule); `stats` counts what it did. Every test
    reaches the emulator through one (fault_rate 0 for a clean run). It also checks GCS's ifGenerationMatch
    preconditions (412), which the emulator ignores and docscore's gs:// leases rely on."""

    def __init__(self, upstream_port: int, *, fault_rate: float = 0.125, seed: int = 0, forbid_listing: bool = False):
        self.schedule = FaultSchedule(fault_rate, seed)
        self._server = _ProxyServer(free_port(), upstream_port, self.schedule)
        self._server.forbid_listing = forbid_listing  # answer 403 to object listings: credentials that may read, not list
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def stats(self) -> FaultStats:
        return self.schedule.stats

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "FaultProxy":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def create_bucket(endpoint_url: str, name: str) -> None:
    """Create bucket `name` straight through the JSON API (not through a faulty proxy)."""
    request = urllib.request.Request(
        f"{endpoint_url}/storage/v1/b?project={EMULATOR_PROJECT}", data=json.dumps({"name": name}).encode(),
        headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


@contextlib.contextmanager
def gcs_environment(endpoint_url: str, credentials_dir: Path) -> Iterator[None]:
    """Point gcsfs, google-cloud-storage (Beam's gs://) and google.auth at `endpoint_url`."""
    credentials = credentials_dir / "emulator_adc.json"
    credentials.write_text(json.dumps(EMULATOR_CREDENTIALS))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STORAGE_EMULATOR_HOST", endpoint_url)
        mp.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        mp.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(credentials))
        mp.setenv("GOOGLE_CLOUD_PROJECT", EMULATOR_PROJECT)
        clear_gcsfs_instances()
        try:
            yield
        finally:
            clear_gcsfs_instances()


def clear_gcsfs_instances() -> None:
    """fsspec caches file system instances; one made for another endpoint must not be reused."""
    import gcsfs

    gcsfs.GCSFileSystem.clear_instance_cache()


def check_gcsfs_flavour() -> None:
    import gcsfs
    import gcsfs.core

    if gcsfs.GCSFileSystem is not gcsfs.core.GCSFileSystem:
        raise RuntimeError(
            "gcsfs was imported with GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT on, which the emulator does not "
            "support; set GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false before gcsfs is imported "
            "(tests/conftest.py)")


@dataclasses.dataclass
class GcsTarget:
    """A bucket on the emulator, reached through `endpoint_url` (its FaultProxy)."""

    endpoint_url: str
    bucket: str
    proxy: FaultProxy

    def url(self, *parts: str) -> str:
        return "gs://" + "/".join([self.bucket, *[p.strip("/") for p in parts]])

    def fs(self):
        import gcsfs

        return gcsfs.GCSFileSystem(project=EMULATOR_PROJECT, endpoint_url=self.endpoint_url)


def unique_bucket_name(prefix: str = "docscore") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GcsEmulator]:
    """One emulator for the whole session, stopped at teardown."""
    emulator = GcsEmulator().start()
    try:
        yield emulator
    finally:
        emulator.stop()


@contextlib.contextmanager
def gcs_target(emulator: GcsEmulator, credentials_dir: Path, *, fault_rate: float, seed: int = 0) -> Iterator[GcsTarget]:
    """A fresh bucket on `emulator`, reached through a FaultProxy, with gs:// pointed at the proxy."""
    check_gcsfs_flavour()
    bucket = unique_bucket_name()
    create_bucket(emulator.url, bucket)
    proxy = FaultProxy(emulator.port, fault_rate=fault_rate, seed=seed).start()
    try:
        with gcs_environment(proxy.url, credentials_dir):
            yield GcsTarget(proxy.url, bucket, proxy)
    finally:
        proxy.stop()


@pytest.fixture
def gcs(gcs_emulator, tmp_path) -> Iterator[GcsTarget]:
    """A fresh bucket on the emulator (through a proxy that injects no faults)."""
    with gcs_target(gcs_emulator, tmp_path, fault_rate=0.0) as target:
        yield target


@pytest.fixture
def gcs_corpus(gcs) -> str:
    """The `corpus` fixture's three documents as one shard on the emulator: its gs:// URL, the --input of a remote
    runner (whose workers could not read a local path)."""
    lines = [json.dumps({"id": f"d{i}", "text": f"document {i}"}) + "\n" for i in range(3)]
    gcs.fs().pipe(f"{gcs.bucket}/in/docs.jsonl", "".join(lines).encode())
    return gcs.url("in", "docs.jsonl")


@pytest.fixture
def unreachable_gcs(tmp_path, monkeypatch):
    """gs:// pointed at a closed port of 127.0.0.1 (every request refused), with gcsfs's back-off between its
    tries taken out: the same refused requests and the same error at the end, without ~35 s of waiting.
    Yields the closed endpoint's port."""
    import types

    import gcsfs.retry

    async def no_wait(_seconds):
        return None

    monkeypatch.setattr(gcsfs.retry, "asyncio", types.SimpleNamespace(sleep=no_wait))
    port = free_port()
    with gcs_environment(f"http://127.0.0.1:{port}", tmp_path):
        yield port


@pytest.fixture
def unavailable_gcs(tmp_path, monkeypatch):
    """gs:// pointed at a server that answers every request 503 (a store that is up but unavailable), with gcsfs's
    back-off between its retries taken out. Yields the server's port."""
    import http.server
    import threading
    import types

    import gcsfs.retry

    async def no_wait(_seconds):
        return None

    class Unavailable(http.server.BaseHTTPRequestHandler):
        def answer(self):
            body = b'{"error": {"code": 503, "message": "backend unavailable"}}'
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = answer

        def log_message(self, *_args):
            pass

    monkeypatch.setattr(gcsfs.retry, "asyncio", types.SimpleNamespace(sleep=no_wait))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Unavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with gcs_environment(f"http://127.0.0.1:{server.server_port}", tmp_path):
            yield server.server_port
    finally:
        server.shutdown()


FAULT_RATE = 0.125  # one request in 8 fails


@pytest.fixture
def faulty_gcs(gcs_emulator, tmp_path) -> Iterator[GcsTarget]:
    """A fresh bucket reached through a FaultProxy: one request in 8 answered 503 or dropped
    (seed 0, at most 2 in a row)."""
    with gcs_target(gcs_emulator, tmp_path, fault_rate=FAULT_RATE, seed=0) as target:
        yield target
