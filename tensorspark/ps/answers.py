"""What a parameter server's answer means to its client: the body, or the error to raise.

:class:`~tensorspark.ps.client.ParameterClient` reads an answer
(:mod:`tensorspark.ps.connection`) and hands it to :func:`check_answer`: a 200's body,
:class:`~tensorspark.errors.AuthenticationError` for a 401 (retrying cannot help),
:class:`Busy` for a 503 with ``Retry-After`` (retried with backoff), else a
:class:`~tensorspark.errors.ParameterServerError` with the server's message; a server not
reached in time is :func:`unreachable`. Pure; runs on executors.
"""

from __future__ import annotations

import json

from tensorspark.errors import (
    AuthenticationError,
    ParameterServerConnectionError,
    ParameterServerError,
)


class Busy(Exception):
    """A 503 with ``Retry-After``: the server may take the request a moment later."""

    def __init__(self, error: ParameterServerError) -> None:
        super().__init__(str(error))
        self.error = error


def check_answer(
    url: str, method: str, path: str, status: int, headers: dict[str, str], body: bytearray
) -> bytearray:
    """``body`` of a 200; otherwise the error the server's answer means.

    Raises:
        AuthenticationError: 401.
        Busy: 503 with ``Retry-After`` (retried by the caller).
        ParameterServerError: any other status, with the server's message.
    """
    if status == 200:
        return body
    try:
        message = json.loads(bytes(body).decode("utf-8")).get("error", "")
    except ValueError:
        message = bytes(body[:500]).decode("utf-8", "replace")
    if status == 401:
        raise AuthenticationError(
            f"the parameter server at {url} refused {method} {path}: {message}. "
            "The worker must use the secret of the run that started this server.",
            status=status,
            url=f"{url}{path}",
        )
    error = ParameterServerError(
        f"parameter server {url}{path} answered {status}: {message}",
        status=status,
        url=f"{url}{path}",
    )
    if status == 503 and "retry-after" in headers:
        raise Busy(error)
    raise error


def unreachable(
    url: str, err: BaseException, waited: float, ps_timeout: float, path: str
) -> ParameterServerConnectionError:
    """The error of a server not reached within ``waited`` seconds, with the usual causes."""
    within = (
        f"ps_timeout={ps_timeout:g}s"
        if waited >= ps_timeout
        else f"{waited:g}s (the run's ps_timeout={ps_timeout:g}s since the job started had passed)"
    )
    return ParameterServerConnectionError(
        f"cannot reach the parameter server at {url} within {within} "
        f"({type(err).__name__}: {err}). Usual causes: the server host is not reachable from "
        "the executors (set server_host / spark.driver.host to an address they can route to), "
        "a firewall blocks the port, or the driver died.",
        url=f"{url}{path}",
    )
