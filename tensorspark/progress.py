"""Progress of a training run, shown on the driver while the Spark job runs.

Two layers:

* :class:`Progress` draws a count towards a total: a tqdm bar when its stream is a
  terminal, otherwise one plain line every ``interval`` seconds (spark-submit logs, CI),
  and nothing at all when disabled. It knows nothing about training.
* :class:`ProgressListener`, a :class:`~tensorspark.listeners.RunListener`, turns the
  parameter server's ``/status`` into what a person wants to see (samples done of the
  total, epoch, global loss as a moving average of what the workers report, updates/s,
  ETA) and feeds a :class:`Progress`. The run calls its ``on_poll`` every 0.5 s on the
  driver thread.

Both write to ``sys.stderr`` by default, like tqdm and logging, so stdout stays free for a
program's own results. The library's other output goes through the ``tensorspark``
logger hierarchy, which is silent unless the application configures logging.

Runs on the driver. Neither class is thread-safe: call them from one thread.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from tensorspark.arguments import positive_int, positive_number
from tensorspark.errors import ConfigurationError
from tensorspark.listeners import RunInfo, RunListener

logger = logging.getLogger(__name__)

#: Pushes averaged into the "global loss" shown by the bar, the dashboard and TensorBoard.
DEFAULT_LOSS_WINDOW = 20
#: Seconds between two progress lines when the stream is not a terminal.
DEFAULT_INTERVAL = 10.0


def format_duration(seconds: float | None) -> str:
    """``H:MM:SS`` (or ``M:SS`` under an hour); ``?`` when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """A count towards an optional total, drawn as a bar or as periodic lines.

    Args:
        total: the count at which the work is done, or None when unknown (the bar then
            shows the count and rate without a percentage or ETA).
        desc: the label in front of the bar or line.
        unit: what is counted (``"sample"``, ``"trial"``).
        enabled: False draws nothing and writes nothing.
        stream: where to write; default ``sys.stderr`` (looked up when constructed).
        interval: seconds between two lines when ``stream`` is not a terminal.
        clock: a monotonic clock (tests pass a fake one).

    Raises:
        ConfigurationError: ``total`` is negative or ``interval`` is not positive.
    """

    def __init__(
        self,
        total: int | None = None,
        *,
        desc: str = "train",
        unit: str = "sample",
        enabled: bool = True,
        stream: IO[str] | None = None,
        interval: float = DEFAULT_INTERVAL,
        clock: Any = time.monotonic,
    ) -> None:
        positive_int("total", total, allow_none=True, minimum=0)
        positive_number("interval", interval)
        self.total = None if total is None else int(total)
        self.desc = desc
        self.unit = unit
        self.enabled = bool(enabled)
        self.stream: IO[str] | None = (
            (stream if stream is not None else sys.stderr) if enabled else None
        )
        self.interval = float(interval)
        self._clock = clock
        self.n = 0
        self.fields: dict[str, str] = {}
        self.bar: Any = None
        self._started = clock()
        self._last_line: float | None = None
        self._closed = False
        if self.stream is not None and _isatty(self.stream):
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=self.total,
                desc=desc,
                unit=unit,
                unit_scale=unit == "sample",
                file=self.stream,
                dynamic_ncols=True,
                leave=True,
            )

    @property
    def is_terminal(self) -> bool:
        """Whether a tqdm bar is drawn (the stream is a terminal)."""
        return self.bar is not None

    def write(self, text: str) -> None:
        """Write one line of text above the bar (or as a plain line); nothing when disabled."""
        if self.stream is None:
            return
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def update(
        self, n: int, fields: Mapping[str, str] | None = None, *, eta: float | None = None
    ) -> None:
        """Set the count to ``n`` and the trailing fields (``{"loss": "0.31", ...}``).

        Args:
            n: the count so far (absolute, not an increment).
            fields: name -> already formatted value, shown after the count.
            eta: seconds left, when the caller estimates it better than the bar would
                (shown in plain lines; tqdm computes its own).
        """
        if self._closed:
            return
        self.n = int(n)
        if fields is not None:
            self.fields = dict(fields)
        if self.stream is None:
            return
        if self.bar is not None:
            delta = self.n - self.bar.n
            if fields is not None:
                self.bar.set_postfix_str(self._postfix(), refresh=delta == 0)
            if delta:
                self.bar.update(delta)
            return
        now = self._clock()
        if self._last_line is None or now - self._last_line >= self.interval:
            self._last_line = now
            self.write(self.line(eta))

    def line(self, eta: float | None = None) -> str:
        """The plain-text progress line for the current state."""
        elapsed = self._clock() - self._started
        if self.total:
            count = f"{self.n}/{self.total} {self.unit}s ({100.0 * self.n / self.total:.1f}%)"
        else:
            count = f"{self.n} {self.unit}s"
        parts = [f"{self.desc}: {count}"]
        parts += [f"{k} {v}" for k, v in self.fields.items()]
        parts.append(f"elapsed {format_duration(elapsed)}")
        if self.total:
            parts.append(f"ETA {format_duration(eta)}")
        return " | ".join(parts)

    def close(self) -> None:
        """Finish the bar, or write a last line so that short runs show their end. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.bar is not None:
            self.bar.set_postfix_str(self._postfix(), refresh=False)
            self.bar.close()
        elif self.stream is not None:
            self.write(self.line(0.0 if self.total and self.n >= self.total else None))

    def _postfix(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.fields.items())

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _isatty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or file-like objects without a tty
        return False


@dataclass
class LossPoint:
    """The global loss after one applied push: a moving average of the workers' reports."""

    time: float
    version: int
    loss: float
    metrics: dict[str, float] = field(default_factory=dict)


