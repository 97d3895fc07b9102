"""Transport: bytes of one file from an HTTP(S) mirror or a local directory, into a sink.

HTTPS certificates are always verified; proxies come from the environment (``https_proxy``,
``http_proxy``, ``no_proxy``) as urllib reads them. A redirect from https to anything else
is refused. Transient failures (connection reset or cut, timeout, HTTP 5xx) are retried
with backoff, resuming with an HTTP ``Range`` request where the server allows it.

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
from typing import IO, Protocol

from mnist2db import __version__
from mnist2db.errors import DownloadError
from mnist2db.fetch.sink import CHUNK, SourceFailed, Transient
from mnist2db.progress import NamedProgress

#: ``progress(file_name, bytes_done, bytes_total)``; total is 0 when unknown.
FetchProgress = NamedProgress


class Sink(Protocol):
    """What a source writes into (:class:`mnist2db.fetch.sink.DownloadSink`)."""

    received: int

    def feed(self, chunk: bytes) -> None: ...

    def reset(self) -> None: ...


class _NoDowngradeRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects, but never from https to plain http (or to another scheme)."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        new_scheme = urllib.parse.urlsplit(newurl).scheme.lower()
        old_scheme = urllib.parse.urlsplit(req.full_url).scheme.lower()
        if new_scheme not in ("http", "https") or (old_scheme == "https" and new_scheme != "https"):
            fp.close()
            raise SourceFailed(f"refused a redirect from {req.full_url} to {newurl}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _opener() -> urllib.request.OpenerDirector:
    # build_opener adds a ProxyHandler reading the environment's proxies; the context
    # verifies certificates and host names (there is deliberately no way to turn that off).
    context = ssl.create_default_context()
    return urllib.request.build_opener(
        urllib.request.HTTPSHandler(context=context), _NoDowngradeRedirects()
    )


@dataclass
class Options:
    timeout: float
    retries: int
    backoff: float
    progress: FetchProgress  # progress.named_reporting: never None
    opener: urllib.request.OpenerDirector = field(default_factory=_opener)


def is_url(mirror: str) -> bool:
    return urllib.parse.urlsplit(mirror).scheme.lower() in ("http", "https")


def check_mirror(mirror: str) -> None:
    """Refuse, before anything is fetched, a mirror that is neither a URL we speak nor a path."""
    try:
        parts = urllib.parse.urlsplit(mirror)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise DownloadError(f"{mirror}: not a valid mirror URL ({exc})") from None
    scheme = parts.scheme.lower()
    if not mirror or ("://" in mirror and scheme not in ("http", "https", "file")):
        raise DownloadError(
            f"{mirror!r}: not a mirror: expected an http(s):// or file:// URL or a directory"
        )
    if scheme == "file" and parts.netloc not in ("", "localhost"):
        raise DownloadError(f"{mirror}: a file:// URL must name a local path (file:///...)")


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
    """
    attempts_without_progress = 0
    best = 0
    validator: str | None = None
    while True:
        try:
            total, validator = _download_once(url, sink, opts, label, total, validator)
            return
        except Transient as exc:
            if sink.received > best:
                best = sink.received
                attempts_without_progress = 0  # it moved on: resume at once
                continue
            attempts_without_progress += 1
            if attempts_without_progress > opts.retries:
                attempts = opts.retries + 1
                plural = "s" if attempts > 1 else ""
                raise SourceFailed(f"{exc}, after {attempts} attempt{plural}") from None
            delay = opts.backoff * 2 ** (attempts_without_progress - 1)
            if delay > 0:
                time.sleep(delay)
            opts.progress(label, sink.received, total)


def _download_once(
    url: str, sink: Sink, opts: Options, label: str, total: int, validator: str | None
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
        with opts.opener.open(request, timeout=opts.timeout) as response:
            length = _content_length(response.headers.get("Content-Length"))
            if response.status == 206 and offset:
                start = _content_range_start(response.headers.get("Content-Range"))
                if start != offset:
                    sink.reset()
                    raise Transient(f"bad Content-Range {response.headers.get('Content-Range')!r}")
            elif response.status == 200:
                if offset:
                    sink.reset()  # Range ignored: the whole file again
                total = length or total
                validator = response.headers.get("ETag") or response.headers.get("Last-Modified")
            else:
                raise SourceFailed(f"unexpected HTTP {response.status} {response.reason}")
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
            if length is not None and got < length:
                # http.client returns a short body silently when the peer closes early.
                raise Transient(f"connection closed after {got} of {length} bytes")
            return total, validator
    except urllib.error.HTTPError as exc:
        exc.close()
        code = exc.code
        if code == 416 and offset:
            sink.reset()
            raise Transient("HTTP 416 Range Not Satisfiable") from None
        if code in (408, 429) or code >= 500:
            raise Transient(f"HTTP {code} {exc.reason}") from None
        if 300 <= code < 400:
            raise SourceFailed(f"too many redirects (HTTP {code})") from None
        raise SourceFailed(f"HTTP {code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise SourceFailed(f"TLS certificate not valid: {reason.verify_message}") from None
        if isinstance(reason, SourceFailed):
            raise reason from None
        if isinstance(reason, TimeoutError):
            raise Transient(f"timed out after {opts.timeout:g} s") from None
        if isinstance(reason, socket.gaierror) and reason.errno != socket.EAI_AGAIN:
            # An unknown host stays unknown: no point waiting to ask again (offline machines).
            raise SourceFailed(f"cannot connect: {reason.strerror}") from None
        text = reason.strerror if isinstance(reason, OSError) and reason.strerror else reason
        raise Transient(f"cannot connect: {text}") from None
    except TimeoutError:
        raise Transient(f"timed out after {opts.timeout:g} s") from None
    except ssl.SSLError as exc:
        raise Transient(f"TLS error: {exc.reason or exc}") from None
    except (http.client.HTTPException, ConnectionError) as exc:
        raise Transient(f"connection failed: {type(exc).__name__} {exc}".rstrip()) from None


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

    A read error is the source's (the next one is tried); a write error (disk full, file
    size limit) is not: it propagates as ``OSError`` and stops the fetch.
    """
    try:
        total = os.path.getsize(path)
        handle = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        raise SourceFailed("not found") from None
    except OSError as exc:
        raise SourceFailed(f"cannot read: {exc.strerror}") from None
    with handle:
        while True:
            try:
                chunk = handle.read(CHUNK)
            except OSError as exc:
                raise SourceFailed(f"cannot read: {exc.strerror}") from None
            if not chunk:
                break
            sink.feed(chunk)
            opts.progress(label, sink.received, total)
