"""Transport: bytes of one file from an HTTP(S) mirror or a local directory, into a sink.

HTTPS certificates are always verified; proxies come from the environment (``https_proxy``,
``http_proxy``, ``no_proxy``) as urllib reads them. A redirect from https to anything else
is refused. Transient failures (connection reset or cut, timeout, HTTP 5xx) are retried
with backoff, resuming with an HTTP ``Range`` request where the server allows it.

Every source is bounded in time and requests: ``timeout`` bounds each wait, the low-speed
limit (curl's ``--speed-limit``/``--speed-time``) the whole transfer, ``retries`` the
attempts that bring nothing new (a restart from zero is one), :data:`MAX_RESUMES` those
that do. Bytes are bounded by the sink. What a server says (its reason phrase, headers,
the URL it redirects to) reaches a message only through :func:`~mnist2db.fetch.sink.clean`.

A source's faults are :class:`~mnist2db.fetch.sink.SourceFailed` (the next source is tried); a
failure to write the local temporary is an ``OSError`` that stops the fetch.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import ssl
import string
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from mnist2db import __version__
from mnist2db.errors import DownloadError
from mnist2db.fetch.sink import CHUNK, SourceFailed, Transient, clean, open_regular
from mnist2db.progress import NamedProgress

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
#: Redirects followed for one request (curl's default is 50; browsers stop at about 20).
MAX_REDIRECTS = 10


class Sink(Protocol):
    """What a source writes into (:class:`mnist2db.fetch.sink.DownloadSink`)."""

    received: int
    resets: int

    def feed(self, chunk: bytes) -> None: ...

    def reset(self) -> None: ...

    def announce(self, length: int) -> None: ...


def shown_url(url: str) -> str:
    """``url`` as it may be printed: any password masked, control characters spelled out."""
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:
        password = None
    if password is not None:
        user, _, host = parts.netloc.rpartition("@")
        user = user.split(":", 1)[0]
        url = urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    return clean(url, 2000)


def _redirect_refusal(old: str, new: str) -> str | None:
    """Why a redirect from ``old`` to ``new`` is not followed, or None."""
    try:
        parts = urllib.parse.urlsplit(new)
        hostname = parts.hostname
    except ValueError:
        return "not a valid URL"
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        return "only http(s) is followed"
    if urllib.parse.urlsplit(old).scheme.lower() == "https" and scheme != "https":
        return "https is never downgraded"
    if not hostname:
        return "no host"
    if parts.username is not None or parts.password is not None:
        return "it carries credentials"
    return None


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Redirects as urllib follows them, with these differences: the redirect's body is
    never read (it may be endless), https is never downgraded, only http(s) without
    credentials is followed, and every refusal says what it is."""

    def http_error_302(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
    ) -> IO[bytes]:
        fp.close()
        location = (headers.get("Location") or "").strip()
        if not location:
            raise SourceFailed(f"HTTP {code} {clean(msg)} without a Location header")
        # As urllib: recover the header's bytes, percent-encode spaces and non-ASCII bytes.
        location = urllib.parse.quote(location, encoding="iso-8859-1", safe=string.punctuation)
        newurl = urllib.parse.urljoin(req.full_url, location)
        refusal = _redirect_refusal(req.full_url, newurl)
        if refusal is not None:
            raise SourceFailed(
                f"refused a redirect (HTTP {code}) to {shown_url(newurl)}: {refusal}"
            )
        visited: dict[str, int] = getattr(req, "redirect_dict", {})
        if newurl in visited or len(visited) >= MAX_REDIRECTS:
            raise SourceFailed(f"too many redirects (HTTP {code})")
        new = self.redirect_request(req, fp, code, msg, headers, newurl)
        if new is None:  # pragma: no cover - only for methods other than GET/HEAD
            raise SourceFailed(f"HTTP {code} {clean(msg)}: redirect not followed")
        new.redirect_dict = {**visited, newurl: 1}  # type: ignore[attr-defined]
        return self.parent.open(new, timeout=req.timeout)  # type: ignore[no-any-return]

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


# -- the response head's deadline ---------------------------------------------------------
# --timeout bounds each wait, so a server sending its status line and headers a byte at a
# time would hold a request for ever (http.client reads them before any code of ours runs).
# The connections below hand their socket to the request's watch, which shuts it down when
# the whole head has not arrived by its deadline.

_watching = threading.local()


class _HeadWatch:
    """Shuts down the connections of one request still waiting for its response head
    ``seconds`` after it started (a redirect's hops included)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.fired = False
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []

    def attach(self, sock: socket.socket) -> None:
        with self.lock:
            # A duplicate: shutting it down ends the connection, whatever wraps the original
            # (TLS detaches it), and it cannot be a reused descriptor of something else.
            self.sockets.append(sock.dup())
            if self.fired:
                self._shut()

    def _fire(self) -> None:
        with self.lock:
            self.fired = True
            self._shut()

    def _shut(self) -> None:
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> _HeadWatch:
        self.timer = threading.Timer(self.seconds, self._fire)
        self.timer.daemon = True
        self.timer.start()
        _watching.current = self
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.timer.cancel()
        _watching.current = None
        with self.lock:
            for sock in self.sockets:
                sock.close()
            self.sockets.clear()


def _watched(create: Callable[..., socket.socket]) -> Callable[..., socket.socket]:
    def create_connection(*args: Any, **kwargs: Any) -> socket.socket:
        sock = create(*args, **kwargs)
        watch = getattr(_watching, "current", None)
        if watch is not None:
            watch.attach(sock)
        return sock

    return create_connection


class _HTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = _watched(self._create_connection)  # type: ignore[has-type]


class _HTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = _watched(self._create_connection)  # type: ignore[has-type]


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__(context=context)
        self.tls = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPSConnection, req, context=self.tls)


def _opener() -> urllib.request.OpenerDirector:
    # build_opener adds a ProxyHandler reading the environment's proxies; the context
    # verifies certificates and host names (there is deliberately no way to turn that off).
    context = ssl.create_default_context()
    return urllib.request.build_opener(_HTTPHandler(), _HTTPSHandler(context), _Redirects())


def _open(opts: Options, request: urllib.request.Request) -> http.client.HTTPResponse:
    """``opts.opener.open(request)``, its response head due within ``opts.timeout`` plus
    ``opts.speed_time`` seconds (connection, redirects and headers included)."""
    deadline = opts.timeout + opts.speed_time
    watch = _HeadWatch(deadline)
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
    opener: urllib.request.OpenerDirector = field(default_factory=_opener)


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
