"""Fetch MNIST-format datasets from their mirrors, verify them, unpack them; build both databases.

The datasets are data: :data:`DATASETS` below names, for each dataset, its mirrors in order
and, for each of its four files, the published digests of the ``.gz`` archive and (where
published) of the unpacked file. Mirrors re-compress (Debian's Fashion-MNIST ``.gz`` files
differ from the official ones, their content does not), so a file is accepted when its
``.gz`` digest **or** its unpacked digest matches a published value.

A download streams: bytes from the network are hashed, unpacked and written to a temporary
file beside the destination in one pass, never held whole in memory. The file reaches its
final name (``os.replace`` after ``fsync``) only once verified, so an interrupted or failed
fetch never leaves an unverified file under a final name. Transient failures (connection
reset or cut, timeout, HTTP 5xx) are retried with backoff, resuming with an HTTP ``Range``
request where the server allows it; then the next mirror is tried.

HTTPS certificates are always verified; proxies come from the environment (``https_proxy``,
``http_proxy``, ``no_proxy``) as urllib reads them. A redirect from https to anything else
is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import socket
import ssl
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from . import __version__
from .errors import ChecksumError, DownloadError, IdxFormatError, Mnist2dbError
from .fsutil import AtomicFile, file_mode, fsync_dir, remove_stale, temp_prefix

if TYPE_CHECKING:
    from .conversion import ConvertResult

__all__ = [
    "DATASETS",
    "Dataset",
    "FetchedFile",
    "Resource",
    "create_databases",
    "fetch",
    "get_dataset",
]

# -- the datasets, as data ----------------------------------------------------------------

TRAIN_IMAGES = "train-images-idx3-ubyte"
TRAIN_LABELS = "train-labels-idx1-ubyte"
TEST_IMAGES = "t10k-images-idx3-ubyte"
TEST_LABELS = "t10k-labels-idx1-ubyte"
FILE_NAMES = (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS)


@dataclass(frozen=True)
class Resource:
    """One file of a dataset and its published digests (lowercase hex, by hashlib name).

    Attributes:
        name: the unpacked file name; mirrors serve ``name + ".gz"``.
        gz: digests of the published ``.gz`` archive, e.g. ``{"sha256": "..."}``.
        unpacked: digests of the unpacked file.
        size: published size of the ``.gz`` in bytes (a progress hint only: mirrors
            re-compress).
    """

    name: str
    gz: Mapping[str, str] = field(default_factory=dict)
    unpacked: Mapping[str, str] = field(default_factory=dict)
    size: int | None = None


@dataclass(frozen=True)
class Dataset:
    """A dataset: its name, its mirrors in order of preference, its files."""

    name: str
    mirrors: tuple[str, ...]
    resources: tuple[Resource, ...]


DATASETS: dict[str, Dataset] = {
    "mnist": Dataset(
        name="mnist",
        mirrors=(
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "https://storage.googleapis.com/cvdf-datasets/mnist/",
            "http://yann.lecun.com/exdb/mnist/",
        ),
        resources=(
            Resource(
                TRAIN_IMAGES,
                gz={
                    "sha256": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
                    "md5": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
                },
                unpacked={"md5": "6bbc9ace898e44ae57da46a324031adb"},
                size=9912422,
            ),
            Resource(
                TRAIN_LABELS,
                gz={
                    "sha256": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
                    "md5": "d53e105ee54ea40749a09fcbcd1e9432",
                },
                unpacked={"md5": "a25bea736e30d166cdddb491f175f624"},
                size=28881,
            ),
            Resource(
                TEST_IMAGES,
                gz={
                    "sha256": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
                    "md5": "9fb629c4189551a2d022fa330f9573f3",
                },
                unpacked={"md5": "2646ac647ad5339dbf082846283269ea"},
                size=1648877,
            ),
            Resource(
                TEST_LABELS,
                gz={
                    "sha256": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
                    "md5": "ec29112dd5afa0611ce80d1b7f02629c",
                },
                unpacked={"md5": "27ae3e4e09519cfbb04c329615203637"},
                size=4542,
            ),
        ),
    ),
    "fashion-mnist": Dataset(
        name="fashion-mnist",
        mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
        resources=(
            Resource(
                TRAIN_IMAGES,
                gz={"sha256": "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84"},
                unpacked={
                    "sha256": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888"
                },
            ),
            Resource(
                TRAIN_LABELS,
                gz={"sha256": "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845"},
                unpacked={
                    "sha256": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9"
                },
            ),
            Resource(
                TEST_IMAGES,
                gz={"sha256": "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073"},
                unpacked={
                    "sha256": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b"
                },
            ),
            Resource(
                TEST_LABELS,
                gz={"sha256": "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5"},
                unpacked={
                    "sha256": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"
                },
            ),
        ),
    ),
    "kmnist": Dataset(
        name="kmnist",
        mirrors=("http://codh.rois.ac.jp/kmnist/dataset/kmnist/",),
        resources=(
            Resource(
                TRAIN_IMAGES,
                gz={"sha256": "51467d22d8cc72929e2a028a0428f2086b092bb31cfb79c69cc0a90ce135fde4"},
            ),
            Resource(
                TRAIN_LABELS,
                gz={"sha256": "e38f9ebcd0f3ebcdec7fc8eabdcdaef93bb0df8ea12bee65224341c8183d8e17"},
            ),
            Resource(
                TEST_IMAGES,
                gz={"sha256": "edd7a857845ad6bb1d0ba43fe7e794d164fe2dce499a1694695a792adfac43c5"},
            ),
            Resource(
                TEST_LABELS,
                gz={"sha256": "20bb9a0ef54c7db3efc55a92eef5582c109615df22683c380526788f98e42a1c"},
            ),
        ),
    ),
}

DEFAULT_DATASET = "mnist"
DEFAULT_TIMEOUT = 30.0
DEFAULT_RETRIES = 3
DEFAULT_BACKOFF = 1.0

#: sha256 of the unpacked files this module placed, in ``sha256sum`` format, so that files
#: whose dataset publishes no unpacked digest (KMNIST) are still recognised as verified.
MANIFEST_NAME = ".mnist2db.sha256"

_CHUNK = 1 << 16
_UNPACK_CHUNK = 1 << 20
# An unpacked MNIST-format file is under 60 MB; anything far beyond is not one of them
# (and a decompression bomb must not fill the disk).
_MAX_UNPACKED = 1 << 30

#: ``progress(file_name, bytes_done, bytes_total)``; total is 0 when unknown.
FetchProgress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class FetchedFile:
    """What :func:`fetch` did for one file.

    Attributes:
        name: the file name (``train-images-idx3-ubyte``).
        path: where the unpacked file is.
        status: ``"present"`` (already there and verified: nothing fetched),
            ``"downloaded"`` (from a mirror) or ``"unpacked"`` (from a ``.gz`` kept beside it).
        source: the URL or path it came from (``None`` when present).
        verified_by: which published digest matched, e.g. ``".gz sha256"`` or ``"unpacked md5"``.
        nbytes: bytes read from the source (the ``.gz`` size for a download).
        seconds: time taken.
    """

    name: str
    path: str
    status: str
    source: str | None
    verified_by: str
    nbytes: int
    seconds: float


def get_dataset(dataset: str | Dataset) -> Dataset:
    """The :class:`Dataset` named ``dataset`` (a :class:`Dataset` is returned as is).

    Raises:
        Mnist2dbError: unknown name.
    """
    if isinstance(dataset, Dataset):
        return dataset
    try:
        return DATASETS[dataset]
    except KeyError:
        raise Mnist2dbError(
            f"unknown dataset {dataset!r}: expected one of {', '.join(DATASETS)}"
        ) from None


def default_data_dir(dataset: str | Dataset) -> str:
    """``data/<dataset>``: where :func:`fetch` stores and :func:`create_databases` reads."""
    return os.path.join("data", get_dataset(dataset).name)


def default_out_dir(dataset: str | Dataset) -> str:
    """``examples/<dataset>``, where :func:`create_databases` writes (Caffe: examples/mnist)."""
    return os.path.join("examples", get_dataset(dataset).name)


# -- failures inside one mirror -----------------------------------------------------------


class _SourceFailed(Exception):
    """This source cannot deliver the file; the reason goes into the final error line."""


class _Transient(_SourceFailed):
    """Worth retrying on the same source (connection cut, timeout, 5xx)."""


class _Rejected(_SourceFailed):
    """Delivered, but the bytes match no published digest."""


# -- the streaming sink: hash, unpack, write -----------------------------------------------


def _hashers(algorithms: Iterable[str]) -> dict[str, Any]:
    return {name: hashlib.new(name) for name in sorted(set(algorithms))}


class _Sink:
    """Takes a source's bytes in order: hashes them, unpacks them, writes temp files.

    The unpacked bytes go to a temporary file beside ``final``; the archive itself to a
    second one when ``keep_gz``. :meth:`reset` starts over (a server that ignored ``Range``);
    :meth:`place` moves both to their final names; :meth:`discard` removes what is left.
    """

    def __init__(self, final: str, resource: Resource, *, compressed: bool, keep_gz: bool) -> None:
        self.final = final
        self.resource = resource
        self.compressed = compressed
        directory = os.path.dirname(final) or "."
        prefix = temp_prefix(os.path.basename(final))
        # Temporaries of killed fetches of this file are recognised by name and removed.
        remove_stale(directory, prefix, directories=False, extensions=(".gz",))
        prefix = f"{prefix}{os.getpid()}-"
        self.raw_path = _mkstemp(directory, prefix)
        self.gz_path: str | None = None
        try:
            self.raw_file: IO[bytes] = open(self.raw_path, "wb")  # noqa: SIM115 - closed in discard
            self.gz_file: IO[bytes] | None = None
            if compressed and keep_gz:
                self.gz_path = _mkstemp(directory, prefix, suffix=".gz")
                self.gz_file = open(self.gz_path, "wb")  # noqa: SIM115
        except BaseException:
            self.discard()
            raise
        self.reset()

    def reset(self) -> None:
        """Forget everything received so far."""
        gz_algos = ["sha256", *self.resource.gz] if self.compressed else []
        self.gz_hashers = _hashers(gz_algos)
        self.raw_hashers = _hashers(["sha256", *self.resource.unpacked])
        self.received = 0
        self.unpacked = 0
        self.raw_sha256 = ""
        self.gz_sha256: str | None = None
        self._unpacker: Any = zlib.decompressobj(wbits=31) if self.compressed else None
        for handle in (self.raw_file, self.gz_file):
            if handle is not None:
                handle.seek(0)
                handle.truncate()

    def feed(self, chunk: bytes) -> None:
        if self.compressed and self.received == 0 and chunk[:2] != b"\x1f\x8b"[: len(chunk)]:
            raise _Rejected(f"not gzip data (it starts with {_preview(chunk)})")
        self.received += len(chunk)
        for hasher in self.gz_hashers.values():
            hasher.update(chunk)
        if self.gz_file is not None:
            self.gz_file.write(chunk)
        if self.compressed:
            self._unpack(chunk)
        else:
            self._write(chunk)

    def _unpack(self, data: bytes) -> None:
        try:
            while data:
                if self._unpacker.eof:
                    # A gzip file may hold several members, one after another.
                    self._unpacker = zlib.decompressobj(wbits=31)
                self._write(self._unpacker.decompress(data, _UNPACK_CHUNK))
                data = (
                    self._unpacker.unused_data
                    if self._unpacker.eof
                    else self._unpacker.unconsumed_tail
                )
        except zlib.error as exc:
            raise _Rejected(f"corrupt gzip data at byte {self.received} ({exc})") from None

    def _write(self, data: bytes) -> None:
        self.unpacked += len(data)
        if self.unpacked > _MAX_UNPACKED:
            raise _Rejected(f"unpacks to more than {_MAX_UNPACKED} bytes; not an IDX file")
        for hasher in self.raw_hashers.values():
            hasher.update(data)
        self.raw_file.write(data)

    def finish(self) -> str:
        """Check the stream is complete and matches a published digest; returns which one."""
        if self.compressed:
            if self.received == 0:
                raise _Rejected("empty response")
            try:
                while not self._unpacker.eof and self._unpacker.unconsumed_tail:
                    self._write(
                        self._unpacker.decompress(self._unpacker.unconsumed_tail, _UNPACK_CHUNK)
                    )
            except zlib.error as exc:
                raise _Rejected(f"corrupt gzip data ({exc})") from None
            if not self._unpacker.eof:
                raise _Rejected(f"gzip data ends early (after {self.received} bytes)")
        gz = {name: h.hexdigest() for name, h in self.gz_hashers.items()}
        raw = {name: h.hexdigest() for name, h in self.raw_hashers.items()}
        self.raw_sha256 = raw["sha256"]
        self.gz_sha256 = gz.get("sha256")
        return _match(self.resource, gz, raw)

    def place(self) -> None:
        """fsync the verified temp files and move them to their final names."""
        mode = file_mode()
        pairs = [(self.raw_file, self.raw_path, self.final)]
        if self.gz_file is not None and self.gz_path is not None:
            pairs.append((self.gz_file, self.gz_path, self.final + ".gz"))
        for handle, temp, final in pairs:
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
            os.chmod(temp, mode)
            os.replace(temp, final)
        fsync_dir(os.path.dirname(self.final) or ".")

    def discard(self) -> None:
        for handle in (getattr(self, "raw_file", None), getattr(self, "gz_file", None)):
            if handle is not None:
                handle.close()
        for path in (self.raw_path, self.gz_path):
            if path is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


def _match(resource: Resource, gz: Mapping[str, str], raw: Mapping[str, str]) -> str:
    """Which published digest matches; raises :class:`_Rejected` listing both sides if none."""
    for kind, published, actual in (("gz", resource.gz, gz), ("unpacked", resource.unpacked, raw)):
        for algorithm, expected in published.items():
            if actual.get(algorithm) == expected.lower():
                return f"{'.gz' if kind == 'gz' else kind} {algorithm}"
    expected_text = " or ".join(
        [f".gz {a} {d}" for a, d in resource.gz.items()]
        + [f"unpacked {a} {d}" for a, d in resource.unpacked.items()]
    )
    actual_text = ", ".join(
        [f".gz {a} {gz[a]}" for a in resource.gz if a in gz]
        + [f"unpacked {a} {raw[a]}" for a in resource.unpacked if a in raw]
    )
    if not expected_text:
        raise _Rejected("no published digest to check it against")
    if not actual_text:
        # An unpacked file offered where only .gz digests are published.
        actual_text = f"unpacked sha256 {raw['sha256']}"
    raise _Rejected(f"checksum mismatch: got {actual_text}; expected {expected_text}")


def _preview(chunk: bytes) -> str:
    text = chunk[:16]
    hint = "; an HTML error page?" if chunk.lstrip()[:1] == b"<" else ""
    return f"{text!r}{hint}"


# -- sources: HTTP(S) mirrors and local directories ----------------------------------------


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
            raise _SourceFailed(f"refused a redirect from {req.full_url} to {newurl}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _opener() -> urllib.request.OpenerDirector:
    # build_opener adds a ProxyHandler reading the environment's proxies; the context
    # verifies certificates and host names (there is deliberately no way to turn that off).
    context = ssl.create_default_context()
    return urllib.request.build_opener(
        urllib.request.HTTPSHandler(context=context), _NoDowngradeRedirects()
    )


@dataclass
class _Options:
    timeout: float
    retries: int
    backoff: float
    progress: FetchProgress | None
    opener: urllib.request.OpenerDirector = field(default_factory=_opener)


def _is_url(mirror: str) -> bool:
    return urllib.parse.urlsplit(mirror).scheme.lower() in ("http", "https")


def _check_mirror(mirror: str) -> None:
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


def _local_dir(mirror: str) -> str:
    """A plain directory, or the directory of a ``file://`` URL."""
    parts = urllib.parse.urlsplit(mirror)
    if parts.scheme.lower() == "file":
        return urllib.request.url2pathname(parts.path)
    return mirror


