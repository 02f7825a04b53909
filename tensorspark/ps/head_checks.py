"""The checks of a request's head, made before anything is allocated for its body.

A request to the parameter server is refused on its head alone when its route does not
exist (404) or takes another method (405), when its declared body is over the route's
limit (413), when it is signed to a server without a secret (400), or when its signature
does not verify (401). ``GET /status`` and ``GET /`` are also served unsigned when the
status is public or the read-only ``?token=`` is right. :mod:`tensorspark.ps.http`
answers the refusal; room among the bodies in flight is :mod:`tensorspark.ps.admission`'s.

Runs on the server's loop thread; pure apart from the verifier's replay window.
"""

from __future__ import annotations

from collections.abc import Set
from urllib.parse import parse_qs

from tornado import httputil

import tensorspark.ps.auth as auth
from tensorspark.errors import AuthenticationError
from tensorspark.ps.admission import Limits
from tensorspark.ps.routes import STATUS_ROUTES, shown
from tensorspark.ps.validation import RequestError


def check_head(
    method: str,
    target: str,
    headers: httputil.HTTPHeaders,
    length: int,
    *,
    routes: Set[tuple[str, str]],
    limits: Limits,
    verifier: auth.Verifier | None,
    public_status: bool,
) -> bool:
    """Refuse a head whose route, size or signature is wrong (nothing allocated yet).

    Args:
        method: the request's method.
        target: the request line's target (path and query).
        headers: the request's headers.
        length: the declared body length, already read from a well-formed header
            (:func:`~tensorspark.ps.admission.content_length`).
        routes: the ``(method, path)`` pairs this server answers.
        limits: the server's request limits (body sizes).
        verifier: checks signed requests; None: the server takes unsigned ones only.
        public_status: ``GET /status`` and ``GET /`` need no authentication.

    Returns:
        Whether the head was verified as signed: the body then ends with its signature.

    Raises:
        RequestError: 404/405 (route), 413 (size), 400 (signed to a server without a
            secret), 401 (authentication).
    """
    path, _, query = target.partition("?")
    if (method, path) not in routes:
        allowed = next((m for m, p in routes if p == path), None)
        if allowed is None:
            raise RequestError(404, f"no endpoint {shown(method)} {shown(path)}")
        raise RequestError(405, f"{shown(method)} is not allowed on {path}; use {allowed}")
    limit = limits.max_body_bytes if path in ("/push", "/rows") else limits.max_json_bytes
    if length > limit:
        raise RequestError(
            413, f"request body of {length} bytes exceeds the limit of {limit} bytes"
        )
    if verifier is None:
        if auth.HEADER_NONCE in headers or auth.HEADER_HEAD in headers:
            # A signed request's body ends with its signature, which this server would
            # take for part of the body.
            raise RequestError(
                400,
                "this parameter server does not check signatures (authenticate=False); "
                "create the client without secret=",
            )
        return False
    if status_read_allowed(method, path, query, verifier, public_status):
        return False
    try:
        verifier.check_head(method, target, headers, length)
    except AuthenticationError as err:
        raise RequestError(401, str(err)) from None
    return True


def status_read_allowed(
    method: str, path: str, query: str, verifier: auth.Verifier, public_status: bool
) -> bool:
    """Whether an unsigned request may read the status: it is public, or the request
    carries the read-only status token (``?token=``)."""
    if (method, path) not in STATUS_ROUTES:
        return False
    if public_status:
        return True
    token = parse_qs(query).get("token")
    return token is not None and len(token) > 0 and verifier.check_status_token(token[-1])
