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

import tensorspark as sps  # noqa: E402
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
                                                (False, False, True)):  # fmt: skip
        guard = _Guard(log_model)
        tracker = type("T", (), {"run": type("R", (), {"run_id": "r"})(), "guard": guard})()
        TrackedFit(tracker, graph=True).finish(None, logged_by_export=logged_by_export)  # type: ignore[arg-type]
        assert ("tagging the model" in guard.calls) is tagged
        assert "logging the model" not in guard.calls  # a graph is never logged as Keras


class _Versions:
    """What GraphExport hands a version to: records the folder it was registered from
    (checked while it exists); its guard raises what ``strict`` kept, if anything."""

    def __init__(self, kept: Exception | None = None) -> None:
        self.folders: list[tuple[str, bool]] = []
        self.guard = self
        self.kept = kept

    def decided(self, record: dict[str, Any], folder: str) -> int:
        self.folders.append((folder, (Path(folder) / "saved_model.pb").is_file()))
        return 7

    def raise_kept(self) -> None:
        if self.kept is not None:
            raise self.kept


def _remote(local: Any) -> Any:
    """A storage that is not local disk (publish uploads to it), backed by ``local``."""
    from tensorspark.storage.base import Storage

    def forward(name: str) -> Any:
        return lambda self, *args, **kwargs: getattr(local, name)(*args, **kwargs)

    methods = {name: forward(name) for name in Storage.__abstractmethods__}
    return type("RemoteStorage", (Storage,), methods)()


@pytest.mark.parametrize("remote", [False, True])
def test_a_version_is_registered_from_a_folder_written_once(tmp_path: Path, remote: bool) -> None:
    """On local disk from the published folder; elsewhere from the local copy that was
    uploaded (not a second export), removed after."""
    g = _graph()
    spec = Export(str(tmp_path / "g"), inputs={"ids": g["ids"].name}, outputs={"p": "logit:0"})
    export = GraphExport(g["sess"], spec, {})
    if remote:
        export.storage = _remote(export.storage)
    writes: list[str] = []
    write = export.write
    export.write = lambda folder: (writes.append(folder), write(folder))[1]  # type: ignore[method-assign]
    export.versions = _Versions()  # type: ignore[assignment]
    record = export.after_run(1)
    assert record["registered_version"] == 7 and len(writes) == 1
    ((folder, whole),) = export.versions.folders  # type: ignore[attr-defined]
    assert whole and (folder == record["path"]) is not remote
    assert Path(record["path"], "saved_model.pb").is_file()
    assert Path(folder).exists() is not remote  # the local copy is gone


def test_strict_tracking_raises_a_failed_registration_after_the_listeners_are_told(
    tmp_path: Path,
) -> None:
    from tensorspark.errors import TrackingError

    g = _graph()
    spec = Export(str(tmp_path / "g"), inputs={"ids": g["ids"].name}, outputs={"p": "logit:0"})
    told: list[int] = []

    class _Told(sps.RunListener):
        def on_export(self, record: dict) -> None:
            told.append(record["version"])

    export = GraphExport(g["sess"], spec, {}, listeners=[_Told()])
    export.versions = _Versions(TrackingError("registering failed"))  # type: ignore[assignment]
    with pytest.raises(TrackingError, match="registering failed"):
        export.after_run(1)
    assert told == [1] and Path(tmp_path, "g", "1", "saved_model.pb").is_file()