def _describe(mirror: str, name: str) -> str:
    if _is_url(mirror):
        return urllib.parse.urljoin(mirror if mirror.endswith("/") else mirror + "/", name + ".gz")
    return os.path.join(_local_dir(mirror), name + ".gz")


def _download(url: str, sink: _Sink, opts: _Options) -> None:
    """Stream ``url`` into ``sink``: retries transient failures, resumes with ``Range``."""
    name = sink.resource.name
    attempts_without_progress = 0
    best = 0
    validator: str | None = None
    total = sink.resource.size or 0
    while True:
        try:
            total, validator = _download_once(url, sink, opts, total, validator)
            return
        except _Transient as exc:
            if sink.received > best:
                best = sink.received
                attempts_without_progress = 0  # it moved on: resume at once
                continue
            attempts_without_progress += 1
            if attempts_without_progress > opts.retries:
                attempts = opts.retries + 1
                plural = "s" if attempts > 1 else ""
                raise _SourceFailed(f"{exc}, after {attempts} attempt{plural}") from None
            delay = opts.backoff * 2 ** (attempts_without_progress - 1)
            if delay > 0:
                time.sleep(delay)
            if opts.progress is not None:
                opts.progress(name, sink.received, total)


def _download_once(
    url: str, sink: _Sink, opts: _Options, total: int, validator: str | None
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
                    raise _Transient(f"bad Content-Range {response.headers.get('Content-Range')!r}")
            elif response.status == 200:
                if offset:
                    sink.reset()  # Range ignored: the whole file again
                total = length or total
                validator = response.headers.get("ETag") or response.headers.get("Last-Modified")
            else:
                raise _SourceFailed(f"unexpected HTTP {response.status} {response.reason}")
            got = 0
            while True:
                # read1: what has arrived, so a stall loses nothing already received.
                try:
                    chunk = response.read1(_CHUNK)
                except (TimeoutError, ConnectionError, ssl.SSLError, http.client.HTTPException):
                    raise  # classified below
                except OSError as exc:
                    # Any other network fault mid-body (host or network unreachable, ...):
                    # not a write error; retry, then the next mirror.
                    raise _Transient(f"network error: {exc.strerror or exc}") from None
                if not chunk:
                    break
                got += len(chunk)
                sink.feed(chunk)
                if opts.progress is not None:
                    opts.progress(sink.resource.name, sink.received, total)
            if length is not None and got < length:
                # http.client returns a short body silently when the peer closes early.
                raise _Transient(f"connection closed after {got} of {length} bytes")
            return total, validator
    except urllib.error.HTTPError as exc:
        exc.close()
        code = exc.code
        if code == 416 and offset:
            sink.reset()
            raise _Transient("HTTP 416 Range Not Satisfiable") from None
        if code in (408, 429) or code >= 500:
            raise _Transient(f"HTTP {code} {exc.reason}") from None
        if 300 <= code < 400:
            raise _SourceFailed(f"too many redirects (HTTP {code})") from None
        raise _SourceFailed(f"HTTP {code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise _SourceFailed(f"TLS certificate not valid: {reason.verify_message}") from None
        if isinstance(reason, _SourceFailed):
            raise reason from None
        if isinstance(reason, TimeoutError):
            raise _Transient(f"timed out after {opts.timeout:g} s") from None
        if isinstance(reason, socket.gaierror) and reason.errno != socket.EAI_AGAIN:
            # An unknown host stays unknown: no point waiting to ask again (offline machines).
            raise _SourceFailed(f"cannot connect: {reason.strerror}") from None
        text = reason.strerror if isinstance(reason, OSError) and reason.strerror else reason
        raise _Transient(f"cannot connect: {text}") from None
    except TimeoutError:
        raise _Transient(f"timed out after {opts.timeout:g} s") from None
    except ssl.SSLError as exc:
        raise _Transient(f"TLS error: {exc.reason or exc}") from None
    except (http.client.HTTPException, ConnectionError) as exc:
        raise _Transient(f"connection failed: {type(exc).__name__} {exc}".rstrip()) from None


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


def _read_local(path: str, sink: _Sink, opts: _Options) -> None:
    try:
        total = os.path.getsize(path)
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                sink.feed(chunk)
                if opts.progress is not None:
                    opts.progress(sink.resource.name, sink.received, total)
    except FileNotFoundError:
        raise _SourceFailed("not found") from None
    except OSError as exc:
        raise _SourceFailed(f"cannot read: {exc.strerror}") from None


# -- the manifest of verified files --------------------------------------------------------


def _manifest_header(dataset: str) -> str:
    # A comment line (sha256sum -c skips it) binding the entries to one dataset: a file
    # recorded for one dataset must not pass as verified for another fetched into the same
    # directory (KMNIST has no unpacked digest to catch it).
    return f"# mnist2db dataset: {dataset}\n"


def _read_manifest(directory: str, dataset: str) -> dict[str, str]:
    entries: dict[str, str] = {}
    try:
        with open(os.path.join(directory, MANIFEST_NAME), encoding="utf-8") as handle:
            if handle.readline() != _manifest_header(dataset):
                return {}  # another dataset's (or an unknown) manifest vouches for nothing here
            for line in handle:
                digest, _, name = line.rstrip("\n").partition("  ")
                if len(digest) == 64 and name:
                    entries[name] = digest.lower()
    except (OSError, UnicodeDecodeError):
        pass  # no manifest, or an unreadable one: files are checked against published digests
    return entries


def _write_manifest(directory: str, dataset: str, entries: Mapping[str, str]) -> None:
    lines = [_manifest_header(dataset)] + [f"{entries[n]}  {n}\n" for n in sorted(entries)]
    with AtomicFile(os.path.join(directory, MANIFEST_NAME)) as target:
        target.stream.write("".join(lines).encode("utf-8"))
        target.commit()


def _file_digests(path: str, algorithms: Iterable[str]) -> dict[str, str] | None:
    hashers = _hashers(algorithms)
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(_UNPACK_CHUNK):
                for hasher in hashers.values():
                    hasher.update(chunk)
    except OSError:
        return None
    return {name: h.hexdigest() for name, h in hashers.items()}


def _verified_present(path: str, published: Mapping[str, str], recorded: str | None) -> str | None:
    """How the file at ``path`` is verified (published digest or manifest), or None."""
    if not os.path.isfile(path):
        return None
    digests = _file_digests(path, ["sha256", *published])
    if digests is None:
        return None
    kind = ".gz" if path.endswith(".gz") else "unpacked"
    for algorithm, expected in published.items():
        if digests.get(algorithm) == expected.lower():
            return f"{kind} {algorithm}"
    if recorded is not None and digests["sha256"] == recorded:
        return f"{kind} sha256 recorded when fetched"
    return None


# -- fetch ----------------------------------------------------------------------------------


def fetch(
    dataset: str | Dataset = DEFAULT_DATASET,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    mirrors: Sequence[str] = (),
    force: bool = False,
    keep_gz: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = DEFAULT_RETRIES,
    backoff: float | None = None,
    progress: FetchProgress | None = None,
    on_file: Callable[[FetchedFile], None] | None = None,
) -> list[FetchedFile]:
    """Fetch a dataset's four files into ``data_dir``, verified and unpacked.

    Files already present and verified (against a published unpacked digest, or the sha256
    recorded when this function placed them) are left alone unless ``force``. A ``.gz``
    kept beside a missing or corrupt file is unpacked instead of downloading. Each file is
    otherwise taken from the first source that delivers it verified: ``mirrors`` first, then
    the dataset's own.

    Args:
        dataset: a name in :data:`DATASETS`, or a :class:`Dataset` (tests pass their own).
        data_dir: destination directory; default ``data/<dataset>``. Created if missing.
        mirrors: extra mirrors tried first, in order: ``http(s)://`` or ``file://`` URLs,
            or plain directories (which may also hold unpacked files).
        force: download even when a verified file is present.
        keep_gz: also keep the verified ``.gz`` archive beside each file.
        timeout: seconds to wait for a connection or for data before counting a failure.
        retries: retries of a transient failure (cut, timeout, 5xx) per mirror.
        backoff: seconds before the first retry, doubled for each further one; default
            :data:`DEFAULT_BACKOFF`.
        progress: called as ``progress(name, bytes_done, bytes_total)`` while downloading.
        on_file: called with each :class:`FetchedFile` as soon as that file is done.

    Returns:
        One :class:`FetchedFile` per file, in the dataset's order.

    Raises:
        ChecksumError: every source delivered bytes matching no published digest.
        DownloadError: no source delivered a verified file (the line lists each with its
            reason), or the destination cannot be written.
    """
    spec = get_dataset(dataset)
    directory = os.fspath(data_dir) if data_dir is not None else default_data_dir(spec)
    sources = [*mirrors, *spec.mirrors]
    for mirror in sources:
        _check_mirror(mirror)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise DownloadError(f"{directory}: cannot create the directory: {exc.strerror}") from None
    if backoff is None:
        backoff = DEFAULT_BACKOFF
    opts = _Options(timeout=timeout, retries=retries, backoff=backoff, progress=progress)
    manifest = _read_manifest(directory, spec.name)
    results = []
    for resource in spec.resources:
        result = _fetch_one(resource, directory, spec.name, sources, opts, manifest, force, keep_gz)
        if on_file is not None:
            on_file(result)
        results.append(result)
    return results


def _fetch_one(
    resource: Resource,
    directory: str,
    dataset: str,
    sources: Sequence[str],
    opts: _Options,
    manifest: dict[str, str],
    force: bool,
    keep_gz: bool,
) -> FetchedFile:
    start = time.perf_counter()
    final = os.path.join(directory, resource.name)
    gz_final = final + ".gz"
    if not force:
        how = _verified_present(final, resource.unpacked, manifest.get(resource.name))
        gz_ok = not keep_gz or _verified_present(
            gz_final, resource.gz, manifest.get(resource.name + ".gz")
        )
        if how is not None and gz_ok:
            return FetchedFile(
                resource.name, final, "present", None, how, 0, time.perf_counter() - start
            )
    # (where, is a URL, is gzip); a .gz kept beside the file comes first.
    candidates: list[tuple[str, bool, bool]] = []
    if not force and os.path.isfile(gz_final):
        candidates.append((gz_final, False, True))
    for mirror in sources:
        if _is_url(mirror):
            candidates.append((_describe(mirror, resource.name), True, True))
        else:
            local = _local_dir(mirror)
            gz_path = os.path.join(local, resource.name + ".gz")
            raw_path = os.path.join(local, resource.name)
            if not os.path.exists(gz_path) and os.path.isfile(raw_path):
                candidates.append((raw_path, False, False))
            else:
                candidates.append((gz_path, False, True))
    failures: list[tuple[str, _SourceFailed]] = []
    for where, is_url, compressed in candidates:
        beside = where == gz_final
        try:
            sink = _Sink(final, resource, compressed=compressed, keep_gz=keep_gz and not beside)
        except OSError as exc:
            raise DownloadError(f"{final}: cannot write in {directory}: {exc.strerror}") from None
        try:
            if is_url:
                _download(where, sink, opts)
            else:
                _read_local(where, sink, opts)
            how = sink.finish()
            try:
                sink.place()
            except OSError as exc:
                raise DownloadError(f"{final}: cannot write: {exc.strerror}") from None
            manifest[resource.name] = sink.raw_sha256
            if sink.gz_file is not None and sink.gz_sha256 is not None:
                manifest[resource.name + ".gz"] = sink.gz_sha256
            with contextlib.suppress(OSError):
                _write_manifest(directory, dataset, manifest)
            return FetchedFile(
                resource.name,
                final,
                "unpacked" if beside else "downloaded",
                where,
                how,
                sink.received,
                time.perf_counter() - start,
            )
        except _SourceFailed as exc:
            failures.append((where, exc))
        except OSError as exc:  # writing the temporary file (disk full, ...)
            raise DownloadError(f"{final}: cannot write: {exc.strerror or exc}") from None
        finally:
            sink.discard()
    if not failures:
        raise DownloadError(f"{resource.name}: no mirror to fetch it from")
    reasons = "; ".join(f"{where} ({exc})" for where, exc in failures)
    if all(isinstance(exc, _Rejected) for _, exc in failures):
        raise ChecksumError(f"{resource.name}: rejected from every source: {reasons}")
    raise DownloadError(f"{resource.name}: no mirror delivered a verified file: {reasons}")


# -- create: both databases, as create_mnist.sh makes them ---------------------------------

#: (database name stem, images, labels), as create_mnist.sh converts them.
SPLITS = (("train", TRAIN_IMAGES, TRAIN_LABELS), ("test", TEST_IMAGES, TEST_LABELS))


def create_databases(
    dataset: str | Dataset = DEFAULT_DATASET,
    data_dir: str | os.PathLike[str] | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    backend: str = "lmdb",
    *,
    overwrite: bool = False,
    batch_size: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    on_database: Callable[[ConvertResult], None] | None = None,
) -> list[ConvertResult]:
    """Convert a fetched dataset into ``mnist_train_<backend>`` and ``mnist_test_<backend>``.

    The same conversion as ``mnist2db convert`` (:func:`mnist2db.conversion.convert`), run
    for the training and the test split, as Caffe's ``create_mnist.sh`` does. Each input
    is the unpacked file, or its ``.gz`` when only that is present.

    Args:
        dataset: its name gives the default directories.
        data_dir: where the IDX files are; default ``data/<dataset>``.
        out_dir: where the databases go; default ``examples/<dataset>``.
        backend: ``"lmdb"`` or ``"leveldb"``.
        overwrite: replace existing databases.
        batch_size: records per transaction (default: the converter's, 1000).
        progress: called as ``progress(database_path, done, total)``.
        on_database: called with each ``ConvertResult`` once that database is complete.

    Returns:
        The two ``ConvertResult`` objects, train then test.

    Raises:
        IdxFormatError: an input is missing (with a hint to run ``mnist2db fetch``) or bad.
        OutputExistsError, BackendError: as :func:`mnist2db.conversion.convert`.
    """
    from .conversion import DEFAULT_BATCH_SIZE, convert

    spec = get_dataset(dataset)
    data = os.fspath(data_dir) if data_dir is not None else default_data_dir(spec)
    out = os.fspath(out_dir) if out_dir is not None else default_out_dir(spec)
    inputs = []
    for stem, images, labels in SPLITS:
        paths = []
        for name in (images, labels):
            path = os.path.join(data, name)
            if not os.path.exists(path) and os.path.exists(path + ".gz"):
                path += ".gz"
            if not os.path.exists(path):
                raise IdxFormatError(
                    f"{path}: not found (run: mnist2db fetch --dataset {spec.name}"
                    f"{'' if data_dir is None else f' --data {data}'})"
                )
            paths.append(path)
        db = os.path.join(out, f"mnist_{stem}_{backend}")
        inputs.append((paths[0], paths[1], db))
    results = []
    for images_path, labels_path, db in inputs:
        result = convert(
            images_path,
            labels_path,
            db,
            backend,
            batch_size=batch_size or DEFAULT_BATCH_SIZE,
            overwrite=overwrite,
            progress=None if progress is None else _labelled(progress, db),
        )
        if on_database is not None:
            on_database(result)
        results.append(result)
    return results


def _labelled(progress: Callable[[str, int, int], None], label: str) -> Callable[[int, int], None]:
    def report(done: int, total: int) -> None:
        progress(label, done, total)

    return report


# -- small file-system helpers ------------------------------------------------------------


def _mkstemp(directory: str, prefix: str, suffix: str = "") -> str:
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
    os.close(fd)
    return path
