"""Example jobs shipped with tensorspark (importable from the pyspark shell)."""
