"""Which versions tensorspark supports, and whether the driver and executors agree on them.

Two checks, both raising :class:`~tensorspark.errors.ConfigurationError` on the driver:

* :func:`require_supported` (driver, at session start): pyspark, Python, TensorFlow and
  Keras are within what tensorspark supports (:data:`SUPPORTED`). The decision itself,
  :func:`unsupported`, is a pure function of version strings.
* :func:`check_executors` (driver, before a training, inference or tuning job): one tiny
  Spark job, one task per default-parallelism slot, reports each executor's versions
  (:func:`installed`, run on the executor); any that differs from the driver's
  (:func:`mismatches`) fails the call before a parameter server or model is started. Its
  result is remembered per application and set of executors, so a session pays for it once
  (and again only when executors come or go).

Versions are read from installed package metadata, or from the module when it is already
imported, so neither check imports TensorFlow.
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
import socket
import sys
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from typing import Any

# Only the standard library and errors at the top: the probe's task unpickles this module on
# executors whose environment may be broken (no numpy, another TensorFlow), and must still
# run there to say so. The Spark side (connect, jobs) is imported where the driver uses it.
from tensorspark._version import __version__
from tensorspark.errors import ConfigurationError

logger = logging.getLogger(__name__)

#: What tensorspark supports: (oldest, newest) major.minor, inclusive; ``None``: no bound.
SUPPORTED: dict[str, tuple[tuple[int, int], tuple[int, int] | None]] = {
    "python": ((3, 10), (3, 13)),
    "pyspark": ((3, 5), (4, 99)),
    "tensorflow": ((2, 16), None),
    "keras": ((3, 0), (3, 99)),
}

#: The supported versions in words (every error of :func:`require_supported` says it).
SUPPORTED_TEXT = "pyspark 3.5 to 4.x, Python 3.10 to 3.13, TensorFlow >= 2.16 with Keras 3"

# Distributions that install the ``tensorflow`` module, most common first.
_TF_DISTS = ("tensorflow", "tensorflow-cpu", "tensorflow-macos", "tensorflow-intel", "tf-nightly")
_RELEASE = re.compile(r"^(\d+)\.(\d+)")
#: How many (application, executors) results :func:`check_executors` remembers.
_CACHE_SIZE = 8
# What ``SparkContext.setJobGroup`` sets on the calling thread.
_GROUP_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")


@dataclass(frozen=True)
class Versions:
    """The versions one Python process runs (``None``: not installed there).

    Attributes:
        tensorspark: ``tensorspark.__version__``.
        pyspark: pyspark's version.
        python: ``major.minor.micro`` of the interpreter.
        tensorflow: TensorFlow's version.
        keras: Keras's version.
        host: the machine's host name.
    """

    tensorspark: str | None
    pyspark: str | None
    python: str
    tensorflow: str | None
    keras: str | None
    host: str = ""

    def describe(self) -> str:
        """``tensorspark 0.1.0, pyspark 4.3.0, Python 3.11.7, TensorFlow 2.21.0, Keras 3.12.0``."""
        return ", ".join(f"{label} {value or 'not installed'}" for label, value in self._pairs())

    def _pairs(self) -> Iterator[tuple[str, str | None]]:
        yield "tensorspark", self.tensorspark
        yield "pyspark", self.pyspark
        yield "Python", self.python
        yield "TensorFlow", self.tensorflow
        yield "Keras", self.keras


def _module_version(module: str, dists: Iterable[str]) -> str | None:
    """The version of ``module``: its ``__version__`` when imported, else its metadata."""
    loaded = sys.modules.get(module)
    version = getattr(loaded, "__version__", None)
    if isinstance(version, str):
        return version
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def installed() -> Versions:
    """The versions this process runs (driver or executor; cheap: imports nothing heavy).

    pyspark's version comes from the imported module when there is one (on a cluster the
    Python workers import pyspark from Spark's own ``pyspark.zip``, which has no metadata).
    """
    ours: str | None = __version__
    if "pyspark" not in sys.modules:
        try:
            import pyspark  # noqa: F401  (light next to TensorFlow; the worker has it anyway)
        except ImportError:
            pass
    return Versions(
        tensorspark=ours,
        pyspark=_module_version("pyspark", ("pyspark", "pyspark-client")),
        python="{}.{}.{}".format(*sys.version_info[:3]),
        tensorflow=_module_version("tensorflow", _TF_DISTS),
        keras=_module_version("keras", ("keras", "keras-nightly")),
        host=socket.gethostname(),
    )


def release(version: str | None) -> tuple[int, int] | None:
    """``(major, minor)`` of a version string (``"4.3.0.dev1"`` -> ``(4, 3)``); else None."""
    match = _RELEASE.match(version or "")
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def unsupported(versions: Versions) -> list[str]:
    """What in ``versions`` tensorspark does not support, one phrase each (pure function).

    An empty list means all is supported. A package that is not installed counts, since
    the driver needs every one of them.
    """
    problems = []
    for field in ("python", "pyspark", "tensorflow", "keras"):
        value = getattr(versions, field)
        oldest, newest = SUPPORTED[field]
        have = release(value)
        if have is None:
            problems.append(f"{field} {value or 'is not installed'}"[:80])
        elif have < oldest or (newest is not None and have > newest):
            problems.append(f"{field} {value}")
    return problems


def require_supported(versions: Versions | None = None) -> Versions:
    """Raise unless the versions (default: this process's) are supported; return them.

    Runs on the driver (at session start, before each job's executor check).

    Raises:
        ConfigurationError: naming each unsupported version and what is supported.
    """
    versions = installed() if versions is None else versions
    problems = unsupported(versions)
    if problems:
        raise ConfigurationError(
            f"tensorspark {versions.tensorspark} does not support {', '.join(problems)}. "
            f"It supports {SUPPORTED_TEXT}: install versions in that range "
            f"(`pip install tensorspark` picks them for this Python). "
            f"Received: {versions.describe()}"
        )
    return versions


def mismatches(driver: Versions, executor: Versions) -> list[str]:
    """Where an executor's versions differ from the driver's (pure function).

    tensorspark and pyspark must be the same release; Python, TensorFlow and Keras the same
    major.minor (what decides pickled functions and the ``.keras`` format).
    """
    found = []
    for f in fields(Versions):
        if f.name == "host":
            continue
        mine, theirs = getattr(driver, f.name), getattr(executor, f.name)
        exact = f.name in ("tensorspark", "pyspark")
        same = mine == theirs if exact else release(mine) == release(theirs)
        if not same:
            theirs, mine = theirs or "not installed", mine or "not installed"
            found.append(f"{f.name} {theirs} (driver: {mine})")
    return found


def _probe(_: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """One executor's versions (executor: the probe job's task body)."""
    yield asdict(installed())


class _Checked:
    """The (application, executors) pairs whose versions matched: bounded and locked."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._keys: OrderedDict[tuple[str, frozenset[str]], None] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, key: tuple[str, frozenset[str]]) -> bool:
        with self._lock:
            return key in self._keys

    def add(self, key: tuple[str, frozenset[str]]) -> None:
        with self._lock:
            self._keys[key] = None
            while len(self._keys) > self._size:
                self._keys.popitem(last=False)


#: Applications (and their executor sets) already checked by :func:`check_executors`.
_CHECKED = _Checked(_CACHE_SIZE)


def _executors(sc: Any) -> frozenset[str]:
    """The ids of the application's live executors (driver; ``{'driver'}`` in local mode)."""
    ids = sc._jsc.sc().getExecutorIds()  # noqa: SLF001
    return frozenset(str(ids.apply(i)) for i in range(ids.size())) or frozenset({"driver"})


def check_executors(sc: Any, *, what: str = "the job") -> Versions:
    """Raise unless the executors run the driver's versions (driver, before ``what``).

    Runs :func:`require_supported` here, then (once per application and set of executors)
    a job of one tiny task per default-parallelism slot that reports each executor's
    versions. Spark Connect sessions skip the executor part (no RDDs to run it on).

    Returns:
        The driver's versions.

    Raises:
        ConfigurationError: an unsupported version on the driver, or an executor whose
            versions differ (naming both and the executor's host), or an executor whose
            Python worker could not start at all (pyspark's own check failed, for example
            another Python minor version).
    """
    from tensorspark import connect, jobs

    driver = require_supported()
    if connect.is_connect(sc):
        return driver
    key = (str(sc.applicationId), _executors(sc))
    if key in _CHECKED:
        return driver
    slots = max(1, int(sc.defaultParallelism))
    rdd = sc.parallelize(range(slots), slots).mapPartitions(_probe)
    group = f"tensorspark-versions-{uuid.uuid4().hex[:12]}"
    saved = {k: sc.getLocalProperty(k) for k in _GROUP_PROPERTIES}
    sc.setJobGroup(group, f"tensorspark: version check before {what}")
    try:
        rows = rdd.collect()
    except Exception as err:
        if not jobs.is_spark_failure(err):
            raise
        raise _unstartable(driver, err, _failed_hosts(sc, group), what) from None
    finally:
        for k, v in saved.items():  # the caller's thread keeps its own job group
            sc.setLocalProperty(k, v)
    for row in rows:
        theirs = Versions(**row)
        found = mismatches(driver, theirs)
        if found:
            raise ConfigurationError(
                f"The executor on host {theirs.host} runs other versions than the driver "
                f"(host {driver.host}): {'; '.join(found)}. Every executor must run the "
                f"driver's tensorspark and pyspark releases and its Python, TensorFlow and "
                f"Keras major.minor versions; install the same on every node (or point "
                f"spark.pyspark.python at an environment that has them) before {what}. "
                f"Received: executor={theirs.describe()}; driver={driver.describe()}"
            )
    logger.debug("executors %s run the driver's versions: %s", sorted(key[1]), driver.describe())
    _CHECKED.add(key)
    return driver


def _failed_hosts(sc: Any, group: str) -> list[str]:
    """The hosts where tasks of ``group``'s jobs failed, from Spark's status store (driver).

    Spark 4's job failure no longer names the task's host, so it is read here; any trouble
    reading it (the store is Spark-internal) gives an empty list.
    """
    hosts: set[str] = set()
    try:
        tracker = sc.statusTracker()
        store = sc._jsc.sc().statusStore()  # noqa: SLF001
        for job in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job)
            for stage in info.stageIds if info is not None else ():
                tasks = store.taskList(stage, 0, 1000)
                for i in range(tasks.size()):
                    task = tasks.apply(i)
                    if str(task.status()) == "FAILED":
                        hosts.add(str(task.host()))
    except Exception as err:  # noqa: BLE001 - only the message's detail is lost
        logger.debug("could not read the failed tasks' hosts: %s", err)
    return sorted(hosts)


