"""Train the seed's MNIST softmax model on Spark and print its test accuracy.

    python examples/spark_mnist.py [--data-dir D] [--partitions N] [--epochs E]
    spark-submit --master spark://host:7077 --py-files dist/tensorspark-*.whl \
        examples/spark_mnist.py

The same as ``tensorspark mnist``. The code lives in :mod:`tensorspark.examples.spark_mnist`
so that the pyspark shell can import it
(``import tensorspark.examples.spark_mnist as mnist; mnist.train(sc=sc, ...)``).
"""

import sys

from tensorspark.cli import main

if __name__ == "__main__":
    sys.exit(main(["mnist", *sys.argv[1:]]))
