"""Hosts with their own addresses for the `netns` test set: a cluster across network namespaces.

:class:`Network` makes a Linux bridge with an address of a private test subnet
(``10.213.X.0/24``, a ``X`` no route of this machine uses) and one network namespace per
"host", each joined to the bridge by a veth pair and given its own address on the subnet.
The subnet exists only on this machine. The standalone cluster of ``tests/cluster`` then
runs with its Master and the driver (this test process) on the bridge's address and each
Worker, with its executors and their Python workers, inside its own namespace. Inside a
namespace, 127.0.0.1 is that namespace's own loopback: an executor reaches the driver only
at the bridge's address.

Links are degraded inside a namespace, so nothing outside it is touched:

* :meth:`Network.cut`: iptables DROP of everything between the host and the driver, both
  ways (a pulled cable; nothing is refused, packets vanish);
* :meth:`Network.delay`: every packet to the driver held for a fixed time, through
  NFQUEUE and ``tests/netns/linkdelay.py`` (this kernel has no ``sch_netem``).

Needs root (CI runs as root); otherwise every test here is skipped, saying why, and fails
under ``CI=true`` (``tests/privileges.py``). ``ip``,
``iptables`` come from Debian's iproute2 and iptables (``scripts/setup.sh`` installs them).
Namespaces, the bridge and every process in them are removed at the end whatever happened,
and so are those left by an earlier session that was killed (their names carry its pid).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pyspark import SparkContext

from tensorspark.cli import CommandError, fetch_status
from tensorspark.ps.store import Store
from tests.cluster.conftest import (
    StandaloneCluster,
    WorkerHost,
    new_cluster,
    start_cluster,
    start_worker,
    wait_workers,
)
from tests.privileges import missing_privilege, require_root

logger = logging.getLogger(__name__)

HOSTS = 2
PREFIX = "tensorspark-"  # namespace names: tensorspark-<pid>-h<i>
LINKDELAY = Path(__file__).resolve().parent / "linkdelay.py"
COMMAND_TIMEOUT_S = 30.0
KILL_TIMEOUT_S = 15.0


def _run(
    *command: str, check: bool = True, timeout: float = COMMAND_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} exited with {done.returncode}: {done.stderr.strip()}"
        )
    return done


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def namespace_pids(namespace: str) -> list[int]:
    """Pids of the live processes in ``namespace`` (``ip netns pids``, without zombies: a
    killed child stays listed until its parent reaps it)."""
    done = _run("ip", "netns", "pids", namespace, check=False)
    if done.returncode != 0:
        return []
    live = []
    for pid in (int(p) for p in done.stdout.split()):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone meanwhile
        if state != "Z":
            live.append(pid)
    return live


def kill_namespace(namespace: str, timeout: float = KILL_TIMEOUT_S) -> None:
    """SIGKILL every process in ``namespace`` until none is left (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = namespace_pids(namespace)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"processes {pids} in {namespace} survived SIGKILL for {timeout:.0f} s"
            )
        time.sleep(0.1)


@dataclass(frozen=True)
class Host:
    """One namespace "host": its namespace, address, and the bridge side of its veth pair."""

    index: int
    namespace: str
    address: str
    veth: str

    @property
    def prefix(self) -> tuple[str, ...]:
        """Runs a command inside this host's namespace."""
        return ("ip", "netns", "exec", self.namespace)


