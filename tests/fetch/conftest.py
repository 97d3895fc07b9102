"""The fixtures every fetch test shares: a loopback HTTP server, and no proxy or mirror
setting of the machine's between the tests and it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_fetch import Server, start_server


@pytest.fixture
def server() -> Iterator[Server]:
    yield from start_server()


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loopback server must be reached directly, whatever the machine's proxies."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "MNIST2DB_MIRROR"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
