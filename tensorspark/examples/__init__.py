"""Example jobs shipped with tensorspark, each importable (from the pyspark shell) and
runnable as a script.

The repository's top-level ``examples`` is a link to this folder, so
``python examples/spark_mnist.py`` and ``spark-submit ... examples/spark_mnist.py`` run these
very files; there is one copy.

* :mod:`~tensorspark.examples.spark_mnist`: the seed's MNIST softmax in a TF1 graph
  (``tensorspark mnist``; ``spark_mnist.train(sc=sc, ...)`` from the pyspark shell).
* :mod:`~tensorspark.examples.ctr_embeddings`: a click-through-rate model with a 1M-row
  embedding table (``ctr_model``, also the embeddings benchmark's model).
* :mod:`~tensorspark.examples.streaming_mnist`: training from a stream of Parquet files.
* :mod:`~tensorspark.examples.dynamic_vocab`: a click model over an unbounded, drifting
  vocabulary: a dynamic embedding table against the hashing trick (``vocab_model``, also
  the dynamic-table benchmark's model).
"""