@dataclass
class Network:
    """A bridge on ``driver`` and :data:`HOSTS` namespaces on the same /24.

    Created by :meth:`create`.
    """

    tag: str
    subnet: str  # "10.213.X"
    bridge: str
    hosts: tuple[Host, ...] = ()
    _delayers: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def driver(self) -> str:
        """The bridge's address: the driver's, and the Master's."""
        return f"{self.subnet}.1"

    def create(self) -> None:
        """Make the bridge and the namespaces. Whatever was made is recorded for :meth:`destroy`."""
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.driver}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        hosts = []
        for index in range(HOSTS):
            host = Host(
                index,
                f"{PREFIX}{self.tag}-h{index}",
                f"{self.subnet}.{11 + index}",
                f"tsv{self.tag}h{index}",
            )
            inner = f"tsv{self.tag}n{index}"
            _run("ip", "netns", "add", host.namespace)
            hosts.append(host)
            self.hosts = tuple(hosts)
            _run("ip", "link", "add", host.veth, "type", "veth", "peer", "name", inner)
            _run("ip", "link", "set", host.veth, "master", self.bridge)
            _run("ip", "link", "set", host.veth, "up")
            _run("ip", "link", "set", inner, "netns", host.namespace)
            _run("ip", "-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", inner)
            _run("ip", "-n", host.namespace, "link", "set", inner, "up")
            _run("ip", "-n", host.namespace, "link", "set", "lo", "up")

    def destroy(self) -> None:
        """Stop delayers, kill every process in the namespaces, delete them and the bridge."""
        for process in self._delayers:
            _stop_process(process)
        self._delayers.clear()
        for host in self.hosts:
            with contextlib.suppress(RuntimeError):
                kill_namespace(host.namespace)
            _run("ip", "netns", "del", host.namespace, check=False)  # takes its veth pair along
            _run("ip", "link", "del", host.veth, check=False)
        _run("ip", "link", "del", self.bridge, check=False)

    def check_reachable(self) -> None:
        """Every host reaches the driver over the bridge (a TCP connection from inside it)."""
        probe = (
            "import socket,sys; "
            "socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()"
        )
        with _listener(self.driver) as port:
            for host in self.hosts:
                done = _run(
                    *host.prefix, sys.executable, "-c", probe, self.driver, str(port), check=False
                )
                if done.returncode != 0:
                    raise RuntimeError(
                        f"{host.namespace} cannot reach the driver at {self.driver}:{port}: "
                        f"{done.stderr}"
                    )

    # ------------------------------------------------------------------ link faults

    def _iptables(self, host: Host, *rule: str) -> None:
        _run(*host.prefix, "iptables", "-w", "5", *rule)

    def cut(self, host: Host, port: int | None = None) -> None:
        """Drop every packet between ``host`` and the driver, both ways (until :meth:`mend`).

        With ``port``, only the packets of the driver's TCP port ``port`` (the parameter
        server's, say): Spark's own connections keep working.
        """
        inbound = ["-s", self.driver] + (["-p", "tcp", "--sport", str(port)] if port else [])
        outbound = ["-d", self.driver] + (["-p", "tcp", "--dport", str(port)] if port else [])
        self._iptables(host, "-I", "INPUT", *inbound, "-j", "DROP")
        self._iptables(host, "-I", "OUTPUT", *outbound, "-j", "DROP")

    def mend(self, host: Host) -> None:
        """Undo :meth:`cut` and :meth:`delay` rules: flush the host's INPUT and OUTPUT chains."""
        self._iptables(host, "-F", "INPUT")
        self._iptables(host, "-F", "OUTPUT")

    @contextlib.contextmanager
    def delay(self, host: Host, milliseconds: float) -> Iterator[dict[str, int]]:
        """Hold every packet from ``host`` to the driver for ``milliseconds`` (one way).

        Yields a dict that says, once the block is over, how many ``"packets"`` were held,
        and how many times the kernel had more to report than the program's socket held
        (``"overruns"``; packets it could not report pass undelayed).
        """
        counts: dict[str, int] = {}
        queue = 10 + host.index
        process = subprocess.Popen(
            [
                *host.prefix,
                sys.executable,
                str(LINKDELAY),
                "--queue",
                str(queue),
                "--delay-ms",
                str(milliseconds),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._delayers.append(process)
        try:
            assert process.stdout is not None
            ready = _read_line(process, timeout=COMMAND_TIMEOUT_S)
            if ready != "ready":
                raise RuntimeError(f"linkdelay did not start: {ready!r}")
            self._iptables(
                host,
                "-I",
                "OUTPUT",
                "-d",
                self.driver,
                "-j",
                "NFQUEUE",
                "--queue-num",
                str(queue),
                "--queue-bypass",
            )
            yield counts
        finally:
            self.mend(host)
            _stop_process(process)
            self._delayers.remove(process)
            tail = process.stdout.read() if process.stdout is not None else ""
            found = re.search(r"delayed (\d+) packets \((\d+) socket overruns\)", tail)
            counts["packets"] = int(found.group(1)) if found else 0
            counts["overruns"] = int(found.group(2)) if found else -1


def _read_line(process: subprocess.Popen[str], timeout: float) -> str:
    """The first line ``process`` prints, waiting at most ``timeout`` seconds."""
    line: list[str] = []
    assert process.stdout is not None
    reader = threading.Thread(
        target=lambda: line.append(process.stdout.readline().strip()), daemon=True
    )  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    return line[0] if line else ""


def _stop_process(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@contextlib.contextmanager
def _listener(host: str) -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind((host, 0))
        sock.listen(8)
        yield int(sock.getsockname()[1])


def _used_subnets() -> set[str]:
    text = _run("ip", "-4", "-o", "addr").stdout + _run("ip", "-4", "route").stdout
    return set(re.findall(r"\b10\.213\.(\d+)\.", text))


def _remove_stale() -> None:
    """Delete namespaces and bridges left by earlier sessions whose process is gone."""
    names = _run("ip", "netns", "list", check=False).stdout.split()
    for name in names:
        match = re.fullmatch(rf"{PREFIX}(\d+)-h\d+", name)
        if match and not _alive(int(match.group(1))):
            with contextlib.suppress(RuntimeError):
                kill_namespace(name)
            _run("ip", "netns", "del", name, check=False)
    links = _run("ip", "-o", "link", "show", "type", "bridge", check=False).stdout
    for match in re.finditer(r"^\d+: (tsb(\d+)):", links, re.M):
        if not _alive(int(match.group(2))):
            _run("ip", "link", "del", match.group(1), check=False)


def require_namespaces() -> None:
    """Skip (saying why; under CI=true fail) where namespaces cannot be made for want of
    root; fail where a tool is missing."""
    require_root("creating the netns tests' network namespaces and bridge")
    missing = [tool for tool in ("ip", "iptables") if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"netns tests need {', '.join(missing)}: run scripts/setup.sh as root "
            "(apt: iproute2, iptables)"
        )


@contextlib.contextmanager
def network() -> Iterator[Network]:
    """A bridge and :data:`HOSTS` namespaces on a free 10.213.X.0/24, removed at the end."""
    require_namespaces()
    _remove_stale()
    used = _used_subnets()
    pid = os.getpid()
    free = [x for x in [20 + (pid + i) % 230 for i in range(230)] if str(x) not in used]
    net = Network(tag=str(pid), subnet=f"10.213.{free[0]}", bridge=f"tsb{pid}")
    try:
        try:
            net.create()
        except RuntimeError as err:
            if "Operation not permitted" in str(err):
                missing_privilege(f"cannot create network namespaces here: {err}")
            raise
        net.check_reachable()
        yield net
    finally:
        net.destroy()


# ---------------------------------------------------------------------- the cluster


@dataclass
class NetnsCluster:
    """The standalone cluster across the namespaces, and the network under it."""

    net: Network
    spark: StandaloneCluster
    #: Scratch folders of Workers killed with their host: a crashed host's disk keeps what
    #: was on it (Spark's per-application folders, tensorspark's spill files inside them).
    crashed: set[Path] = field(default_factory=set)

    def executors(self, host: Host) -> dict[int, str]:
        """The executor JVMs running in ``host``: pid -> Spark executor id."""
        found = {}
        for pid in namespace_pids(host.namespace):
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if (
                b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in args
                and b"--executor-id" in args
            ):
                found[pid] = args[args.index(b"--executor-id") + 1].decode()
        return found

    def restart_worker(self, host: Host) -> None:
        """Start ``host``'s Worker again (after :meth:`kill_host`) and wait until it registered."""
        self.restart_workers([host])

    def restart_workers(self, hosts: Sequence[Host]) -> None:
        """Start the Workers of ``hosts`` that were killed, then wait until every Worker
        registered (all at once: with two hosts killed, one restarted alone never sees
        the other's)."""
        names = {f"worker-{host.index}": host for host in hosts}
        self.spark.daemons = [
            d for d in self.spark.daemons if d.name not in names or d.process.poll() is None
        ]
        running = {d.name for d in self.spark.daemons}
        dead = [host for name, host in names.items() if name not in running]
        if not dead:
            return
        for host in dead:
            start_worker(self.spark, host.index)
        wait_workers(self.spark, len(self.net.hosts))

    def kill_host(self, host: Host) -> list[int]:
        """SIGKILL every process of ``host`` (Worker, executor, Python workers).

        Returns their pids.
        """
        pids = namespace_pids(host.namespace)
        kill_namespace(host.namespace)
        self.crashed.update((self.spark.root / "local" / f"worker-{host.index}").iterdir())
        for daemon in self.spark.daemons:
            if daemon.name == f"worker-{host.index}":
                with contextlib.suppress(subprocess.TimeoutExpired):
                    daemon.process.wait(timeout=KILL_TIMEOUT_S)
        return pids

    def context(self, app_name: str, **conf: str) -> SparkContext:
        """A SparkContext (the driver on the bridge's address) with an executor on every host.

        The background warm-up is off unless asked for: these tests place one task per host
        (each Worker offers one core), which holds only when both slots are free as a job
        starts, and a warm-up or keep-alive task (seconds of TensorFlow import under the
        suite's load) can hold one, so Spark runs both partitions one after the other on
        the other host. The warm-up's scheduling has its own tests
        (tests/spark/test_warmup.py).
        """
        return self.spark.context(app_name, **{"spark.tensorspark.warmup.enabled": "false", **conf})

    def spill_dirs(self) -> list[Path]:
        """tensorspark's spill folders still under the Workers' local dirs, but for those of
        Workers that died with their host (:attr:`crashed`)."""
        found = (self.spark.root / "local").glob("**/tensorspark-spill-*")
        return sorted(d for d in found if not any(c in d.parents for c in self.crashed))


@pytest.fixture(scope="package")
def netns_cluster() -> Iterator[NetnsCluster]:
    """A standalone cluster whose 2 Workers each run in their own network namespace, for
    tests/netns: removed after its last test, before the sets after it run."""
    with network() as net, tempfile.TemporaryDirectory(prefix="tensorspark-netns-") as tmp:
        hosts = tuple(WorkerHost(h.address, h.prefix) for h in net.hosts)
        spark = new_cluster(Path(tmp), host=net.driver, worker_hosts=hosts)
        try:
            start_cluster(spark)
            yield NetnsCluster(net, spark)
        finally:
            active = SparkContext._active_spark_context  # noqa: SLF001
            if active is not None and active.master == spark.master_url:
                active.stop()
            spark.stop()


# ---------------------------------------------------------------------- watching a run


class RunWatch(logging.Handler):
    """Learns a run's dashboard address from tensorspark's log and reads its server's status.

    Install with :meth:`installed`; the training runs in the test's thread while a helper
    thread (:meth:`when`) acts once the status satisfies a condition, e.g. kills an executor
    after some pushes.
    """

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.dashboard: str | None = None
        self.found = threading.Event()
        self._triggers: list[PushTrigger] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("dashboard at "):
            self.dashboard = message.removeprefix("dashboard at ").strip()
            self.found.set()

    @contextlib.contextmanager
    def installed(self) -> Iterator[RunWatch]:
        package = logging.getLogger("tensorspark")
        level = package.level
        package.setLevel(min(level or logging.INFO, logging.INFO))
        package.addHandler(self)
        original = Store.push
        triggers = self._triggers

        def push(store: Store, *args: Any, **kwargs: Any) -> bool:
            kept = original(store, *args, **kwargs)
            waiting = [t for t in triggers if not t.settled.is_set()]
            if waiting:
                try:
                    status = store.status()
                except BaseException as err:  # kept for the test, never answered to the worker
                    for trigger in waiting:
                        trigger.fail(err)
                else:
                    for trigger in waiting:
                        trigger.check(status)
            return kept

        Store.push = push  # type: ignore[method-assign,assignment]
        try:
            yield self
        finally:
            Store.push = original  # type: ignore[method-assign]
            package.removeHandler(self)
            package.setLevel(level)

    def at_push(
        self,
        condition: Callable[[dict[str, Any]], bool],
        action: Callable[[dict[str, Any]], Any],
    ) -> PushTrigger:
        """Run ``action(status)`` once, on the parameter server's loop thread, right after
        the first push that makes ``condition(status)`` hold (``status``: the store's part
        of ``/status``, its worker rows and counters) and before the server answers it.

        Exact where :meth:`when` polls: an elastic sync rerun that trains alone can finish
        its pushes within one poll's interval. The action must be quick (a kill): the
        server waits for it. Only while :meth:`installed`.
        """
        trigger = PushTrigger(condition, action)
        self._triggers.append(trigger)
        return trigger

    def status(self) -> dict[str, Any] | None:
        """The server's status now, or None when it does not answer (not yet, or no more)."""
        if self.dashboard is None:
            return None
        try:
            return fetch_status(self.dashboard, timeout=5.0)
        except CommandError:
            return None

    def when(
        self,
        condition: Callable[[dict[str, Any]], bool],
        action: Callable[[dict[str, Any]], Any],
        timeout: float = 300.0,
    ) -> Background:
        """Run ``action(status)`` in a thread as soon as ``condition(status)`` holds."""

        def body() -> Any:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                status = self.status()
                if status is not None and condition(status):
                    return action(status)
                time.sleep(0.2)  # the server gives no push notification to this process
            raise TimeoutError(f"the condition did not hold within {timeout:.0f} s")

        return Background(body)


class PushTrigger:
    """A condition on the server's status checked after each push, and its action
    (:meth:`RunWatch.at_push`); errors of either are kept for :meth:`result`, never
    answered to the pushing worker."""

    def __init__(
        self,
        condition: Callable[[dict[str, Any]], bool],
        action: Callable[[dict[str, Any]], Any],
    ) -> None:
        self._condition, self._action = condition, action
        self._outcome: dict[str, Any] = {}
        self.settled = threading.Event()

    def check(self, status: dict[str, Any]) -> None:
        try:
            if self._condition(status):
                self._outcome["value"] = self._action(status)
                self.settled.set()
        except BaseException as err:  # re-raised in result()
            self.fail(err)

    def fail(self, err: BaseException) -> None:
        """Keep ``err`` for :meth:`result`; the trigger is done."""
        self._outcome["error"] = err
        self.settled.set()

    def result(self) -> Any:
        """The action's value, once the run is over; raises its error, or AssertionError
        when no push of the run met the condition."""
        if not self.settled.is_set():
            raise AssertionError("no push of the run met the trigger's condition")
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome.get("value")


class Background:
    """A function run in a daemon thread; :meth:`result` joins it and re-raises its error."""

    def __init__(self, body: Callable[[], Any]) -> None:
        self._outcome: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, args=(body,), daemon=True)
        self._thread.start()

    def _run(self, body: Callable[[], Any]) -> None:
        try:
            self._outcome["value"] = body()
        except BaseException as err:  # re-raised in result()
            self._outcome["error"] = err

    def result(self, timeout: float = 60.0) -> Any:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("the background action did not finish")
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome.get("value")


def status_from(host: Host, url: str) -> subprocess.CompletedProcess[str]:
    """``tensorspark status URL --json``, run inside ``host``'s namespace."""
    return _run(
        *host.prefix,
        sys.executable,
        "-m",
        "tensorspark.cli",
        "status",
        url,
        "--json",
        check=False,
        timeout=60,
    )


def parse_json(text: str) -> dict[str, Any]:
    return dict(json.loads(text))
