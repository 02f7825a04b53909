"""``run(feed_rdd=..., export=)``: a TF1 graph exported for serving after its run (driver).

A TF1 session has no compiled metrics and no input layer, so the user names what a
server feeds and fetches (``Export(inputs={"x": "x:0"}, outputs={"y": "Softmax:0"})``):
the SavedModel is written with ``tf.compat.v1.saved_model.Builder`` under the serving
tag, its ``serving_default`` signature mapping those names to the tensors, and the
session's variables as they are after the run (the server's final values); an input
that a dynamic table looks up takes raw ids, mapped inside the SavedModel
(:mod:`tensorspark.export.graph_vocab`). Numbering,
the hidden folder and its rename, and retention are the Keras exports'
(:mod:`tensorspark.export.layout`, :mod:`tensorspark.export.saved`). The quality gate
scores compiled Keras metrics and is refused here. With MLflow tracking on (``run(...,
tracking=)`` or ``tensorspark.autolog()``), the version is logged to the run as an MLflow
model (:mod:`tensorspark.tracking.graph_model`) and registered as the next version of the
registered model (``Export(registered_model=)``, else the session's name), as a Keras
export's is (:mod:`tensorspark.tracking.versions`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from tensorspark.errors import ConfigurationError
from tensorspark.export.graph_vocab import mapped_inputs, write_mapped
from tensorspark.export.layout import check_writable, next_version, retire, sweep_partial
from tensorspark.export.publisher import RECORD_FILE
from tensorspark.export.saved import publish
from tensorspark.export.spec import Export, tensor_names
from tensorspark.listeners import ListenerList, RunListener
from tensorspark.storage import open_storage
from tensorspark.storage.local import LocalStorage

logger = logging.getLogger(__name__)


def graph_tensors(session: Any, names: Mapping[str, str], role: str) -> dict[str, Any]:
    """The session graph's tensors by signature key (driver).

    Raises:
        ConfigurationError: a name that is no tensor of the graph.
    """
    found = {}
    for key, name in names.items():
        try:
            found[key] = session.graph.get_tensor_by_name(name)
        except (KeyError, ValueError) as err:
            raise ConfigurationError(
                f"Argument `{role}` names a tensor the session's graph does not have: {err}. "
                f"Received: {role}[{key!r}]={name!r}"
            ) from err
    return found


class GraphExport:
    """Checks a TF1 export before the run and writes its version after it (driver).

    Args:
        tracking: ``run``'s ``tracking`` (None follows ``tensorspark.autolog()``; False:
            untracked): each version is logged and registered in MLflow.
        name: the session's name (the registered model's default name).

    Raises:
        ConfigurationError: no ``inputs``/``outputs``, a gate, an unknown tensor, a base
            path that cannot be written, a registered-model name MLflow refuses.
    """

    def __init__(
        self,
        session: Any,
        spec: Export,
        conf: Mapping[str, str],
        listeners: Any = (),
        tracking: Any = False,
        name: str = "tensorspark",
    ) -> None:
        if spec.inputs is None or spec.outputs is None:
            raise ConfigurationError(
                "Exporting a TF1 graph needs the tensors a server feeds and fetches: "
                "Export(..., inputs={'x': 'x:0'}, outputs={'y': 'Softmax:0'}). Received: "
                f"inputs={spec.inputs!r}, outputs={spec.outputs!r}"
            )
        if spec.gate is not None:
            raise ConfigurationError(
                "The quality gate scores a Keras model's compiled metrics; a TF1 graph's "
                f"export has none. Received: gate={spec.gate!r}"
            )
        self.session = session
        self.spec = spec
        self.inputs = graph_tensors(session, tensor_names("inputs", spec.inputs) or {}, "inputs")
        self.outputs = graph_tensors(
            session, tensor_names("outputs", spec.outputs) or {}, "outputs"
        )
        #: The inputs a dynamic table looks up: exported taking raw ids (graph_vocab.py).
        self.mapped = mapped_inputs(session, self.inputs)
        self.storage, self.base = open_storage(spec.base_path, user=spec.user, conf=conf)
        check_writable(self.storage, self.base, spec.base_path)
        sweep_partial(self.storage, self.base)
        self.listeners = ListenerList([x for x in listeners if isinstance(x, RunListener)])
        self.versions = None
        if tracking is not False:  # checked (and the registered model made) before the job
            from tensorspark.tracking.versions import ModelVersions

            self.versions = ModelVersions.open(
                tracking, spec.registered_model or name, name, "run", self._log_model
            )

    def signature(self) -> Any:
        """The MLflow signature of the exported inputs (raw ids: int64) and outputs."""
        from tensorspark.tracking.graph_model import graph_signature

        def described(tensors: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
            return {
                k: (
                    "int64" if k in self.mapped else t.dtype.as_numpy_dtype,
                    None if t.shape.rank is None else t.shape.as_list(),
                )
                for k, t in tensors.items()
            }

        return graph_signature(described(self.inputs), described(self.outputs))

    def _log_model(self, run_id: str, folder: str, step: int) -> Any:
        """Log a published version (a local folder) as the run's MLflow model."""
        from tensorspark.tracking.graph_model import log_graph_model

        return log_graph_model(run_id, folder, self.signature(), step)

    def write(self, folder: str) -> None:
        """The SavedModel of the session's graph and current variables into ``folder``
        (with dynamic tables: their inputs take raw ids, :func:`write_mapped`)."""
        if self.mapped:
            write_mapped(self.session, self.inputs, self.outputs, self.mapped, folder)
            return
        import tensorflow as tf

        tf1 = tf.compat.v1
        with self.session.graph.as_default():  # signatures are built in graph mode
            signature = tf1.saved_model.predict_signature_def(
                inputs=self.inputs, outputs=self.outputs
            )
            builder = tf1.saved_model.Builder(folder)
            builder.add_meta_graph_and_variables(
                self.session,
                [tf1.saved_model.tag_constants.SERVING],
                signature_def_map={"serving_default": signature},
                strip_default_attrs=True,
            )
        builder.save()

    def after_run(self, epochs: int) -> dict[str, Any]:
        """Publish the session's variables as the next version; the record (with
        tracking on, registered in MLflow).

        Raises:
            TrackingError: ``strict`` tracking, and logging or registering it failed.
        """
        started = time.time()
        version = next_version(self.storage, self.base)
        meta = {"version": version, "batch_id": epochs - 1, "written_at": started}
        local_disk = isinstance(self.storage, LocalStorage)
        with tempfile.TemporaryDirectory(prefix="tensorspark-export-") as local:
            # On local disk the version is written in place and registered from there;
            # elsewhere it is written once here, uploaded, and registered from this copy.
            here = os.path.join(local, "version")

            def write(folder: str) -> None:
                if local_disk:
                    self._write(folder, meta)
                else:
                    self._write(here, meta)
                    shutil.copytree(here, folder)

            path = self.storage.location(publish(self.storage, self.base, version, write))
            retire(self.storage, self.base, self.spec.keep)
            record = {
                "batch_id": epochs - 1,
                "version": version,
                "published": True,
                "reason": "no gate: a TF1 graph after its run",
                "metric": None,
                "value": None,
                "baseline": None,
                "path": path,
                "export_s": time.time() - started,
            }
            logger.info("exported the TF1 graph as version %d to %s", version, path)
            if self.versions is not None:
                folder = path if local_disk else here
                record["registered_version"] = self.versions.decided(record, folder)
        self.listeners.on_export(record)
        if self.versions is not None:
            self.versions.guard.raise_kept()  # strict: a failed registration is an error
        return record

    def _write(self, folder: str, meta: Mapping[str, Any]) -> None:
        """The SavedModel (:meth:`write`) and the version's record into ``folder``."""
        self.write(folder)
        with open(os.path.join(folder, RECORD_FILE), "w", encoding="utf-8") as out:
            json.dump(dict(meta), out)
