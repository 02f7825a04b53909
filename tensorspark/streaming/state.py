"""A stream's model checkpoints: one per trained micro-batch, with the batch's id (driver).

Exactly once across a driver crash rests on two logs under one ``checkpoint_location``:

* ``<location>/stream``: Spark's own checkpoint of the query (offsets planned per batch,
  batches committed). A batch whose ``foreachBatch`` did not return before the crash is
  planned again, over the same offsets, with the same id, when the query restarts.
* ``<location>/model``: tensorspark's checkpoints (atomic: temporary name, then rename),
  each written after a micro-batch trained and before ``foreachBatch`` returns, holding
  the weights and that batch's id (``extra["stream"]["batch_id"]``).

On restart the model resumes from its newest checkpoint; a replayed batch whose id it
already holds is skipped, every other batch trains. A crash mid-batch leaves neither log
moved, so that batch trains again, from the weights before it; a crash between the model
checkpoint and Spark's commit leaves the batch in the model, so its replay is skipped.
A checkpoint that cannot be written fails the batch (Spark does not commit it), never
lets it through unrecorded.
"""

from __future__ import annotations

import logging
import os
import posixpath
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorspark.checkpoint import Checkpoint, CheckpointManager, check_signature, model_signature
from tensorspark.errors import CheckpointError, ConfigurationError
from tensorspark.ps.snapshot import Snapshot
from tensorspark.storage import local_path

logger = logging.getLogger(__name__)

#: Subfolders of ``checkpoint_location``.
STREAM_DIR = "stream"
MODEL_DIR = "model"


def stream_dir(location: str) -> str:
    """Spark's checkpoint of the query under ``location`` (``checkpointLocation``)."""
    return posixpath.join(location.rstrip("/"), STREAM_DIR)


