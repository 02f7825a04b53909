"""The driver's side of pruning: a small signed JSON endpoint that trials report their
epochs to while they train, answered with the searcher's decision (driver).

:class:`PruneServer` is a :class:`~tensorspark.ps.loop.LoopServer` (the parameter
server's base: its own Tornado loop in a thread, a bound port, a clean stop) that serves
one path, :data:`~tensorspark.tuning.prune_link.PATH`. A request must be signed with the
search's secret (:mod:`tensorspark.ps.auth`, the parameter server's scheme): anything
unsigned, altered or replayed gets 401 before its body is read as JSON. The body is one
JSON object ``{"trial": int, "epoch": int, "value": float}``; the answer is
``{"decision": "prune"}`` or ``{"decision": "go on"}``. The decision (``judge``) runs in
a small thread pool, so a slow study storage never stalls the loop, and is waited for at
most ``decide_timeout`` seconds: then the answer is "go on".

:func:`open_channel` starts one for a search, at the address executors reach (as the
parameter server's: ``spark.tensorspark.server.host``, else ``spark.driver.host``; bound
to ``spark.tensorspark.server.bind`` when set) on a free port; the search stops it when it
ends, whatever happened (:meth:`PruneServer.stop`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import math
from collections.abc import Callable
from typing import Any

from tornado import httputil, web

from tensorspark import conf as tsconf
from tensorspark.errors import AuthenticationError, ConfigurationError
from tensorspark.ps import auth
from tensorspark.ps.loop import LoopServer
from tensorspark.tuning.prune_link import GO_ON, PATH, PRUNE, PruneLink

logger = logging.getLogger(__name__)

__all__ = ["Judge", "PruneServer", "open_channel"]

#: ``judge(trial_index, epoch, value) -> prune?``, called from the server's thread pool.
Judge = Callable[[int, int, float], bool]

#: Largest report body accepted (a report is some 60 bytes, the signature 64).
MAX_BODY_BYTES = 4096


class _ReportHandler(web.RequestHandler):
    """``POST /v1/report``: verify, parse, ask the judge, answer (loop thread)."""

    def initialize(
        self,
        verifier: auth.Verifier,
        judge: Judge,
        pool: concurrent.futures.ThreadPoolExecutor,
        decide_timeout: float,
    ) -> None:
        self.verifier = verifier
        self.judge = judge
        self.pool = pool
        self.decide_timeout = decide_timeout

    def check_xsrf_cookie(self) -> None:  # signed requests, no cookies
        return None

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.finish({"error": self._reason})

    def _refuse(self, status: int, message: str) -> None:
        self.set_status(status)
        self.finish({"error": message})

    async def post(self) -> None:
        body = self.request.body
        headers = self.request.headers
        try:
            self.verifier.check_head("POST", PATH, headers, len(body))
            payload, trailer = body[: -auth.TRAILER_BYTES], body[-auth.TRAILER_BYTES :]
            digest = self.verifier.digest(headers, payload)
            self.verifier.check_body("POST", PATH, digest, headers, trailer)
        except AuthenticationError as err:
            logger.debug("pruning report refused: %s", err)
            return self._refuse(401, str(err))
        try:
            trial, epoch, value = _parse(payload)
        except ValueError as err:
            return self._refuse(400, str(err))
        future = self.pool.submit(self.judge, trial, epoch, value)
        try:
            prune = await asyncio.wait_for(asyncio.wrap_future(future), self.decide_timeout)
        except asyncio.TimeoutError:
            logger.warning(
                "Trial %d: the pruner did not decide epoch %d within %gs; the trial goes on",
                trial,
                epoch + 1,
                self.decide_timeout,
            )
            prune = False
        except Exception:  # a pruner's failure must not stop a trial
            logger.exception("Trial %d: the pruner failed at epoch %d; going on", trial, epoch + 1)
            prune = False
        logger.debug("Trial %d epoch %d: %g, prune: %s", trial, epoch + 1, value, prune)
        self.finish({"decision": PRUNE if prune else GO_ON})


def _log_request(handler: web.RequestHandler) -> None:
    """One DEBUG line per request (tornado's own access log is INFO, one line per epoch)."""
    logger.debug(
        "%d %s %s (%s) %.1f ms",
        handler.get_status(),
        handler.request.method,
        handler.request.uri,
        handler.request.remote_ip,
        1000.0 * handler.request.request_time(),
    )


def _parse(payload: bytes) -> tuple[int, int, float]:
    """The trial, epoch and value of a report body.

    Raises:
        ValueError: not the JSON object of a report (the message says which field).
    """
    try:
        report = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("the body must be a JSON object") from None
    if not isinstance(report, dict):
        raise ValueError("the body must be a JSON object")
    trial, epoch, value = report.get("trial"), report.get("epoch"), report.get("value")
    for name, field_value in (("trial", trial), ("epoch", epoch)):
        if isinstance(field_value, bool) or not isinstance(field_value, int) or field_value < 0:
            raise ValueError(f"`{name}` must be a non-negative integer")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("`value` must be a number")
    if not math.isfinite(value):
        raise ValueError("`value` must be finite")
    return int(trial), int(epoch), float(value)  # type: ignore[arg-type]


class PruneServer(LoopServer):
    """The pruning endpoint of one search (driver). Thread-safe to start and stop.

    Args:
        judge: Decides whether a trial is pruned after an epoch; called from a pool of
            ``workers`` threads, so it must be thread-safe.
        host: Address to bind.
        advertised_host: The address trials are told (default: ``host``).
        secret: The search's secret (default: a fresh random one).
        port: A port, 0 for a free one, or a ``(first, last)`` range.
        decide_timeout: Seconds a report waits for ``judge``; then "go on".
        workers: Threads that run ``judge``.
    """

    def __init__(
        self,
        judge: Judge,
        host: str,
        *,
        advertised_host: str | None = None,
        secret: bytes | None = None,
        port: int | tuple[int, int] = 0,
        decide_timeout: float = 20.0,
        workers: int = 2,
    ) -> None:
        super().__init__(
            host, port, max_body_bytes=MAX_BODY_BYTES, what="pruning endpoint", body_timeout=30.0
        )
        self.secret = auth.new_secret() if secret is None else auth.as_secret(secret)
        self._verifier = auth.Verifier(self.secret)
        self._judge = judge
        self._advertised = advertised_host or host
        self._decide_timeout = float(decide_timeout)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            workers, thread_name_prefix="tensorspark-prune"
        )

    def _router(self) -> httputil.HTTPServerConnectionDelegate:
        options = {
            "verifier": self._verifier,
            "judge": self._judge,
            "pool": self._pool,
            "decide_timeout": self._decide_timeout,
        }
        return web.Application([(PATH, _ReportHandler, options)], log_function=_log_request)

    def _started(self) -> None:
        logger.info("Pruning endpoint listening at %s", self.url)

    def link(self) -> PruneLink:
        """What trials are told: the URL at the advertised host, and the secret. The read
        timeout leaves the driver time to answer "go on" first."""
        host = self._advertised
        host = f"[{host}]" if ":" in host else host
        return PruneLink(
            f"http://{host}:{self.port}", self.secret, read_timeout=self._decide_timeout + 10.0
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Close the port and end the loop and the judge's threads. Idempotent."""
        super().stop(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)


def open_channel(sc: Any, conf: tsconf.ConfSnapshot, judge: Judge) -> PruneServer:
    """Start the pruning endpoint of a search at the address executors reach (driver);
    the caller stops it.

    Raises:
        ConfigurationError: no address for executors to reach the driver at.
        ParameterServerError: the port could not be bound.
    """
    options = tsconf.resolve({}, conf)
    host = options["server_host"] or tsconf.driver_host(sc, conf)
    if not host:
        raise ConfigurationError(
            "Pruning needs an address of the driver that executors reach: set "
            "spark.tensorspark.server.host or spark.driver.host. Received: neither is set"
        )
    server = PruneServer(judge, options["server_bind_host"] or host, advertised_host=host)
    server.start()
    return server
