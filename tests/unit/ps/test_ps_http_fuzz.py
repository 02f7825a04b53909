"""Fuzzing the parameter server's HTTP layer: a live server in its own process.

The mutation corpus of :mod:`tests.unit.ps_probes` (every endpoint × method × way of
authenticating, framing variants, body mutations, hang-ups, replays, with valid pushes
interleaved) and hypothesis-drawn probes (random methods, paths, authentication, framing,
bodies and byte mutations) go to one server. Asserted, as the issue asks: no response
>= 500, no log record at ERROR level, the parameters equal the model of the valid pushes
bit for bit, a signed pull is still answered, and the server's RSS grows by less than
:data:`RSS_BOUND`. Short form (about 1,300 probes, a few seconds); the long form is
``bench/ps_fuzz.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from tensorspark.ps.client import ParameterClient
from tests.unit.ps_probes import (
    DRAWS,
    SECRET,
    Corpus,
    Probe,
    Reply,
    ServerProcess,
    drawn_probe,
    exchange,
)

#: Growth of the server's RSS allowed over this module's probes. Measured: 4-6 MB (the
#: nonce cache, counters, allocator pools); the findings grew it by megabytes per request.
RSS_BOUND = 24 * 1024 * 1024

_FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(body_timeout=1.0) as s:  # edited lengths wait for it
        with ParameterClient(s.url, secret=SECRET) as client:  # warm: first-request imports
            client.pull()
        s.baseline = s.rss()
        yield s


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return Corpus(partition=0, seed=22)


def _check(probe: Probe, reply: Reply) -> None:
    assert not [s for s in reply.statuses if s >= 500], (probe.label, reply)
    assert reply.note != "timeout", f"{probe.label}: the server neither answered nor closed"
    if probe.valid_push:
        assert reply.statuses[-1:] == [200], (probe.label, reply)


def test_the_mutation_corpus_over_every_endpoint_method_and_authentication(
    server: ServerProcess, corpus: Corpus
) -> None:
    seen = set()
    for probe in corpus.everything():
        reply = exchange(server.port, probe)
        _check(probe, reply)
        seen.update(reply.statuses)
    assert {200, 400, 401, 404, 405, 413} <= seen  # the corpus reaches every kind of answer
    assert corpus.applied >= 9


@_FUZZ
@given(draws=DRAWS)
def test_drawn_probes(server: ServerProcess, corpus: Corpus, draws: dict) -> None:
    probe = drawn_probe(corpus, **draws)
    _check(probe, exchange(server.port, probe))


def test_after_the_fuzzing_the_server_is_whole(server: ServerProcess, corpus: Corpus) -> None:
    """No ERROR records; parameters as the valid pushes made them; RSS bounded; the
    bodies in flight all given back; hang-ups counted."""
    with ParameterClient(server.url, secret=SECRET) as client:
        version, params = client.pull()
        status = client.status()
    for name, expected in corpus.expected.items():
        np.testing.assert_array_equal(params[name], expected, err_msg=name)
    assert version >= corpus.applied
    records = server.records()
    assert records["levels"].get("ERROR", 0) == 0 and records["levels"].get("CRITICAL", 0) == 0, (
        records["errors"]
    )
    growth = server.rss() - server.baseline
    assert growth < RSS_BOUND, f"RSS grew by {growth / 2**20:.1f} MiB"
    assert status["inflight_bodies"] == 0 and status["inflight_bytes"] == 0
    assert status["client_hangups"] > 0 and status["busy_refusals"] == 0
