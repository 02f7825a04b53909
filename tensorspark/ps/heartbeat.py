"""A worker's heartbeat in elastic sync mode: "this partition still trains" (executor).

In elastic sync mode the server declares a partition lost when it has neither pushed nor
sent a heartbeat for ``lost_after`` seconds (:mod:`tensorspark.ps.elastic`), so a worker
that trains a long chunk, or waits for a slow round, sends ``POST /heartbeat`` every
:func:`~tensorspark.ps.elastic.heartbeat_interval` seconds from a daemon thread of its
own, with a client of its own (the loop's client is not shared between threads). Each
request is bounded (its retries by the interval, its reads by twice it); a failed one is
logged and the next one tried. :meth:`Heartbeat.stop` sets the stop event and joins the
thread, so none is left when the task ends.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from tensorspark.ps.client import ParameterClient
from tensorspark.ps.elastic import heartbeat_interval

logger = logging.getLogger(__name__)


class Reaching(Protocol):
    """How a worker reaches the server (a :class:`~tensorspark.worker.WorkerConfig`)."""

    @property
    def server_url(self) -> str: ...
    @property
    def lost_after(self) -> float | None: ...
    @property
    def ps_timeout(self) -> float: ...
    @property
    def ssl_cafile(self) -> str | None: ...
    @property
    def secret(self) -> bytes | None: ...


class Heartbeat:
    """``partition``'s heartbeats to the server ``config`` names, from :meth:`start` (at
    the join) until :meth:`stop`, a quarter of its ``lost_after`` apart; none when
    ``config.lost_after`` is None (not elastic). ``attempt``: the task's attempt number."""

    def __init__(self, config: Reaching, partition: int, attempt: int) -> None:
        self.config = config
        self.partition = partition
        self.attempt = attempt
        self.interval = 0.0 if config.lost_after is None else heartbeat_interval(config.lost_after)
        self.sent = 0  # heartbeats the server took
        self._stop = threading.Event()
        self._client: ParameterClient | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start sending (elastic sync only; once)."""
        if self.config.lost_after is None or self._thread is not None:
            return
        self._client = ParameterClient(
            self.config.server_url,
            timeout=max(1.0, 2 * self.interval),
            ps_timeout=self.config.ps_timeout,
            ssl_cafile=self.config.ssl_cafile,
            secret=self.config.secret,
        )
        self._thread = threading.Thread(
            target=self._run, args=(self._client,), name=f"tensorspark-heartbeat-{self.partition}"
        )
        self._thread.daemon = True
        self._thread.start()

    def _run(self, client: ParameterClient) -> None:
        replaced = False
        while not self._stop.wait(self.interval):
            try:
                ok = client.heartbeat(self.partition, self.attempt, wait=self.interval)
            except Exception as err:  # the next one may get through; the loop's own requests decide
                logger.debug("partition %s: heartbeat failed: %s", self.partition, err)
                continue
            if ok:
                self.sent += 1
            elif not replaced:
                replaced = True
                logger.warning(
                    "partition %s attempt %s: the server knows a newer attempt of this "
                    "partition; its heartbeats are ignored",
                    self.partition,
                    self.attempt,
                )

    def stop(self) -> None:
        """Stop sending and wait for the thread (bounded by a request's timeouts); nothing
        when it never started."""
        if self._thread is None or self._client is None:
            return
        self._stop.set()
        self._thread.join(timeout=4 * self.interval + 5.0)
        if self._thread.is_alive():  # pragma: no cover - a request stuck past its timeouts
            logger.warning("partition %s: the heartbeat thread did not end", self.partition)
        self._client.close()
