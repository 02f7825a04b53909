"""Numbered exports for serving, behind an optional quality gate (driver).

* :mod:`.spec`: :class:`Export`, what the user asks (pure, checked on construction).
* :mod:`.layout`: ``<base>/<version>/`` folders, the next number, retention, leftovers.
* :mod:`.saved`: one version written aside and renamed into place (local disk, HDFS).
* :mod:`.gate`: publish or hold back a candidate version (pure).
* :mod:`.publisher`: :class:`~tensorspark.export.publisher.Exporter`, which ``fit`` and
  ``fit_stream`` drive after each epoch or micro-batch.

Importing this package loads no TensorFlow, Keras or Spark.
"""

from __future__ import annotations

from tensorspark.export.spec import Export

__all__ = ["Export"]
