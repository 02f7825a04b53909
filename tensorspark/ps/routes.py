"""The parameter server's routes, and the small parsers its request handler uses.

:data:`ROUTES` are what a model-holding server answers; :data:`STATUS_ROUTES` what a
status-only one (the front of a sharded server, a :class:`StatusBooks` in place of the
store) answers, and what the read-only ``?token=`` may read. Everything here is pure or
owned by the server's loop thread.

Endpoints (binary bodies use :mod:`tensorspark.wire`; control messages are JSON):

* ``POST /push``  wire(update, meta) -> wire(global params, {version, status, ...})
* ``GET  /pull[?partition=P]``  -> wire(global params, {version})
* ``POST /rows``  wire({T@ids}, {rows, dense, partition}) -> wire(those rows, {version, rows})
  (a worker's row cache: :meth:`~tensorspark.ps.sparse.RowTables.lookup`)
* ``POST /vocab`` wire({T@keys}, {partition, epoch, seq, versions}) -> wire(rows, map changes)
  (dynamic tables: :mod:`tensorspark.ps.vocab_route`)
* ``POST /join``  JSON {partition, attempt, wire} -> JSON {progress, version, mode, payload,
  compression, wire} (the worker's address is recorded as its ``host``)
* ``POST /leave`` JSON {partition, attempt, state} -> JSON {ok}
* ``POST /heartbeat`` JSON {partition, attempt} -> JSON {ok} (elastic sync: the worker
  trains; ``ok`` false for an attempt a newer one replaced; :mod:`tensorspark.ps.elastic`)
* ``GET  /status`` -> JSON (version, applied_pushes, duplicate_pushes, workers, ...)
* ``GET  /``      the live dashboard (:mod:`tensorspark.ps.dashboard`)
"""

from __future__ import annotations

import collections
import json
from typing import Any
from urllib.parse import parse_qs

from tornado import httputil

from tensorspark.ps.validation import RequestError, check_json_depth, int_field

ROUTES = {
    ("POST", "/push"),
    ("GET", "/pull"),
    ("POST", "/rows"),
    ("POST", "/vocab"),
    ("POST", "/join"),
    ("POST", "/leave"),
    ("POST", "/heartbeat"),
    ("GET", "/status"),
    ("GET", "/"),  # the live dashboard (tensorspark.ps.dashboard)
}
#: The methods of each path, for 405 answers (their ``Allow`` header).
ALLOWED = {path: method for method, path in ROUTES}

#: Routes that only read the status: open to the read-only ``?token=`` (and to everyone
#: with ``public_status=True``). The dashboard's ``("GET", "/")`` belongs here too.
STATUS_ROUTES = {("GET", "/"), ("GET", "/status")}


class StatusBooks:
    """What a status-only server counts (the front of a sharded server, which holds no
    model): refused requests and traffic. Loop thread only."""

    def __init__(self) -> None:
        self.counters = collections.Counter[str]()

    def take_body(self, length: int) -> bytearray:
        return bytearray(length)

    def count_refused(self, code: int) -> None:
        if code != 404:
            self.counters["rejected_requests"] += 1
            if code == 401:
                self.counters["unauthorized_requests"] += 1

    def count_traffic(self, partition: int | None, received: int, sent: int) -> None:
        self.counters["bytes_received"] += received
        self.counters["bytes_sent"] += sent


def head_size(start_line: str, headers: httputil.HTTPHeaders) -> int:
    """Bytes of an HTTP/1.1 message's start line and headers as written on the wire."""
    size = len(start_line) + 4  # CRLF after the start line and after the headers
    for name, value in headers.get_all():
        size += len(name) + len(value) + 4  # "Name: value\r\n"
    return size


def query_int(query: str, key: str) -> int | None:
    values = parse_qs(query).get(key)
    if not values or not values[-1].isdigit() or len(values[-1]) > 18:
        return None
    return int(values[-1])


def json_object(body: bytes | bytearray | memoryview, required: tuple[str, ...]) -> dict[str, Any]:
    try:
        text = bytes(body).decode("utf-8")
        check_json_depth(text)
        obj = json.loads(text or "{}")
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise RequestError(400, f"body is not valid JSON: {type(err).__name__}: {err}") from None
    if not isinstance(obj, dict):
        raise RequestError(400, "body must be a JSON object")
    missing = [k for k in required if k not in obj]
    if missing:
        raise RequestError(400, f"missing fields {missing}")
    return obj


def shown(text: str) -> str:
    """A path or method from the network, cut short for an error message."""
    return text if len(text) <= 80 else text[:80] + "..."


def leave_request(body: bytes | bytearray | memoryview) -> tuple[int, int, str]:
    """``POST /leave``'s ``(partition, attempt, state)``, checked.

    Raises:
        RequestError: 400: not a JSON object with those fields, or an unknown state.
    """
    req = json_object(body, ("partition", "attempt", "state"))
    partition, attempt, state = int_field(req, "partition"), int_field(req, "attempt"), req["state"]
    if state not in ("done", "failed"):
        raise RequestError(
            400, f'field \'state\' must be "done" or "failed", received {str(state)[:40]!r}'
        )
    return partition, attempt, state
