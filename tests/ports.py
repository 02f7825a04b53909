"""Loopback ports for the tests' servers: the one place that picks a free port."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` a moment ago (the OS picks it; the socket is closed again,
    so a server started next can bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens: connections to it are refused at once."""
    return free_port()
