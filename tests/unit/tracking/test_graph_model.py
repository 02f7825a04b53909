"""tensorspark.tracking.graph_model: a TF1 graph's export (a SavedModel whose input takes
raw ids, mapped inside it) saved as an MLflow model that ``mlflow.pyfunc`` loads and
answers with plain TensorFlow, as the session answers the ids' rows; its signature the
export's tensors (raw ids int64); and a tracked TF1 ``run`` without an export says why it
logged no model. No tracking server: the flavour's ``save_model`` and MLflow's loader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.unit

mlflow = pytest.importorskip("mlflow")
tf = pytest.importorskip("tensorflow")

from mlflow.models import Model  # noqa: E402

from tensorspark.export.graph import GraphExport  # noqa: E402
from tensorspark.export.spec import Export  # noqa: E402
from tensorspark.models.tf1_vocab import dynamic_table  # noqa: E402
from tensorspark.tracking.fit import NO_GRAPH_MODEL, TrackedFit  # noqa: E402
from tensorspark.tracking.graph_model import GraphFlavor, graph_signature  # noqa: E402
from tests.unit.export.test_graph_vocab import CAP, _graph  # noqa: E402


def _saved(g: dict[str, Any], tmp_path: Path) -> tuple[GraphExport, str]:
    spec = Export(
        str(tmp_path / "g"),
        inputs={"ids": g["ids"].name, "x": g["x"].name},
        outputs={"p": "logit:0"},
    )
    export = GraphExport(g["sess"], spec, {})
    record = export.after_run(1)
    path = str(tmp_path / "mlflow-model")
    GraphFlavor.save_model(path, Model(), folder=record["path"], signature=export.signature())
    return export, path


def test_the_logged_graph_answers_raw_ids_through_mlflow_pyfunc(tmp_path: Path) -> None:
    g = _graph()
    table = dynamic_table(g["emb"], CAP)
    table.set_map(np.array([10**15, -4, 7, 99], np.int64), np.array([3, 0, 5, 1], np.int64))
    _, path = _saved(g, tmp_path)
    loaded = mlflow.pyfunc.load_model(path)
    raw = np.array([[10**15, -4], [7, 8], [12345, 99]], np.int64)  # 8, 12345: unknown ids
    x = np.arange(3, dtype=np.float32).reshape(3, 1)
    got = loaded.predict({"ids": raw, "x": x})["p"]
    want = g["sess"].run(g["logit"], {g["ids"]: table.rows(raw), g["x"]: x})
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=0, atol=1e-5)
    inputs = {
        s["name"]: (s["tensor-spec"]["dtype"], list(s["tensor-spec"]["shape"]))
        for s in loaded.metadata.signature.inputs.to_dict()
    }
    assert inputs == {"ids": ("int64", [-1, 2]), "x": ("float32", [-1, 1])}  # raw ids: int64
    conf = loaded.metadata.flavors["tensorflow"]
    assert conf["model_type"] == "tf1-estimator" and conf["signature_def_key"] == "serving_default"
    pins = (Path(path) / "requirements.txt").read_text().split()
    assert any(p.startswith("tensorflow==") for p in pins)
    assert not any(p.startswith(("keras==", "tensorspark")) for p in pins)


def test_a_graph_signature_needs_every_tensor_s_rank() -> None:
    known = graph_signature({"a": ("int64", [None, 2])}, {"b": ("float32", [None])})
    assert known is not None and list(known.inputs.to_dict()[0]["tensor-spec"]["shape"]) == [-1, 2]
    assert graph_signature({"a": ("int64", None)}, {"b": ("float32", [None])}) is None


class _Guard:
    """What TrackedFit.finish reads of a guard, recording the logging calls."""

    def __init__(self, log_model: bool) -> None:
        self.settings = type("S", (), {"log_model": log_model})()
        self.failed = False
        self.seconds = 0.0
        self.calls: list[str] = []

    def call(self, what: str, fn: Any) -> None:
        self.calls.append(what)

    def raise_kept(self) -> None:
        return None


def test_a_tracked_graph_run_without_an_export_tags_why_it_logged_no_model() -> None:
    assert "export=Export(" in NO_GRAPH_MODEL
    for logged_by_export, log_model, tagged in ((False, True, True), (True, True, False),
                                                (False, False, False)):  # fmt: skip
        guard = _Guard(log_model)
        tracker = type("T", (), {"run": type("R", (), {"run_id": "r"})(), "guard": guard})()
        TrackedFit(tracker, graph=True).finish(None, logged_by_export=logged_by_export)  # type: ignore[arg-type]
        assert ("tagging the model" in guard.calls) is tagged
        assert "logging the model" not in guard.calls  # a graph is never logged as Keras
