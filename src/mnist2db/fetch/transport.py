"""Transport: bytes of one file from an HTTP(S) mirror or a local directory, into a sink.

HTTPS certificates are always verified; proxies come from the environment (``https_proxy``,
``http_proxy``, ``no_proxy``) as urllib reads them. A redirect from https to anything else
is refused. Transient failures (connection reset or cut, timeout, HTTP 5xx) are retried
with backoff, resuming with an HTTP ``Range`` request where the server allows it.

Every source is bounded in time and requests: ``timeout`` bounds each wait, the low-speed
limit (curl's ``--speed-limit``/``--speed-time``) the whole transfer, ``retries`` the
attempts that bring nothing new (a restart from zero is one), :data:`MAX_RESUMES` those
that do. Bytes are bounded by the sink. What a server says (its reason phrase, headers,
the URL it redirects to) reaches a message only through :func:`~mnist2db.untrusted.clean`.

A source's faults are :class:`~mnist2db.fetch.sink.SourceFailed` (the next source is tried); a
failure to write the local temporary is an ``OSError`` that stops the fetch.
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Protocol

from mnist2db.errors import DownloadError
from mnist2db.fetch.connections import HeadWatch, opener
from mnist2db.fetch.failures import SourceFailed, Transient
from mnist2db.fetch.sink import CHUNK
from mnist2db.progress import NamedProgress
from mnist2db.untrusted import clean, open_regular, shown_url
from mnist2db.version import __version__

#: ``progress(file_name, bytes_done, bytes_total)``; total is 0 when unknown.
FetchProgress = NamedProgress

#: The low-speed limit: a source slower than DEFAULT_SPEED_LIMIT bytes/s for
#: DEFAULT_SPEED_TIME seconds is abandoned for the next one. 1000 B/s is 3 hours for
#: MNIST's 9.9 MB training images: no mirror worth waiting for is that slow.
DEFAULT_SPEED_LIMIT = 1000
DEFAULT_SPEED_TIME = 30.0
#: Attempts that did bring new bytes (resumed with Range) before a source is given up: a
#: real mirror cut this often is not worth more; a hostile one cannot keep us for ever.
MAX_RESUMES = 100


class Sink(Protocol):
    """What a source writes into (:class:`mnist2db.fetch.sink.DownloadSink`)."""

    received: int
    resets: int

    def feed(self, chunk: bytes) -> None: ...

    def reset(self) -> None: ...

    def announce(self, length: int) -> None: ...


def _open(opts: Options, request: urllib.request.Request) -> http.client.HTTPResponse:
    """``opts.opener.open(request)``, its response head due within ``opts.timeout`` plus
    ``opts.speed_time`` seconds (connection, redirects and headers included)."""
    deadline = opts.timeout + opts.speed_time
    watch = HeadWatch(deadline)
    try:
        with watch:
            response: http.client.HTTPResponse = opts.opener.open(request, timeout=opts.timeout)
    except (OSError, http.client.HTTPException) as exc:
        if watch.fired and not isinstance(exc, urllib.error.HTTPError):
            raise Transient(f"no response within {deadline:g} s") from None
        raise
    if watch.fired:
        # Cut by the watch, a head can look complete (its end read as the end of the
        # headers): not to be trusted.
        response.close()
        raise Transient(f"no response within {deadline:g} s")
    return response


@dataclass
class Options:
    timeout: float
    retries: int
    backoff: float
    progress: FetchProgress  # progress.named_reporting: never None
    speed_limit: float = DEFAULT_SPEED_LIMIT
    speed_time: float = DEFAULT_SPEED_TIME
    opener: urllib.request.OpenerDirector = field(default_factory=opener)


class _Pace:
    """The low-speed limit over one source, across its attempts (a source that drips, or
    answers a byte per connection, is caught whichever way it does it)."""

    def __init__(self, limit: float, window: float) -> None:
        self.limit = limit
        self.window = window
        self.restart()

    def restart(self) -> None:
        """Start a new window (after a pause of our own: the backoff)."""
        self.start = time.monotonic()
        self.bytes = 0

    def add(self, count: int) -> None:
        """Count ``count`` bytes received; raises SourceFailed when too slow."""
        self.bytes += count
        if self.limit <= 0:
            return
        elapsed = time.monotonic() - self.start
        if elapsed < self.window:
            return
        if self.bytes < self.limit * elapsed:
            raise SourceFailed(
                f"too slow: {self.bytes} bytes in {elapsed:.1f} s, under the low-speed limit "
                f"of {self.limit:g} bytes/s for {self.window:g} s"
            )
        self.restart()


def is_url(mirror: str) -> bool:
    return urllib.parse.urlsplit(mirror).scheme.lower() in ("http", "https")


def check_mirror(mirror: str) -> None:
    """Refuse, before anything is fetched, a mirror that is neither a URL we speak nor a path."""
    shown = shown_url(mirror)
    try:
        parts = urllib.parse.urlsplit(mirror)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise DownloadError(f"{shown}: not a valid mirror URL ({clean(exc)})") from None
    scheme = parts.scheme.lower()
    if not mirror or ("://" in mirror and scheme not in ("http", "https", "file")):
        raise DownloadError(
            f"{shown!r}: not a mirror: expected an http(s):// or file:// URL or a directory"
        )
    if scheme == "file" and parts.netloc not in ("", "localhost"):
        raise DownloadError(f"{shown}: a file:// URL must name a local path (file:///...)")
    if scheme in ("http", "https"):
        if parts.username is not None or parts.password is not None:
            # urllib would take them for part of the host name; sent as they are they would
            # go in the clear and follow redirects to other hosts. Not supported: refused.
            raise DownloadError(
                f"{shown}: credentials in a mirror URL are not supported "
                "(serve the files without a login, or use a local copy)"
            )
        if not parts.hostname:
            raise DownloadError(f"{shown}: not a valid mirror URL (no host)")


def local_dir(mirror: str) -> str:
    """A plain directory, or the directory of a ``file://`` URL."""
    parts = urllib.parse.urlsplit(mirror)
    if parts.scheme.lower() == "file":
        return urllib.request.url2pathname(parts.path)
    return mirror


