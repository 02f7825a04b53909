"""``fit(..., export=)``: a version after every N epochs and after the last (driver).

The export rides on ``fit``'s Keras callbacks (:mod:`tensorspark.training.callbacks`):
at each epoch's end the driver's model holds that epoch's server weights, and
:class:`~tensorspark.export.publisher.Exporter` judges and writes them. The records of
an epoch "arrive" when the epoch starts (a batch ``fit`` has no record times), so the
freshness of a ``fit`` export is the time since the epochs it includes began.
"""

from __future__ import annotations

import time
from typing import Any

from tensorspark.export.publisher import Exporter
from tensorspark.export.spec import Export


def epoch_exports(sc: Any, spec: Export, model: Any, **options: Any) -> Any:
    """A ``keras.callbacks.Callback`` exporting ``model`` after epochs (driver).

    ``options`` go to :class:`Exporter` (``custom_objects``, ``conf``, ``batch_size``,
    ``features_col``, ``label_col``, ``listeners``, ``mixed_precision``, ``tracking``,
    ``name``, ``call``); the model's
    bytes and compiled copy are made here, so every check runs before the job.

    Raises:
        ConfigurationError: as :class:`Exporter` (base path, gate metric, holdout).
    """
    import keras

    from tensorspark.models.keras import model_payload, read_weights
    from tensorspark.models.vocab_sync import copy_maps

    payload, checked = model_payload(model, options.get("custom_objects"))
    exporter = Exporter(sc, spec, payload=payload, model=checked, **options)

    class EpochExports(keras.callbacks.Callback):  # type: ignore[misc]
        """Export after every ``spec.batches`` epochs (or interval), and the last."""

        def __init__(self) -> None:
            super().__init__()
            self.exporter = exporter
            self.began = time.time()
            self.last_epoch = -1

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.began = time.time()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            final = epoch + 1 >= int(self.params.get("epochs") or 0)
            self._export(epoch, final)

        def on_train_end(self, logs: Any = None) -> None:
            copy_maps(self.model, self.exporter.model)  # DynamicEmbedding layers' maps
            if self.exporter.since:  # stopped early: the epochs since the last decision
                self.exporter.flush(read_weights(self.model), self.last_epoch)
            self.exporter.close()

        def _export(self, epoch: int, final: bool) -> None:
            self.last_epoch = epoch
            copy_maps(self.model, self.exporter.model)  # the epoch's, with its weights
            self.exporter.after(
                lambda: read_weights(self.model),  # copied only when an export is due
                batch_id=epoch,
                rows=1,
                arrival_median=self.began,
                arrival_oldest=self.began,
                final=final,
            )

    return EpochExports()