@dataclass(eq=False)
class StreamCheckpoints:
    """The model half of a stream's checkpoint location (driver; one micro-batch at a time).

    Args:
        location: the stream's ``checkpoint_location`` (local path, ``file://``,
            ``hdfs://``, ``webhdfs://``).
        name: the model's name (a session's ``name``), written into every checkpoint and
            checked on restart.
        manager: where the model checkpoints go (``<location>/model``).
        user: the HDFS user the manager was made with (for readers elsewhere).
        replay: the stream's ``seed`` and ``shuffle``
            (:meth:`tensorspark.streaming.replay.StreamReplay.recorded`), written into every
            checkpoint and checked on restart: a replay is the same only with the same ones.
            Empty: not recorded, not checked.
    """

    location: str
    name: str
    manager: CheckpointManager
    user: str | None = None
    replay: Mapping[str, Any] = field(default_factory=dict)
    resumed: Checkpoint | None = field(default=None, init=False)
    #: The id of the last micro-batch in the model (-1: none yet).
    last_batch_id: int = field(default=-1, init=False)

    def resume(self, params: Mapping[str, np.ndarray], mode: str) -> Checkpoint | None:
        """The newest model checkpoint, checked against the model, or None for a new
        location (driver; before anything trains).

        Raises:
            CheckpointError: the location holds another model's checkpoints (other
                weights, another ``name``), one written by another mode or with another
                ``seed`` or ``shuffle`` (a checkpoint that recorded none, written before
                they were, resumes), or model checkpoints without Spark's checkpoint of the
                stream beside them.
        """
        checkpoint = self.manager.latest()
        if checkpoint is None:
            logger.info("stream checkpoint location %s is new: training starts", self.location)
            return None
        extra = checkpoint.meta.get("extra", {})
        saved_name = extra.get("name")
        if saved_name != self.name:
            raise CheckpointError(
                f"checkpoint_location {self.location!r} holds the checkpoints of model "
                f"{saved_name!r}, not of this one ({self.name!r}); give this model a "
                "checkpoint_location of its own (or the SparkSession the name= of the model "
                f"that wrote it). Received: checkpoint {checkpoint.path}"
            )
        check_signature(model_signature(params), checkpoint.signature, checkpoint.path)
        if checkpoint.mode != mode:
            raise CheckpointError(
                f"checkpoint {checkpoint.path} was written with mode={checkpoint.mode!r}; this "
                f"stream trains with mode={mode!r}. Use the same mode or a new "
                f"checkpoint_location. Received: mode={mode!r}"
            )
        if "stream" not in extra:
            raise CheckpointError(
                f"checkpoint_location {self.location!r} holds checkpoints of a fit() run, not "
                "of a stream; give the stream a checkpoint_location of its own. "
                f"Received: checkpoint {checkpoint.path}"
            )
        self._check_replay(extra.get("replay"), checkpoint.path)
        self._require_stream_log()
        self.resumed = checkpoint
        meta = self._stream_meta(checkpoint)
        self.last_batch_id = int(meta.get("batch_id", -1))
        logger.info(
            "stream resumes from %s: version %d, micro-batch %s, %s rows trained",
            checkpoint.path,
            checkpoint.version,
            meta.get("batch_id"),
            meta.get("samples"),
        )
        return checkpoint

    def before(self) -> dict[str, int]:
        """What the resumed checkpoint counted: ``batches``, ``samples``, ``pushes``,
        ``server_samples`` (zeros for a new location)."""
        meta = self._stream_meta(self.resumed)
        keys = ("batches", "samples", "pushes", "server_samples")
        return {k: int(meta.get(k, 0)) for k in keys}

    def save(
        self,
        snapshot: Snapshot,
        *,
        combiner: str,
        stream: Mapping[str, Any],
    ) -> str:
        """Write the checkpoint of a trained micro-batch (micro-batch thread).

        ``snapshot``: the server's :class:`~tensorspark.ps.snapshot.Snapshot` after the
        batch; ``stream``: the batch's id and the counts so far.

        Raises:
            CheckpointError: it could not be written (the batch must not be committed).
        """
        meta = {
            "name": self.name,
            "combiner": combiner,
            "applied_pushes": int(stream.get("pushes", 0)),
            "saved_at": time.time(),
            "stream": dict(stream),
        }
        if self.replay:
            meta["replay"] = dict(self.replay)
        path = snapshot.save(self.manager, meta, progress={})
        if path is None:
            raise CheckpointError(
                f"the model checkpoint of micro-batch {stream.get('batch_id')} could not be "
                f"written to {self.manager.location}; the batch is not committed and trains "
                "again when the stream restarts"
            )
        self.last_batch_id = int(stream["batch_id"])
        return path

    def _check_replay(self, saved: Any, path: str) -> None:
        """Refuse a checkpoint whose recorded ``seed`` or ``shuffle`` differs from this
        stream's: restarted with another, the stream would silently stop replaying."""
        if not isinstance(saved, Mapping) or not self.replay:
            return  # written before seed and shuffle were recorded (or not recorded now)
        differ = sorted(k for k in self.replay if k in saved and saved[k] != self.replay[k])
        if differ:
            was = ", ".join(f"{k}={saved[k]!r}" for k in differ)
            now = ", ".join(f"{k}={self.replay[k]!r}" for k in differ)
            raise CheckpointError(
                f"checkpoint {path} was written by a stream with {was}; this stream has "
                f"{now}, and a replay gives the same weights only with the same ones. Pass "
                f"fit_stream the same seed and shuffle, or use a new checkpoint_location. "
                f"Received: {now}"
            )

    def _require_stream_log(self) -> None:
        """Refuse model checkpoints whose stream log is gone (local disk only: elsewhere
        Spark's own check applies). Batch ids would start again at 0 and be skipped."""
        local = local_path(self.location)
        if local is None:
            return
        offsets = os.path.join(local, STREAM_DIR, "offsets")
        if not os.path.isdir(offsets):
            raise CheckpointError(
                f"checkpoint_location {self.location!r} holds model checkpoints but not "
                f"Spark's checkpoint of the stream ({offsets} is missing): the stream would "
                "start again from batch 0 and the model would skip it. Restore that folder "
                "or use a new checkpoint_location. Received: checkpoint_location="
                f"{self.location!r}"
            )

    @staticmethod
    def _stream_meta(checkpoint: Checkpoint | None) -> dict[str, Any]:
        if checkpoint is None:
            return {}
        stream = checkpoint.meta.get("extra", {}).get("stream", {})
        return dict(stream) if isinstance(stream, Mapping) else {}


def model_manager(
    location: str,
    *,
    user: str | None,
    conf: Mapping[str, str],
    keep: int,
    full_every: int = 10,
    fallback: bool = False,
) -> CheckpointManager:
    """The :class:`CheckpointManager` of ``<location>/model`` (driver).

    Raises:
        ConfigurationError: ``location`` is empty or not a string.
    """
    if not isinstance(location, str) or not location.strip():
        raise ConfigurationError(
            "Argument `checkpoint_location` must be a folder (local path, file://, hdfs:// "
            f"or webhdfs://) for the stream's and the model's checkpoints. "
            f"Received: checkpoint_location={location!r}"
        )
    return CheckpointManager(
        posixpath.join(location.rstrip("/"), MODEL_DIR),
        user=user,
        conf=conf,
        keep=keep,
        full_every=full_every,
        fallback=fallback,
    )
