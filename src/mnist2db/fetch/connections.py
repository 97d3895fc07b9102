"""The HTTP(S) opener fetch uses: certificates always verified, proxies from the
environment, redirects followed only as :class:`_Redirects` allows (never downgraded, never
to another scheme or to credentials, their bodies never read), and connections that hand
their socket to the request's :class:`HeadWatch`, so that a response head dripped a byte at
a time meets a deadline (``--timeout`` alone bounds only each wait)."""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import string
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import IO, Any

from mnist2db.fetch.failures import SourceFailed
from mnist2db.untrusted import clean, shown_url

#: Redirects followed for one request (curl's default is 50; browsers stop at about 20).
MAX_REDIRECTS = 10


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

_WATCHING = threading.local()


class HeadWatch:
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

    def __enter__(self) -> HeadWatch:
        self.timer = threading.Timer(self.seconds, self._fire)
        self.timer.daemon = True
        self.timer.start()
        _WATCHING.current = self
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.timer.cancel()
        _WATCHING.current = None
        with self.lock:
            for sock in self.sockets:
                sock.close()
            self.sockets.clear()


def _watched(create: Callable[..., socket.socket]) -> Callable[..., socket.socket]:
    def create_connection(*args: Any, **kwargs: Any) -> socket.socket:
        sock = create(*args, **kwargs)
        watch = getattr(_WATCHING, "current", None)
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


def opener() -> urllib.request.OpenerDirector:
    # build_opener adds a ProxyHandler reading the environment's proxies; the context
    # verifies certificates and host names (there is deliberately no way to turn that off).
    context = ssl.create_default_context()
    return urllib.request.build_opener(_HTTPHandler(), _HTTPSHandler(context), _Redirects())