class LossAverager:
    """Reads the server's push history and keeps a sample-weighted moving average.

    The server's ``/status`` returns its last few hundred pushes on every call; this
    object remembers which ones it has seen (by version and partition; in sync mode a
    round's pushes share one version), so each is averaged once.

    Args:
        window: how many of the latest pushes the average spans.
    """

    def __init__(self, window: int = DEFAULT_LOSS_WINDOW) -> None:
        positive_int("window", window)
        self._recent: deque[tuple[int, float, dict[str, float]]] = deque(maxlen=int(window))
        self._last_version = -1
        self._seen_at_last: set[int] = set()
        self.latest: LossPoint | None = None

    def mark_seen(self, history: Iterable[Mapping[str, Any]]) -> None:
        """Remember these entries as seen without averaging them (an earlier run's pushes)."""
        for entry in history:
            self._is_new(entry)

    def _is_new(self, entry: Mapping[str, Any]) -> bool:
        version, partition = int(entry["version"]), int(entry["partition"])
        if version < self._last_version or (
            version == self._last_version and partition in self._seen_at_last
        ):
            return False
        if version > self._last_version:
            self._last_version, self._seen_at_last = version, set()
        self._seen_at_last.add(partition)
        return True

    def add(self, history: Iterable[Mapping[str, Any]]) -> list[LossPoint]:
        """Average in the entries not seen before; return one point per new entry."""
        points: list[LossPoint] = []
        for entry in history:
            if not self._is_new(entry):
                continue
            version = int(entry["version"])
            metrics = {str(k): float(v) for k, v in (entry.get("metrics") or {}).items()}
            self._recent.append(
                (max(1, int(entry.get("samples", 1))), float(entry["loss"]), metrics)
            )
            total = sum(w for w, _, _ in self._recent)
            loss = sum(w * v for w, v, _ in self._recent) / total
            names = {k for _, _, m in self._recent for k in m}
            averaged = {}
            for name in sorted(names):
                pairs = [(w, m[name]) for w, _, m in self._recent if name in m]
                averaged[name] = sum(w * v for w, v in pairs) / sum(w for w, _ in pairs)
            self.latest = LossPoint(float(entry["time"]), version, loss, averaged)
            points.append(self.latest)
        return points


