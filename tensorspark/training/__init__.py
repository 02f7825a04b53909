"""The training job: one run's lifecycle (:mod:`.run`), its executor tasks (:mod:`.tasks`),
its result (:mod:`.result`), and the Keras ``fit`` and TF1 ``run`` flows built on them."""

from tensorspark.training.result import EpochSnapshots, History, TrainResult
from tensorspark.training.run import RunSettings, Server, ServerHost, TrainingRun

__all__ = [
    "EpochSnapshots",
    "History",
    "RunSettings",
    "Server",
    "ServerHost",
    "TrainResult",
    "TrainingRun",
]
