"""Raw HTTP probes of a live parameter server: the tools of the hardening tests.

* :class:`ServerProcess` runs a :class:`~tensorspark.ps.server.ParameterServer` in a child
  process, so that its RSS is its own, and counts the log records it writes by level.
* :func:`exchange` sends one probe's raw bytes on a fresh connection (all of them, or up to
  a hang-up) and reads back every response status.
* :class:`Corpus` makes the probes: every endpoint × method × way of authenticating,
  framing variants (Content-Length forms, chunked, Expect, HTTP/1.0, oversized headers),
  body mutations (wire metadata and shapes, JSON nesting and numbers), hang-ups, replays;
  and it keeps the model of the valid pushes (the parameters they must add up to).

Used by ``tests/unit/ps/test_ps_http_fuzz.py`` (short form) and ``bench/ps_fuzz.py`` (long form).
Run as ``python -m tests.unit.ps_probes CONFIG_JSON`` it is the child process's host.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import select
import socket
import string
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st

from tensorspark import wire
from tensorspark.ps import auth

ROOT = Path(__file__).resolve().parents[2]
SECRET = b"probe-secret-probe-secret-probe!"
OTHER_SECRET = b"not-the-secret-not-the-secret-no"

METHODS = ["GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", "get", "FOO"]
ENDPOINTS = ["/push", "/pull", "/join", "/leave", "/status", "/"]
OTHER_PATHS = ["/nope", "/push/", "//push", "/push?x=1", "*"]
AUTHS = ["signed", "none", "wrong-secret", "old-scheme", "bad-head", "stale", "token"]
FRAMINGS = [
    "plain",
    "cl-plus",
    "cl-underscore",
    "cl-inner-space",
    "cl-hex",
    "cl-negative",
    "cl-duplicate",
    "cl-list",
    "cl-unicode",
    "cl-huge",
    "cl-19-digits",
    "cl-float",
    "cl-empty",
    "no-cl",
    "cl-short",
    "cl-long",
    "chunked",
    "chunked-and-cl",
    "expect",
    "http10",
    "connection-close",
    "long-header",
    "huge-header",
    "bad-request-line",
]
DELIVERIES = ["full", "hangup-head", "hangup-mid", "hangup-after"]
#: Framings that leave a signed request valid.
STILL_VALID = ("plain", "expect", "http10", "connection-close", "long-header")


def model_params() -> dict[str, np.ndarray]:
    """The small model the probes push to (60 bytes: the body limit is about 4 MiB)."""
    return {"w": np.arange(12, dtype=np.float32).reshape(4, 3), "b": np.ones(3, np.float32)}


# ---------------------------------------------------------------------- the server's process


class ServerProcess:
    """A parameter server in a child process (``combiner="delta"``, this module's SECRET).

    Args:
        params: parameters of the model: ``"probe"`` (:func:`model_params`) or a number of
            float32 parameters in one tensor.
        server: more keyword arguments of ``ParameterServer``.
    """

    def __init__(self, params: str | int = "probe", **server: Any) -> None:
        config = {"params": params, "server": server}
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.unit.ps_probes", json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            env=env,
            text=True,
        )
        first = self._line(60)
        self.port: int = first["port"]
        self.pid: int = first["pid"]
        self.url = f"http://127.0.0.1:{self.port}"
        self.baseline = 0  # an RSS for the caller to compare with

    def _line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.close()
            raise RuntimeError(f"the server process said nothing within {timeout}s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the server process ended (exit code {self.proc.wait(10)})")
        return json.loads(line)  # type: ignore[no-any-return]

    def rss(self) -> int:
        """The server process's resident memory, bytes (Linux: /proc)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS in /proc")

    def records(self) -> dict[str, Any]:
        """``{"levels": {level name: count}, "errors": [the first ERROR+ messages]}``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("records\n")
        self.proc.stdin.flush()
        return self._line(30)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Records(logging.Handler):
    """Counts every log record by level and keeps the first ERROR+ messages."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.levels: Counter[str] = Counter()
        self.errors: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.levels[record.levelname] += 1
        if record.levelno >= logging.ERROR and len(self.errors) < 5:
            # exc_text is only filled by a Formatter, which this handler does not run.
            trace = logging.Formatter().formatException(record.exc_info) if record.exc_info else ""
            self.errors.append(f"{record.name}: {record.getMessage()}\n{trace}"[-4000:])

    def summary(self) -> dict[str, Any]:
        return {"levels": dict(self.levels), "errors": self.errors}


def _host(config_text: str) -> None:
    """The child process: serve until told to quit on stdin."""
    from tensorspark.ps.server import ParameterServer

    config = json.loads(config_text)
    records = _Records()
    logging.basicConfig(level=logging.INFO, handlers=[records])
    logging.captureWarnings(True)
    spec = config["params"]
    params = model_params() if spec == "probe" else {"w": np.zeros(int(spec), np.float32)}
    with ParameterServer(params, combiner="delta", secret=SECRET, **config["server"]) as server:
        print(json.dumps({"port": server.port, "pid": os.getpid()}), flush=True)
        for line in sys.stdin:
            if line.strip() == "records":
                print(json.dumps(records.summary()), flush=True)
            elif line.strip() == "quit":
                break


# ---------------------------------------------------------------------- one exchange


@dataclass
class Reply:
    """What came back on a probe's connection."""

    statuses: list[int]  # every response status, in order (100 Continue included)
    hung_up: bool  # the probe closed the connection itself before reading
    note: str = ""  # a reset connection, a timeout...


def exchange(port: int, probe: Probe, timeout: float = 10.0) -> Reply:
    """Send ``probe`` on a new connection; then hang up, or read until the first final
    answer is complete or the server closes the connection.

    A probe that waits longer than ``timeout`` is reported with ``note="timeout"``: the
    server neither answered nor let go. (The probe never half-closes its side: Tornado
    takes that for the client going away.)
    """
    data = probe.data
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        received = b""
        try:
            if probe.expect_at is not None:
                sock.sendall(data[: probe.expect_at])
                received = _read_head(sock)
                if received.startswith(b"HTTP/1.1 100"):
                    sock.sendall(data[probe.expect_at :])
            elif probe.send is not None:
                sock.sendall(data[: probe.send])
                return Reply([], hung_up=True)
            else:
                sock.sendall(data)
            if probe.hang_up:
                return Reply([], hung_up=True)
            while not _answered(received, probe.method):
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                received += chunk
        except (ConnectionResetError, BrokenPipeError) as err:
            return Reply(_statuses(received, probe.method)[0], False, type(err).__name__)
        except TimeoutError:
            return Reply(_statuses(received, probe.method)[0], False, "timeout")
    return Reply(_statuses(received, probe.method)[0], False)


def _read_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def _answered(data: bytes, method: str) -> bool:
    return _statuses(data, method)[1]


def _statuses(data: bytes, method: str) -> tuple[list[int], bool]:
    """The status of every response in ``data`` (interim ones included), and whether a
    final one has arrived whole (its body by Content-Length; without one, the server
    closes the connection after it)."""
    out: list[int] = []
    pos = 0
    while pos < len(data):
        end = data.find(b"\r\n\r\n", pos)
        if end < 0 or not data.startswith(b"HTTP/1.", pos):
            break
        lines = data[pos:end].decode("latin-1").split("\r\n")
        if not lines[0][9:12].isdigit():
            break
        code = int(lines[0][9:12])
        out.append(code)
        length: int | None = None
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length" and value.strip().isdigit():
                length = int(value.strip())
        pos = end + 4
        if code >= 200:
            if method == "HEAD":
                return out, True
            return out, length is not None and len(data) >= pos + length
    return out, False


# ---------------------------------------------------------------------- the probes


@dataclass
class Probe:
    """One request as raw bytes, and how to deliver it."""

    label: str
    data: bytes
    method: str = ""
    send: int | None = None  # hang up after sending this many bytes
    hang_up: bool = False  # send everything, then hang up without reading
    expect_at: int | None = None  # send the head, wait for 100 Continue, then the body
    valid_push: bool = False  # a valid, fresh push: must be answered 200 and applied
    extra: dict[str, Any] = field(default_factory=dict)


def _cl_forms(n: int) -> dict[str, list[tuple[str, str]]]:
    """Content-Length headers that a strict parser refuses (by framing name)."""
    digits = str(n)
    arabic = "".join(chr(0x660 + int(d)) for d in digits)
    return {
        "cl-plus": [("Content-Length", f"+{n}")],
        "cl-underscore": [("Content-Length", f"{digits[:1]}_{digits[1:] or '0'}")],
        "cl-inner-space": [("Content-Length", f"{digits[:1]} {digits[1:] or '0'}")],
        "cl-hex": [("Content-Length", hex(n))],
        "cl-negative": [("Content-Length", f"-{n}")],
        "cl-duplicate": [("Content-Length", digits), ("Content-Length", digits)],
        "cl-list": [("Content-Length", f"{n}, {n}")],
        "cl-unicode": [("Content-Length", arabic)],
        "cl-huge": [("Content-Length", "9" * 25)],
        "cl-19-digits": [("Content-Length", digits.rjust(19, "0"))],
        "cl-float": [("Content-Length", f"{n}.0")],
        "cl-empty": [("Content-Length", "")],
    }


class Corpus:
    """Makes probes for one server and keeps the model of the valid pushes.

    Valid pushes come from ``partition`` with increasing ``seq``; each adds a delta of
    multiples of 1/8 (exact in float32, so the sum does not depend on the order). Pushes
    that are refused for certain carry a non-zero delta too (an accepted one would show);
    pushes that a random mutation might leave valid carry zeros, on ``partition + 1000``.
    """

    def __init__(self, partition: int = 0, seed: int = 0) -> None:
        self.partition = partition
        self.seq = 0
        self.rng = random.Random(seed)
        self.expected = {k: v.copy() for k, v in model_params().items()}
        self.applied = 0
        self.token = auth.status_token(SECRET)

    # -- bodies

    def _meta(self, seq: int, partition: int | None = None) -> dict[str, Any]:
        return {
            "partition": self.partition if partition is None else partition,
            "epoch": 0,
            "seq": seq,
            "attempt": 0,
            "samples": 1,
            "base_version": 0,
        }

    def _delta(self, zero: bool = False) -> dict[str, np.ndarray]:
        out = {}
        for k, v in model_params().items():
            steps = np.array([self.rng.randint(-4, 4) for _ in range(v.size)], np.float32).reshape(
                v.shape
            )
            out[k] = np.zeros_like(v) if zero else steps / np.float32(8)
        return out

    def push_body(self, *, zero: bool = False, meta: dict[str, Any] | None = None) -> bytes:
        """A well-formed push at the next sequence number (not counted as applied)."""
        partition = self.partition + 1000 if zero else self.partition
        return wire.encode_bytes(
            self._delta(zero), {**self._meta(self.seq + 1, partition), **(meta or {})}
        )

    def natural_body(self, path: str, *, zero: bool = False) -> bytes:
        if path.startswith("/push"):
            return self.push_body(zero=zero)
        if path.startswith("/join"):
            return json.dumps({"partition": self.partition, "attempt": 0}).encode()
        if path.startswith("/leave"):
            return json.dumps({"partition": self.partition, "attempt": 0, "state": "done"}).encode()
        return b""

    # -- requests

    def request(
        self,
        method: str,
        target: str,
        body: bytes,
        *,
        how: str = "signed",
        framing: str = "plain",
        delivery: str = "full",
        label: str = "",
    ) -> Probe:
        """A request as raw bytes: authenticated ``how``, framed and delivered as named."""
        headers: list[tuple[str, str]] = [
            ("Host", "127.0.0.1"),
            ("Content-Type", "application/octet-stream"),
        ]
        if how == "token":
            target = f"{target}{'&' if '?' in target else '?'}token={self.token}"
        elif how != "none":
            secret = OTHER_SECRET if how == "wrong-secret" else SECRET
            now = time.time() - 1000 if how == "stale" else None
            signed, trailer = auth.Signer(secret).sign(method, target, body, now=now)
            if how == "old-scheme":  # what a TSPS2 client sends: no head signature
                signed.pop(auth.HEADER_HEAD)
            elif how == "bad-head":  # the head signed for another length
                signed = auth.Signer(secret).sign(method, target, body + b"x", now=now)[0]
            headers.extend(signed.items())
            body = body + trailer
        head_line = f"{method} {target} HTTP/1.1"
        expect_at = None
        forms = _cl_forms(len(body))
        if framing in forms:
            headers.extend(forms[framing])
        elif framing == "no-cl":
            pass
        elif framing == "cl-short":
            headers.append(("Content-Length", str(max(0, len(body) - 1))))
        elif framing == "cl-long":
            headers.append(("Content-Length", str(len(body) + 10)))
        elif framing in ("chunked", "chunked-and-cl"):
            headers.append(("Transfer-Encoding", "chunked"))
            if framing == "chunked-and-cl":
                headers.append(("Content-Length", str(len(body))))
            body = (f"{len(body):x}\r\n".encode() + body + b"\r\n" if body else b"") + b"0\r\n\r\n"
        else:
            headers.append(("Content-Length", str(len(body))))
            if framing == "expect":
                headers.append(("Expect", "100-continue"))
            elif framing == "http10":
                head_line = f"{method} {target} HTTP/1.0"
            elif framing == "connection-close":
                headers.append(("Connection", "close"))
            elif framing == "long-header":
                headers.append(("X-Junk", "j" * 10_000))
            elif framing == "huge-header":
                headers.append(("X-Junk", "j" * 70_000))
            elif framing == "bad-request-line":
                head_line = f"{method}  {target} HTTP/1.1 extra"
        head = ("\r\n".join([head_line, *(f"{k}: {v}" for k, v in headers)]) + "\r\n\r\n").encode(
            "utf-8"
        )
        if framing == "expect":
            expect_at = len(head)
        data = head + body
        probe = Probe(
            label or f"{method} {target} {how} {framing} {delivery}",
            data,
            method=method,
            expect_at=expect_at,
        )
        if framing == "cl-long":  # the body never completes: the client goes away
            delivery = "hangup-after" if delivery == "full" else delivery
        if delivery == "hangup-head":
            probe.send, probe.expect_at = len(head), None
        elif delivery == "hangup-mid":
            probe.send, probe.expect_at = len(head) + len(body) // 2, None
        elif delivery == "hangup-after":
            probe.hang_up = True
        return probe

    def valid_push(self, target: str = "/push", framing: str = "plain") -> Probe:
        """A valid push (signed, fresh seq): counted in the model; must be applied."""
        self.seq += 1
        delta = self._delta()
        body = wire.encode_bytes(delta, self._meta(self.seq))
        probe = self.request(
            "POST",
            target,
            body,
            framing=framing,
            label=f"valid push seq={self.seq} {target} {framing}",
        )
        probe.valid_push = True
        for k, v in delta.items():
            self.expected[k] = self.expected[k] + v
        self.applied += 1
        return probe

    # -- the deterministic corpus

    def everything(self) -> Iterator[Probe]:
        """Every endpoint × method × way of authenticating; then framings, body
        mutations, JSON mutations, hang-ups and replays. Valid pushes are interleaved."""
        for path in ENDPOINTS + OTHER_PATHS:
            for method in METHODS:
                for how in AUTHS:
                    if (method, path.partition("?")[0], how) == ("POST", "/push", "signed"):
                        yield self.valid_push(path)
                    else:
                        yield self.request(method, path, self.natural_body(path), how=how)
        for path, method in (
            ("/push", "POST"),
            ("/join", "POST"),
            ("/pull", "GET"),
            ("/status", "GET"),
        ):
            for framing in FRAMINGS:
                if path == "/push" and framing in STILL_VALID:
                    yield self.valid_push(framing=framing)
                else:
                    yield self.request(method, path, self.natural_body(path), framing=framing)
        yield from self.push_mutations()
        yield from self.json_mutations()
        for delivery in DELIVERIES[1:]:
            for framing in ("plain", "expect"):
                yield self.request(
                    "POST", "/push", self.big_push(), framing=framing, delivery=delivery
                )
                # Sent whole before hanging up, a push may well be applied: zeros.
                yield self.request(
                    "POST", "/push", self.push_body(zero=True), framing=framing, delivery=delivery
                )
                yield self.request(
                    "POST", "/push", self.big_push(), how="none", framing=framing, delivery=delivery
                )
        yield self.valid_push()
        replayed = self.valid_push()
        yield replayed
        yield Probe("replayed valid push", replayed.data, method="POST")

    def big_push(self) -> bytes:
        """A push over 1 MiB (read by the server's direct path): an unknown extra tensor."""
        tensors = {**self._delta(), "extra": np.zeros(300_000, np.float32)}
        return wire.encode_bytes(tensors, self._meta(self.seq + 1))

    def push_mutations(self) -> Iterator[Probe]:
        """Signed pushes, each malformed for certain (findings 5 and 6 among them)."""
        bad_numbers = [-1, -(10**310), 2**63, 2**64, 1.5, True, "1", None, [1], {"a": 1}]
        for key in ("partition", "epoch", "seq", "attempt", "samples", "base_version"):
            for value in bad_numbers:
                yield self.request(
                    "POST",
                    "/push",
                    self.push_body(meta={key: value}),
                    label=f"meta {key}={str(value)[:20]}",
                )
        yield self.request(
            "POST", "/push", self.push_body(meta={"samples": 2**53}), label="samples 2**53"
        )
        yield self.request(
            "POST",
            "/push",
            self.push_body(meta={"metrics": {f"m{i}": 1.0 for i in range(300)}}),
            label="300 metrics",
        )
        yield self.request(
            "POST",
            "/push",
            self.push_body(meta={"metrics": {"m" * 300: 1.0}}),
            label="long metric name",
        )
        message = self.push_body()
        hlen = int.from_bytes(message[8:12], "little")
        header = json.loads(message[12 : 12 + hlen])
        data_start = 12 + hlen + (-(12 + hlen) % 8)
        entry_changes: list[dict[str, Any]] = [
            {"shape": [0, 10**30], "nbytes": 0},
            {"shape": [0, 2**62, 4], "nbytes": 0},
            {"shape": [0] * 33, "nbytes": 0},
            {"shape": [-1, 3]},
            {"shape": [10**30]},
            {"shape": "3"},
            {"shape": [3.0]},
            {"nbytes": -1},
            {"nbytes": 10**30},
            {"offset": -8},
            {"offset": 10**30},
            {"offset": 4},
            {"dtype": "object"},
            {"dtype": None},
            {"name": ""},
            {"name": "w"},
        ]
        for change in entry_changes:
            mutated = json.loads(json.dumps(header))
            mutated["tensors"][1].update(change)
            text = json.dumps(mutated).encode()
            head = message[:8] + len(text).to_bytes(4, "little") + text
            body = head + b"\0" * (-len(head) % 8) + message[data_start:]
            yield self.request("POST", "/push", body, label=f"entry {str(change)[:40]}")
        for text in (b"[" * 100_000, b"{" * 10_000, b'"' + b"\\" * 5000):
            head = message[:8] + len(text).to_bytes(4, "little") + text
            yield self.request(
                "POST", "/push", head + b"\0" * (-len(head) % 8), label="deep wire header"
            )

    def json_mutations(self) -> Iterator[Probe]:
        """Signed /join and /leave bodies, each malformed for certain (finding 7)."""
        p = self.partition
        bodies = [
            b"[" * 100_000,
            b"[" * 60_000,
            b'{"a":' * 5_000,
            b"{" + b'"k":' * 20 + b"[" * 20,
            b"1" * 5000,
            b"null",
            b"[]",
            b'"x"',
            b"\xff\xfe",
            b"NaN",
            b"",
            b'{"partition": 1e400, "attempt": 0}',
            b'{"partition": ' + b"9" * 5000 + b', "attempt": 0}',
            b'{"partition": -1, "attempt": 0}',
            json.dumps({"partition": 2**63, "attempt": 0}).encode(),
            json.dumps({"partition": p, "attempt": -(10**310)}).encode(),
            json.dumps({"partition": p, "attempt": True}).encode(),
            json.dumps({"partition": str(p), "attempt": 0}).encode(),
        ]
        for path in ("/join", "/leave"):
            for body in bodies:
                yield self.request("POST", path, body, label=f"{path} {body[:24]!r}")
        for state in ("running", 5, None, ["done"], "x" * 100_000):
            body = json.dumps({"partition": p, "attempt": 0, "state": state}).encode()
            yield self.request("POST", "/leave", body, label=f"leave state={str(state)[:10]}")


# ---------------------------------------------------------------------- drawn probes

_texts = st.text(alphabet=string.printable, max_size=12)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_edits = st.lists(
    st.tuples(
        st.sampled_from(["set", "insert", "delete"]), st.integers(0, 10**6), st.integers(0, 255)
    ),
    max_size=3,
)

#: What hypothesis draws for one probe (:func:`drawn_probe`'s keyword arguments).
DRAWS = st.fixed_dictionaries(
    {
        "method": st.sampled_from(METHODS) | _texts,
        "path": st.sampled_from(ENDPOINTS + OTHER_PATHS) | _texts.map(lambda t: "/" + t),
        "how": st.sampled_from(AUTHS),
        "framing": st.sampled_from(FRAMINGS),
        "delivery": st.sampled_from(DELIVERIES),
        "body": st.sampled_from(["natural"]) | st.binary(max_size=512) | _json,
        "body_edits": _edits,
        "head_edits": _edits,
    }
)


def _edited(data: bytes, edits: list[tuple[str, int, int]], limit: int | None = None) -> bytes:
    """``data`` with byte edits at positions below ``limit`` (default: anywhere)."""
    raw = bytearray(data)
    for op, pos, value in edits:
        at = pos % ((len(raw) if limit is None else min(limit, len(raw))) + 1)
        if op == "insert" or at == len(raw):
            raw[at:at] = bytes([value])
        elif op == "set":
            raw[at] = value
        else:
            del raw[at]
    return bytes(raw)


def drawn_probe(
    corpus: Corpus,
    *,
    method: str,
    path: str,
    how: str,
    framing: str,
    delivery: str,
    body: object,
    body_edits: list[tuple[str, int, int]],
    head_edits: list[tuple[str, int, int]],
) -> Probe:
    """A probe from hypothesis's draws (:data:`DRAWS`).

    Body edits are made before signing (they reach the decoder and the checks), head
    edits after (they reach Tornado's parser and ours). A push that may still be valid
    carries zeros, and is edited only in its wire header: whatever it is taken for, it
    changes no value. A head left without its end is sent whole and hung up on (the
    server rightly waits for the rest).
    """
    maybe_valid = how == "signed" and method == "POST" and path.partition("?")[0] == "/push"
    zero = maybe_valid and (framing in STILL_VALID or bool(head_edits))
    if body == "natural":
        data = corpus.natural_body(path, zero=zero)
    elif isinstance(body, bytes):
        data = body
    else:
        data = json.dumps(body).encode()
    if body_edits:
        wire_head = (
            12 + int.from_bytes(data[8:12], "little") if zero and body == "natural" else None
        )
        data = _edited(data, body_edits, wire_head)
    probe = corpus.request(method, path, data, how=how, framing=framing, delivery=delivery)
    if head_edits:
        head_end = probe.data.find(b"\r\n\r\n") + 4
        probe.data = _edited(probe.data[:head_end], head_edits) + probe.data[head_end:]
        end = re.search(rb"\r?\n\r?\n", probe.data)
        if end is None:
            probe.hang_up, probe.expect_at = True, None
        elif probe.expect_at is not None:
            probe.expect_at = end.end()
    return probe


if __name__ == "__main__":
    _host(sys.argv[1])