class ProgressListener(RunListener):
    """The run's progress on stderr, and where its live dashboard is (driver listener).

    Turns the parameter server's ``/status`` (:meth:`on_poll`) into what a person wants to
    see: samples done of the total, epoch, global loss as a moving average of what the
    workers report, updates/s, ETA; and announces the dashboard's URL when the run starts
    (an INFO log line, and a line above the bar). The dashboard itself is served by the
    parameter server, which keeps the push history it draws (``/status``).

    Args:
        progress: show progress (a bar on a terminal, else periodic lines on stderr); or
            a ready :class:`Progress` to draw on. False still logs the dashboard's URL.
        loss_window: pushes averaged into the global loss.

    Not thread-safe: its hooks are called on the driver's thread that called fit/run.
    """

    def __init__(
        self, progress: bool | Progress = True, *, loss_window: int = DEFAULT_LOSS_WINDOW
    ) -> None:
        self._given = progress
        self._loss_window = loss_window
        self.averager = LossAverager(loss_window)
        self.progress: Progress | None = progress if isinstance(progress, Progress) else None
        self.num_epoch: int | None = None
        self._clock = time.monotonic
        self._first: tuple[float, int] | None = None  # (time, samples done) at the first poll
        self._base_samples = 0
        self.last_status: Mapping[str, Any] | None = None
        self._warned = False

    def on_run_start(self, info: RunInfo) -> None:
        """Open the display for this run and announce its dashboard."""
        self.num_epoch = info.num_epoch
        self.averager = LossAverager(self._loss_window)
        self._first, self._warned = None, False
        if not isinstance(self._given, Progress):
            self.progress = Progress(
                info.total_samples, desc=info.name, unit="sample", enabled=bool(self._given)
            )
        # A reused server already holds earlier runs' pushes: count and plot from here on.
        self._base_samples = int(info.status.get("samples", 0))
        self.averager.mark_seen(info.status.get("history", ()))
        logger.info("dashboard at %s", info.dashboard_url)
        self._guarded(self._display().write, f"tensorspark: live dashboard at {info.dashboard_url}")

    def _display(self) -> Progress:
        if self.progress is None:
            raise ConfigurationError(
                "ProgressListener.on_run_start was not called before the run's polls"
            )
        return self.progress

    def on_poll(self, status: Mapping[str, Any]) -> None:
        """Update the display from the server's status.

        A failure here (a closed stream) is logged once as a warning and never interrupts
        the training run it displays.
        """
        self._guarded(self._poll, status)

    def _guarded(self, draw: Any, *args: Any) -> None:
        try:
            draw(*args)
        except Exception:
            if not self._warned:
                self._warned = True
                logger.warning(
                    "progress display or TensorBoard summaries failed; training goes on",
                    exc_info=True,
                )

    def _poll(self, status: Mapping[str, Any]) -> None:
        self.last_status = status
        self.averager.add(status.get("history", ()))
        progress = self._display()
        done = int(status.get("samples", 0)) - self._base_samples
        now = self._clock()
        if self._first is None:
            self._first = (now, done)
        progress.update(done, self.fields(status), eta=self._eta(progress, now, done))

    def fields(self, status: Mapping[str, Any]) -> dict[str, str]:
        """The fields shown after the count: epoch, global loss, metrics, updates/s."""
        out: dict[str, str] = {}
        epochs = [
            int(w["epoch"]) for w in status.get("workers", ()) if int(w.get("epoch", -1)) >= 0
        ]
        if epochs:
            epoch = max(epochs) + 1
            out["epoch"] = f"{epoch}/{self.num_epoch}" if self.num_epoch else str(epoch)
        latest = self.averager.latest
        if latest is not None:
            out["loss"] = f"{latest.loss:.4g}"
            for name, value in latest.metrics.items():
                out[name] = f"{value:.4g}"
        out["updates/s"] = f"{float(status.get('updates_per_sec', 0.0)):.1f}"
        return out

    def _eta(self, progress: Progress, now: float, done: int) -> float | None:
        total = progress.total
        if not total or self._first is None:
            return None
        t0, n0 = self._first
        if now - t0 <= 0 or done <= n0:
            return None
        rate = (done - n0) / (now - t0)
        return max(0.0, (total - done) / rate)

    def on_run_end(self, result: Any) -> None:
        """Finish the display. Idempotent."""
        if self.progress is not None:
            self._guarded(self.progress.close)

    def on_run_failed(self, error: BaseException) -> None:
        """Finish the display (the error is the caller's to show)."""
        self.on_run_end(None)
