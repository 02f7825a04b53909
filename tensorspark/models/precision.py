"""Mixed precision for Keras models on the executors: ``mixed_precision=`` of fit, predict, tune.

Keras computes a layer in the dtype of its *dtype policy*. Under ``"mixed_float16"`` or
``"mixed_bfloat16"`` a layer keeps its variables in float32 and computes in float16 or
bfloat16: faster on GPUs with tensor cores, and about half the activation memory. Only the
executors' copies change: the driver's model, the parameter server's master weights and
every push and pull stay float32, because the variables of a mixed policy are float32
(the server refuses a tensor whose dtype differs from the model's).

How the policy reaches a model depends on how the model arrives:

* ``fit`` and ``predict`` get a built model, which travels as ``.keras`` bytes in which
  every layer's policy is written out (float32 unless the user chose another). On the
  executor :func:`mixed_archive` rewrites the archive's ``config.json``: each layer whose
  policy is float32 takes the mixed policy, **except the layers that produce the model's
  outputs, which stay float32** (Keras's mixed-precision guide keeps the final softmax in
  float32 for numerical stability; outputs and predictions stay float32). Layers given
  another policy keep it. The model is then loaded under :func:`policy_scope`, so the model
  itself carries the policy and, for ``mixed_float16``, ``compile`` wraps its optimizer in
  Keras's ``LossScaleOptimizer`` (loss scaling keeps small float16 gradients from
  vanishing).
* ``tune`` calls the user's ``build(params)`` on the executor: it runs under
  :func:`policy_scope`, Keras's own global policy, so every layer it creates without an
  explicit ``dtype`` takes the policy (give the final layer ``dtype="float32"``, as the
  guide advises).

``mixed_float16`` on a CPU runs, slowly (CPUs have no fast float16 arithmetic);
``mixed_bfloat16`` runs on CPUs with bfloat16 support and on recent GPUs and TPUs.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import zipfile
from collections.abc import Iterator
from typing import Any

from tensorspark.errors import ConfigurationError

#: The accepted values of ``mixed_precision=``.
POLICIES = (None, "mixed_float16", "mixed_bfloat16")
_FLOAT32 = "float32"


def check_policy(value: Any) -> str | None:
    """``mixed_precision=`` checked on the driver. Pure.

    Raises:
        ConfigurationError: not one of :data:`POLICIES`.
    """
    if value is None or (isinstance(value, str) and value in POLICIES):
        return value  # type: ignore[no-any-return]
    raise ConfigurationError(
        f"Argument `mixed_precision` must be one of {list(POLICIES)}. Received: "
        f"mixed_precision={value!r}"
    )


@contextlib.contextmanager
def policy_scope(policy: str | None) -> Iterator[None]:
    """Within the block, Keras's global dtype policy is ``policy`` (nothing changes for
    ``None``). Keras keeps that policy per thread, so other threads are unaffected; it is
    restored on leaving."""
    if policy is None:
        yield
        return
    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def mixed_config(config: dict[str, Any], policy: str) -> dict[str, Any]:
    """A copy of a saved model's config in which each layer whose dtype policy is float32
    takes ``policy``, except the layers producing the top model's outputs. Pure.

    Args:
        config: the ``config.json`` of a ``.keras`` archive (``{"class_name", "config",
            ...}``) or a model's ``get_config()`` wrapped the same way.
        policy: ``"mixed_float16"`` or ``"mixed_bfloat16"``.
    """
    out = copy.deepcopy(config)
    body = out.get("config", {})
    keep = _output_layers(out.get("class_name"), body)
    _retype(out, policy, keep, top=True)
    return out


def mixed_archive(data: bytes, policy: str) -> bytes:
    """The ``.keras`` archive ``data`` with :func:`mixed_config` applied to its
    ``config.json`` (weights and metadata copied unchanged). Anywhere; pure."""
    source = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with source, zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            content = source.read(info.filename)
            if info.filename == "config.json":
                content = json.dumps(mixed_config(json.loads(content), policy)).encode("utf-8")
            target.writestr(info, content)
    return out.getvalue()


def _output_layers(class_name: Any, body: dict[str, Any]) -> set[str]:
    """Names of the layers whose outputs are the model's (Sequential: the last layer;
    functional: ``output_layers``); empty for other models."""
    layers = body.get("layers")
    if not isinstance(layers, list) or not layers:
        return set()
    if class_name == "Sequential":
        last = layers[-1]
        name = last.get("config", {}).get("name") if isinstance(last, dict) else None
        return {name} if isinstance(name, str) else set()
    outputs = body.get("output_layers")
    if isinstance(outputs, list) and outputs and isinstance(outputs[0], str):
        outputs = [outputs]  # one output: [name, node, tensor]
    names = set()
    for entry in outputs or []:
        if isinstance(entry, list) and entry and isinstance(entry[0], str):
            names.add(entry[0])
    return names


def _retype(node: Any, policy: str, keep: set[str], top: bool = False) -> None:
    """Walks a config; switches float32 dtype policies of layers not in ``keep``."""
    if isinstance(node, list):
        for item in node:
            _retype(item, policy, keep)
        return
    if not isinstance(node, dict):
        return
    body = node.get("config")
    if "class_name" in node and isinstance(body, dict):
        name = body.get("name")
        if not (name in keep and not top) and _is_float32_policy(body.get("dtype")):
            body["dtype"] = _policy_entry(policy)
        for key, value in body.items():
            if key != "dtype":
                _retype(value, policy, keep)
        return
    for value in node.values():
        _retype(value, policy, keep)


def _is_float32_policy(dtype: Any) -> bool:
    # A layer's policy is saved as {"class_name": "DTypePolicy", "config": {"name": ...}};
    # an InputLayer's "dtype" is a plain dtype string, not a policy, and is left alone.
    return (
        isinstance(dtype, dict)
        and dtype.get("class_name") == "DTypePolicy"
        and isinstance(dtype.get("config"), dict)
        and dtype["config"].get("name") == _FLOAT32
    )


def _policy_entry(policy: str) -> dict[str, Any]:
    return {
        "module": "keras",
        "class_name": "DTypePolicy",
        "config": {"name": policy},
        "registered_name": None,
    }
