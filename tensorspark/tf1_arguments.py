"""The arguments :class:`~tensorspark.SparkSession`'s calls take for a TF1 session.

The seed's graph path needs what a Keras model carries itself: ``run(feed_rdd=...)`` the
names its feed tuples are fed to, ``predict()`` the output tensor (``fetches=``) and the
input placeholder's name (``feed_name_list=``). These checks refuse, on the driver and
before any job starts, what a call cannot use, naming the argument and how to fix it.
Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensorspark.arguments import positive_int
from tensorspark.errors import ConfigurationError


def check_graph_run(
    feed_dict: dict[Any, Any] | None,
    run_metadata: Any,
    num_epoch: int,
    feed_name_list: Sequence[str] | None,
) -> tuple[int, Sequence[str]]:
    """Check the arguments of a distributed ``run(feed_rdd=...)``.

    Returns:
        ``num_epoch`` as an int, and ``feed_name_list``.

    Raises:
        ConfigurationError: a ``feed_dict`` or ``run_metadata`` (local runs only), a
            ``num_epoch`` that is not a positive integer, no ``feed_name_list``.
    """
    if feed_dict:
        raise ConfigurationError(
            "pass either feed_dict (a local run) or feed_rdd (a distributed run), not both"
        )
    if run_metadata is not None:
        raise ConfigurationError(
            "run_metadata is only filled by local runs (without feed_rdd): executors' metadata "
            "cannot be merged into one RunMetadata. Profile a local run instead."
        )
    num_epoch = positive_int("num_epoch", num_epoch)
    if feed_name_list is None:
        raise ConfigurationError("feed_name_list is required with feed_rdd, e.g. [x.name, y_.name]")
    return num_epoch, feed_name_list


def model_to_predict(
    session: Any, is_keras: bool, fetches: Any, feed_name_list: Sequence[str] | None
) -> Any:
    """What ``predict()`` applies: the Keras model itself, or a
    :class:`~tensorspark.inference.TF1SessionSource` over the TF1 session's graph.

    Raises:
        ConfigurationError: a TF1 session without ``fetches`` and ``feed_name_list``, or a
            Keras model with either.
    """
    if not is_keras:
        from tensorspark.inference import TF1SessionSource

        if fetches is None or feed_name_list is None:
            raise ConfigurationError(
                "predict() on a TF1 session needs fetches= (the output tensor) and "
                "feed_name_list= (the input placeholder's name), "
                "e.g. fetches=y, feed_name_list=[x.name]"
            )
        return TF1SessionSource(session, fetches, feed_name_list)
    if fetches is not None or feed_name_list is not None:
        raise ConfigurationError(
            "fetches= and feed_name_list= are for TF1 sessions; "
            "this SparkSession wraps a Keras model"
        )
    return session
