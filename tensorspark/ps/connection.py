"""The parameter client's socket: TCP options for a dead link, and reading one response.

The client writes requests itself (a signed body in steps, ``Expect: 100-continue``) and
reads each HTTP/1.1 response here: the head in a few ``recv`` calls, the body straight into
a buffer the client chooses (recycled for large models). Executor side; no state.
"""

from __future__ import annotations

import http.client
import math
import socket
from collections.abc import Callable

_HEAD_READ = 64 * 1024  # one recv usually holds a small response whole
_MAX_HEAD = 64 * 1024


def bound_dead_link(sock: socket.socket, ps_timeout: float) -> None:
    """Make a connection fail about ``ps_timeout`` seconds after its link stops carrying packets.

    TCP keepalive probes an idle connection (one waiting for an answer) every second, and
    the TCP user timeout closes the connection once sent data or probes have gone
    unacknowledged for ``ps_timeout``; a healthy link acknowledges the probes, however long
    the server takes to answer. Options a platform lacks are left out (keepalive alone then
    gives up after ``ps_timeout`` probes).
    """
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    seconds = max(1, math.ceil(ps_timeout))
    for name, value in (("TCP_KEEPIDLE", 1), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", seconds)):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
    user_timeout = getattr(socket, "TCP_USER_TIMEOUT", None)
    if user_timeout is not None:
        sock.setsockopt(socket.IPPROTO_TCP, user_timeout, int(ps_timeout * 1000))


def read_head(
    sock: socket.socket, url: str, data: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    """Read the status line and headers (``data``: bytes of it received
    already); returns them and the body bytes that arrived with them."""
    while True:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            break
        if len(data) > _MAX_HEAD:
            raise http.client.HTTPException(f"response headers from {url} exceed {_MAX_HEAD} bytes")
        chunk = sock.recv(_HEAD_READ)
        if not chunk:
            raise http.client.RemoteDisconnected(
                f"the parameter server at {url} closed the connection"
            )
        data += chunk
    status_line, *header_lines = data[:end].decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise http.client.BadStatusLine(status_line[:100])
    headers = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    if version == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
        headers["connection"] = "close"
    return int(code), headers, data[end + 4 :]


def read_body(
    sock: socket.socket,
    url: str,
    headers: dict[str, str],
    early: bytes,
    buffer_for: Callable[[int], bytearray],
) -> bytearray:
    """A response's body (``Content-Length`` bytes) from the server at ``url``, ``early``
    being its first bytes, read into ``buffer_for(length)``."""
    length_text = headers.get("content-length", "0")
    if not length_text.isascii() or not length_text.isdigit():
        raise http.client.HTTPException(
            f"the parameter server at {url} answered without a valid Content-Length: "
            f"{length_text[:40]!r}"
        )
    length = int(length_text)
    body = buffer_for(length)
    view = memoryview(body)
    got = min(len(early), length)
    view[:got] = early[:got]
    while got < length:
        n = sock.recv_into(view[got:])
        if not n:
            raise http.client.IncompleteRead(bytes(body[:got]), length - got)
        got += n
    view.release()
    return body
