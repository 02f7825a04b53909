"""One shard of a sharded parameter server: a process of its own, and the driver's handle on it.

A shard is a :class:`~tensorspark.ps.server.ParameterServer` over its slice of the model
(:mod:`tensorspark.ps.layout`), run by ``python -m tensorspark.ps.shard`` (not by
``multiprocessing``, which would import the driver's ``__main__`` script again). The
driver talks to it over the child's stdin and stdout with frames (:mod:`~tensorspark.ps.frames`)::

    u32 header length | u32 0 | u64 data length | header JSON | data (a wire message)

The driver sends commands (``{"id", "cmd", ...}``); the shard answers each with
``{"id", "ok", "result"}`` or ``{"id", "ok": false, "error", "kind"}``, from a few
threads so a long wait never delays a status read. Shard 0 also sends
``{"event": "push", "meta", "status"}`` after each push, for the driver's push listener.
No pickle: JSON and the wire format only. The run's secret travels in the first command,
never on a command line or in the environment.

A shard ends when told to stop, or when its stdin closes: when the driver exits, however
it exits, no shard outlives it. With a ``journal`` in its init, it writes each push it
applies there and, restarted, replays the journal first (:mod:`tensorspark.ps.revive`).
:class:`ShardProcess` (driver side) is thread-safe: calls from several threads are
matched to their answers by id. The child's side runs in its own process.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import numpy as np

from tensorspark import wire
from tensorspark.errors import ConfigurationError, ParameterServerError
from tensorspark.ps import cut_books
from tensorspark.ps.frames import read_frame, write_frame
from tensorspark.ps.journal import Journal, replay

logger = logging.getLogger(__name__)

#: Seconds a shard may take to start (import, bind, answer) before the driver gives up.
START_TIMEOUT = 60.0
#: Seconds the driver waits for a command's answer (a consistent-cut wait adds its own).
CALL_TIMEOUT = 60.0


# ---------------------------------------------------------------------- driver side


class ShardProcess:
    """The driver's handle on one shard process.

    Args:
        index: the shard's number.
        on_event: called with each event the shard sends (on this handle's reader thread).
    """

    def __init__(
        self, index: int, on_event: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        self.index = index
        self._on_event = on_event
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()  # guards writes, _next and _waiting
        self._next = 0
        self._waiting: dict[int, Future[tuple[Any, bytearray]]] = {}
        self._reader: threading.Thread | None = None
        self.pipe_closed = False  # it ended, even while `alive` says not yet (see _read)
        self.port: int | None = None
        self.exit_reason: str | None = None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    @property
    def on_event(self) -> Callable[[dict[str, Any]], None] | None:
        return self._on_event

    def ended(self) -> str:
        """How the process ended, in words (its exit code, or why it was stopped)."""
        code = self.returncode
        return self.exit_reason or (f"exit code {code}" if code is not None else "its pipe closed")

    def kill(self, why: str = "killed: it stopped answering") -> None:
        """SIGKILL the process (a hung shard; its handle then reads as dead)."""
        if self._proc is not None and self.alive:
            self.exit_reason = why
            self._proc.kill()

    def spawn(self) -> None:
        """Start the process (it waits for its ``init`` command)."""
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH", "")) if p
        )
        self.pipe_closed = False
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tensorspark.ps.shard"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
            start_new_session=True,  # a Ctrl-C at the driver does not kill it mid-answer
        )
        self._reader = threading.Thread(
            target=self._read, name=f"tensorspark-shard-{self.index}", daemon=True
        )
        self._reader.start()

    def begin(
        self, command: str, args: Mapping[str, Any] | None = None, data: list[Any] | bytes = b""
    ) -> Future[tuple[Any, bytearray]]:
        """Send a command; its answer arrives in the returned future (see :meth:`call`)."""
        future: Future[tuple[Any, bytearray]] = Future()
        with self._lock:
            if self._proc is None or self._proc.stdin is None or not self.alive:
                future.set_exception(self._dead(command))
                return future
            ident = self._next
            self._next += 1
            self._waiting[ident] = future
            try:
                write_frame(self._proc.stdin, {"id": ident, "cmd": command, **(args or {})}, data)
            except (BrokenPipeError, OSError):
                self._waiting.pop(ident, None)
                future.set_exception(self._dead(command))
        return future

    def call(
        self,
        command: str,
        args: Mapping[str, Any] | None = None,
        data: list[Any] | bytes = b"",
        timeout: float = CALL_TIMEOUT,
    ) -> tuple[Any, bytearray]:
        """Run a command in the shard; its result and data.

        Raises:
            ParameterServerError: the shard answered with an error, died, or did not answer
                within ``timeout`` seconds.
            ConfigurationError: the shard refused its settings.
        """
        return wait_answer(self.begin(command, args, data), timeout, self, command)

    def _read(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        try:
            while True:
                header, data = read_frame(proc.stdout)
                if "event" in header:
                    if self._on_event is not None:
                        self._on_event(header)
                    continue
                with self._lock:
                    future = self._waiting.pop(int(header["id"]), None)
                if future is not None:
                    future.set_result((header, data))
                del header, data, future  # a snapshot's answer: not held till the next frame
        except (EOFError, OSError, ValueError):
            pass
        with self._lock:
            self.pipe_closed = True  # before a waiting call fails: check_shards sees it first
            waiting, self._waiting = list(self._waiting.values()), {}
        for future in waiting:
            future.set_exception(self._dead("its command"))

    def _dead(self, what: str) -> ParameterServerError:
        return ParameterServerError(
            f"parameter-server shard {self.index} is not running ({self.ended()}); {what} failed"
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the shard to stop, then make sure its process is gone. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        if self.alive:
            try:
                self.call("stop", timeout=timeout)
            except ParameterServerError:
                pass
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            logger.warning(
                "parameter-server shard %d did not stop within %ss; killing it", self.index, timeout
            )
            proc.kill()
            proc.wait(timeout)
        if proc.stdout is not None:
            proc.stdout.close()
        self.exit_reason = self.exit_reason or "stopped"


def wait_answer(
    future: Future[tuple[Any, bytearray]], timeout: float, shard: ShardProcess, command: str
) -> tuple[Any, bytearray]:
    """The result of a command sent with :meth:`ShardProcess.begin`, or its error raised."""
    try:
        header, data = future.result(timeout)
    except TimeoutError:
        raise ParameterServerError(
            f"parameter-server shard {shard.index} did not answer {command} within {timeout:g}s"
        ) from None
    if not header.get("ok"):
        kind = (
            ConfigurationError
            if header.get("kind") == "ConfigurationError"
            else ParameterServerError
        )
        raise kind(f"parameter-server shard {shard.index}: {header.get('error')}")
    return header.get("result"), data


# ---------------------------------------------------------------------- the shard's side


def _progress_arg(obj: Mapping[str, Any]) -> dict[int, tuple[int, int]]:
    return {int(p): (int(t[0]), int(t[1])) for p, t in obj.items()}


class _Shard:
    """The child: one parameter server, commanded over stdin/stdout."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.lock = threading.Lock()
        self.server: Any = None
        self.pool = ThreadPoolExecutor(4, thread_name_prefix="tensorspark-shard-cmd")
        self.journal: Journal | None = None
        self.replaying = False  # no push events for replayed pushes (the driver had them)

    def journal_bytes(self) -> int:
        return 0 if self.journal is None else self.journal.bytes

    def send(self, header: Mapping[str, Any], data: list[Any] | bytes = b"") -> None:
        with self.lock:
            try:
                write_frame(self.out, header, data)
            except (BrokenPipeError, OSError):
                pass  # the driver is gone; stdin's EOF ends this process

    def answer(self, header: Mapping[str, Any], data: bytearray) -> None:
        ident = header.get("id")
        try:
            result, out = self.run(str(header.get("cmd")), header, data)
            self.send({"id": ident, "ok": True, "result": result}, out)
        except Exception as err:  # every failure goes back to the driver, named
            self.send({"id": ident, "ok": False, "error": str(err), "kind": type(err).__name__})

    def run(
        self, cmd: str, args: Mapping[str, Any], data: bytearray
    ) -> tuple[Any, list[Any] | bytes]:
        if cmd == "init":
            return self.init(args, data), b""
        server = self.server
        if server is None:
            raise ParameterServerError("the shard is not initialised")
        if cmd == "status":
            status = server.status()
            if not args.get("history", True):
                status.pop(
                    "history", None
                )  # the driver keeps one shard's: they hold the same losses
            return status, b""
        if cmd == "version":
            return server.version, b""
        if cmd == "progress":
            return {str(p): [v["epoch"], v["seq"]] for p, v in server.progress().items()}, b""
        if cmd == "health":  # through the loop: a hung loop does not answer
            return {"version": server.version, "journal_bytes": self.journal_bytes()}, b""
        if cmd == "snapshot":
            since = args.get("rows_since")
            cut, journal = None, self.journal
            if args.get("cut") and journal is not None and since is None:
                # The driver's next base: the copy and the journal's next segment at once,
                # on the loop (no push is journaled between them), with the books.
                store = server._served()
                snap, cut = server._on_loop(
                    lambda: (store.snapshot(None), (journal.rotate(), cut_books.books(store))),
                    "cut",
                )
            else:
                snap = server.snapshot(rows_since=None if since is None else int(since))
            arrays = {f"p/{k}": v for k, v in snap.params.items()}
            arrays.update({f"s/{k}": v for k, v in snap.state.items()})
            for key, (ids, values) in snap.rows.items():  # an increment's: changed rows only
                arrays[f"ri/{key}"] = ids
                arrays[f"rv/{key}"] = values
            meta = {
                "version": snap.version,
                "applied_pushes": snap.applied_pushes,
                "state_meta": snap.state_meta,
                "progress": {str(p): [v["epoch"], v["seq"]] for p, v in snap.progress.items()},
            }
            if cut is not None:
                meta["segment"], meta["ledger"] = cut
            return meta, wire.encode(arrays)
        if cmd == "vocab_maps":  # the dynamic tables' maps now, by block key
            maps = server.vocab_maps()
            return list(maps), wire.encode(
                {f"{k}//{a}": v for k, m in maps.items() for a, v in zip(("ids", "rows"), m)}
            )
        if cmd == "hold":
            now = server.hold(_progress_arg(args["target"]))
            return {str(p): list(t) for p, t in now.items()}, b""
        if cmd == "wait":
            return server.wait_reached(_progress_arg(args["target"]), float(args["timeout"])), b""
        if cmd == "release":
            server.release()
            return None, b""
        if cmd == "num_workers":
            server.num_workers = args.get("value")
            return None, b""
        if cmd == "control":
            return server.set_control(args.get("value") or {}), b""
        if cmd == "reset_progress":
            server.reset_progress()
            return None, b""
        if cmd == "stop":
            server.stop()
            return None, b""
        raise ParameterServerError(f"unknown command {cmd!r}")

    def init(self, args: Mapping[str, Any], data: bytearray) -> dict[str, Any]:
        from tensorspark.ps.server import ParameterServer
        from tensorspark.ps.settings import ServerSettings
        from tensorspark.ps.sparse import split_vocab

        level = args.get("log_level")
        if isinstance(level, int):
            logging.basicConfig(
                level=level,
                format=f"shard {args.get('index')}: %(levelname)s %(name)s: %(message)s",
            )
        tensors, _ = wire.decode(data)
        params = {k[2:]: np.array(v) for k, v in tensors.items() if k.startswith("p/")}
        state = {k[2:]: np.array(v) for k, v in tensors.items() if k.startswith("s/")}
        state_meta = args.get("state_meta") or None
        settings = ServerSettings.from_json(args["settings"])
        if state_meta and "vocab" in state_meta:  # a restart from a cut: its maps in the state
            (state, state_meta), maps = split_vocab(state, state_meta)
        else:  # a start: the maps it was dealt (ps/vocab_shards.py), if any
            maps = ({k[2:]: np.array(v) for k, v in tensors.items() if k.startswith("v/")},
                    dict(args.get("vocab_meta") or {}))  # fmt: skip
        if settings.vocab and maps is not None and maps[1]:
            settings = settings.replace(vocab_state=maps)
        events = bool(args.get("events"))
        server = ParameterServer(
            params,
            settings=settings,
            num_workers=args.get("num_workers"),
            version=int(args["version"]),
            progress={
                int(p): {"epoch": v[0], "seq": v[1]} for p, v in args.get("progress", {}).items()
            },
            on_push=(
                lambda meta, status: (
                    None
                    if self.replaying
                    else self.send({"event": "push", "meta": meta, "status": status})
                )
            )
            if events
            else None,
            combiner_state=(state, state_meta) if state_meta else None,
        )
        if args.get("journal"):
            self._restore(server._served(), args["journal"], args.get("ledger"))
        server.start()
        self.server = server
        return {"port": server.port}

    def _restore(self, store: Any, journal: Mapping[str, Any], ledger: Any) -> None:
        """A restarted shard (:mod:`tensorspark.ps.revive`): the books of the base cut (its
        keys too, :mod:`~tensorspark.ps.cut_books`), the pushes, ``/vocab`` requests and
        stale refusals journaled since replayed, into a journal of its own (before its loop
        runs). A first start: only the journal."""
        cut_books.load(store, ledger)
        store.control = dict(journal.get("control") or {})
        self.journal = Journal(journal["dir"], int(journal["segment"]))
        store.journal = self.journal
        store.rebases.journal = self.journal.refusal  # stale refusals: meta-only records
        first = journal.get("replay_from")
        if first is not None:
            self.replaying = True
            if store.vocab is not None:  # its maps' clock as the dead shard's read it
                store.vocab.count_from_cut()
            try:
                count = replay(store, journal["dir"], int(first), int(journal["segment"]) - 1)
            finally:
                self.replaying = False
            logger.info(
                "replayed %d journaled pushes, /vocab requests and stale refusals (version %d)",
                count,
                store.version,
            )


def main() -> None:
    """The shard process: answer the driver's commands until told to stop or stdin closes."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print must not corrupt the frames
    inp = sys.stdin.buffer
    shard = _Shard(out)
    try:
        while True:
            try:
                header, data = read_frame(inp)
            except EOFError:
                break
            cmd = header.get("cmd")
            if cmd in ("init", "stop"):
                shard.answer(header, data)  # in order: nothing else runs before init or after stop
                if cmd == "stop":
                    break
            else:
                shard.pool.submit(shard.answer, header, data)
    finally:
        if shard.server is not None:
            shard.server.stop()
        shard.pool.shutdown(wait=False, cancel_futures=True)


if __name__ == "__main__":
    main()
