"""Fuzzing the push endpoint of a live server (hypothesis, loopback).

Random and mutated payloads, correctly signed so they reach the decoder, never crash
the server, never change the parameters, and are answered with a 4xx. One server serves
the whole module; it must still work normally at the end.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorspark import wire
from tensorspark.errors import WireFormatError
from tensorspark.ps import auth
from tensorspark.ps.client import ParameterClient
from tensorspark.ps.server import ParameterServer

SECRET = b"fuzz-secret-fuzz-secret-fuzz-sec"
_FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _model() -> dict[str, np.ndarray]:
    return {"w": np.arange(12, dtype=np.float32).reshape(4, 3), "b": np.ones(3, np.float32)}


def _meta(seq: int = 0) -> dict:
    return {"partition": 0, "epoch": 0, "seq": seq, "attempt": 0, "samples": 1, "base_version": 0}


@pytest.fixture(scope="module")
def server() -> Iterator[ParameterServer]:
    with ParameterServer(_model(), combiner="delta", secret=SECRET) as s:  # exact sums below
        yield s


def _push(server: ParameterServer, body: bytes) -> int:
    headers, trailer = auth.Signer(SECRET).sign("POST", "/push", body)
    headers["Content-Length"] = str(len(body) + len(trailer))
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", "/push", body=body + trailer, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def _assert_untouched(server: ParameterServer) -> None:
    params = server.params()
    for name, arr in _model().items():
        np.testing.assert_array_equal(params[name], arr)
    assert server.version == 0


@_FUZZ
@given(body=st.binary(max_size=2048))
def test_random_payloads_get_4xx(server: ParameterServer, body: bytes) -> None:
    assert 400 <= _push(server, body) < 500
    _assert_untouched(server)


# Each mutation turns the valid push into an invalid one, whatever the drawn values.
_BAD_VALUES = st.one_of(
    st.none(),
    st.text(max_size=3),
    st.floats(allow_nan=False),
    st.lists(st.integers(), max_size=2),
    st.booleans(),
)
_MUTATIONS = st.one_of(
    st.tuples(
        st.just("meta"),
        st.sampled_from(["partition", "epoch", "seq", "attempt", "samples", "base_version"]),
        _BAD_VALUES,
    ),
    st.tuples(
        st.just("drop-meta"),
        st.sampled_from(["partition", "epoch", "seq", "attempt", "samples", "base_version"]),
        st.none(),
    ),
    st.tuples(
        st.just("entry"),
        st.sampled_from(["name", "dtype", "shape", "offset", "nbytes"]),
        st.one_of(_BAD_VALUES, st.integers(-10, -1), st.integers(10**6, 10**30)),
    ),
    st.tuples(
        st.just("rename"),
        st.text(min_size=1, max_size=4).filter(lambda t: t not in ("w", "b")),
        st.none(),
    ),
    st.tuples(
        st.just("dtype"), st.sampled_from(["float64", "int32", "float16", "uint8"]), st.none()
    ),
    # "b" (12 bytes) ends the message with 4 bytes of padding: cut at least into its data.
    st.tuples(st.just("truncate"), st.integers(5, 48), st.none()),
)


def _mutated(kind: str, key: object, value: object) -> bytes:
    if kind == "dtype":  # same names and shapes, another dtype
        return wire.encode_bytes({k: v.astype(str(key)) for k, v in _model().items()}, _meta())
    if kind == "rename":
        return wire.encode_bytes({"w": _model()["w"], str(key): _model()["b"]}, _meta())
    message = wire.encode_bytes(_model(), _meta())
    if kind == "truncate":
        return message[: len(message) - int(key)]  # type: ignore[call-overload]
    (hlen,) = np.frombuffer(message[8:12], "<u4")
    header = json.loads(message[12 : 12 + int(hlen)])
    if kind == "meta":
        header["meta"][key] = value
    elif kind == "drop-meta":
        del header["meta"][key]
    elif kind == "entry":
        entry = header["tensors"][1]
        if entry[key] == value or (key == "nbytes" and value is False):
            value = "changed"  # the value drawn happens to be the valid one
        entry[key] = value
    text = json.dumps(header).encode()
    head = message[:8] + len(text).to_bytes(4, "little") + text
    data_start = 12 + int(hlen) + (-(12 + int(hlen)) % 8)
    return head + b"\0" * (-len(head) % 8) + message[data_start:]


@_FUZZ
@given(mutation=_MUTATIONS)
def test_mutated_pushes_get_4xx(
    server: ParameterServer, mutation: tuple[str, object, object]
) -> None:
    assert 400 <= _push(server, _mutated(*mutation)) < 500, mutation
    _assert_untouched(server)


@_FUZZ
@given(data=st.data())
def test_byte_flips_never_change_the_parameters(
    server: ParameterServer, data: st.DataObject
) -> None:
    """Flipping bytes in the preamble and header of a push whose delta is all zeros:
    whatever still parses as a valid push may be applied (and can change no value, as
    every data byte is zero); anything else gets a 4xx."""
    zeros = {k: np.zeros_like(v) for k, v in _model().items()}
    parts = wire.encode(zeros, _meta(seq=10**6))
    message = bytearray(b"".join(bytes(p) for p in parts))
    header_end = len(parts[0])
    for _ in range(data.draw(st.integers(1, 4))):
        message[data.draw(st.integers(0, header_end - 1))] = data.draw(st.integers(0, 255))
    code = _push(server, bytes(message))
    try:
        tensors, _meta_out = wire.decode(bytes(message))
        parses = {k: (v.dtype, v.shape) for k, v in tensors.items()} == {
            k: (v.dtype, v.shape) for k, v in _model().items()
        }
    except WireFormatError:
        parses = False
    if not parses:
        assert 400 <= code < 500
    else:
        assert code in (200, 400)
    params = server.params()
    for name, arr in _model().items():
        np.testing.assert_array_equal(params[name], arr)


def test_server_still_serves_after_the_fuzzing(server: ParameterServer) -> None:
    with ParameterClient(server.url, secret=SECRET) as client:
        delta = {k: np.ones_like(v) for k, v in _model().items()}
        result = client.push(delta, {**_meta(seq=2 * 10**6), "partition": 99})
        assert result.status == "applied"
        np.testing.assert_array_equal(result.params["b"], 2.0)
        status = client.status()
    assert status["rejected_requests"] > 0
