"""fetch against mirrors that misbehave on purpose: bytes, memory, time and
requests stay bounded, nothing a server says reaches the terminal raw, local sources that
are not regular files are refused without waiting.

The server here answers with whatever bytes a test writes (status lines, headers and
bodies no well-behaved server would send), counts requests and the bytes it managed to
send, and stops every endless answer at :data:`SERVER_CAP` or when the client hangs up.
"""

from __future__ import annotations

import gzip
import http.server
import lzma
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import idx_bytes
from test_fetch import FILE_NAMES, gz, make_spec, quick, sha256, small_files

from mnist2db.cli.app import cli
from mnist2db.errors import ChecksumError, DownloadError
from mnist2db.fetch import fetcher as fetch_module
from mnist2db.fetch.catalog import DATASETS, Dataset, Resource
from mnist2db.fetch.fetcher import fetch
from mnist2db.fetch.manifest import MANIFEST_NAME

#: The most an endless answer sends before the server gives up on its own.
SERVER_CAP = 64 << 20

Handler = Callable[["Request"], None]


class Request(http.server.BaseHTTPRequestHandler):
    """One request; the route's function writes the raw answer."""

    state: RawServer  # set on the subclass made per server
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - base signature
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?")[0]
        with self.state.lock:
            self.state.requests.append((path, self.headers.get("Range")))
        handler = self.state.routes.get(path)
        try:
            if handler is None:
                self.raw(b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            else:
                handler(self)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up: what a bounded client does

    def raw(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()
        with self.state.lock:
            self.state.sent[self.path] = self.state.sent.get(self.path, 0) + len(data)

    def answer(self, body: bytes, status: str = "200 OK", headers: str = "") -> None:
        self.raw(
            f"HTTP/1.0 {status}\r\nContent-Length: {len(body)}\r\n{headers}\r\n".encode("latin-1")
            + body
        )

    def endless(self, head: bytes, block: bytes) -> None:
        """``head`` (status line, headers, the start of the body), then ``block`` again and
        again until the client hangs up or SERVER_CAP is sent."""
        self.raw(head)
        sent = len(head)
        while sent < SERVER_CAP and not self.state.stop.is_set():
            self.raw(block)
            sent += len(block)


@dataclass
class RawServer:
    base: str
    routes: dict[str, Handler] = field(default_factory=dict)
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    def url(self, path: str = "") -> str:
        return f"{self.base}/{path}"

    def count(self, path: str) -> int:
        with self.lock:
            return sum(1 for p, _ in self.requests if p == path)


@pytest.fixture
def raw_server() -> Iterator[RawServer]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Request)
    httpd.daemon_threads = True
    state = RawServer(base=f"http://127.0.0.1:{httpd.server_address[1]}")
    httpd.RequestHandlerClass = type("Bound", (Request,), {"state": state})
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
def tiny() -> tuple[dict[str, bytes], dict[str, bytes]]:
    raw = small_files()
    return raw, gz(raw)


def serve_files(server: RawServer, prefix: str, files: dict[str, bytes]) -> None:
    """A well-behaved mirror under ``/prefix/``: each file, whole, with a Content-Length."""
    for name, body in files.items():
        server.routes[f"/{prefix}/{name}.gz"] = lambda r, body=body: r.answer(body)


def one_file_spec(raw: dict[str, bytes], packed: dict[str, bytes], *mirrors: str) -> Dataset:
    """The tiny dataset reduced to its first file (train-images), for one-file scenarios."""
    spec = make_spec(raw, packed, tuple(mirrors))
    return Dataset(spec.name, spec.mirrors, spec.resources[:1])


NAME = FILE_NAMES[0]  # train-images-idx3-ubyte


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["fetch", *args])
    return result.exit_code, result.stderr


# -- what a server says is cleaned before it is printed -------------------------------------

ESCAPES = "\x1b[2K\r\x1b[1A4 files ready\x1b]0;pwned\x07"


