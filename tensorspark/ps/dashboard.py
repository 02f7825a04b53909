"""The parameter server's live dashboard: one self-contained HTML page served at ``GET /``.

The page (``dashboard.html`` beside this module, shipped as package data) has no external
scripts, fonts or stylesheets, because clusters are often offline; its Content-Security-
Policy forbids loading any. Inline JavaScript reads ``/status`` (JSON) once a second and
draws the loss over time and over the model version (SVG), updates/s, and one table row
per partition's worker.

Authentication: a browser cannot sign requests, so when the server has a secret the page
is opened with the run's read-only token, ``/?token=<status_token(secret)>``
(:func:`tensorspark.ps.auth.status_token`), and the page passes that token on to its
``/status`` requests. :func:`dashboard_url` builds that address; the driver logs it when a
run starts.

Thread-safe: the page is read from the package once and cached (immutable bytes).
"""

from __future__ import annotations

import functools
import importlib.resources
from urllib.parse import quote

#: Content type of the page.
CONTENT_TYPE = "text/html; charset=utf-8"


@functools.lru_cache(maxsize=1)
def page() -> bytes:
    """The dashboard's HTML (read from the package once)."""
    return importlib.resources.files("tensorspark.ps").joinpath("dashboard.html").read_bytes()


def dashboard_url(server_url: str, token: str | None = None) -> str:
    """The address to open the dashboard of the server at ``server_url`` with.

    Args:
        server_url: the server's ``http(s)://host:port``.
        token: the run's read-only status token, or None when the server needs none.
    """
    base = server_url.rstrip("/") + "/"
    return base if not token else f"{base}?token={quote(token, safe='')}"
