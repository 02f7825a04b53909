"""A SparkConf stand-in over a plain dict, for unit tests of code that reads Spark conf."""

from __future__ import annotations


class DictConf:
    """The two SparkConf calls tensorspark makes (``getAll``, ``get``), over a plain dict."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def getAll(self) -> list[tuple[str, str]]:  # noqa: N802 - SparkConf's name
        return list(self.values.items())

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)
