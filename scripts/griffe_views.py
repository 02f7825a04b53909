"""A griffe extension for the API reference: SparkSession's read-only settings.

The session's settings are properties that :func:`tensorspark.session_settings.add_views`
adds from the declarations when the class is created, which griffe's reading of the source
cannot see; this extension adds them to the class as documented read-only properties (each
with its declared one-line doc), in the declarations' order.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import griffe

#: The checkout whose declarations are documented (not an installed tensorspark's).
ROOT = str(Path(__file__).resolve().parent.parent)


class SettingsViews(griffe.Extension):
    """Adds the declared settings' views to ``tensorspark.session.SparkSession``."""

    def on_class_members(self, *, node: Any, cls: griffe.Class, agent: Any, **kwargs: Any) -> None:
        if cls.path != "tensorspark.session.SparkSession":
            return
        if ROOT not in sys.path:
            sys.path.insert(0, ROOT)
        declared = importlib.import_module("tensorspark.settings.declared")
        for setting in declared.SETTINGS:
            if not setting.view:
                continue
            name = setting.view_as or setting.name
            doc = f"{setting.doc[:1].upper()}{setting.doc[1:]} (read-only, as resolved)."
            attribute = griffe.Attribute(name, lineno=cls.lineno, docstring=griffe.Docstring(doc))
            attribute.labels |= {"property", "read-only"}
            cls.set_member(name, attribute)
