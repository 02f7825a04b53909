"""Compressed updates: codecs, error feedback, the wire's compressed entries, and a real
server that keeps float32 weights, refuses NaN, applies each push once and counts bytes."""

from __future__ import annotations

import json
import socket
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorspark import wire
from tensorspark.errors import ConfigurationError, ParameterServerError, WireFormatError
from tensorspark.ps import Compression, ParameterClient, ParameterServer
from tensorspark.ps import compression as comp
from tensorspark.ps.store import Store

# Largest error of one rounding, relative to the largest magnitude (of the block, for int8).
_ERROR = {"bf16": 2.0**-8, "fp16": 2.0**-11, "int8": 0.5 / 127 * 1.0001}


def _meta(seq: int, partition: int = 0, base: int = 0) -> dict:
    return {
        "partition": partition,
        "epoch": 0,
        "seq": seq,
        "attempt": 0,
        "samples": 8,
        "base_version": base,
    }


@pytest.mark.parametrize("codec", comp.CODECS)
@pytest.mark.parametrize("size", [1, 7, 255, 256, 257, 70_001])
def test_round_trip_through_the_wire_within_one_rounding(codec: str, size: int) -> None:
    rng = np.random.default_rng(size)
    x = (rng.standard_normal(size) * 0.01).astype(np.float32)
    message = wire.encode_bytes({"x": comp.encode(codec, x, 256), "i": np.arange(3)}, {"seq": 1})
    tensors, meta = wire.decode_encoded(bytearray(message))
    assert meta == {"seq": 1} and tensors["i"].tolist() == [0, 1, 2]
    enc = tensors["x"]
    assert isinstance(enc, wire.Encoded) and enc.codec == codec and enc.shape == (size,)
    back = comp.decode(enc)
    if codec == "int8":  # per block of 256: error at most half a step of that block's scale
        for lo in range(0, size, 256):
            block = x[lo : lo + 256]
            assert np.abs(back[lo : lo + 256] - block).max() <= np.abs(block).max() * _ERROR[codec]
    else:
        subnormal = 2.0**-25 if codec == "fp16" else 0.0  # float16 below 6.1e-5 has fewer bits
        assert np.all(np.abs(back - x) <= np.abs(x) * _ERROR[codec] + subnormal)
    assert len(message) < x.nbytes * {"bf16": 0.5, "fp16": 0.5, "int8": 0.27}[codec] + 400


@pytest.mark.parametrize("codec", comp.CODECS)
def test_error_feedback_loses_nothing_over_many_pushes(codec: str) -> None:
    rng = np.random.default_rng(0)
    feedback = comp.ErrorFeedback(codec, 64)
    true_sum = np.zeros(1000, np.float64)
    sent_sum = np.zeros(1000, np.float64)
    plain_sum = np.zeros(1000, np.float64)  # the same deltas rounded without feedback
    for _ in range(200):
        delta = (rng.standard_normal(1000) * 1e-3 + 2e-5).astype(np.float32)  # a small steady drift
        true_sum += delta
        sent_sum += comp.decode(feedback.encode({"w": delta})["w"])  # type: ignore[arg-type]
        plain_sum += comp.decode(comp.encode(codec, delta, 64))
    drift = np.abs(sent_sum - true_sum).max()
    assert drift <= 4e-3 * _ERROR[codec] * 64 + 1e-6  # one rounding of one delta, not 200 of them
    assert drift <= np.abs(plain_sum - true_sum).max()
    assert feedback.residual_norm() > 0
    feedback.reset()
    assert feedback.residual_norm() == 0


@pytest.mark.parametrize("codec", comp.CODECS)
@pytest.mark.parametrize(
    "bad", [np.nan, np.inf, -np.inf, np.float32(np.frombuffer(b"\xff\xff\xff\x7f", np.float32)[0])]
)
def test_non_finite_values_stay_non_finite(codec: str, bad: float) -> None:
    x = np.linspace(-1, 1, 1000, dtype=np.float32)
    assert comp.is_finite(comp.encode(codec, x))
    for at in (0, 517, 999):
        y = x.copy()
        y[at] = bad
        assert not comp.is_finite(comp.encode(codec, y)), (codec, at)
        feedback = comp.ErrorFeedback(codec)
        assert not comp.is_finite(feedback.encode({"w": y})["w"])