def source_for(mirror: str, remote: str) -> str:
    """The URL or path of the file ``remote`` on ``mirror``."""
    if is_url(mirror):
        return urllib.parse.urljoin(mirror if mirror.endswith("/") else mirror + "/", remote)
    return os.path.join(local_dir(mirror), remote)


def download(url: str, sink: Sink, opts: Options, label: str, total: int = 0) -> None:
    """Stream ``url`` into ``sink``: retries transient failures, resumes with ``Range``.

    ``label`` names the file for ``opts.progress``; ``total`` is its expected size (0: unknown).
    An attempt that kept what was received before it and brought bytes never held before is
    progress: the next one follows at once (at most :data:`MAX_RESUMES` of them). Any other
    failed attempt, a restart from zero among them, counts against ``opts.retries``.
    """
    without_progress = 0
    resumes = 0
    most = 0  # the most bytes held at the end of an attempt
    validator: str | None = None
    pace = _Pace(opts.speed_limit, opts.speed_time)
    while True:
        resets = sink.resets
        try:
            total, validator = _download_once(url, sink, opts, label, total, validator, pace)
            return
        except Transient as exc:
            progressed = sink.resets == resets and sink.received > most
            most = max(most, sink.received)
            if progressed:
                resumes += 1
                if resumes > MAX_RESUMES:
                    raise SourceFailed(f"{exc}, cut {resumes} times") from None
                without_progress = 0
                continue
            without_progress += 1
            if without_progress > opts.retries:
                attempts = opts.retries + 1
                plural = "s" if attempts > 1 else ""
                raise SourceFailed(f"{exc}, after {attempts} attempt{plural}") from None
            delay = opts.backoff * 2 ** (without_progress - 1)
            if delay > 0:
                time.sleep(delay)
                pace.restart()
            opts.progress(label, sink.received, total)


def _validator(value: str | None) -> str | None:
    """An ETag or Last-Modified to send back in If-Range, if it is a clean header value."""
    if value and value.isascii() and value.isprintable() and len(value) <= 200:
        return value
    return None


