"""The training job: one run's lifecycle (:mod:`.run`), the server host it takes its
parameter server from (:mod:`.host`), its executor tasks (:mod:`.tasks`), its result
(:mod:`.result`), and the Keras ``fit`` and TF1 ``run`` flows built on them."""

from tensorspark.training.host import RunSettings, ServerHost
from tensorspark.training.result import EpochSnapshots, History, TrainResult
from tensorspark.training.run import RunJob, Server, TrainingRun

__all__ = [
    "EpochSnapshots",
    "History",
    "RunJob",
    "RunSettings",
    "Server",
    "ServerHost",
    "TrainResult",
    "TrainingRun",
]