def test_settings_are_checked() -> None:
    assert comp.get_compression(None) is None and comp.get_compression("none") is None
    assert comp.get_compression("INT8") == Compression("int8", "int8")
    assert comp.get_compression(Compression("bf16", None)).name == "push=bf16,pull=none"  # type: ignore[union-attr]
    with pytest.raises(ConfigurationError, match="Received: compression='int4'"):
        comp.get_compression("int4")
    with pytest.raises(ConfigurationError, match="power of two .* Received: block=100"):
        Compression("int8", "int8", block=100)
    with pytest.raises(ConfigurationError, match="Received: push='float8'"):
        Compression("float8")


def _entry(**changes: object) -> bytes:
    entry = {
        "name": "x",
        "dtype": "float32",
        "shape": [4],
        "offset": 0,
        "nbytes": 16,
        "codec": "int8",
        "block": 2,
    }
    entry.update(changes)
    text = json.dumps({"tensors": [entry]}).encode()
    head = wire.MAGIC + struct.pack("<HHI", wire.VERSION, 0, len(text)) + text
    return head + b"\0" * ((-len(head)) % 8) + bytes(16)


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (_entry(codec="int4"), "unknown codec 'int4'"),
        (_entry(dtype="float64"), "stands for float32"),
        (_entry(block=0), "invalid int8 block 0"),
        (_entry(block=True), "invalid int8 block True"),
        (_entry(nbytes=12), "do not match codec int8"),
        (_entry(shape=[40], nbytes=48), "do not match codec int8"),
        (_entry(offset=8), "lies outside the message"),
    ],
)
def test_malformed_compressed_entries_name_the_problem(message: bytes, error: str) -> None:
    assert wire.decode_encoded(_entry())[0]["x"].scales.size == 2  # type: ignore[union-attr]
    with pytest.raises(WireFormatError) as info:
        wire.decode_encoded(message)
    assert error in str(info.value)
    with pytest.raises(WireFormatError, match="compressed, which is not expected here"):
        wire.decode(_entry())


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=64), st.integers(0, 200))
def test_mutated_compressed_messages_are_refused_cleanly(noise: bytes, at: int) -> None:
    message = bytearray(wire.encode_bytes({"x": comp.encode("int8", np.ones(300, np.float32), 64)}))
    at %= len(message)
    message[at : at + len(noise)] = noise[: len(message) - at]
    try:
        tensors, _ = wire.decode_encoded(message)
    except WireFormatError:
        return
    for value in tensors.values():
        if isinstance(value, wire.Encoded):
            comp.decode(value)  # whatever decodes is consistent enough to expand


def test_a_compressed_push_is_added_to_float32_weights_once() -> None:
    params = {"w": np.zeros(1000, np.float32), "step": np.zeros((), np.int64)}
    deltas = [
        np.random.default_rng(i).standard_normal(1000).astype(np.float32) * 1e-3 for i in range(5)
    ]
    with (
        ParameterServer(params, "delta", compression="int8") as server,
        ParameterClient(server.url, **server.client_options()) as client,
    ):
        joined = client.join(0, 0)
        assert (
            joined["compression"] == {"push": "int8", "pull": "int8", "block": 256}
            and joined["wire"] == 2
        )
        feedback = comp.ErrorFeedback("int8")
        sent = []
        for seq, delta in enumerate(deltas):
            update = feedback.encode({"w": delta, "step": np.ones((), np.int64)})
            sent.append(comp.decode(update["w"]))  # type: ignore[arg-type]
            result = client.push(update, _meta(seq))
            assert result.status == "applied"
            again = client.push(update, _meta(seq))  # a retry: applied once only
            assert again.status == "duplicate" and again.version == seq + 1
        master = server.params()["w"]
        assert master.dtype == np.float32 and server.params()["step"] == 5
        np.testing.assert_allclose(master, np.sum(sent, axis=0), rtol=1e-5, atol=1e-7)
        pulled = result.params["w"]  # int8 weights, within one rounding of the master
        assert pulled.dtype == np.float32
        assert np.abs(pulled - master).max() <= np.abs(master).max() * _ERROR["int8"]
        bad = {"w": deltas[0].copy(), "step": np.ones((), np.int64)}
        bad["w"][123] = np.nan
        assert client.push(feedback.encode(bad), _meta(9)).status == "diverged"
        np.testing.assert_array_equal(server.params()["w"], master)


