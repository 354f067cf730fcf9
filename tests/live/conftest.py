"""Fixtures of the live tests: a stub OpenAI endpoint and a queueing server."""

from __future__ import annotations

import threading

import pytest

from .helpers import _QueueServer, _StubServer


@pytest.fixture
def stub():
    def make(mode: str = "ok") -> str:
        server = _StubServer(mode)
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        thread.start()
        servers.append((server, thread))
        return f"http://127.0.0.1:{server.server_port}"

    servers: list = []
    make.servers = servers
    yield make
    for server, thread in servers:
        server.shutdown()
        server.server_close()
        thread.join(2)


@pytest.fixture
def queue_server():
    servers: list = []

    def make(slots: int, service_s: float, stall_after: int | None = None) -> str:
        server = _QueueServer(slots, service_s, stall_after)
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        thread.start()
        servers.append((server, thread))
        return f"http://127.0.0.1:{server.server_port}"

    yield make
    for server, thread in servers:
        server.released.set()
        server.shutdown()
        server.server_close()
        thread.join(2)
