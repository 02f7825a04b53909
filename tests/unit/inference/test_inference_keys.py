"""The executors' model cache key of a predict call (tensorspark.inference.job._cache_key)."""

from __future__ import annotations

from tensorspark import inference
from tensorspark.inference.job import _cache_key


class _Source(inference.ModelSource):
    def input_shape(self):  # type: ignore[no-untyped-def]
        return (None, 2)

    def output_shape(self):  # type: ignore[no-untyped-def]
        return (None, 1)

    def payload(self) -> bytes:
        return b"model"

    def loader(self):  # type: ignore[no-untyped-def]
        return inference.KerasLoader()


def test_the_same_model_and_loader_share_a_key_and_any_difference_changes_it() -> None:
    source = _Source()
    a = inference.SavedModelLoader("serving_default", "x", "y")
    b = inference.SavedModelLoader("other", "x", "y")
    assert _cache_key(source, a, b"m") == _cache_key(source, a, b"m")
    assert _cache_key(source, a, b"m") != _cache_key(source, b, b"m")
    assert _cache_key(source, a, b"m") != _cache_key(source, a, b"n")
    # Custom classes may be redefined under the same name: never served from the cache.
    custom = inference.KerasLoader({"Layer": object})
    assert _cache_key(source, custom, b"m") != _cache_key(source, custom, b"m")
