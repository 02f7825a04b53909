"""Writing a parameter-server response from the arrays' memory, without joining it.

The parts of a response (a wire header and the arrays' buffers, or one JSON ``bytes``) are
written as they are: small runs are joined (:func:`tensorspark.wire.coalesce`), large
buffers go to the socket untouched, and the headers leave with a small first part in one
send (one TCP segment). :mod:`tensorspark.ps.http` decides what to answer; this writes it.

Runs on the server's loop thread (the connection's).
"""

from __future__ import annotations

import logging
from typing import Any

from tornado import httputil
from tornado.concurrent import Future

from tensorspark import wire

logger = logging.getLogger(__name__)

#: A first part at most this large leaves in the same send as the headers.
_WITH_HEADERS = 256 * 1024


def send(
    conn: httputil.HTTPConnection,
    start: httputil.ResponseStartLine,
    head: httputil.HTTPHeaders,
    parts: list[Any],
) -> Future[None] | None:
    """Write a response's start line, headers and ``parts`` on ``conn``, and finish it.

    Returns:
        What the last write returned (done once the socket no longer needs the parts'
        memory), or None when the client went away while answering (logged at DEBUG).
    """
    chunks = wire.coalesce([p for p in parts if memoryview(p).nbytes])
    # Headers and a small first chunk leave in one send (one TCP segment).
    first = (
        chunks.pop(0)
        if chunks and isinstance(chunks[0], bytes) and len(chunks[0]) <= _WITH_HEADERS
        else None
    )
    try:
        last = conn.write_headers(start, head, first)
        for chunk in chunks:
            last = conn.write(chunk)
        conn.finish()
    except Exception:  # connection went away while answering
        logger.debug("parameter server: client went away during the response", exc_info=True)
        return None
    return last
