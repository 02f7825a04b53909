"""The parameter server: the server, its settings, the client workers push through, the
compression of what they send and the combiners that fold a push into the parameters.

``import tensorspark.ps`` stays light (no Tornado, no NumPy): each name below loads its
module on first use (PEP 562), as the package's face does. The modules of ``ps/`` import
each other by their full path (``import tensorspark.ps.auth as auth``), never through this
package, so this face (and its type-checking imports below) closes no import cycle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Name -> the module that defines it; ``__all__`` and ``__getattr__`` follow it.
_EXPORTS: dict[str, str] = {
    "ParameterServer": "tensorspark.ps.server",
    "ServerSettings": "tensorspark.ps.settings",
    "ParameterClient": "tensorspark.ps.client",
    "PushResult": "tensorspark.ps.client",
    "Compression": "tensorspark.ps.compression",
    "WeightCombiner": "tensorspark.ps.combiners",
    "DeltaWeightCombiner": "tensorspark.ps.combiners",
    "DynSGDCombiner": "tensorspark.ps.combiners",
    "MeanWeightCombiner": "tensorspark.ps.combiners",
    "NesterovCombiner": "tensorspark.ps.combiners",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Load the module behind an exported name on first use (a submodule imports as usual)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tensorspark.ps' has no attribute {name!r}")
    globals()[name] = value = getattr(importlib.import_module(_EXPORTS[name]), name)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what type checkers and IDEs see (test-checked against _EXPORTS)
    from tensorspark.ps.client import ParameterClient as ParameterClient
    from tensorspark.ps.client import PushResult as PushResult
    from tensorspark.ps.combiners import DeltaWeightCombiner as DeltaWeightCombiner
    from tensorspark.ps.combiners import DynSGDCombiner as DynSGDCombiner
    from tensorspark.ps.combiners import MeanWeightCombiner as MeanWeightCombiner
    from tensorspark.ps.combiners import NesterovCombiner as NesterovCombiner
    from tensorspark.ps.combiners import WeightCombiner as WeightCombiner
    from tensorspark.ps.compression import Compression as Compression
    from tensorspark.ps.server import ParameterServer as ParameterServer
    from tensorspark.ps.settings import ServerSettings as ServerSettings
