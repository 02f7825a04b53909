"""Loading a checkpoint for use elsewhere: one file, or the newest of a folder (driver).

:func:`load_checkpoint` reads a full checkpoint file, or the newest valid checkpoint of a
folder through :class:`~tensorspark.checkpoint.manager.CheckpointManager` (an increment's
chain included).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping

from tensorspark.checkpoint.format import SUFFIX, Checkpoint, checkpoint_name, decode_checkpoint
from tensorspark.checkpoint.increments import increment_fields
from tensorspark.checkpoint.manager import CheckpointManager
from tensorspark.errors import CheckpointError, StorageError
from tensorspark.storage import open_storage
from tensorspark.storage.options import DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT


def load_checkpoint(
    location: str,
    user: str | None = None,
    conf: Mapping[str, str] | None = None,
    *,
    auth: str = "insecure",
    token: str | None = None,
    timeout: float = DEFAULT_READ_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
) -> Checkpoint:
    """Load a checkpoint file, or the newest valid one of a checkpoint directory (an
    increment's file: the state its chain restores).

    Runs on the driver (or anywhere with access to the storage).

    Args:
        location: A ``...safetensors`` file, or a directory of checkpoints.
        user: HDFS user name.
        conf: Spark configuration as a plain mapping.
        auth: WebHDFS authentication: ``"insecure"``, ``"token"`` or ``"kerberos"``.
        token: Delegation token for ``auth="token"``.
        timeout: Seconds each storage network call may wait for an answer.
        connect_timeout: Seconds each storage network call may wait for its connection.

    Raises:
        CheckpointError: the file is missing, corrupt or unreadable, or the directory holds
            no valid checkpoint.
        ConfigurationError: a bad location or auth setting.
    """
    storage, path = open_storage(
        location, user, conf, auth, token, timeout=timeout, connect_timeout=connect_timeout
    )
    name = posixpath.basename(path.rstrip("/"))
    if increment_fields(name) is not None:  # an increment: its chain, from its folder
        folder = location.rstrip("/")[: -len(name)].rstrip("/")
        manager = CheckpointManager(folder, storage=storage, path=posixpath.dirname(path))
        return manager.restore(name)
    if location.rstrip("/").endswith(SUFFIX):
        where = location.rstrip("/")
        try:
            data = storage.read_bytes(path)
        except StorageError as err:
            raise CheckpointError(f"Could not read checkpoint {where}: {err}") from err
        return decode_checkpoint(data, where)
    manager = CheckpointManager(location, storage=storage, path=path)
    checkpoint = manager.latest()
    if checkpoint is None:
        raise CheckpointError(
            f"No valid checkpoint in {manager.location}: expected files named like "
            f"{checkpoint_name(0)} (corrupt ones are skipped and logged). Pass a checkpoint "
            "directory or file that exists."
        )
    return checkpoint