def _download_once(
    url: str,
    sink: Sink,
    opts: Options,
    label: str,
    total: int,
    validator: str | None,
    pace: _Pace,
) -> tuple[int, str | None]:
    """One HTTP request, continuing from ``sink.received``; returns (total, validator)."""
    offset = sink.received
    headers = {"User-Agent": f"mnist2db/{__version__}", "Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        if validator:
            headers["If-Range"] = validator
    request = urllib.request.Request(url, headers=headers)
    try:
        with _open(opts, request) as response:
            length = _content_length(response.headers.get("Content-Length"))
            if response.status == 206 and offset:
                content_range = response.headers.get("Content-Range")
                if _content_range_start(content_range) != offset:
                    sink.reset()
                    raise Transient(f"bad Content-Range {clean(repr(content_range))}")
            elif response.status == 200:
                if offset:
                    sink.reset()  # Range ignored: the whole file again
                total = length or total
                validator = _validator(
                    response.headers.get("ETag") or response.headers.get("Last-Modified")
                )
            else:
                raise SourceFailed(f"unexpected HTTP {response.status} {clean(response.reason)}")
            if length is not None:
                sink.announce(sink.received + length)  # a promise past the bound: refused now
            got = 0
            while True:
                # read1: what has arrived, so a stall loses nothing already received.
                try:
                    chunk = response.read1(CHUNK)
                except (TimeoutError, ConnectionError, ssl.SSLError, http.client.HTTPException):
                    raise  # classified below
                except OSError as exc:
                    # Any other network fault mid-body (host or network unreachable, ...):
                    # not a write error; retry, then the next mirror.
                    raise Transient(f"network error: {exc.strerror or exc}") from None
                if not chunk:
                    break
                got += len(chunk)
                sink.feed(chunk)
                opts.progress(label, sink.received, total)
                pace.add(len(chunk))
            if length is not None and got < length:
                # http.client returns a short body silently when the peer closes early.
                raise Transient(f"connection closed after {got} of {length} bytes")
            return total, validator
    except urllib.error.HTTPError as exc:
        exc.close()
        code = exc.code
        reason = clean(exc.reason)
        if code == 416 and offset:
            sink.reset()
            raise Transient("HTTP 416 Range Not Satisfiable") from None
        if code in (408, 429) or code >= 500:
            raise Transient(f"HTTP {code} {reason}") from None
        if 300 <= code < 400:
            # 301/302/303/307/308 are followed (or refused, saying why) by _Redirects.
            raise SourceFailed(f"HTTP {code} {reason}: not a redirect mnist2db follows") from None
        raise SourceFailed(f"HTTP {code} {reason}") from None
    except urllib.error.URLError as exc:
        cause = exc.reason
        if isinstance(cause, ssl.SSLCertVerificationError):
            raise SourceFailed(
                f"TLS certificate not valid: {clean(cause.verify_message)}"
            ) from None
        if isinstance(cause, SourceFailed):
            raise cause from None
        if isinstance(cause, TimeoutError):
            raise Transient(f"timed out after {opts.timeout:g} s") from None
        if isinstance(cause, socket.gaierror) and cause.errno != socket.EAI_AGAIN:
            # An unknown host stays unknown: no point waiting to ask again (offline machines).
            raise SourceFailed(f"cannot connect: {cause.strerror}") from None
        if not isinstance(cause, OSError):
            # urllib's own refusals ("no host given", "unknown url type"): asking again
            # gets the same answer.
            raise SourceFailed(f"cannot connect: {clean(cause)}") from None
        raise Transient(f"cannot connect: {clean(cause.strerror or cause)}") from None
    except TimeoutError:
        raise Transient(f"timed out after {opts.timeout:g} s") from None
    except ssl.SSLError as exc:
        raise Transient(f"TLS error: {clean(exc.reason or exc)}") from None
    except (http.client.HTTPException, ConnectionError) as exc:
        # http.client quotes what the server sent (BadStatusLine, LineTooLong): cleaned.
        raise Transient(clean(f"connection failed: {type(exc).__name__} {exc}".rstrip())) from None


def _content_length(value: str | None) -> int | None:
    return _decimal(value.strip()) if value is not None else None


def _content_range_start(value: str | None) -> int | None:
    # "bytes 100-199/200"
    if not value or not value.startswith("bytes "):
        return None
    return _decimal(value[6:].split("-", 1)[0].strip())


def _decimal(text: str) -> int | None:
    # str.isdigit() alone accepts "²" (a header is latin-1), which int() refuses.
    return int(text) if text.isascii() and text.isdigit() else None


def read_local(path: str, sink: Sink, opts: Options, label: str) -> None:
    """Stream the local file ``path`` into ``sink``.

    Only a regular file is read (a FIFO or a device in a mirror directory is refused at
    once, never waited on). A read error is the source's (the next one is tried); a write
    error (disk full, file size limit) is not: it propagates as ``OSError`` and stops the
    fetch.
    """
    try:
        handle = open_regular(path)
    except FileNotFoundError:
        raise SourceFailed("not found") from None
    except OSError as exc:
        raise SourceFailed(f"cannot read: {exc.strerror}") from None
    with handle:
        total = os.fstat(handle.fileno()).st_size
        sink.announce(total)
        while True:
            try:
                chunk = handle.read(CHUNK)
            except OSError as exc:
                raise SourceFailed(f"cannot read: {exc.strerror}") from None
            if not chunk:
                break
            sink.feed(chunk)
            opts.progress(label, sink.received, total)
