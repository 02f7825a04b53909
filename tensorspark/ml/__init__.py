"""Spark ML (``pyspark.ml``) for Keras models: an Estimator and its Model, both saveable.

    from tensorspark.ml import KerasEstimator
    est = KerasEstimator(model=compiled_keras_model, featuresCol="scaled", labelCol="label",
                         epochs=3, batchSize=64, syncInterval=20, mode="async")
    pipeline = Pipeline(stages=[VectorAssembler(...), StandardScaler(...), est])
    fitted = pipeline.fit(train_df)                  # a PipelineModel ending in a KerasModel
    fitted.write().overwrite().save("hdfs:///models/fashion-pipeline")

The modules:

* :mod:`~tensorspark.ml.params`: the shared, typed params and their checks;
* :mod:`~tensorspark.ml.estimator`: :class:`KerasEstimator` (training through
  :meth:`tensorspark.SparkSession.fit`);
* :mod:`~tensorspark.ml.model`: :class:`KerasModel` (inference through
  :func:`tensorspark.predict`);
* :mod:`~tensorspark.ml.persistence`: the ``.keras`` file inside Spark ML's folder layout.

Importing this package imports ``pyspark.ml`` (the base classes); TensorFlow and Keras are
imported when a model is built, trained or loaded.
"""

from tensorspark.ml.estimator import KerasEstimator
from tensorspark.ml.model import KerasModel

__all__ = ["KerasEstimator", "KerasModel"]
