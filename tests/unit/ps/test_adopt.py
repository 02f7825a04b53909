"""A server that adopts the arrays it is given holds them, not copies (a ``fit``'s driver
then holds its tables once); arrays it may not write, or that share memory, are copied,
and without ``adopt`` every array is copied as before."""

from __future__ import annotations

import numpy as np
import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.ps import ParameterServer
from tensorspark.ps.combiners import get_combiner
from tensorspark.ps.settings import check_settings
from tensorspark.ps.store import Store

pytestmark = pytest.mark.unit


def _params() -> dict[str, np.ndarray]:
    return {
        "emb": np.arange(40, dtype=np.float32).reshape(10, 4).copy(),
        "b": np.zeros(3, np.float32),
    }


def test_adopted_arrays_are_held_themselves_and_others_copied() -> None:
    combiner = get_combiner("delta")
    params = _params()
    held = check_settings(params, "async", None, combiner, None, adopt=True)
    assert all(held[k] is params[k] for k in params)
    copied = check_settings(params, "async", None, combiner, None)
    assert not any(np.shares_memory(copied[k], params[k]) for k in params)
    frozen = np.ones(4, np.float32)
    frozen.flags.writeable = False
    base = np.ones((4, 4), np.float32)
    odd = {"frozen": frozen, "strided": base[:, 1], "view": base[1:], "list": [1.0, 2.0]}
    held = check_settings(odd, "async", None, combiner, None, adopt=True)
    assert not any(np.shares_memory(held[k], v) for k, v in odd.items() if k != "list")
    assert all(held[k].flags.writeable for k in odd)
    np.testing.assert_array_equal(held["view"], base[1:])


def test_a_store_and_a_server_hold_the_arrays_they_adopt() -> None:
    params = _params()
    store = Store(params, "delta", adopt=True)
    assert store._sets.current["emb"] is params["emb"]  # noqa: SLF001
    assert Store(params, "delta")._sets.current["emb"] is not params["emb"]  # noqa: SLF001
    server = ParameterServer(params, "delta", adopt=True)
    assert server._store._sets.current["emb"] is params["emb"]  # noqa: SLF001
    np.testing.assert_array_equal(server.params()["emb"], _params()["emb"])


def test_a_stopped_server_hands_its_arrays_over_and_a_running_one_copies() -> None:
    params = _params()
    server = ParameterServer(params, "delta", adopt=True)
    with server:
        running = server.params(copy=False)
        assert not np.shares_memory(running["emb"], params["emb"])
    final = server.params(copy=False)
    assert final["emb"] is params["emb"] and final["b"] is params["b"]
    assert server.params()["emb"] is not params["emb"]  # a copy unless asked


def test_a_stopped_server_hands_its_arrays_over_to_where_the_weights_are_held() -> None:
    """After ``hand_over`` a stopped server holds no array: ``params()`` and
    ``snapshot()`` read the weights where they are now; ``/status`` keeps the sizes."""
    params = _params()
    elsewhere = {k: v + 1 for k, v in params.items()}
    server = ParameterServer(params, "delta", adopt=True)
    with server:
        with pytest.raises(ConfigurationError, match="stopped server"):
            server.hand_over(elsewhere)
    sizes = {k: server.status()[k] for k in ("num_params", "model_bytes")}
    server.hand_over(elsewhere)
    held = server._store._sets.current  # noqa: SLF001
    assert all(v.nbytes == 0 or v.strides == (0,) * v.ndim for v in held.values())
    assert not any(np.shares_memory(v, params[k]) for k, v in held.items())
    for got in (server.params(), server.params(copy=False), server.snapshot().params):
        assert got.keys() == elsewhere.keys()
        for k, v in got.items():
            np.testing.assert_array_equal(v, elsewhere[k])
            assert not np.shares_memory(v, elsewhere[k])
    assert {k: server.status()[k] for k in sizes} == sizes
