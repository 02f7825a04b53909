"""The executor's side of pruning: a trial reports each epoch's metric to the driver, which
answers "prune" or "go on".

A search whose searcher prunes (:class:`~tensorspark.tuning.optuna_search.OptunaSearcher`
with an Optuna pruner) starts a small endpoint on the driver
(:mod:`tensorspark.tuning.prune_server`) and ships a :class:`PruneLink` (its URL and the
search's secret, plain values) to every trial inside the trial's config. After each epoch
the trial's :class:`PruneReporter` POSTs one JSON object, signed as the parameter server's
requests are (:mod:`tensorspark.ps.auth`: HMAC over head and body, timestamp and nonce),
and reads the one-field JSON answer. No pickle travels either way.

A driver that does not answer must not cost the trial anything but time: every request has
a connect and a read timeout, a failed report counts as "go on", and after
:data:`MAX_FAILURES` failures in a row the trial stops reporting and trains on. Runs on an
executor; one reporter per trial, not thread-safe.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from tensorspark.ps import auth

logger = logging.getLogger(__name__)

__all__ = ["GO_ON", "MAX_FAILURES", "PATH", "PRUNE", "PruneLink", "PruneReporter"]

#: The endpoint's one path; the version is part of it.
PATH = "/v1/report"
PRUNE = "prune"
GO_ON = "go on"
#: Failed reports in a row after which a trial stops reporting (and is never pruned).
MAX_FAILURES = 3
#: Largest answer read (the answer is one short JSON object).
_MAX_ANSWER_BYTES = 4096


@dataclass(frozen=True)
class PruneLink:
    """Where a trial reports its epochs: shipped to executors in the trial's config.

    Attributes:
        url: ``http://host:port`` of the driver's endpoint, as executors reach it.
        secret: The search's secret the reports are signed with (never in ``repr``).
        connect_timeout: Seconds to wait for the connection.
        read_timeout: Seconds to wait for the answer; the driver answers "go on" itself
            before this when its pruner is slower.
    """

    url: str
    secret: bytes = field(repr=False)
    connect_timeout: float = 5.0
    read_timeout: float = 30.0


class PruneReporter:
    """Reports one trial's epochs through a :class:`PruneLink` (executor).

    Args:
        link: The driver's endpoint.
        index: The trial's index, which the driver's searcher knows it by.
    """

    def __init__(self, link: PruneLink, index: int) -> None:
        self._link = link
        self._index = int(index)
        self._signer = auth.Signer(link.secret)
        parts = urlsplit(link.url)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"a PruneLink's url must be http://host:port. Received: {link.url}")
        self._host, self._port = parts.hostname, parts.port
        self.failures = 0

    def should_stop(self, epoch: int, value: float) -> bool:
        """Report ``value``, the metric after ``epoch`` (0-based), and whether the driver
        says to prune the trial now. Never raises: a report that fails is "go on"."""
        if self.failures >= MAX_FAILURES or not math.isfinite(value):
            return False
        try:
            answer = self._post({"trial": self._index, "epoch": int(epoch), "value": value})
        except (OSError, http.client.HTTPException, ValueError) as err:
            self.failures += 1
            logger.warning(
                "Trial %d: the pruning report of epoch %d failed (%s: %s); going on%s",
                self._index,
                epoch + 1,
                type(err).__name__,
                err,
                "; no more reports from this trial" if self.failures >= MAX_FAILURES else "",
            )
            return False
        self.failures = 0
        return answer == PRUNE

    def _post(self, report: dict[str, object]) -> str:
        """POST one signed report; the answer's ``decision``.

        Raises:
            OSError: no connection, or a timeout.
            http.client.HTTPException: a broken answer.
            ValueError: an answer other than 200 with ``{"decision": "prune" | "go on"}``.
        """
        body = json.dumps(report).encode("utf-8")
        headers, trailer = self._signer.sign("POST", PATH, body)
        headers["Content-Type"] = "application/json"
        headers["Content-Length"] = str(len(body) + len(trailer))
        conn = http.client.HTTPConnection(
            self._host, self._port, timeout=self._link.connect_timeout
        )
        try:
            conn.connect()
            if conn.sock is not None:  # connect and read: separate limits
                conn.sock.settimeout(self._link.read_timeout)
            conn.request("POST", PATH, body=body + trailer, headers=headers)
            response = conn.getresponse()
            data = response.read(_MAX_ANSWER_BYTES)
        finally:
            conn.close()
        if response.status != 200:
            raise ValueError(f"the driver answered {response.status}: {data[:200]!r}")
        decision = json.loads(data).get("decision")
        if decision not in (PRUNE, GO_ON):
            raise ValueError(f"the driver's answer has no decision: {data[:200]!r}")
        return str(decision)