def test_compression_needs_a_combiner_of_deltas() -> None:
    with pytest.raises(ConfigurationError, match="weight_combiner='mean' takes whole weights"):
        ParameterServer({"w": np.zeros(3, np.float32)}, "mean", compression="bf16")


def test_an_old_client_and_an_old_server_get_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with ParameterServer({"w": np.zeros(3, np.float32)}, authenticate=False) as server:
        old_join = json.dumps({"partition": 0, "attempt": 0}).encode()  # version 1 sent no "wire"
        status, body = _raw(
            server.port,
            b"POST /join HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(old_join)
            + old_join,
        )
        assert status == 400 and "run different tensorspark versions" in json.loads(body)["error"]
        v1 = bytearray(wire.encode_bytes({"w": np.ones(3, np.float32)}, _meta(0)))
        v1[4:6] = struct.pack("<H", 1)
        status, body = _raw(
            server.port,
            b"POST /push HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(v1) + bytes(v1),
        )
        assert status == 400 and "wire format version 1 received" in json.loads(body)["error"]
        assert server.version == 0

    original = Store.join

    def old_server_join(self: Store, *args: object) -> dict:
        answer = original(self, *args)  # type: ignore[arg-type]
        answer.pop("wire")  # servers before wire version 2 did not say theirs
        return answer

    monkeypatch.setattr(Store, "join", old_server_join)
    with (
        ParameterServer({"w": np.zeros(3, np.float32)}) as server,
        ParameterClient(server.url, **server.client_options()) as client,
    ):
        with pytest.raises(
            ParameterServerError,
            match="wire format version 1 received, but this tensorspark speaks version 2",
        ):
            client.join(0, 0)


def _raw(port: int | None, request: bytes) -> tuple[int, bytes]:
    """Send one HTTP request byte for byte; the status and body of the answer."""
    assert port is not None
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(
            next(
                line.split(b":")[1]
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
        )
        while len(body) < length:
            body += sock.recv(65536)
    return int(head.split(b" ")[1]), body


def test_traffic_is_counted_per_worker_and_in_total_headers_included() -> None:
    with ParameterServer({"w": np.zeros(100, np.float32)}, authenticate=False) as server:
        join = json.dumps({"partition": 3, "attempt": 0, "wire": wire.VERSION}).encode()
        request = (
            b"POST /join HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % len(join)
            + join
        )
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:  # type: ignore[arg-type]
            sock.sendall(request)
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += sock.recv(65536)
            head, _, body = answer.partition(b"\r\n\r\n")
            length = int(
                next(
                    v
                    for k, _, v in (line.partition(b": ") for line in head.split(b"\r\n"))
                    if k.lower() == b"content-length"
                )
            )
            while len(body) < length:
                body += sock.recv(65536)
        status = server.status()
        row = status["workers"][0]
        assert row["partition"] == 3
        assert (row["bytes_received"], row["bytes_sent"]) == (len(request), len(head) + 4 + length)
        assert (status["bytes_received"], status["bytes_sent"]) == (
            len(request),
            len(head) + 4 + length,
        )
        with ParameterClient(server.url) as client:
            client.pull(3)
            client.pull()  # names no partition: counted in the total only
        status = server.status()
        assert status["workers"][0]["bytes_sent"] > 400 + len(head)
        assert status["bytes_sent"] > status["workers"][0]["bytes_sent"] > 400