def _unstartable(
    driver: Versions, err: BaseException, hosts: list[str], what: str
) -> ConfigurationError:
    """The error for a probe whose Python worker failed before running (driver)."""
    from tensorspark import jobs

    last = jobs.worker_error_line(err) or type(err).__name__
    host = ", ".join(hosts) or "unknown"
    daemon = jobs.failed_daemon(err)
    if daemon is not None:
        return ConfigurationError(
            f"The executor(s) on host {host} could not start the Python daemon that "
            f"spark.python.daemon.module names, {daemon}: it exited before it started a "
            f"worker (the executor's stderr says why, typically a module its Python cannot "
            f"import). For tensorspark's daemon (tensorspark.warmup.daemon) the executors' "
            f"Python needs tensorspark and its dependencies: install them in that environment "
            f"(or ship tensorspark with --py-files), or remove the setting to use PySpark's "
            f"own daemon, before {what}. The driver runs {driver.describe()}. Received: "
            f"executor error={last[:200]!r}"
        )
    return ConfigurationError(
        f"The Python workers of the executor(s) on host {host} could not run tensorspark's "
        f"version check: {last[:600]} The driver runs {driver.describe()}. Every executor "
        f"must run the same tensorspark and pyspark releases and Python, TensorFlow and "
        f"Keras major.minor versions: point spark.pyspark.python (or PYSPARK_PYTHON) at an "
        f"environment that has them before {what}. Received: executor error={last[:200]!r}"
    )