def test_reason_phrase_headers_and_urls_are_printed_cleaned(
    raw_server: RawServer, tiny: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw, packed = tiny
    reason = f"HTTP/1.0 404 {ESCAPES}\r\nContent-Length: 0\r\n\r\n".encode("latin-1")
    raw_server.routes[f"/a/{NAME}.gz"] = lambda r: r.raw(reason)
    location = f"ftp://evil/{ESCAPES}"
    raw_server.routes[f"/b/{NAME}.gz"] = lambda r: r.answer(
        b"", "302 Found", f"Location: {location}\r\n"
    )
    raw_server.routes[f"/c/{NAME}.gz"] = lambda r: r.raw(
        f"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\n{ESCAPES}".encode("latin-1")
    )
    spec = one_file_spec(raw, packed, raw_server.url("a/"), raw_server.url("b/"))
    spec = Dataset(spec.name, (*spec.mirrors, raw_server.url("c/")), spec.resources)
    monkeypatch.setitem(DATASETS, "mnist", spec)
    code, stderr = run_cli("--data", str(tmp_path / "d"), "--retries", "0")
    assert code == 1
    assert stderr.count("\n") == 1 and stderr.endswith("\n")
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", stderr), repr(stderr)
    shown = "\\x1b[2K\\x0d\\x1b[1A4 files ready\\x1b]0;pwned\\x07"
    assert f"{raw_server.url('a/')}{NAME}.gz (HTTP 404 {shown})" in stderr
    assert (
        f"{raw_server.url('b/')}{NAME}.gz (refused a redirect (HTTP 302) to "
        "ftp://evil/%1B[2K: only http(s) is followed)"  # the header ends at its \r
    ) in stderr
    assert "(not gzip data (it starts with b'\\x1b[2K\\r')" in stderr


# -- credentials ----------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["option", "env"])
def test_credentials_in_a_mirror_url_are_refused_and_never_printed(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror = "http://user:s3cret@127.0.0.1:9/mnist/"
    if where == "env":
        monkeypatch.setenv("MNIST2DB_MIRROR", mirror)
        code, stderr = run_cli("--data", str(tmp_path / "d"))
    else:
        code, stderr = run_cli("--data", str(tmp_path / "d"), "--mirror", mirror)
    assert code == 1
    assert stderr == (
        "Error: http://user:***@127.0.0.1:9/mnist/: credentials in a mirror URL are not "
        "supported (serve the files without a login, or use a local copy)\n"
    )
    assert not (tmp_path / "d").exists()


def test_redirect_to_a_url_with_credentials_is_refused_without_printing_them(
    raw_server: RawServer, tiny: tuple, tmp_path: Path
) -> None:
    raw, packed = tiny
    target = raw_server.url(f"good/{NAME}.gz").replace("http://", "http://u:pa55@")
    raw_server.routes[f"/a/{NAME}.gz"] = lambda r: r.answer(
        b"", "302 Found", f"Location: {target}\r\n"
    )
    with pytest.raises(DownloadError) as info:
        fetch(one_file_spec(raw, packed, raw_server.url("a/")), tmp_path, **quick())
    assert "pa55" not in str(info.value)
    assert str(info.value).endswith(
        f"(refused a redirect (HTTP 302) to {target.replace('pa55', '***')}: "
        "it carries credentials)"
    )


# -- redirects ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "headers", "reason"),
    [
        ("302 Found", "", "HTTP 302 Found without a Location header"),
        ("304 Not Modified", "", "HTTP 304 Not Modified: not a redirect mnist2db follows"),
        (
            "300 Multiple Choices",
            "Location: /elsewhere\r\n",
            "HTTP 300 Multiple Choices: not a redirect mnist2db follows",
        ),
        (
            "302 Found",
            "Location: file:///etc/passwd\r\n",
            "refused a redirect (HTTP 302) to file:///etc/passwd: only http(s) is followed",
        ),
        (
            "301 Moved Permanently",
            "Location: http://:80/mnist/x.gz\r\n",
            "refused a redirect (HTTP 301) to http://:80/mnist/x.gz: no host",
        ),
    ],
)
def test_redirects_that_are_not_followed_say_why_once(
    raw_server: RawServer, tiny: tuple, tmp_path: Path, status: str, headers: str, reason: str
) -> None:
    raw, packed = tiny
    raw_server.routes[f"/a/{NAME}.gz"] = lambda r: r.answer(b"", status, headers)
    with pytest.raises(DownloadError) as info:
        fetch(one_file_spec(raw, packed, raw_server.url("a/")), tmp_path, **quick(retries=3))
    assert str(info.value) == (
        f"{NAME}: no mirror delivered a verified file: {raw_server.url('a/')}{NAME}.gz ({reason})"
    )
    assert raw_server.count(f"/a/{NAME}.gz") == 1  # permanent: not retried


def test_a_redirect_body_is_never_read(raw_server: RawServer, tiny: tuple, tmp_path: Path) -> None:
    raw, packed = tiny
    serve_files(raw_server, "good", packed)
    head = f"HTTP/1.0 302 Found\r\nLocation: /good/{NAME}.gz\r\n\r\n".encode()
    raw_server.routes[f"/a/{NAME}.gz"] = lambda r: r.endless(head, bytes(1 << 16))
    results = fetch(one_file_spec(raw, packed, raw_server.url("a/")), tmp_path, **quick())
    assert results[0].verified_by == ".gz sha256"
    time.sleep(0.2)  # the server notices the hang-up
    assert raw_server.sent[f"/a/{NAME}.gz"] < 8 << 20  # urllib read the body to its end


def test_http_url_without_a_host_is_refused_up_front(tmp_path: Path) -> None:
    code, stderr = run_cli("--data", str(tmp_path / "d"), "--mirror", "http:///mnist/")
    assert code == 1
    assert stderr == "Error: http:///mnist/: not a valid mirror URL (no host)\n"


def test_a_validator_with_control_characters_is_not_sent_back(
    raw_server: RawServer, tiny: tuple, tmp_path: Path
) -> None:
    # A cut answer with a hostile ETag: the resume must not put it into If-Range (http.client
    # refuses such a header value with a ValueError traceback).
    raw, packed = tiny
    body = packed[NAME]
    answers = iter(range(10))
    sent_back: list[str | None] = []

    def cut_then_whole(r: Request) -> None:
        sent_back.append(r.headers.get("If-Range"))
        if next(answers) == 0:
            r.raw(
                f'HTTP/1.0 200 OK\r\nContent-Length: {len(body)}\r\nETag: "a\x0bb"\r\n\r\n'.encode()
                + body[:1000]
            )
        else:
            r.answer(body)

    raw_server.routes[f"/a/{NAME}.gz"] = cut_then_whole
    results = fetch(one_file_spec(raw, packed, raw_server.url("a/")), tmp_path, **quick())
    assert results[0].status == "downloaded"
    assert raw_server.count(f"/a/{NAME}.gz") == 2
    assert sent_back == [None, None]  # resumed from byte 1000 without the hostile ETag


# -- time and requests ----------------------------------------------------------------------


def test_a_restart_from_zero_is_an_attempt_without_progress(
    raw_server: RawServer, tiny: tuple, tmp_path: Path
) -> None:
    # Range ignored, each answer cut one byte later than the one before: on main, 301
    # requests with --retries 0 (a new most-bytes-ever counted as progress).
    raw, packed = tiny
    body = packed[NAME]
    answered = [0]

    def cut_later_each_time(r: Request) -> None:
        answered[0] += 1
        head = f"HTTP/1.0 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        r.raw(head + body[: 1000 + answered[0]])

    raw_server.routes[f"/a/{NAME}.gz"] = cut_later_each_time
    with pytest.raises(DownloadError) as info:
        fetch(one_file_spec(raw, packed, raw_server.url("a/")), tmp_path, **quick(retries=0))
    assert raw_server.count(f"/a/{NAME}.gz") == 2
    assert str(info.value).endswith(
        f"(connection closed after 1002 of {len(body)} bytes, after 1 attempt)"
    )
    with pytest.raises(DownloadError):
        fetch(one_file_spec(raw, packed, raw_server.url("a/")), tmp_path, **quick(retries=2))
    assert raw_server.count(f"/a/{NAME}.gz") == 2 + 4


def test_a_dripping_server_is_abandoned_by_the_low_speed_limit(
    raw_server: RawServer, tiny: tuple, tmp_path: Path
) -> None:
    raw, packed = tiny
    body = packed[NAME]
    serve_files(raw_server, "good", packed)

    def drip(r: Request) -> None:
        r.raw(f"HTTP/1.0 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        for byte in body:
            if raw_server.stop.wait(0.02):
                return
            r.raw(bytes([byte]))

    raw_server.routes[f"/a/{NAME}.gz"] = drip
    spec = one_file_spec(raw, packed, raw_server.url("a/"), raw_server.url("good/"))
    start = time.monotonic()
    results = fetch(spec, tmp_path, speed_limit=1000, speed_time=0.5, **quick(timeout=2))
    assert time.monotonic() - start < 3  # --timeout alone: 23 minutes (one byte per 20 ms)
    assert results[0].source == raw_server.url(f"good/{NAME}.gz")
    with pytest.raises(DownloadError) as info:
        fetch(
            one_file_spec(raw, packed, raw_server.url("a/")),
            tmp_path / "x",
            speed_limit=1000,
            speed_time=0.5,
            **quick(timeout=2),
        )
    assert re.search(
        r"\(too slow: \d+ bytes in 0\.\d s, under the low-speed limit of 1000 bytes/s for "
        r"0\.5 s\)$",
        str(info.value),
    ), str(info.value)


def test_a_byte_per_connection_is_caught_across_attempts(
    raw_server: RawServer, tiny: tuple, tmp_path: Path
) -> None:
    # Range honoured, one byte per answer: every attempt is progress; the low-speed limit
    # spans the attempts and ends it.
    raw, packed = tiny
    body = packed[NAME]

    def one_byte(r: Request) -> None:
        start = int((r.headers.get("Range") or "bytes=0-")[6:-1])
        time.sleep(0.01)
        status = "206 Partial Content" if start else "200 OK"
        extra = f"Content-Range: bytes {start}-{len(body) - 1}/{len(body)}\r\n" if start else ""
        r.raw(
            f"HTTP/1.0 {status}\r\nContent-Length: {len(body) - start}\r\n{extra}\r\n".encode()
            + body[start : start + 1]
        )

    raw_server.routes[f"/a/{NAME}.gz"] = one_byte
    with pytest.raises(DownloadError, match=r"too slow: "):
        fetch(
            one_file_spec(raw, packed, raw_server.url("a/")),
            tmp_path,
            speed_limit=1000,
            speed_time=0.3,
            **quick(retries=0),
        )
    assert 5 < raw_server.count(f"/a/{NAME}.gz") < 100


@pytest.mark.parametrize("redirect", [False, True])
def test_a_response_head_dripped_a_byte_at_a_time_meets_its_deadline(
    raw_server: RawServer, tiny: tuple, tmp_path: Path, redirect: bool
) -> None:
    # The status line and headers, a byte every 20 ms: each wait is short, so --timeout
    # never fires; the head is due within --timeout plus --speed-time (redirects included).
    raw, packed = tiny
    serve_files(raw_server, "good", packed)
    head = b"HTTP/1.0 200 OK\r\n" + b"X-Pad: " + b"x" * 2000 + b"\r\n"

    def drip_head(r: Request) -> None:
        for byte in head:
            if raw_server.stop.wait(0.02):
                return
            r.raw(bytes([byte]))

    raw_server.routes[f"/a/{NAME}.gz"] = drip_head
    raw_server.routes[f"/r/{NAME}.gz"] = lambda r: r.answer(
        b"", "302 Found", f"Location: /a/{NAME}.gz\r\n"
    )
    first = raw_server.url("r/" if redirect else "a/")
    spec = one_file_spec(raw, packed, first, raw_server.url("good/"))
    start = time.monotonic()
    results = fetch(spec, tmp_path, speed_time=0.25, **quick(timeout=0.25, retries=1))
    assert time.monotonic() - start < 4  # on main: 40 s per attempt (2000 bytes at 50/s)
    assert results[0].source == raw_server.url(f"good/{NAME}.gz")
    assert raw_server.count(f"/a/{NAME}.gz") == 2  # one attempt and one retry
    with pytest.raises(DownloadError) as info:
        fetch(
            one_file_spec(raw, packed, first),
            tmp_path / "x",
            speed_time=0.25,
            **quick(timeout=0.25, retries=0),
        )
    assert str(info.value).endswith("(no response within 0.5 s, after 1 attempt)")


def test_cli_low_speed_options(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["fetch", "--help"])
    assert "--speed-limit BYTES" in result.output and "--speed-time SECONDS" in result.output
    code, _ = run_cli("--speed-time", "0")
    assert code == 2
    from mnist2db.cli import fetch_commands
    from mnist2db.fetch import transport

    assert fetch_commands.DEFAULT_SPEED_LIMIT == transport.DEFAULT_SPEED_LIMIT
    assert fetch_commands.DEFAULT_SPEED_TIME == transport.DEFAULT_SPEED_TIME


# -- bytes on disk --------------------------------------------------------------------------

GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
EMPTY_STORED_BLOCK = b"\x00\x00\x00\xff\xff"  # not final, 0 bytes: deflate may repeat it


@pytest.mark.parametrize("keep_gz", [False, True])
def test_an_endless_gzip_member_is_stopped_and_the_next_mirror_tried(
    raw_server: RawServer, tiny: tuple, tmp_path: Path, keep_gz: bool
) -> None:
    raw, packed = tiny
    serve_files(raw_server, "good", packed)
    head = b"HTTP/1.0 200 OK\r\n\r\n" + GZIP_HEADER
    raw_server.routes[f"/a/{NAME}.gz"] = lambda r: r.endless(head, EMPTY_STORED_BLOCK * 4096)
    spec = one_file_spec(raw, packed, raw_server.url("a/"), raw_server.url("good/"))
    results = fetch(spec, tmp_path, keep_gz=keep_gz, **quick())
    assert results[0].source == raw_server.url(f"good/{NAME}.gz")
    time.sleep(0.2)
    assert raw_server.sent[f"/a/{NAME}.gz"] < 8 << 20
    assert sorted(os.listdir(tmp_path)) == sorted(
        [MANIFEST_NAME, NAME, *([f"{NAME}.gz"] if keep_gz else [])]
    )
    with pytest.raises(ChecksumError) as info:
        fetch(one_file_spec(raw, packed, raw_server.url("a/")), tmp_path / "x", **quick())
    assert str(info.value).endswith("(more than 1048576 bytes, without unpacking to an IDX header)")


def test_a_gzip_bomb_stops_at_the_size_its_idx_header_declares(
    raw_server: RawServer, tiny: tuple, tmp_path: Path
) -> None:
    raw, packed = tiny
    header = struct.pack(">IIII", 0x803, 30, 28, 28)  # 23 536 bytes declared
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = packer.compress(header)
    zeros = bytes(1 << 20)
    for _ in range(256):  # 256 MiB of zeros in about 250 kB
        bomb += packer.compress(zeros)
    bomb += packer.flush()
    headerless = gzip.compress(bytes(1 << 20), mtime=0)
    raw_server.routes[f"/a/{NAME}.gz"] = lambda r: r.answer(bomb)
    raw_server.routes[f"/b/{NAME}.gz"] = lambda r: r.answer(headerless)
    spec = one_file_spec(raw, packed, raw_server.url("a/"), raw_server.url("b/"))
    with pytest.raises(ChecksumError) as info:
        fetch(spec, tmp_path, **quick())
    assert str(info.value) == (
        f"{NAME}: rejected from every source: "
        f"{raw_server.url('a/')}{NAME}.gz (unpacks past the 23536 bytes its IDX header declares); "
        f"{raw_server.url('b/')}{NAME}.gz (not an IDX file (it starts with 00000000))"
    )
    assert not tmp_path.exists() or os.listdir(tmp_path) == []


def test_an_idx_header_declaring_more_than_any_mnist_file_is_refused(
    raw_server: RawServer, tiny: tuple, tmp_path: Path
) -> None:
    raw, packed = tiny
    huge = gzip.compress(struct.pack(">IIII", 0x803, 2_000_000, 28, 28) + bytes(4096))
    raw_server.routes[f"/a/{NAME}.gz"] = lambda r: r.answer(huge)
    with pytest.raises(ChecksumError) as info:
        fetch(one_file_spec(raw, packed, raw_server.url("a/")), tmp_path, **quick())
    assert str(info.value).endswith(
        "(its IDX header declares 1568000016 bytes (2000000 x 28 x 28), more than the "
        "1073741824 bytes an MNIST-format file can be)"
    )


def test_a_content_length_past_the_bound_is_refused_before_reading(
    raw_server: RawServer, tiny: tuple, tmp_path: Path
) -> None:
    raw, packed = tiny
    raw_server.routes[f"/a/{NAME}.gz"] = lambda r: r.endless(
        b"HTTP/1.0 200 OK\r\nContent-Length: 10000000000\r\n\r\n", bytes(1 << 16)
    )
    with pytest.raises(ChecksumError) as info:
        fetch(one_file_spec(raw, packed, raw_server.url("a/")), tmp_path, **quick())
    assert str(info.value).endswith(
        "(10000000000 bytes announced, more than a packed file of 1073741824 bytes can take)"
    )
    time.sleep(0.2)
    assert raw_server.sent[f"/a/{NAME}.gz"] < 8 << 20


def test_published_packed_size_bounds_a_file_only_its_packed_digest_can_match(
    raw_server: RawServer, tiny: tuple, tmp_path: Path
) -> None:
    # KMNIST-like: only .gz digests, and the catalog publishes the .gz's size.
    raw, packed = tiny
    body = packed[NAME]
    spec = Dataset(
        "sized",
        (raw_server.url("a/"),),
        (Resource(NAME, gz={"sha256": sha256(body)}, size=len(body)),),
    )
    raw_server.routes[f"/a/{NAME}.gz"] = lambda r: r.raw(
        b"HTTP/1.0 200 OK\r\n\r\n" + body + bytes(100)
    )
    with pytest.raises(ChecksumError) as info:
        fetch(spec, tmp_path, **quick())
    assert str(info.value).endswith(
        f"(more than {len(body)} bytes, {NAME}.gz is published as {len(body)} bytes)"
    )


def test_a_sparse_file_in_a_mirror_directory_is_refused_by_its_size(
    tiny: tuple, tmp_path: Path
) -> None:
    raw, packed = tiny
    cache = tmp_path / "cache"
    cache.mkdir()
    with open(cache / NAME, "wb") as handle:
        handle.truncate(200 << 30)  # 200 GiB, sparse: hashing it would take minutes
    start = time.monotonic()
    with pytest.raises(ChecksumError) as info:
        fetch(one_file_spec(raw, packed), tmp_path / "out", mirrors=[str(cache)], **quick())
    assert time.monotonic() - start < 2
    assert str(info.value).endswith(
        "(214748364800 bytes announced, the 1073741824 bytes a file of this dataset can be)"
    )


# -- memory and xz padding ------------------------------------------------------------------


def xz_with_dictionary(data: bytes, dict_bits: int) -> bytes:
    """``data`` as .xz whose LZMA2 filter declares the dictionary size code ``dict_bits``
    (37: 1.5 GiB), the block header's CRC32 fixed: a valid file that asks for that memory."""
    packed = bytearray(lzma.compress(data, check=lzma.CHECK_CRC32))
    start = 12  # after the stream header
    size = (packed[start] + 1) * 4
    header = packed[start : start + size]
    flags = header[1]
    assert flags & 0xC0 == 0, "no sizes in the block header"
    assert header[2] == 0x21 and header[3] == 1  # LZMA2, one property byte
    header[4] = dict_bits
    header[-4:] = struct.pack("<I", zlib.crc32(bytes(header[:-4])))
    packed[start : start + size] = header
    return bytes(packed)


def test_an_xz_asking_for_a_huge_dictionary_is_refused(
    raw_server: RawServer, tmp_path: Path
) -> None:
    data = idx_bytes(np.zeros(100, dtype=np.uint8))
    hostile = xz_with_dictionary(data, 37)
    assert lzma.decompress(xz_with_dictionary(data, 16)) == data  # the crafting is sound
    spec = Dataset(
        "xz", (raw_server.url("q/"),), (Resource(NAME, gz={"md5": "0" * 32}, packing="xz"),)
    )
    raw_server.routes[f"/q/{NAME}.xz"] = lambda r: r.answer(hostile)
    with pytest.raises(ChecksumError) as info:
        fetch(spec, tmp_path, **quick())
    assert str(info.value).endswith("(xz data needs more than 128 MiB of memory to unpack)")


@pytest.mark.parametrize("padding", [4, 3])
def test_xz_stream_padding(tmp_path: Path, padding: int) -> None:
    # Padding that fills whole reads (the directory source reads 64 KiB at a time) between
    # two streams and at the end, as xz(1) accepts it; padding not a multiple of 4 is not xz.
    data = idx_bytes(np.arange(200_000, dtype=np.uint8) % 7)
    half = len(data) // 2
    body = lzma.compress(data[:half]) + bytes(1 << 17) + lzma.compress(data[half:])
    body += bytes(padding)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / f"{NAME}.xz").write_bytes(body)
    spec = Dataset(
        "xz", (), (Resource(NAME, unpacked={"sha256": sha256(data)}, packing="xz"),), splits=()
    )
    if padding % 4:
        with pytest.raises(ChecksumError, match=r"\(xz stream padding of 3 bytes, not a multiple"):
            fetch(spec, tmp_path / "out", mirrors=[str(cache)], **quick())
        return
    results = fetch(spec, tmp_path / "out", mirrors=[str(cache)], **quick())
    assert results[0].verified_by == "unpacked sha256"
    assert (tmp_path / "out" / NAME).read_bytes() == data


# -- local sources that are not regular files ----------------------------------------------


def bounded(call: Callable[[], object], fifos: list[Path], seconds: float = 5) -> object:
    """Run ``call`` in a thread; if it is still waiting after ``seconds`` (a FIFO open on
    main), open each FIFO for writing to release it, and fail."""
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for fifo in fifos:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        thread.join(5)
        pytest.fail(f"still waiting after {seconds} s: a FIFO was opened blocking")
    return outcome[0]


def test_a_fifo_in_a_mirror_directory_is_refused_without_waiting(
    tiny: tuple, tmp_path: Path
) -> None:
    raw, packed = tiny
    hostile, good = tmp_path / "hostile", tmp_path / "good"
    hostile.mkdir()
    good.mkdir()
    fifo = hostile / f"{NAME}.gz"
    os.mkfifo(fifo)
    (good / f"{NAME}.gz").write_bytes(packed[NAME])
    spec = one_file_spec(raw, packed)
    out = tmp_path / "out"
    results = bounded(
        lambda: fetch(spec, out, mirrors=[str(hostile), str(good)], **quick()), [fifo]
    )
    assert isinstance(results, list), results
    assert results[0].source == str(good / f"{NAME}.gz")
    error = bounded(lambda: fetch(spec, tmp_path / "o2", mirrors=[str(hostile)], **quick()), [fifo])
    assert isinstance(error, DownloadError)
    assert str(error) == (
        f"{NAME}: no mirror delivered a verified file: {fifo} "
        "(cannot read: not a regular file (a FIFO))"
    )


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge"])
def test_a_manifest_that_is_not_one_is_named_in_one_line(
    tiny: tuple, tmp_path: Path, kind: str
) -> None:
    raw, packed = tiny
    data = tmp_path / "data"
    data.mkdir()
    manifest = data / MANIFEST_NAME
    if kind == "fifo":
        os.mkfifo(manifest)
        why = "not a regular file (a FIFO)"
    elif kind == "dev-zero":
        manifest.symlink_to("/dev/zero")
        why = "not a regular file (a character device)"
    else:
        with open(manifest, "wb") as handle:
            handle.truncate(1 << 30)
        why = "larger than 65536 bytes"
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / f"{NAME}.gz").write_bytes(packed[NAME])
    spec = one_file_spec(raw, packed)
    error = bounded(
        lambda: fetch(spec, data, mirrors=[str(cache)], **quick()),
        [manifest] if kind == "fifo" else [],
    )
    assert isinstance(error, DownloadError), error
    assert str(error) == f"{manifest}: {why}; not a manifest mnist2db wrote (remove it)"
    assert os.path.lexists(manifest)  # not ours to remove
    assert sorted(os.listdir(data)) == [MANIFEST_NAME]


# -- directories the run made ---------------------------------------------------------------


def test_a_failed_fetch_removes_the_directories_it_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny: tuple
) -> None:
    raw, packed = tiny
    monkeypatch.setitem(DATASETS, "mnist", make_spec(raw, packed, ("http://127.0.0.1:9/",)))
    monkeypatch.setattr(fetch_module, "DEFAULT_BACKOFF", 0.0)
    code, stderr = run_cli("--data", str(tmp_path / "a" / "b" / "c"), "--retries", "0")
    assert code == 1 and stderr.startswith("Error: train-images-idx3-ubyte: no mirror ")
    assert os.listdir(tmp_path) == []
    (tmp_path / "a").mkdir()
    code, _ = run_cli("--data", str(tmp_path / "a" / "b" / "c"), "--retries", "0")
    assert code == 1
    assert os.listdir(tmp_path) == ["a"] and os.listdir(tmp_path / "a") == []
