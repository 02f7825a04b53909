"""Fixtures of the parameter-server unit tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from tensorspark.ps.shards import ShardedServer
from tests.processes import process_gone
from tests.unit.ps.sharding import port_free


@pytest.fixture
def started_shards() -> Iterator[Callable[..., ShardedServer]]:
    """Start a :class:`ShardedServer` with the given arguments, for a test that kills its
    shards; at the end every server started is stopped, and none may leave a process or a
    listening port behind."""
    servers: list[ShardedServer] = []

    def start(params: dict[str, np.ndarray], *args: Any, **kwargs: Any) -> ShardedServer:
        server = ShardedServer(params, *args, **kwargs)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        ports, pids = [*server.ports, server.port], server.pids
        server.stop()
        assert all(process_gone(pid) for pid in pids)
        assert all(port_free(p) for p in ports)  # type: ignore[arg-type]
