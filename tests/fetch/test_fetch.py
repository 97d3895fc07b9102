"""mnist2db fetch: downloads from a real HTTP server on 127.0.0.1 that this file starts.

The server serves small generated IDX ``.gz`` files (and, for the real-data test, Debian's
Fashion-MNIST), counts every request, and can misbehave on purpose: 404, 500, a connection
cut mid-body, Range ignored, a stall, a Content-Length longer than the body, a redirect
loop, an HTML page with status 200.
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner
from db_helpers import record_digest
from helpers import FASHION_DIGESTS, FASHION_DIR, idx_bytes, make_images, make_labels

from mnist2db.cli.app import cli
from mnist2db.errors import ChecksumError, DownloadError
from mnist2db.fetch import fetcher as fetch_module
from mnist2db.fetch.catalog import DATASET_NAMES, DATASETS, FILE_NAMES, Dataset, Resource
from mnist2db.fetch.fetcher import fetch
from mnist2db.fetch.manifest import MANIFEST_NAME

# -- the test server ------------------------------------------------------------------------


@dataclass
class Route:
    """What the server answers for one path. ``mode`` applies to the next ``times`` requests
    (``times=None``: to all of them); then the route behaves."""

    body: bytes
    mode: str = "ok"  # ok | 404 | 500 | cut | stall | short | odd-length | loop | html
    times: int | None = None
    cut_at: int = 1000
    ignore_range: bool = False
    location: str = ""  # for mode "redirect"


@dataclass
class Server:
    base: str
    routes: dict[str, Route] = field(default_factory=dict)
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, prefix: str) -> str:
        return f"{self.base}/{prefix}/"

    def serve(self, prefix: str, files: dict[str, bytes], **route: object) -> None:
        for name, body in files.items():
            self.routes[f"/{prefix}/{name}.gz"] = Route(body, **route)  # type: ignore[arg-type]

    def count(self, prefix: str = "") -> int:
        with self.lock:
            return sum(1 for path, _ in self.requests if path.startswith(f"/{prefix}"))

    def ranges(self, path: str) -> list[str | None]:
        with self.lock:
            return [rng for p, rng in self.requests if p == path]


HTML_PAGE = b"<!DOCTYPE html>\n<html><body><h1>Page not found</h1></body></html>\n"


class Handler(http.server.BaseHTTPRequestHandler):
    server_state: Server  # set on the subclass made per server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - base signature
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        state = self.server_state
        # Through a proxy the request line holds the absolute URL.
        path = urllib.parse.urlsplit(self.path).path
        with state.lock:
            state.requests.append((path, self.headers.get("Range")))
        route = state.routes.get(path)
        if route is None:
            self.send_error(404, "Not Found")
            return
        mode = route.mode
        if route.times is not None:
            if route.times > 0:
                route.times -= 1
            else:
                mode = "ok"
        if mode == "404":
            self.send_error(404, "Not Found")
        elif mode == "500":
            self.send_error(500, "Internal Server Error")
        elif mode == "loop":
            self.send_response(302)
            self.send_header("Location", path)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif mode == "redirect":
            self.send_response(302)
            self.send_header("Location", route.location)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif mode == "html":
            self._send(200, HTML_PAGE, {"Content-Type": "text/html"})
        else:
            self._send_body(route, mode)

    def _send_body(self, route: Route, mode: str) -> None:
        body = route.body
        status, start = 200, 0
        extra = {"ETag": '"v1"'}
        match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if match and not route.ignore_range:
            start = int(match.group(1))
            if start >= len(body):
                self._send(416, b"", {"Content-Range": f"bytes */{len(body)}"})
                return
            status = 206
            extra["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
        part = body[start:]
        if mode == "cut":
            self._send(status, part, extra, send=route.cut_at)
        elif mode == "stall":
            self._send(status, part, extra, send=route.cut_at, stall=True)
        elif mode == "short":
            self._send(status, part, extra, length=len(part) + 100)
        elif mode == "odd-length":
            self._send(status, part, extra, length="²")  # isdigit(), but not int()
        else:
            self._send(status, part, extra)

    def _send(
        self,
        status: int,
        body: bytes,
        headers: dict[str, str],
        *,
        send: int | None = None,
        length: int | str | None = None,
        stall: bool = False,
    ) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        self.wfile.write(body if send is None else body[:send])
        self.wfile.flush()
        if stall:
            self.server_state.stop.wait(10)
        self.close_connection = True


def start_server(tls: ssl.SSLContext | None = None) -> Iterator[Server]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    scheme = "http" if tls is None else "https"
    state = Server(base=f"{scheme}://127.0.0.1:{httpd.server_address[1]}")
    httpd.RequestHandlerClass = type("BoundHandler", (Handler,), {"server_state": state})
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.stop.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


@pytest.fixture
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    """An HTTPS server with a self-signed certificate for 127.0.0.1; yields it and the cert."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
        + ["-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    for state in start_server(context):
        yield state, cert


# -- a small dataset and its table entry ----------------------------------------------------

COUNT = 30


def small_files(seed: int = 0) -> dict[str, bytes]:
    """The four unpacked IDX files of a 30-image train split and a 30-image test split."""
    return {
        "train-images-idx3-ubyte": idx_bytes(make_images(COUNT, seed=seed)),
        "train-labels-idx1-ubyte": idx_bytes(make_labels(COUNT, seed=seed + 1)),
        "t10k-images-idx3-ubyte": idx_bytes(make_images(COUNT, seed=seed + 2)),
        "t10k-labels-idx1-ubyte": idx_bytes(make_labels(COUNT, seed=seed + 3)),
    }


def gz(files: dict[str, bytes]) -> dict[str, bytes]:
    return {name: gzip.compress(data, mtime=0) for name, data in files.items()}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_spec(
    raw: dict[str, bytes],
    packed: dict[str, bytes],
    mirrors: tuple[str, ...] = (),
    *,
    gz_digests: bool = True,
    unpacked_digests: bool = True,
) -> Dataset:
    return Dataset(
        name="tiny",
        mirrors=mirrors,
        resources=tuple(
            Resource(
                name,
                gz={"sha256": sha256(packed[name])} if gz_digests else {},
                unpacked={"sha256": sha256(raw[name])} if unpacked_digests else {},
            )
            for name in FILE_NAMES
        ),
    )


@pytest.fixture
def tiny() -> tuple[dict[str, bytes], dict[str, bytes]]:
    raw = small_files()
    return raw, gz(raw)


def listing(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


FINAL = sorted(FILE_NAMES)


def quick(**kwargs: object) -> dict[str, object]:
    """Options for fast failure tests: short timeout, no waiting between retries."""
    return {"timeout": 0.5, "retries": 1, "backoff": 0.0, **kwargs}


# -- the table ------------------------------------------------------------------------------


def test_table_lists_the_mnist_format_datasets_and_the_cli_offers_them() -> None:
    assert list(DATASETS) == list(DATASET_NAMES)
    assert list(DATASETS) == [
        "mnist",
        "fashion-mnist",
        "kmnist",
        *(f"emnist-{s}" for s in ("byclass", "bymerge", "balanced", "letters", "digits", "mnist")),
        "qmnist",
        "qmnist-nist",
    ]
    for command in ("fetch", "create"):
        option = next(
            p
            for p in cli.get_command(None, command).params
            if p.name == "dataset"  # type: ignore[union-attr]
        )
        assert list(option.type.choices) == list(DATASETS)  # type: ignore[attr-defined]
    for spec in [DATASETS["mnist"], DATASETS["fashion-mnist"], DATASETS["kmnist"]]:
        assert [r.name for r in spec.resources] == list(FILE_NAMES)
        assert spec.mirrors
        for resource in spec.resources:
            assert len(resource.gz["sha256"]) == 64
            assert len(resource.gz["md5"]) == 32
    mnist = DATASETS["mnist"]
    assert mnist.mirrors[-1] == "http://yann.lecun.com/exdb/mnist/"
    assert mnist.mirrors[0].startswith("https://")
    assert mnist.resources[0].size == 9912422


def test_cli_start_up_imports_no_network_modules() -> None:
    # The --dataset choices come from the table module, which must stay light.
    code = (
        "import sys, mnist2db.cli.app; "
        "print(sorted(m for m in ('urllib.request', 'ssl', 'http.client', 'zipfile', 'lzma') "
        "if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "[]\n"


# -- success paths --------------------------------------------------------------------------


def test_fetch_from_first_mirror(server: Server, tiny: tuple, tmp_path: Path) -> None:
    raw, packed = tiny
    server.serve("a", packed)
    server.serve("b", packed)
    spec = make_spec(raw, packed, (server.url("a"), server.url("b")))
    results = fetch(spec, tmp_path, **quick())
    for name in FILE_NAMES:
        assert (tmp_path / name).read_bytes() == raw[name]
    assert [r.status for r in results] == ["downloaded"] * 4
    assert [r.verified_by for r in results] == [".gz sha256"] * 4
    assert results[0].source == f"{server.base}/a/train-images-idx3-ubyte.gz"
    assert results[0].nbytes == len(packed["train-images-idx3-ubyte"])
    assert server.count("a") == 4 and server.count("b") == 0
    # Nothing else left behind: no temporary file, no .gz (no --keep-gz), the manifest.
    assert listing(tmp_path) == sorted([MANIFEST_NAME, *FILE_NAMES])
    manifest = (tmp_path / MANIFEST_NAME).read_text()
    assert manifest.startswith("# mnist2db dataset: tiny\n")
    assert f"{sha256(raw['t10k-labels-idx1-ubyte'])}  t10k-labels-idx1-ubyte\n" in manifest


def test_first_mirror_404_then_second(server: Server, tiny: tuple, tmp_path: Path) -> None:
    raw, packed = tiny
    server.serve("b", packed)
    spec = make_spec(raw, packed, (server.url("a"), server.url("b")))
    results = fetch(spec, tmp_path, **quick(retries=3))
    assert {r.source for r in results} == {f"{server.url('b')}{n}.gz" for n in FILE_NAMES}
    # A 404 is not transient: one request per file, no retry.
    assert server.count("a") == 4 and server.count("b") == 4


def test_accepted_through_unpacked_digest_when_recompressed(
    server: Server, tiny: tuple, tmp_path: Path
) -> None:
    raw, packed = tiny
    recompressed = {n: gzip.compress(d, compresslevel=1, mtime=12345) for n, d in raw.items()}
    assert recompressed != packed
    server.serve("a", recompressed)
    results = fetch(make_spec(raw, packed, (server.url("a"),)), tmp_path, **quick())
    assert [r.verified_by for r in results] == ["unpacked sha256"] * 4
    assert (tmp_path / "train-images-idx3-ubyte").read_bytes() == raw["train-images-idx3-ubyte"]


def test_cut_mid_body_is_resumed_with_range(server: Server, tiny: tuple, tmp_path: Path) -> None:
    raw, packed = tiny
    server.serve("a", packed, mode="cut", times=1, cut_at=1000)
    fetch(make_spec(raw, packed, (server.url("a"),)), tmp_path, **quick(retries=0))
    path = "/a/train-images-idx3-ubyte.gz"
    assert server.ranges(path) == [None, "bytes=1000-"]
    assert (tmp_path / "train-images-idx3-ubyte").read_bytes() == raw["train-images-idx3-ubyte"]


def test_server_ignoring_range_restarts_cleanly(
    server: Server, tiny: tuple, tmp_path: Path
) -> None:
    raw, packed = tiny
    server.serve("a", packed, mode="cut", times=1, cut_at=1000, ignore_range=True)
    results = fetch(make_spec(raw, packed, (server.url("a"),)), tmp_path, **quick(retries=0))
    assert server.ranges("/a/train-images-idx3-ubyte.gz") == [None, "bytes=1000-"]
    # The 200 answer to the Range request was taken from its first byte, not appended.
    assert (tmp_path / "train-images-idx3-ubyte").read_bytes() == raw["train-images-idx3-ubyte"]
    assert results[0].nbytes == len(packed["train-images-idx3-ubyte"])


def test_transient_500_is_retried(server: Server, tiny: tuple, tmp_path: Path) -> None:
    raw, packed = tiny
    server.serve("a", packed, mode="500", times=2)
    fetch(make_spec(raw, packed, (server.url("a"),)), tmp_path, **quick(retries=2))
    assert server.ranges("/a/train-images-idx3-ubyte.gz") == [None, None, None]
    assert listing(tmp_path) == sorted([MANIFEST_NAME, *FILE_NAMES])


def test_verified_files_are_not_downloaded_again(
    server: Server, tiny: tuple, tmp_path: Path
) -> None:
    raw, packed = tiny
    server.serve("a", packed)
    spec = make_spec(raw, packed, (server.url("a"),))
    fetch(spec, tmp_path, **quick())
    assert server.count() == 4
    results = fetch(spec, tmp_path, **quick())
    assert server.count() == 4
    assert [r.status for r in results] == ["present"] * 4
    assert [r.verified_by for r in results] == ["unpacked sha256"] * 4
    fetch(spec, tmp_path, force=True, **quick())
    assert server.count() == 8


def test_manifest_verifies_files_without_a_published_unpacked_digest(
    server: Server, tiny: tuple, tmp_path: Path
) -> None:
    # KMNIST publishes .gz digests only: the sha256 recorded at download vouches for the file.
    raw, packed = tiny
    server.serve("a", packed)
    spec = make_spec(raw, packed, (server.url("a"),), unpacked_digests=False)
    fetch(spec, tmp_path, **quick())
    results = fetch(spec, tmp_path, **quick())
    assert server.count() == 4
    assert results[0].verified_by == "unpacked sha256 recorded when fetched"
    # ... and does not vouch for a file changed since.
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(b"changed")
    results = fetch(spec, tmp_path, **quick())
    assert server.count() == 5
    assert [r.status for r in results] == ["present"] * 3 + ["downloaded"]
    assert (tmp_path / "t10k-labels-idx1-ubyte").read_bytes() == raw["t10k-labels-idx1-ubyte"]


def test_manifest_of_another_dataset_vouches_for_nothing(
    server: Server, tiny: tuple, tmp_path: Path
) -> None:
    # MNIST fetched into a directory, then a dataset publishing only .gz digests (as KMNIST)
    # into the same one: MNIST's files must not pass as that dataset's through the manifest.
    raw, packed = tiny
    other_raw = small_files(seed=7)
    other_packed = gz(other_raw)
    server.serve("a", packed)
    server.serve("k", other_packed)
    fetch(make_spec(raw, packed, (server.url("a"),)), tmp_path, **quick())
    kmnist_like = Dataset(
        "kmnist-like",
        (server.url("k"),),
        tuple(Resource(n, gz={"sha256": sha256(other_packed[n])}) for n in FILE_NAMES),
    )
    results = fetch(kmnist_like, tmp_path, **quick())
    assert [r.status for r in results] == ["downloaded"] * 4
    assert server.count("k") == 4
    for name in FILE_NAMES:
        assert (tmp_path / name).read_bytes() == other_raw[name]
    manifest = (tmp_path / MANIFEST_NAME).read_text().splitlines()
    assert manifest[0] == "# mnist2db dataset: kmnist-like"
    assert len(manifest) == 5
    # Its own manifest does vouch for its files: nothing fetched again.
    assert [r.status for r in fetch(kmnist_like, tmp_path, **quick())] == ["present"] * 4
    assert server.count("k") == 4


def test_corrupt_local_file_is_replaced(server: Server, tiny: tuple, tmp_path: Path) -> None:
    raw, packed = tiny
    server.serve("a", packed)
    spec = make_spec(raw, packed, (server.url("a"),))
    broken = bytearray(raw["train-images-idx3-ubyte"])
    broken[500] ^= 0xFF
    (tmp_path / "train-images-idx3-ubyte").write_bytes(bytes(broken))
    for name in FILE_NAMES[1:]:
        (tmp_path / name).write_bytes(raw[name])
    results = fetch(spec, tmp_path, **quick())
    assert [r.status for r in results] == ["downloaded", "present", "present", "present"]
    assert server.count() == 1
    assert (tmp_path / "train-images-idx3-ubyte").read_bytes() == raw["train-images-idx3-ubyte"]


def test_keep_gz_keeps_the_archive_and_reuses_it(
    server: Server, tiny: tuple, tmp_path: Path
) -> None:
    raw, packed = tiny
    server.serve("a", packed)
    spec = make_spec(raw, packed, (server.url("a"),))
    fetch(spec, tmp_path, keep_gz=True, **quick())
    for name in FILE_NAMES:
        assert (tmp_path / f"{name}.gz").read_bytes() == packed[name]
    assert server.count() == 4
    assert [r.status for r in fetch(spec, tmp_path, keep_gz=True, **quick())] == ["present"] * 4
    # The unpacked file lost: unpacked again from the kept archive, without the network.
    (tmp_path / "train-labels-idx1-ubyte").unlink()
    results = fetch(spec, tmp_path, **quick())
    assert server.count() == 4
    assert results[1].status == "unpacked"
    assert results[1].source == str(tmp_path / "train-labels-idx1-ubyte.gz")
    assert (tmp_path / "train-labels-idx1-ubyte").read_bytes() == raw["train-labels-idx1-ubyte"]


def test_directory_and_file_url_mirrors(tiny: tuple, tmp_path: Path) -> None:
    raw, packed = tiny
    cache = tmp_path / "cache"
    cache.mkdir()
    for name, data in packed.items():
        (cache / f"{name}.gz").write_bytes(data)
    spec = make_spec(raw, packed, ("http://127.0.0.1:9/unused/",))
    for i, mirror in enumerate([str(cache), cache.as_uri(), cache.as_uri() + "/"]):
        out = tmp_path / f"out{i}"
        results = fetch(spec, out, mirrors=[mirror], **quick())
        assert [r.status for r in results] == ["downloaded"] * 4
        assert results[0].source == str(cache / "train-images-idx3-ubyte.gz")
        assert (out / "t10k-images-idx3-ubyte").read_bytes() == raw["t10k-images-idx3-ubyte"]


def test_directory_mirror_with_unpacked_files(tiny: tuple, tmp_path: Path) -> None:
    raw, packed = tiny
    cache = tmp_path / "cache"
    cache.mkdir()
    for name, data in raw.items():
        (cache / name).write_bytes(data)
    results = fetch(make_spec(raw, packed), tmp_path / "out", mirrors=[str(cache)], **quick())
    assert [r.verified_by for r in results] == ["unpacked sha256"] * 4
    assert [r.source for r in results] == [str(cache / name) for name in FILE_NAMES]
    for name in FILE_NAMES:
        assert (tmp_path / "out" / name).read_bytes() == raw[name]
    # Only .gz digests published: an unpacked file cannot be vouched for.
    with pytest.raises(ChecksumError) as info:
        fetch(
            make_spec(raw, packed, unpacked_digests=False),
            tmp_path / "out2",
            mirrors=[str(cache)],
            **quick(),
        )
    assert str(info.value) == (
        f"train-images-idx3-ubyte: rejected from every source: "
        f"{cache / 'train-images-idx3-ubyte'} (checksum mismatch: got unpacked sha256 "
        f"{sha256(raw['train-images-idx3-ubyte'])}; expected .gz sha256 "
        f"{sha256(packed['train-images-idx3-ubyte'])})"
    )
    assert not (tmp_path / "out2").exists()  # made by the run: removed


def test_env_proxy_is_used(
    server: Server, tiny: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw, packed = tiny
    server.serve("a", packed)
    monkeypatch.setenv("http_proxy", server.base)
    # No such host: only the proxy (our server) can answer.
    fetch(make_spec(raw, packed, ("http://mirror.invalid/a/",)), tmp_path, **quick())
    assert server.count("a") == 4
    assert (tmp_path / "train-images-idx3-ubyte").read_bytes() == raw["train-images-idx3-ubyte"]


def test_https_certificate_is_verified(
    tls_server: tuple[Server, Path], tiny: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, cert = tls_server
    raw, packed = tiny
    server.serve("a", packed)
    spec = make_spec(raw, packed, (server.url("a"),))
    with pytest.raises(DownloadError) as info:
        fetch(spec, tmp_path / "x", **quick(retries=3))
    assert str(info.value) == (
        f"train-images-idx3-ubyte: no mirror delivered a verified file: "
        f"{server.url('a')}train-images-idx3-ubyte.gz "
        f"(TLS certificate not valid: self-signed certificate)"
    )
    assert server.count() == 0  # refused at the handshake, and not retried
    assert not (tmp_path / "x").exists()  # made by the run: removed
    # Trusted (as a company's CA would be, through the environment): fetched over HTTPS.
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    results = fetch(spec, tmp_path / "y", **quick())
    assert results[0].source == f"{server.url('a')}train-images-idx3-ubyte.gz"
    assert (tmp_path / "y" / "t10k-images-idx3-ubyte").read_bytes() == raw["t10k-images-idx3-ubyte"]


def test_https_to_http_redirect_is_refused(
    tls_server: tuple[Server, Path],
    server: Server,
    tiny: tuple,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secure, cert = tls_server
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    raw, packed = tiny
    server.serve("plain", packed)
    name = "train-images-idx3-ubyte"
    secure.serve("a", packed, mode="redirect", location=f"{server.url('plain')}{name}.gz")
    with pytest.raises(DownloadError) as info:
        fetch(make_spec(raw, packed, (secure.url("a"),)), tmp_path, **quick())
    assert str(info.value) == (
        f"{name}: no mirror delivered a verified file: {secure.url('a')}{name}.gz "
        f"(refused a redirect (HTTP 302) to {server.url('plain')}{name}.gz: "
        "https is never downgraded)"
    )
    assert server.count() == 0
    assert listing(tmp_path) == []


# -- failures: a clear error, nothing under a final name -----------------------------------


def test_corrupt_bytes_rejected_with_both_digests(
    server: Server, tiny: tuple, tmp_path: Path
) -> None:
    raw, packed = tiny
    other = gz(small_files(seed=7))
    server.serve("a", other)
    spec = make_spec(raw, packed, (server.url("a"),))
    with pytest.raises(ChecksumError) as info:
        fetch(spec, tmp_path, **quick())
    name = "train-images-idx3-ubyte"
    assert str(info.value) == (
        f"{name}: rejected from every source: {server.url('a')}{name}.gz (checksum mismatch: "
        f"got .gz sha256 {sha256(other[name])}, unpacked sha256 {sha256(small_files(7)[name])}; "
        f"expected .gz sha256 {sha256(packed[name])} or unpacked sha256 {sha256(raw[name])})"
    )
    assert listing(tmp_path) == []


def test_damaged_gzip_rejected(server: Server, tiny: tuple, tmp_path: Path) -> None:
    raw, packed = tiny
    damaged = dict(packed)
    body = bytearray(packed["train-images-idx3-ubyte"])
    body[-6] ^= 0xFF  # inside the CRC32/ISIZE trailer
    damaged["train-images-idx3-ubyte"] = bytes(body)
    server.serve("a", damaged)
    with pytest.raises(ChecksumError, match=r"\(corrupt gzip data .*incorrect data check"):
        fetch(make_spec(raw, packed, (server.url("a"),)), tmp_path, **quick())
    assert listing(tmp_path) == []


def test_all_mirrors_failing_give_one_error_listing_each(
    server: Server, tiny: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw, packed = tiny
    server.serve("b", packed, mode="500")
    server.serve("c", packed, mode="html")
    spec = make_spec(raw, packed, (server.url("a"), server.url("b"), server.url("c")))
    monkeypatch.setitem(DATASETS, "mnist", spec)
    monkeypatch.setattr(fetch_module, "DEFAULT_BACKOFF", 0.0)
    out = tmp_path / "data"
    result = CliRunner().invoke(cli, ["fetch", "--data", str(out), "--retries", "1"])
    assert result.exit_code == 1
    name = "train-images-idx3-ubyte"
    assert result.stderr == (
        f"Error: {name}: no mirror delivered a verified file: "
        f"{server.url('a')}{name}.gz (HTTP 404 Not Found); "
        f"{server.url('b')}{name}.gz (HTTP 500 Internal Server Error, after 2 attempts); "
        f"{server.url('c')}{name}.gz (not gzip data (it starts with b'<!DOCTYPE html>\\n'; "
        f"an HTML error page?))\n"
    )
    assert server.count("b") == 2
    assert not out.exists()  # made by the run: removed


def test_stalled_server_times_out_then_resumes(server: Server, tiny: tuple, tmp_path: Path) -> None:
    raw, packed = tiny
    server.serve("a", packed, mode="stall", times=1, cut_at=1000)
    fetch(make_spec(raw, packed, (server.url("a"),)), tmp_path, **quick(timeout=0.2))
    assert server.ranges("/a/train-images-idx3-ubyte.gz") == [None, "bytes=1000-"]
    assert (tmp_path / "train-images-idx3-ubyte").read_bytes() == raw["train-images-idx3-ubyte"]


def test_always_stalling_mirror_gives_way_to_the_next(
    server: Server, tiny: tuple, tmp_path: Path
) -> None:
    raw, packed = tiny
    # Each answer: the first 1000 bytes (Range ignored), then nothing.
    server.serve("a", packed, mode="stall", cut_at=1000, ignore_range=True)
    server.serve("b", packed)
    spec = make_spec(raw, packed, (server.url("a"), server.url("b")))
    results = fetch(spec, tmp_path, **quick(timeout=0.2, retries=1))
    assert results[0].source == f"{server.url('b')}train-images-idx3-ubyte.gz"
    # The first answer made progress (resumed at once); the next two made none: retries=1
    # allows two such attempts, then the next mirror.
    assert server.ranges("/a/train-images-idx3-ubyte.gz") == [None, "bytes=1000-", "bytes=1000-"]
    spec = make_spec(raw, packed, (server.url("a"),))
    with pytest.raises(DownloadError) as info:
        fetch(spec, tmp_path / "x", **quick(timeout=0.2, retries=0))
    assert str(info.value).endswith("(timed out after 0.2 s, after 1 attempt)")
    assert not (tmp_path / "x").exists()  # made by the run: removed


def test_content_length_longer_than_body(server: Server, tiny: tuple, tmp_path: Path) -> None:
    raw, packed = tiny
    server.serve("a", packed, mode="short")
    size = len(packed["train-images-idx3-ubyte"])
    with pytest.raises(DownloadError) as info:
        fetch(make_spec(raw, packed, (server.url("a"),)), tmp_path, **quick())
    # Every byte came, but 100 more were promised: the resume is refused (416), the restart
    # from zero ends short again, no progress: given up after retries=1.
    assert str(info.value).endswith(
        f"(connection closed after {size} of {size + 100} bytes, after 2 attempts)"
    )
    assert server.ranges("/a/train-images-idx3-ubyte.gz") == [None, f"bytes={size}-", None]
    assert listing(tmp_path) == []


def test_content_length_not_a_number(server: Server, tiny: tuple, tmp_path: Path) -> None:
    # Content-Length "²": ignored as unknown, the body read to the close, no ValueError.
    raw, packed = tiny
    server.serve("a", packed, mode="odd-length")
    results = fetch(make_spec(raw, packed, (server.url("a"),)), tmp_path, **quick())
    assert [r.status for r in results] == ["downloaded"] * 4
    assert (tmp_path / "train-images-idx3-ubyte").read_bytes() == raw["train-images-idx3-ubyte"]


def test_redirect_loop(server: Server, tiny: tuple, tmp_path: Path) -> None:
    raw, packed = tiny
    server.serve("a", packed, mode="loop")
    server.serve("b", packed)
    results = fetch(make_spec(raw, packed, (server.url("a"), server.url("b"))), tmp_path, **quick())
    assert results[0].source == f"{server.url('b')}train-images-idx3-ubyte.gz"
    with pytest.raises(DownloadError) as info:
        fetch(make_spec(raw, packed, (server.url("a"),)), tmp_path / "x", **quick())
    assert str(info.value) == (
        f"train-images-idx3-ubyte: no mirror delivered a verified file: "
        f"{server.url('a')}train-images-idx3-ubyte.gz (too many redirects (HTTP 302))"
    )
    assert not (tmp_path / "x").exists()  # made by the run: removed


def test_html_page_with_status_200(server: Server, tiny: tuple, tmp_path: Path) -> None:
    raw, packed = tiny
    server.serve("a", packed, mode="html")
    with pytest.raises(ChecksumError, match=r"not gzip data .*an HTML error page\?"):
        fetch(make_spec(raw, packed, (server.url("a"),)), tmp_path, **quick())
    assert server.count() == 1  # not retried
    assert listing(tmp_path) == []


def test_interrupted_download_leaves_nothing(server: Server, tiny: tuple, tmp_path: Path) -> None:
    raw, packed = tiny
    server.serve("a", packed)

    def interrupt(name: str, done: int, total: int) -> None:
        if name == "t10k-images-idx3-ubyte":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fetch(make_spec(raw, packed, (server.url("a"),)), tmp_path, progress=interrupt, **quick())
    # The two files verified before the interrupt stay; no temporary file, no third file.
    assert listing(tmp_path) == sorted(
        [MANIFEST_NAME, "train-images-idx3-ubyte", "train-labels-idx1-ubyte"]
    )


def test_unwritable_destination(tiny: tuple, tmp_path: Path) -> None:
    raw, packed = tiny
    (tmp_path / "file").write_text("x")
    with pytest.raises(DownloadError, match=r"^.*file/sub: cannot create the directory: "):
        fetch(make_spec(raw, packed), tmp_path / "file" / "sub", **quick())


# -- the command line -----------------------------------------------------------------------


def test_cli_fetch_summary_and_mirror_order(
    server: Server, tiny: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw, packed = tiny
    server.serve("cli", packed)
    server.serve("env", packed)
    # The table's own mirror refuses connections; --mirror comes first, then the env's.
    spec = make_spec(raw, packed, ("http://127.0.0.1:9/",))
    monkeypatch.setitem(DATASETS, "kmnist", spec)
    monkeypatch.setenv("MNIST2DB_MIRROR", f"{server.url('env')}")
    out = tmp_path / "d"
    args = ["fetch", "--dataset", "kmnist", "--data", str(out), "--timeout", "2"]
    result = CliRunner().invoke(cli, [*args, "--mirror", server.url("cli")])
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 5
    assert re.fullmatch(
        rf"{re.escape(str(out / 'train-images-idx3-ubyte'))}: fetched from "
        rf"{re.escape(server.url('cli'))}train-images-idx3-ubyte\.gz \(\d+\.\d kB in "
        rf"\d+\.\d\d s, [\d.]+ [kMG]?B/s\), verified \(\.gz sha256\)",
        lines[0],
    ), lines[0]
    assert lines[4] == f"kmnist: 4 files ready in {out}"
    assert server.count("cli") == 4 and server.count("env") == 0
    result = CliRunner().invoke(cli, [*args, "--force", "-q"])
    assert result.exit_code == 0 and result.stderr == ""
    assert server.count("env") == 4
    result = CliRunner().invoke(cli, args)
    assert result.stderr.splitlines()[0] == (
        f"{out / 'train-images-idx3-ubyte'}: present, verified (unpacked sha256); not downloaded"
    )


def test_cli_fetch_usage_errors() -> None:
    result = CliRunner().invoke(cli, ["fetch", "--dataset", "cifar"])
    assert result.exit_code == 2
    assert "Invalid value for '--dataset': 'cifar' is not one of" in result.stderr
    result = CliRunner().invoke(cli, ["fetch", "--timeout", "0"])
    assert result.exit_code == 2


@pytest.mark.parametrize(
    ("mirror", "error"),
    [
        ("http://[::1/", "http://[::1/: not a valid mirror URL (Invalid IPv6 URL)"),
        (
            "http://127.0.0.1:99999/",
            "http://127.0.0.1:99999/: not a valid mirror URL (Port out of range 0-65535)",
        ),
        (
            "ftp://example.org/mnist/",
            "'ftp://example.org/mnist/': not a mirror: expected an http(s):// or file:// URL "
            "or a directory",
        ),
        (
            "file://server/mnist/",
            "file://server/mnist/: a file:// URL must name a local path (file:///...)",
        ),
    ],
)
def test_cli_fetch_bad_mirror_is_one_line(
    mirror: str, error: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MNIST2DB_MIRROR", mirror)
    result = CliRunner().invoke(cli, ["fetch", "--data", str(tmp_path / "d")])
    assert result.exit_code == 1
    assert result.stderr == f"Error: {error}\n"
    assert not (tmp_path / "d").exists()


def test_cli_help_ends_with_an_example() -> None:
    for command in ("fetch", "create"):
        result = CliRunner().invoke(cli, [command, "--help"])
        assert result.exit_code == 0
        assert f"Examples:\n    mnist2db {command if command == 'fetch' else 'fetch &&'}" in (
            result.output
        )


# -- real data: Debian's Fashion-MNIST served over HTTP ---------------------------------------

FASHION_REFERENCE = {
    "mnist_train_lmdb": FASHION_DIGESTS["train"],
    "mnist_test_lmdb": FASHION_DIGESTS["t10k"],
}


def test_fashion_mnist_over_http_then_create(server: Server, tmp_path: Path) -> None:
    if not all((FASHION_DIR / f"{name}.gz").exists() for name in FILE_NAMES):
        pytest.skip(f"Debian's dataset-fashion-mnist is not installed ({FASHION_DIR})")
    served = {name: (FASHION_DIR / f"{name}.gz").read_bytes() for name in FILE_NAMES}
    server.serve("debian", served)
    data, out = tmp_path / "data", tmp_path / "examples"
    runner = CliRunner()
    result = runner.invoke(
        cli,
        ["fetch", "--dataset", "fashion-mnist", "--data", str(data)]
        + ["--mirror", server.url("debian")],
    )
    assert result.exit_code == 0, result.output
    # Debian re-compressed the files: accepted through the unpacked sha256.
    assert result.stderr.count("verified (unpacked sha256)") == 4
    assert server.count() == 4
    result = runner.invoke(
        cli,
        ["create", "--dataset", "fashion-mnist", "--data", str(data), "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(out)) == sorted(FASHION_REFERENCE)
    for name, reference in FASHION_REFERENCE.items():
        assert record_digest(out / name) == reference


def test_sigterm_mid_download_leaves_nothing(server: Server, tmp_path: Path) -> None:
    # A real process, a real signal: the partial file is removed, exit 143, one line.
    body = gzip.compress(idx_bytes(make_images(255)), mtime=0)
    server.serve("slow", {"train-images-idx3-ubyte": body}, mode="stall", cut_at=100)
    data = tmp_path / "data"
    process = subprocess.Popen(
        [sys.executable, "-m", "mnist2db", "fetch", "--dataset", "fashion-mnist"]
        + ["--data", str(data), "--mirror", server.url("slow"), "--timeout", "30"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(200):  # wait (at most 10 s) until the download is under way
            if data.exists() and os.listdir(data):
                break
            time.sleep(0.05)
        partial = os.listdir(data)
        assert len(partial) == 1 and partial[0].startswith(".train-images-idx3-ubyte.mnist2db-tmp-")
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 143
    assert stderr == "Interrupted\n"
    assert not data.exists()  # made by the run: removed


def test_network_fault_mid_body_is_a_mirror_failure_not_a_write_error(
    server: Server, tiny: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault loopback cannot produce (host unreachable mid-body), injected into the read:
    the first mirror is retried and abandoned, the second delivers."""
    import errno
    import http.client

    raw, packed = tiny
    server.serve("a", packed)
    server.serve("b", packed)
    real_read1 = http.client.HTTPResponse.read1
    bad_port = server.url("a")

    def read1(self: http.client.HTTPResponse, n: int = -1) -> bytes:
        if self.url and self.url.startswith(bad_port):  # type: ignore[attr-defined]
            raise OSError(errno.EHOSTUNREACH, "No route to host")
        return real_read1(self, n)

    monkeypatch.setattr(http.client.HTTPResponse, "read1", read1)
    spec = make_spec(raw, packed, (server.url("a"), server.url("b")))
    results = fetch(spec, tmp_path, **quick(retries=1))
    assert {r.source for r in results} == {f"{server.url('b')}{n}.gz" for n in FILE_NAMES}
    assert server.count("a") == 8  # each file: one try and one retry


def test_temporaries_of_a_killed_fetch_are_removed(
    server: Server, tiny: tuple, tmp_path: Path
) -> None:
    from os_helpers import dead_pid

    raw, packed = tiny
    server.serve("a", packed)
    dead = dead_pid()
    left = [
        tmp_path / f".train-images-idx3-ubyte.mnist2db-tmp-{dead}-k1ll3d",
        tmp_path / f".train-images-idx3-ubyte.mnist2db-tmp-{dead}-k1ll3d.gz",
        tmp_path / f"..mnist2db.sha256.mnist2db-tmp-{dead}-k1ll3d",  # "." + ".mnist2db.sha256"
    ]
    live = tmp_path / ".t10k-labels-idx1-ubyte.mnist2db-tmp-1-st1ll0n"  # pid 1: still running
    for path in (*left, live):
        path.write_bytes(b"partial")
    fetch(make_spec(raw, packed, (server.url("a"),)), tmp_path, **quick())
    assert [path.name for path in left if path.exists()] == []
    assert live.exists()
