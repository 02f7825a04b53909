"""``Export``'s arguments, checked where it is made, and the gate's decisions (no Spark)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tensorspark import Export
from tensorspark.errors import ConfigurationError
from tensorspark.export.gate import decide
from tensorspark.export.publisher import weighted_quantile
from tensorspark.export.spec import check_export, interval_seconds, lower_is_better

pytestmark = pytest.mark.unit


def test_intervals() -> None:
    assert interval_seconds("5 minutes") == 300.0
    assert interval_seconds("30 seconds") == 30.0
    assert interval_seconds("30 s") == 30.0
    assert interval_seconds("500 milliseconds") == 0.5
    assert interval_seconds(90) == 90.0
    for bad in ("soon", 0, -3, True, "10 parsecs", math.nan):
        with pytest.raises(ConfigurationError, match="Received: every="):
            interval_seconds(bad)  # type: ignore[arg-type]


def test_defaults_and_schedules() -> None:
    spec = Export("/m")
    assert (spec.batches, spec.interval_s, spec.keep, spec.formats) == (
        1,
        None,
        5,
        ("saved_model",),
    )
    assert Export("/m", every_batches=3).batches == 3
    assert Export("/m", every="5 minutes").interval_s == 300.0
    assert Export("/m", formats=["saved_model", "keras"]).formats == ("saved_model", "keras")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"base_path": ""}, "base_path"),
        ({"every_batches": 2, "every": "1 minute"}, "either `every_batches` or `every`"),
        ({"every_batches": 0}, "every_batches=0"),
        ({"every_batches": True}, "every_batches=True"),
        ({"every": "often"}, "every='often'"),
        ({"keep": 0}, "keep=0"),
        ({"formats": ("keras",)}, "formats=\\('keras',\\)"),
        ({"formats": ("saved_model", "onnx")}, "onnx"),
        ({"gate": "accuracy"}, "needs both `gate`.*holdout=None"),
        ({"holdout": object()}, "gate=None, holdout=object"),
        ({"gate": "loss", "holdout": object(), "tolerance": -1}, "tolerance=-1"),
        ({"registered_model": " "}, "registered_model"),
    ],
)
def test_bad_arguments_are_refused_where_made(kwargs: dict, match: str) -> None:
    kwargs = {"base_path": "/m", **kwargs}
    with pytest.raises(ConfigurationError, match=match):
        Export(**kwargs)


def test_check_export() -> None:
    spec = Export("/m")
    assert check_export(spec) is spec and check_export(None) is None
    with pytest.raises(ConfigurationError, match="export of type str"):
        check_export("/m")


def test_gate_direction() -> None:
    assert lower_is_better("loss") and lower_is_better("val_mse")
    assert not lower_is_better("accuracy")
    assert Export("/m", gate="accuracy", holdout=object()).gate_higher_is_better
    assert not Export("/m", gate="loss", holdout=object()).gate_higher_is_better
    assert not Export(
        "/m", gate="auc", holdout=object(), higher_is_better=False
    ).gate_higher_is_better


W = {"w": np.ones((2, 2), np.float32)}


def test_gate_decisions() -> None:
    assert decide(W).published
    nan = decide({"w": np.array([1.0, np.nan])}, metric="loss", value=0.1)
    assert not nan.published and "NaN or infinite weights (w)" in nan.reason
    assert not decide({"w": np.array([np.inf])}).published
    assert decide(W, metric="loss", value=0.5).reason == "the first version"
    assert not decide(W, metric="loss", value=math.nan).published
    # lower is better: 0.52 vs 0.5 passes with tolerance 0.05, 0.6 does not
    assert decide(W, metric="loss", value=0.52, baseline=0.5, tolerance=0.05).published
    worse = decide(W, metric="loss", value=0.6, baseline=0.5, tolerance=0.05)
    assert not worse.published and "worse than the published 0.5" in worse.reason
    # higher is better
    assert decide(W, metric="acc", value=0.9, baseline=0.8, higher_is_better=True).published
    assert not decide(W, metric="acc", value=0.7, baseline=0.8, higher_is_better=True).published
    assert (
        decide(W, metric="acc", value=0.9, baseline=0.8, higher_is_better=True).as_dict()[
            "baseline"
        ]
        == 0.8
    )


def test_weighted_quantile() -> None:
    assert weighted_quantile([], [], 0.5) is None
    assert weighted_quantile([3.0, 1.0, 2.0], [1, 1, 1], 0.5) == 2.0
    assert weighted_quantile([1.0, 10.0], [99, 1], 0.5) == 1.0
    assert weighted_quantile([1.0, 10.0], [99, 1], 0.999) == 10.0


def test_tf1_tensor_names() -> None:
    spec = Export("/m", inputs=["input/x:0"], outputs={"probabilities": "Softmax:0"})
    assert spec.inputs == {"input_x": "input/x:0"}
    assert spec.outputs == {"probabilities": "Softmax:0"}
    with pytest.raises(ConfigurationError, match="names both `inputs`"):
        Export("/m", inputs=["x:0"])
    with pytest.raises(ConfigurationError, match="Received: outputs=7"):
        Export("/m", inputs=["x:0"], outputs=7)
    with pytest.raises(ConfigurationError, match=r"Received: inputs=\[\]"):
        Export("/m", inputs=[], outputs=["y:0"])
