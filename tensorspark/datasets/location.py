"""Where MNIST-format data lives when no ``data_dir`` is given.

The rule (:func:`default_mnist_dir`), in order:

1. ``data_dir=`` (the example's ``--data-dir``), when given, always wins; this module is
   not consulted.
2. **Source checkout**: when the folder that holds the ``tensorspark`` package also holds a
   ``pyproject.toml`` naming the ``tensorspark`` project (a git clone, an unpacked sdist,
   an editable install), the default is that checkout's ``MNIST_data/``.
3. **Installed** (a wheel in ``site-packages``): ``./MNIST_data`` when the current working
   directory has such a folder (the seed's habit: ``hadoop fs -put MNIST_data/*``);
   otherwise ``$XDG_CACHE_HOME/tensorspark/MNIST_data``, where an unset, empty or relative
   ``XDG_CACHE_HOME`` means ``~/.cache`` (as the XDG base-directory spec says).

Nothing is ever written inside ``site-packages``, and ``./MNIST_data`` is never created:
a download goes to the cache folder unless the user made ``./MNIST_data`` themselves.

Runs on the driver. The function reads the file system and writes nothing; it is
thread-safe.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

#: The folder name MNIST is kept under, in a checkout, in the working directory or the cache.
MNIST_FOLDER = "MNIST_data"
#: Where Debian's ``dataset-fashion-mnist`` package installs Fashion-MNIST.
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")

_PROJECT_NAME = re.compile(r'^name\s*=\s*["\']tensorspark["\']\s*$', re.MULTILINE)


def source_checkout(package_dir: Path) -> Path | None:
    """The checkout holding ``package_dir`` (the ``tensorspark`` package folder), or None.

    A checkout is the package folder's parent when that parent has a ``pyproject.toml``
    whose ``[project]`` name is ``tensorspark``; an installed package's parent is
    ``site-packages``, which has none.
    """
    root = package_dir.parent
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return root if _PROJECT_NAME.search(text) else None


def user_cache_dir(environ: Mapping[str, str]) -> Path:
    """``$XDG_CACHE_HOME/tensorspark``, or ``~/.cache/tensorspark`` when that is unset, empty
    or relative (the XDG spec says to ignore relative paths)."""
    cache_home = environ.get("XDG_CACHE_HOME", "")
    if cache_home and Path(cache_home).is_absolute():
        return Path(cache_home) / "tensorspark"
    home = environ.get("HOME")
    return (Path(home) if home else Path.home()) / ".cache" / "tensorspark"


def default_mnist_dir(package_dir: Path, cwd: Path | None, environ: Mapping[str, str]) -> Path:
    """The default MNIST folder, by the rule in this module's docstring.

    Args:
        package_dir: the ``tensorspark`` package folder (``Path(tensorspark.__file__).parent``).
        cwd: the current working directory, or None when it cannot be known (deleted).
        environ: the environment (``XDG_CACHE_HOME``, ``HOME``).

    Returns:
        ``<checkout>/MNIST_data``, ``<cwd>/MNIST_data`` or ``<cache>/MNIST_data``. The folder
        may not exist yet; nothing is created here.
    """
    checkout = source_checkout(package_dir)
    if checkout is not None:
        return checkout / MNIST_FOLDER
    if cwd is not None and (cwd / MNIST_FOLDER).is_dir():
        return cwd / MNIST_FOLDER
    return user_cache_dir(environ) / MNIST_FOLDER
