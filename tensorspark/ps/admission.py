"""What a request must pass before the parameter server reads or allocates its body.

The server reads a request body only once its head has been accepted: the route exists,
``Content-Length`` is plain decimal digits within the route's limit, the head is signed
(:meth:`tensorspark.ps.auth.Verifier.check_head`), and the bodies being received at
that moment leave room for it. Until then nothing is allocated for the body; a refused
request is answered before its body is read (see :mod:`tensorspark.ps.http`).

:class:`Limits` holds the server's settings for this; :class:`Admission` keeps the count
and the declared bytes of the bodies in flight, and the counters of what happened to
connections (client hang-ups, body timeouts, busy refusals) that ``/status`` shows.

Thread ownership: an :class:`Admission` belongs to the server's loop thread and takes no
locks; :func:`content_length` and :class:`Limits` are pure.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tensorspark.arguments import positive_int, positive_number
from tensorspark.errors import ConfigurationError
from tensorspark.ps.validation import RequestError

#: Clients send ``Expect: 100-continue`` with bodies of at least this many bytes on a
#: connection that has had no request accepted yet, so that a refusal (a wrong secret,
#: a busy or too small server) reaches them before the body is sent. A refused body below
#: this size is read and thrown away (a chunk at a time, nothing allocated for it), so
#: that the client, which sends it without waiting, reads the answer and keeps its
#: connection; a larger one is answered at once and the connection closed. (Waiting for
#: 100 Continue on every request cost one client 10 % of its pushes of a 4 MB model, in
#: interleaved runs of bench/ps_throughput.py: hence only until a connection is proven.)
EXPECT_CONTINUE_FROM = 1 << 20
#: Largest body of the JSON endpoints (``/join``, ``/leave``), signature included.
MAX_JSON_BYTES = 64 * 1024
#: Seconds a request body may take to arrive, from the end of its head, by default.
DEFAULT_BODY_TIMEOUT = 600.0
#: Default bound on the number of request bodies being received at once.
DEFAULT_INFLIGHT_BODIES = 256
_MIN_INFLIGHT_BYTES = 256 * 1024 * 1024
_DIGITS = re.compile(r"[0-9]{1,18}")  # at most 10**18 - 1: always within int64

#: The counters :meth:`Admission.status` reports (all start at 0).
EVENTS = ("client_hangups", "body_timeouts", "busy_refusals")


def content_length(headers: Any) -> int:
    """The body length a request declares: ASCII decimal digits only, 0 when absent.

    ``+5``, ``5_0``, ``0x10``, ``5, 5``, two Content-Length headers and a chunked
    ``Transfer-Encoding`` are all refused, so no two parsers of the header can disagree
    (the request-smuggling risk behind a proxy). ``headers`` is a
    :class:`tornado.httputil.HTTPHeaders`. Pure.

    Raises:
        RequestError: 400 naming what was received.
    """
    if "Transfer-Encoding" in headers:
        raise RequestError(
            400,
            "chunked request bodies are not accepted: send a Content-Length. Received: "
            f"Transfer-Encoding={_short(headers['Transfer-Encoding'])}",
        )
    values = headers.get_list("Content-Length")
    if not values:
        return 0
    if len(values) > 1:
        raise RequestError(400, f"more than one Content-Length header. Received: {len(values)}")
    text = values[0]
    if _DIGITS.fullmatch(text) is None:
        raise RequestError(
            400,
            "Content-Length must be 1 to 18 decimal digits (0-9) and nothing else. "
            f"Received: Content-Length={_short(text)}",
        )
    return int(text)


def _short(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "...")


@dataclass(frozen=True)
class Limits:
    """The request limits of one server (fixed when it is made; any thread may read).

    Attributes:
        max_body_bytes: largest request body (413 beyond, before it is read).
        max_inflight_bodies: most request bodies received at once (503 beyond).
        max_inflight_bytes: most declared bytes of the bodies received at once (503
            beyond).
        body_timeout: seconds a body may take to arrive after its head; the request is
            then answered 408 and its connection closed.
        max_json_bytes: largest body of ``/join`` and ``/leave``.
    """

    max_body_bytes: int
    max_inflight_bodies: int
    max_inflight_bytes: int
    body_timeout: float
    max_json_bytes: int = MAX_JSON_BYTES

    @classmethod
    def make(
        cls,
        max_body_bytes: int,
        *,
        body_timeout: float = DEFAULT_BODY_TIMEOUT,
        max_inflight_bodies: int = DEFAULT_INFLIGHT_BODIES,
        max_inflight_bytes: int | None = None,
    ) -> Limits:
        """Limits from a server's keyword arguments, checked.

        ``max_inflight_bytes`` defaults to four times ``max_body_bytes`` (at least 256 MiB):
        about eight pushes of the whole model at once.

        Raises:
            ConfigurationError: a value that is not a positive number, or
                ``max_inflight_bytes`` below ``max_body_bytes``, naming it.
        """
        positive_number("body_timeout", body_timeout)
        positive_int("max_inflight_bodies", max_inflight_bodies, allow_none=True)
        positive_int("max_inflight_bytes", max_inflight_bytes, allow_none=True)
        inflight_bytes = (
            max(4 * max_body_bytes, _MIN_INFLIGHT_BYTES)
            if max_inflight_bytes is None
            else max_inflight_bytes
        )
        if inflight_bytes < max_body_bytes:
            raise ConfigurationError(
                "max_inflight_bytes must be at least max_body_bytes (a body of the largest size "
                f"must fit). Received: max_inflight_bytes={inflight_bytes}, "
                f"max_body_bytes={max_body_bytes}"
            )
        return cls(
            int(max_body_bytes), int(max_inflight_bodies), int(inflight_bytes), float(body_timeout)
        )


class Admission:
    """The bodies being received, against :class:`Limits`, and the connection counters.

    Owned by the server's loop thread (not thread-safe), like the store.
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.bodies = 0
        self.bytes = 0
        self._events = collections.Counter[str]()

    def admit(self, length: int) -> bool:
        """Reserve room for a body of ``length`` bytes; False when it does not fit now.
        Each True must be matched by one :meth:`release` of the same length."""
        if (
            self.bodies + 1 > self.limits.max_inflight_bodies
            or self.bytes + length > self.limits.max_inflight_bytes
        ):
            return False
        self.bodies += 1
        self.bytes += length
        return True

    def release(self, length: int) -> None:
        """Give back the room of a body admitted with ``length``."""
        self.bodies -= 1
        self.bytes -= length

    def count(self, event: str) -> None:
        """Count one of :data:`EVENTS`."""
        self._events[event] += 1

    def status(self) -> Mapping[str, int]:
        """The counters and the bodies in flight, for ``/status``."""
        return {
            **{event: self._events[event] for event in EVENTS},
            "inflight_bodies": self.bodies,
            "inflight_bytes": self.bytes,
        }
