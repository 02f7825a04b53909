"""What the driver tells the user while a search runs: one INFO log line per finished
trial and, when asked, a :class:`~tensorspark.progress.Progress` display on stderr.
"""

from __future__ import annotations

import logging
from typing import Any

from tensorspark.progress import Progress
from tensorspark.tuning.trial import TrialResult

logger = logging.getLogger(__name__)

__all__ = ["SearchProgress"]


class SearchProgress:
    """Trials done / total (``None``: not known) and best so far: one INFO log line per
    trial, plus, when ``enabled``, a :class:`~tensorspark.progress.Progress` on stderr (a
    tqdm bar on a terminal, else a line every few seconds). Driver only; called from the
    thread that collects results, so it needs no lock."""

    def __init__(self, total: int | None, metric: str, enabled: bool) -> None:
        self.total = total
        self.metric = metric
        self.done = 0
        self.display = Progress(total, desc="tune", unit="trial", enabled=enabled)
        self.bar: Any = self.display.bar

    def update(self, trial: TrialResult, best: TrialResult | None) -> None:
        """Count ``trial`` as done and show ``best``, the best trial so far (or ``None``)."""
        self.done += 1
        outcome = f"{self.metric}={trial.score:.4g}" if trial.ok else f"failed ({trial.error})"
        if trial.ok and trial.pruned:
            outcome = f"pruned after epoch {trial.epochs}, {outcome}"
        best_text = (
            f"best {self.metric}={best.score:.4g} {best.params}"
            if best is not None
            else "no best yet"
        )
        logger.info(
            "Trial %d/%s done (#%d %s) in %.1fs: %s; %s",
            self.done,
            "?" if self.total is None else self.total,
            trial.index,
            trial.params,
            trial.elapsed_s,
            outcome,
            best_text,
        )
        fields = {} if best is None else {f"best {self.metric}": f"{best.score:.4g}"}
        self.display.update(self.done, fields)

    def close(self) -> None:
        """End the display (the log lines need no closing)."""
        self.display.close()
