"""A Keras model's serving graph built once, its weights written per version (driver).

Keras 3's ``model.export(path, format="tf_saved_model")`` spends almost all of an export
of a small model building the SavedModel's graph: it traces the serving function, walks
the model's trackable objects, traces the save and restore functions and serializes the
functions into ``saved_model.pb`` (about 70 of the 80 ms of an export of the
784-128-10 MLP on the benchmark machine; writing the files takes under 10 ms). Between
two versions of a stream's model only the weights change, so :class:`SavedModelTemplate`
does that work once, exactly as ``model.export`` does it (the same Keras
``ExportArchive``, the same ``serve`` and ``serving_default`` signatures, TensorFlow's own
meta graph builder), keeps the serialized ``saved_model.pb`` and the checkpoint saver
bound to the model's variables, and writes each version as TensorFlow's
``tf.saved_model.save`` writes its files: ``variables/`` (the variables' current
values, through that saver), an empty ``assets/``, ``saved_model.pb``, ``fingerprint.pb``
(about 6 ms for the MLP). The template writes one version aside when it is built, so the
saver's own first-write tracing is not paid by the first micro-batch either.

This reaches into TensorFlow's and Keras's internals (``save._build_meta_graph``, the
archive's endpoint functions), which move between releases: :meth:`SavedModelTemplate.build`
returns None when they are not there or refuse (the caller then exports with
``model.export`` each time, as before), and a template is only built for a SavedModel
whose graph holds nothing but variables and functions (no lookup table or other
resource, no asset file: their contents live in ``saved_model.pb`` or beside it and may
change between versions).
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

#: The serving endpoint's name, as ``model.export`` names it.
ENDPOINT = "serve"


class HeldResources(ValueError):
    """A graph with resources or assets, which only ``model.export`` writes whole."""


#: Models up to this many bytes of variables write one version aside when the template is built.
WARM_BYTES = 64 * 2**20


def structure_key(model: Any) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    """What a template is valid for: the model's variables (path, shape, dtype)."""
    return tuple(
        (str(getattr(v, "path", v.name)), tuple(int(d) for d in v.shape), str(v.dtype))
        for v in model.variables
    )


class SavedModelTemplate:
    """The serialized ``saved_model.pb`` of one model and the saver of its variables.

    Made by :meth:`build`; :meth:`write` writes a version with the variables' current
    values (assign the weights first). Not thread-safe (the exporter's lock holds it).
    """

    def __init__(self, model: Any, graph_bytes: bytes, saver: Any, archive: Any) -> None:
        self.model = model
        self.graph_bytes = graph_bytes
        self.saver = saver
        self.archive = archive  # keeps the traced functions and tracked objects alive

    @classmethod
    def build(cls, model: Any) -> SavedModelTemplate | None:
        """The template of ``model``'s SavedModel, or None when it cannot be made here
        (TensorFlow or Keras internals that moved, a graph with resources or assets)."""
        try:
            return cls._build(model)
        except HeldResources as err:  # a lookup table (DynamicEmbedding), an asset
            logger.info("exports: the serving graph is rebuilt at each version (%s)", err)
            return None
        except Exception as err:  # internals of another release: export as before
            logger.warning(
                "exports: the serving graph is rebuilt at each version (%s: %s)",
                type(err).__name__,
                err,
            )
            return None

    @classmethod
    def _build(cls, model: Any) -> SavedModelTemplate | None:
        from keras.export import ExportArchive
        from keras.src.export.export_utils import get_input_signature
        from tensorflow.core.protobuf import saved_model_pb2
        from tensorflow.python.framework import ops
        from tensorflow.python.saved_model import save as tf_save
        from tensorflow.python.saved_model import save_options
        from tensorflow.python.saved_model.pywrap_saved_model import constants
        from tensorflow.python.trackable import asset, resource

        archive = ExportArchive()
        archive.track_and_add_endpoint(ENDPOINT, model, get_input_signature(model))
        archive._filter_and_track_resources()  # what write_out does before saving
        function = archive._get_concrete_fn(ENDPOINT)
        signatures = {ENDPOINT: function, "serving_default": function}
        saved_model = saved_model_pb2.SavedModel()
        meta_graph = saved_model.meta_graphs.add()
        _, graph, saver, assets, nodes, _ = tf_save._build_meta_graph(
            archive._tf_trackable, signatures, save_options.SaveOptions(), meta_graph
        )
        saved_model.saved_model_schema_version = constants.SAVED_MODEL_SCHEMA_VERSION
        ops.dismantle_graph(graph)
        held = [
            type(n).__name__
            for n in nodes
            if isinstance(n, (resource.CapturableResource, asset.Asset))
        ]
        if held or assets.asset_filename_map:
            raise HeldResources(f"the SavedModel holds resources or assets {held[:5]}")
        template = cls(model, saved_model.SerializeToString(deterministic=True), saver, archive)
        # One version written aside and deleted: the saver traces its save function at its
        # first write (about 100 ms for the MLP); here, when the training starts, instead
        # of in the first micro-batch's export. It also proves the template writes. Not for
        # a large model (a table): a whole copy on local disk costs more than the trace.
        if (
            sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in model.weights)
            <= WARM_BYTES
        ):
            with tempfile.TemporaryDirectory(prefix="tensorspark-export-warm-") as scratch:
                template.write(os.path.join(scratch, "version"))
        return template

    def write(self, folder: str) -> None:
        """Write a SavedModel of the variables' current values into the local ``folder``
        (which must not exist), in the order ``tf.saved_model.save`` writes it:
        ``variables/``, ``assets/``, then ``saved_model.pb``, then ``fingerprint.pb``."""
        from tensorflow.python.checkpoint import checkpoint_options
        from tensorflow.python.eager import context
        from tensorflow.python.lib.io import file_io
        from tensorflow.python.saved_model import fingerprinting_utils, path_helpers
        from tensorflow.python.saved_model.pywrap_saved_model import constants

        os.makedirs(folder)
        path_helpers.get_or_create_variables_dir(folder)
        self.saver.save(
            path_helpers.get_variables_path(folder), options=checkpoint_options.CheckpointOptions()
        )
        path_helpers.get_or_create_assets_dir(folder)  # empty, as model.export leaves it
        context.async_wait()
        file_io.atomic_write_string_to_file(
            os.path.join(folder, constants.SAVED_MODEL_FILENAME_PB), self.graph_bytes
        )
        fingerprinting_utils.write_fingerprint(folder)
