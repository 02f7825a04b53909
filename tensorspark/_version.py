"""The package's version, in a module of its own.

The one place the version is written: ``pyproject.toml`` reads it from here at build time
(``[tool.setuptools.dynamic]``), ``tensorspark.__version__`` re-exports it, and
:mod:`tensorspark.versions` reads it without importing the package's public face.
"""

__version__ = "0.1.0"
