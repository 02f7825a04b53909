"""The ``tensorspark`` command line.

::

    tensorspark mnist [--data-dir D] [--partitions N] [--epochs E] [...]
        Train the seed's MNIST softmax example on local Spark (see
        ``tensorspark.examples.spark_mnist``; every option of that script is accepted).

    tensorspark status URL [--secret S | --token T] [--json] [--timeout SECONDS]
        Print a running parameter server's status: totals and one row per worker.
        URL is the server's address or its dashboard address (a ``?token=`` in it is used).

The CLI is one of the two places (with the progress bar) that write to the terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import IO, Any
from urllib.parse import parse_qs, quote, urlsplit, urlunsplit

from tensorspark.progress import DEFAULT_LOSS_WINDOW, LossAverager, format_duration

#: Environment variable read when ``--secret`` is not given.
SECRET_ENV = "TENSORSPARK_SECRET"

_COLUMNS = (
    ("partition", "partition"),
    ("attempt", "attempt"),
    ("state", "state"),
    ("pushes", "pushes"),
    ("samples", "samples"),
    ("last seen", "last_seen"),
    ("staleness", "staleness"),
    ("epoch", "epoch"),
    ("loss", "loss"),
    ("host", "host"),
)


class CommandError(Exception):
    """A command failed for a reason the user can fix; printed without a traceback."""


def status_url(url: str, token: str | None) -> str:
    """The ``/status`` address of the server at ``url`` (a server or dashboard address).

    A ``token`` query parameter already in ``url`` is kept unless ``token`` is given.

    Raises:
        CommandError: ``url`` is not an http(s) address.
    """
    parts = urlsplit(url if "://" in url else "http://" + url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CommandError(f"URL must look like http://host:port. Received: url={url!r}")
    found = parse_qs(parts.query).get("token")
    token = token or (found[-1] if found else None)
    query = f"token={quote(token, safe='')}" if token else ""
    return urlunsplit((parts.scheme, parts.netloc, "/status", query, ""))


def fetch_status(url: str, token: str | None = None, timeout: float = 10.0) -> dict[str, Any]:
    """GET the server's ``/status`` JSON (one request, ``timeout`` seconds).

    Raises:
        CommandError: the server cannot be reached, refuses the request or answers
            something that is not the status JSON.
    """
    target = status_url(url, token)
    shown = target.split("?", 1)[0]
    try:
        with urllib.request.urlopen(target, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as err:
        if err.code == 401:
            raise CommandError(
                f"{shown} refused the request (401): pass the run's --secret (or ${SECRET_ENV}), "
                "--token, or the dashboard URL with its ?token= that the driver logged"
            ) from None
        raise CommandError(f"{shown} answered {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise CommandError(f"cannot reach the parameter server at {shown}: {reason}") from None
    try:
        status = json.loads(body)
    except ValueError:
        raise CommandError(
            f"{shown} did not answer JSON: is this a tensorspark parameter server?"
        ) from None
    if not isinstance(status, dict) or "workers" not in status:
        raise CommandError(f"{shown} did not answer a tensorspark status")
    return status


def _cell(key: str, value: Any, now: float) -> str:
    if value is None:
        return "-"
    if key == "last_seen":
        return f"{format_duration(now - float(value))} ago" if value else "-"
    if key == "epoch":
        return str(int(value) + 1) if int(value) >= 0 else "-"
    if key == "loss":
        return f"{float(value):.4g}"
    return str(value)


def format_status(status: Mapping[str, Any]) -> str:
    """The status as text: a summary line and an aligned table with one row per worker."""
    now = float(status.get("started_at", 0.0)) + float(status.get("uptime", 0.0))
    combiner = status.get("combiner") or {}
    name = combiner.get("name", "?") if isinstance(combiner, Mapping) else str(combiner)
    lines = [
        f"version {status['version']}  mode {status['mode']}  combiner {name}  "
        f"uptime {format_duration(status.get('uptime'))}",
        f"pushes applied {status['applied_pushes']}  duplicate {status['duplicate_pushes']}  "
        f"stale {status.get('stale_pushes', 0)}  diverged {status.get('diverged_pushes', 0)}  "
        f"samples {status['samples']}  updates/s {float(status.get('updates_per_sec', 0.0)):.1f}",
    ]
    if status.get("elastic"):  # elastic sync (tensorspark.ps.elastic)
        lines.append(
            f"elastic sync: short rounds {status.get('short_rounds', 0)}  partitions lost "
            f"{status.get('partitions_lost', 0)}  rejoined {status.get('partitions_rejoined', 0)}"
            f"  seconds lost {float(status.get('seconds_lost', 0.0)):.1f}"
        )
    averager = LossAverager()
    averager.add(status.get("history") or [])
    if averager.latest is not None:
        metrics = "".join(f"  {k} {v:.4g}" for k, v in averager.latest.metrics.items())
        lines.append(
            f"global loss {averager.latest.loss:.4g}{metrics} (moving average of the last "
            f"{DEFAULT_LOSS_WINDOW} pushes)"
        )
    workers = status.get("workers") or []
    if not workers:
        lines.append("no workers have joined yet")
        return "\n".join(lines)
    rows = [[title for title, _ in _COLUMNS]]
    rows += [[_cell(key, w.get(key), now) for _, key in _COLUMNS] for w in workers]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    lines.append("")
    for r in rows:
        cells = (
            c.ljust(w) if i in (0, 2) else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _token(args: argparse.Namespace) -> str | None:
    if args.token:
        return str(args.token)
    secret = args.secret or os.environ.get(SECRET_ENV)
    if not secret:
        return None
    from tensorspark.errors import ConfigurationError
    from tensorspark.ps.auth import as_secret, status_token

    try:
        return status_token(as_secret(secret, "--secret"))
    except ConfigurationError as err:
        raise CommandError(str(err)) from None


def _status(args: argparse.Namespace, out: IO[str]) -> int:
    status = fetch_status(args.url, _token(args), timeout=args.timeout)
    if args.json:
        out.write(json.dumps(status, indent=2) + "\n")
    else:
        out.write(format_status(status) + "\n")
    return 0


def _mnist(extra: Sequence[str], out: IO[str]) -> int:
    from tensorspark.examples import spark_mnist

    return spark_mnist.main(list(extra), out)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (the ``mnist`` command's options are parsed by the example)."""
    parser = argparse.ArgumentParser(
        prog="tensorspark", description="TensorFlow and Keras on Apache Spark."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "mnist",
        help="train the MNIST softmax example on local Spark",
        description="Train the seed's MNIST softmax example on local Spark. Options: see "
        "`tensorspark mnist --help` (--data-dir, --partitions, --epochs, --master, ...).",
        add_help=False,
    )
    status = commands.add_parser("status", help="print a running parameter server's status table")
    status.add_argument(
        "url", help="the parameter server's URL, or the dashboard URL the driver logged"
    )
    status.add_argument("--secret", default=None, help=f"the run's secret (default: ${SECRET_ENV})")
    status.add_argument("--token", default=None, help="the run's read-only status token")
    status.add_argument("--json", action="store_true", help="print the raw status JSON")
    status.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for the server (default 10)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tensorspark`` console script. Returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "mnist":
        return _mnist(args_list[1:], sys.stdout)
    args = build_parser().parse_args(args_list)
    try:
        return _status(args, sys.stdout)
    except CommandError as err:
        sys.stderr.write(f"tensorspark {args.command}: error: {err}\n")
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
